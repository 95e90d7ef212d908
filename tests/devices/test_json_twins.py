"""The json format's paths agree: its rules (``_jsonparse_py``) run as Python on the whole
payload (a full ``orjson.loads``), compiled (``_jsonparse_c``) on the whole payload, and
compiled on what the selective scanner (the kernel ``_json_c.Selection``) builds of it for a
rule with ``root`` or ``each``.

Same Parsed (items, values and their types, key order, rejections with their detail text)
on LoRaWAN uplinks as the vendors send them, on generated JSON of every shape (random extra
members and nesting, duplicate keys, escapes, unicode, numbers of every form) and on hostile
bytes (every truncation, every single-byte damage, invalid UTF-8 where nothing is read,
deep nesting, NaN, control characters).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from bench.mapping import ttn
from ingest import accel
from ingest.devices.decode import Limits
from ingest.devices.formats import _jsonparse_py
from ingest.devices.formats import json as json_format
from ingest.devices.rules import load_preset, parse
from ingest.metrics import Metrics
from tests.support.devices import base_time, load
from tests.support.twins import compiled

if TYPE_CHECKING:
    from ingest.devices.formats import Parsed
    from ingest.devices.rules import Rule

compiled("ingest.devices.formats._json_c")
compiled_rules = compiled("ingest.devices.formats._jsonparse_c")

OTHER_RULES = """
[[rule]]
name = "gateway"
topic = "g/{gw}"
each = "devices"
sensor_id = ["{model}-{id}", "{_key}", "{gw}"]
[rule.tags]
model = "{model}"
site = "{meta.site}"
[rule.time]
field = "meta.t"

[[rule]]
name = "inner"
topic = "u/{sensor_id}"
root = "up.data"
[rule.tags]
dev = "{up.data.id}"
gw = "{up.gw.id}"
[rule.time]
field = "up.data.at"

[[rule]]
name = "outer-time"
topic = "o/{sensor_id}"
root = "a.b"
[rule.tags]
whole = "{a}"
[rule.time]
field = "a"
"""


def _rule(rules: list[Rule], name: str) -> Rule:
    return next(r for r in rules if r.name == name)


TTN = _rule(load_preset("ttn"), "ttn-up")
CHIRPSTACK = _rule(load_preset("chirpstack"), "chirpstack-up")
RULES = [TTN, CHIRPSTACK, *parse(OTHER_RULES, "twins")]
CAPTURES = {
    "ttn-up": {"application": "app1@ttn", "sensor_id": "dev1"},
    "chirpstack-up": {"sensor_id": "0101010101010101"},
    "gateway": {"gw": "gw1"},
    "inner": {"sensor_id": "s1"},
    "outer-time": {"sensor_id": "s1"},
}
LIMITS = (Limits(), Limits(max_readings=2), Limits(max_readings=0))
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(parse_fn: Any, payload: bytes, rule: Rule, limits: Limits) -> str:
    """What one twin makes of a payload, as text that tells 1, 1.0 and True apart."""
    try:
        parsed: Parsed = parse_fn(payload, rule, CAPTURES[rule.name], limits)
    except Exception as exc:  # noqa: BLE001 - an exception must be the same in both twins
        return f"raised {type(exc).__name__}: {exc}"
    return repr(parsed)


def assert_same(payload: bytes, rules: list[Rule] = RULES) -> None:
    """The rules run as Python on the whole payload, compiled on the whole payload, and
    compiled on what the scanner builds of it: the same Parsed."""
    for rule in rules:
        for limits in LIMITS:
            expected = outcome(_jsonparse_py.parse, payload, rule, limits)
            for parse_fn in (json_format.parse_py, json_format.parse_selective):
                assert outcome(parse_fn, payload, rule, limits) == expected, (
                    parse_fn,
                    rule.name,
                    payload,
                )


def uplinks() -> list[bytes]:
    """The documented TTN and ChirpStack uplinks, and the benchmark's TTN uplink."""
    t = base_time(time.time())
    return [
        m.payload
        for preset in ("ttn", "chirpstack")
        for m in load(preset, t)
        if m.payload.startswith(b"{")
    ] + ttn(2, 2)[0]


# JSON text, as bytes, in every form the grammar allows and, rarely, some it does not.
def rarely(
    common: st.SearchStrategy[bytes], odd: st.SearchStrategy[bytes]
) -> st.SearchStrategy[bytes]:
    """``odd`` one time in 48: a payload has tens of parts, about half stay valid."""
    return st.integers(0, 47).flatmap(lambda i: odd if i == 0 else common)


WS = rarely(
    st.sampled_from([b"", b"", b"", b" ", b"\n", b"\t", b"\r\n  "]),
    st.sampled_from([b"\x0c", b"\xc2\xa0", b"\x00", b"\x0b"]),
)
ODD_NUMBERS = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"01",
    b"-01",
    b"00",
    b"1.",
    b".5",
    b"-",
    b"1e",
    b"1e+",
    b"+1",
    b"0x10",
    b"1e400",
    b"-1e400",
    b"1e309",
    b"1" * 309,
    b"1" * 400,
    b"9" * 19,
    b"9" * 20,
    b"-" + b"9" * 19,
    b"18446744073709551616",
    b"-9223372036854775809",
    b"1E5",
    b"-0",
    b"-0.0",
    b"2.2250738585072011e-308",
    b"4.9e-324",
    b"1e-400",
    b"0.1e310",
    b"123456789012345678901234567890e280",
    b"1.5e+0308",
    b"1e00001",
    b"1e" + b"9" * 25,
    b"1e-" + b"9" * 25,
    b"1e" + b"0" * 30 + b"400",
    b"1E" + b"4" * 19,
    b"1e18446744073709551716",
    b"1.0e",
    b"-.5",
    b"1..2",
    b"1e5.5",
    b"\xd9\xa1",
]
ODD_STRINGS = [
    b'"\\ud800"',
    b'"\\udc00"',
    b'"\\ud800\\udc00"',
    b'"\\uD83D\\uDE00"',
    b'"\\ud800\\u0041"',
    b'"\\ud800x"',
    b'"\\ud800\\ud800"',
    b'"\\udbff\\udfff"',
    b'"\\u00e9"',
    b'"\\u00"',
    b'"\\u00g0"',
    b'"\\x"',
    b'"\\U0041"',
    b'"a\x01b"',
    b'"\x7f"',
    b'"\\/"',
    b'"\\u0000"',
    b'"\t"',
    b'"\n"',
    b'"\xff"',
    b'"\xc0\x80"',
    b'"\xc1\xbf"',
    b'"\xe0\x80\x80"',
    b'"\xed\xa0\x80"',
    b'"\xf0\x80\x80\x80"',
    b'"\xf4\x90\x80\x80"',
    b'"\xf5\x80\x80\x80"',
    b'"\xe2\x82"',
    b'"\xef\xbf\xbf"',
    b'"\xf0\x9f\x98\x80"',
    b'"\x80"',
    b'"\\"',
    b'"a',
    b"'a'",
    b'"\\\\"',
    b'"' + b"x" * 300 + b'\\"' + b"y" * 7 + b'"',
]
ODD_OTHERS = [
    b"tru",
    b"nul",
    b"None",
    b"True",
    b"nulll",
    b"[1,]",
    b"[,1]",
    b"[1 2]",
    b"[1}",
    b'{"a":1]',
    b'{"a":1,}',
    b'{"a"}',
    b'{"a":}',
    b"{,}",
    b'{"a" 1}',
    b"{1:2}",
    b'{"a":1 "b":2}',
    b'{"a":1}}',
    b"[[]",
    b"[]]",
    b"",
    b" ",
    b"\x00",
    b'{"a":1,"a":2}',
    b"[" * 200 + b"]" * 200,
]
NUMBERS = rarely(
    st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70).map(lambda n: str(n).encode()),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
        st.from_regex(rb"\A-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,5})?\Z"),
    ),
    st.sampled_from(ODD_NUMBERS),
)
STRINGS = rarely(
    st.one_of(
        st.text().map(orjson.dumps), st.text().map(lambda s: json.dumps(s).encode())
    ),  # \uXXXX escapes, surrogates too
    st.sampled_from(ODD_STRINGS),
)
SCALARS = st.one_of(
    NUMBERS,
    STRINGS,
    rarely(st.sampled_from([b"true", b"false", b"null"]), st.sampled_from(ODD_OTHERS)),
)
KEYS = st.one_of(
    st.sampled_from(
        [
            b'"uplink_message"',
            b'"decoded_payload"',
            b'"received_at"',
            b'"end_device_ids"',
            b'"dev_eui"',
            b'"object"',
            b'"time"',
            b'"deviceInfo"',
            b'"deviceName"',
            b'"devices"',
            b'"meta"',
            b'"t"',
            b'"up"',
            b'"data"',
            b'"id"',
            b'"model"',
            b'"a"',
            b'"b"',
            b'"gw"',
        ]
    ),
    rarely(
        st.text().map(orjson.dumps),
        st.one_of(
            STRINGS,
            st.sampled_from(
                [b'"\\u0075plink_message"', b'"obj\\u0065ct"', b'"time\\u0000"', b'"ti\xcc\x88me"']
            ),
        ),
    ),
)


def _members(pairs: list[tuple[bytes, bytes]], ws: bytes) -> bytes:
    return b"{" + b",".join(ws + k + ws + b":" + ws + v + ws for k, v in pairs) + b"}"


def _values(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    arrays = st.tuples(st.lists(children, max_size=4), WS).map(
        lambda a: b"[" + a[1] + (b"," + a[1]).join(a[0]) + a[1] + b"]"
    )
    objects = st.tuples(st.lists(st.tuples(KEYS, children), max_size=5), WS).map(
        lambda a: _members(*a)
    )
    return arrays | objects


VALUES = st.recursive(SCALARS, _values, max_leaves=25)


@st.composite
def shaped(draw: st.DrawFn) -> bytes:
    """A payload shaped as the rules expect (an uplink, a gateway's devices...), its
    members shuffled among random others, sometimes given twice or left out."""

    def obj(needed: list[tuple[bytes, bytes]]) -> bytes:
        pairs = [p for p in needed if draw(st.integers(0, 9))]  # each kept 9 times in 10
        pairs += draw(st.lists(st.tuples(KEYS, VALUES), max_size=4))
        if pairs and draw(st.integers(0, 7)) == 0:
            pairs.append(draw(st.sampled_from(pairs)))  # a duplicate key
        return _members(draw(st.permutations(pairs)), draw(WS))

    reading = st.one_of(
        st.just(b"{}"),
        VALUES,
        st.lists(st.tuples(KEYS, VALUES), max_size=6).map(lambda p: _members(p, b"")),
    )
    when = st.sampled_from(
        [
            b'"2026-11-26T19:00:00.250339525Z"',
            b"1764183600250",
            b"null",
            b'"not a time"',
            b"{}",
            b'"\\u0032026-11-26T19:00:00Z"',
        ]
    )
    text = (
        st.sampled_from([b'"dev-\\u00e9"', b'"70B3D57ED0000000"', b"12", b"1.5", b"true", b"[]"])
        | VALUES
    )
    kind = draw(st.sampled_from(["ttn", "chirpstack", "gateway", "inner", "outer"]))
    if kind == "ttn":
        return obj(
            [
                (b'"end_device_ids"', obj([(b'"dev_eui"', draw(text))])),
                (b'"received_at"', draw(when)),
                (
                    b'"uplink_message"',
                    obj([(b'"decoded_payload"', draw(reading)), (b'"received_at"', draw(when))]),
                ),
            ]
        )
    if kind == "chirpstack":
        return obj(
            [
                (b'"time"', draw(when)),
                (b'"object"', draw(reading)),
                (b'"deviceInfo"', obj([(b'"deviceName"', draw(text))])),
            ]
        )
    if kind == "gateway":
        devices = draw(
            st.one_of(
                st.lists(reading, max_size=4).map(lambda r: b"[" + b",".join(r) + b"]"),
                st.lists(st.tuples(KEYS, reading), max_size=4).map(lambda p: _members(p, b"")),
                VALUES,
            )
        )
        return obj(
            [
                (b'"devices"', devices),
                (b'"meta"', obj([(b'"t"', draw(when)), (b'"site"', draw(text))])),
            ]
        )
    if kind == "inner":
        return obj(
            [(b'"up"', obj([(b'"data"', draw(reading)), (b'"gw"', obj([(b'"id"', draw(text))]))]))]
        )
    return obj([(b'"a"', obj([(b'"b"', draw(reading))]))])


@SETTINGS
@given(shaped())
def test_both_twins_agree_on_payloads_shaped_as_the_rules_expect(payload: bytes) -> None:
    assert_same(payload)


@SETTINGS
@given(VALUES)
def test_both_twins_agree_on_any_json_text(payload: bytes) -> None:
    assert_same(payload)


@SETTINGS
@given(st.sampled_from(uplinks()), st.data())
def test_both_twins_agree_on_uplinks_with_damage_anywhere(
    payload: bytes, data: st.DataObject
) -> None:
    """Bytes replaced, inserted or removed, where the rule reads and where it does not."""
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload)))
        junk = data.draw(
            st.sampled_from(
                [
                    b"\xff",
                    b"\xc3",
                    b"\xed\xa0\x80",
                    b"\x00",
                    b"\x1f",
                    b"NaN",
                    b"\\",
                    b'"',
                    b"{",
                    b"}",
                    b"[",
                    b"]",
                    b",",
                    b":",
                    b"\\u",
                    b"\\ud800",
                    b" ",
                    b"e999",
                    b"-",
                    b"0",
                    b".",
                    b"e",
                ]
            )
        )
        cut = data.draw(st.integers(0, 2))
        payload = payload[:at] + junk + payload[at + cut :]
    assert_same(payload)


@pytest.mark.parametrize("payload", uplinks()[:3])
def test_both_twins_agree_on_every_truncation_and_every_single_byte_damage(payload: bytes) -> None:
    for end in range(len(payload) + 1):
        assert_same(payload[:end], [TTN, CHIRPSTACK])
    for at in range(len(payload)):
        for byte in (b"\x00", b"\x1f", b"\x80", b"\xff", b'"', b"\\", b"}", b"x"):
            assert_same(payload[:at] + byte + payload[at + 1 :], [TTN, CHIRPSTACK])
    assert_same(payload + b" \n", [TTN, CHIRPSTACK])
    assert_same(b"\xef\xbb\xbf" + payload, [TTN, CHIRPSTACK])  # a byte order mark
    assert_same(b"[" + payload + b"," + payload + b"]", [TTN, CHIRPSTACK])


# An uplink with one place to fill (``@X@``) where the rule reads nothing, where it
# reads a whole value, or where it reads the value and orjson alone checks it.
PLACES = [
    (
        b'{"end_device_ids":{"dev_eui":"70B3D57ED0000000","x":@X@},"correlation_ids":["a",@X@],'
        b'"uplink_message":{"frm_payload":@X@,"decoded_payload":{"t":1},"received_at":"r"}}'
    ),
    (
        b'{"uplink_message":{"rx_metadata":[{"rssi":-35,"snr":@X@}],"decoded_payload":'
        b'{"t":1,"u":@X@},"received_at":"2026-11-26T19:00:00Z"},"object":{"v":@X@}}'
    ),
    (
        b'{"uplink_message":{"decoded_payload":{"t":1},"received_at":@X@},'
        b'"end_device_ids":{"dev_eui":@X@},"time":@X@,"deviceInfo":{"deviceName":@X@}}'
    ),
    b'{"object":@X@,"uplink_message":{"decoded_payload":@X@}}',
    b'{"uplink_message":{"decoded_payload":{"t":1}},@X@:1}',
]


@pytest.mark.parametrize("odd", [*ODD_NUMBERS, *ODD_STRINGS, *ODD_OTHERS])
def test_both_twins_agree_on_every_odd_token_in_every_place(odd: bytes) -> None:
    for place in PLACES:
        assert_same(place.replace(b"@X@", odd), [TTN, CHIRPSTACK])


@pytest.mark.parametrize("depth", [15, 16, 17, 127, 128, 129, 1023, 1024, 1025, 5000])
def test_both_twins_agree_on_deep_nesting_anywhere(depth: int) -> None:
    deep = b'{"x":' * depth + b"1" + b"}" * depth
    nested = b"[" * depth + b"]" * depth
    for inside in (deep, nested):
        assert_same(b'{"extra":' + inside + b',"uplink_message":{"decoded_payload":{"t":1}}}')
        assert_same(b'{"uplink_message":{"decoded_payload":{"t":' + inside + b"}}}")
        assert_same(b'{"object":' + deep + b',"time":' + inside + b"}")


OTHERS = [  # (payload, the rule it is for)
    (
        (
            b'{"devices":[{"model":"m1","id":7,"temp":21.5},{"id":"x","hum":40},3],'
            b'"meta":{"t":"2026-11-26T19:00:00Z","site":"north"},"rssi":[-40,-51]}'
        ),
        "gateway",
    ),
    (b'{"meta":{"t":1764183600250},"devices":{"a1":{"temp":1,"meta":{"t":1}},"b2":{}}}', "gateway"),
    (b'{"up":{"gw":{"id":"g1"},"data":{"id":"d1","at":"2026-11-26T19:00:00Z","v":1}}}', "inner"),
    (b'{"a":{"b":{"v":1.5,"w":{"x":null}},"c":"\\u00e9"}}', "outer-time"),
]


def test_the_compiled_twin_reads_clean_payloads_without_the_full_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a twin that always falls back: the documented uplinks and gateway messages
    take the short way."""
    cases = [(p, rule) for p in uplinks() for rule in (TTN, CHIRPSTACK)]
    cases += [(p, _rule(RULES, name)) for p, name in OTHERS]
    expected = [json_format.parse_py(p, rule, CAPTURES[rule.name], Limits()) for p, rule in cases]

    def full_parse(*args: object) -> Parsed:
        raise AssertionError(f"parse_py called for {args[0]!r}")

    monkeypatch.setattr(compiled_rules, "parse", full_parse)
    got = [json_format.parse_selective(p, rule, CAPTURES[rule.name], Limits()) for p, rule in cases]
    assert repr(got) == repr(expected)
    assert all(parsed.items for parsed in got[-len(OTHERS) :])
    assert {rule.name for (_, rule), parsed in zip(cases, got, strict=True) if parsed.items} == {
        rule.name for rule in RULES
    }


@pytest.mark.parametrize(
    "payload",
    [
        b'{"uplink_message":{"decoded_payload":{"t":1},"decoded_payload":{"t":2}}}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"uplink_message":{}}',
        b'{"uplink_message":{"decoded_p\\u0061yload":{"t":1}}}',
        b'{"uplink_message":{"decoded_payload":{"t":1}}} x',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":NaN}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":"\xff"}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":"a\x01"}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":"\\ud800"}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":1e400}',
        b'{"uplink_message":{"decoded_payload":{"t":1}},"x":[1,]}',
    ],
)
def test_anything_doubtful_is_left_to_the_full_parse(
    monkeypatch: pytest.MonkeyPatch, payload: bytes
) -> None:
    expected = outcome(json_format.parse_py, payload, TTN, Limits())
    calls: list[bytes] = []
    full_parse = json_format.parse_py

    def counted(*args: Any) -> Parsed:
        calls.append(args[0])
        return full_parse(*args)

    monkeypatch.setattr(compiled_rules, "parse", counted)
    assert outcome(json_format.parse_selective, payload, TTN, Limits()) == expected
    assert calls == [payload]


def test_a_value_the_scanner_cannot_build_is_parsed_whole_counted_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected exception in the compiled scanner (here orjson refusing a value the
    scan checked) is no silent slowdown: the message is parsed whole, the fallback is
    counted in ingest_accelerator_fallbacks_total and its first is logged."""
    kernel = compiled("ingest.devices.formats._json_c")

    def refuse(raw: bytes) -> object:
        raise orjson.JSONDecodeError("refused", raw.decode(), 0)

    monkeypatch.setattr(accel, "_fallbacks", {})
    monkeypatch.setattr(kernel, "_loads", refuse)
    payloads = uplinks()[:2]
    for payload in payloads:
        expected = outcome(json_format.parse_py, payload, TTN, Limits())
        assert outcome(json_format.parse_selective, payload, TTN, Limits()) == expected
    scraped = generate_latest(Metrics("bucket").registry).decode()
    assert (
        'ingest_accelerator_fallbacks_total{cause="JSONDecodeError",'
        f'function="json.Selection.pruned"}} {len(payloads)}.0' in scraped
    )
    warnings = [r.getMessage() for r in caplog.records if r.name == "ingest.accel"]
    assert len(warnings) == 1, warnings
    assert "compiled json.Selection.pruned handed a call to its Python twin" in warnings[0]
