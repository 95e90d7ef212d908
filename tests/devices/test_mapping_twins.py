"""Applying a rule to a format's items, ``_mapping_py.readings`` run as Python
(``mapping.readings_py``) and compiled (``_mapping_c.readings``), gives the same answers.

Same readings (types and key order included) and the same rejections, in order, for
items built by hand in every shape a format makes (times of every kind and unit, none,
out of the window, SenML epochs, problems, line tags, units, payload context with tag
values at and beyond the byte bound, non-ASCII, lone surrogates, missing variables,
positions; a lone surrogate in a tag, which both refuse with the same exception)
under rules that take the sensor id from the topic (of one filter or of a list) or the
payload, keep tags as info or as identity, declare units; and for uplinks parsed from
generated payloads.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.decode import Limits
from ingest.devices.formats import Item, Parsed
from ingest.devices.formats.json import parse_py
from ingest.devices.mapping import Mapping, readings_py
from ingest.devices.rules import parse
from ingest.model import Decoded, Rejection
from tests.support.twins import compiled

twin = compiled("ingest.devices._mapping_c")

NOW = 1_790_000_000.0
TTN = """
[[rule]]
name = "up"
topic = "v3/{application}/devices/{sensor_id}/up"
format = "json"
root = "uplink_message.decoded_payload"
info = ["dev_eui"]
[rule.tags]
dev_eui = "{end_device_ids.dev_eui}"
[rule.time]
field = "uplink_message.received_at"
format = "iso"
"""
RULES = [
    TTN,
    TTN.replace('info = ["dev_eui"]', 'info = ["dev_eui", "application"]'),
    TTN.replace('info = ["dev_eui"]\n', ""),  # an identity tag from the payload
    TTN.replace(
        'dev_eui = "{end_device_ids.dev_eui}"',
        'dev_eui = "{end_device_ids.dev_eui}"\nmodel = "m-{end_device_ids.model}"',
    ),
    TTN.replace('info = ["dev_eui"]', 'info = ["dev_eui"]\nsensor_id = "{end_device_ids.id}"'),
    TTN + '[rule.units]\ntemperature = "Cel"\n',
    TTN + '[rule.units]\n"*" = "x-{end_device_ids.dev_eui}"\ntemperature = "Cel"\n',
    (
        '[[rule]]\nname = "plain"\ntopic = "p/{site}/{sensor_id}"\ninfo = ["site"]\n'
        '[rule.time]\nfield = "t"\nformat = "auto"\n'
    ),
    '[[rule]]\nname = "plain"\ntopic = "p/{site}/{sensor_id}"\n',
    # A rule listing filters: its captures from whichever matched (q/<sensor>/<site>).
    (
        '[[rule]]\nname = "listed"\ntopic = ["p/{site}/{sensor_id}", "q/{sensor_id}/{site}"]\n'
        'info = ["site"]\n'
    ),
]
TOPICS = [
    "v3/app@ttn/devices/dev-1/up",
    "v3/" + "a" * 300 + "/devices/d/up",
    "p/site/s1",
    "p/é/s2",
    "v3/x/devices/bad id/up",
    "q/s3/site-q",
]

TIMES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "2026-11-27T10:00:00.123456789Z",
            "2026-11-27T10:00:00Z",
            "2026-11-27T10:00:00+02:00",
            "2026-11-27T10:00:00",
            "1790000000",
            "1790000000123",
            " 1790000000 ",
            "nonsense",
            "",
            "1990-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "2026-11-27T10:00:00.5Z" * 4,
        ]
    ),
    st.sampled_from(
        [
            NOW,
            NOW + 0.0005,
            1_790_000_000_123,
            1_790_000_000_123_456_789,
            2**70,
            float("nan"),
            float("inf"),
            -1.0,
            True,
            0,
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=1),
)
TAG_TEXT = st.one_of(
    st.sampled_from(
        ["70B3D57ED0000001", "", "é" * 64, "é" * 129, "a" * 256, "a" * 257, "\ud800", "x\udcffy"]
    ),
    st.text(max_size=8),
)
FIELDS = st.dictionaries(
    st.sampled_from(["temperature", "hum", "a b", "seq", "x" * 70]),
    st.one_of(
        st.floats(),
        st.integers(),
        st.booleans(),
        st.none(),
        st.text(max_size=3),
        st.lists(st.integers(), max_size=1),
    ),
    max_size=4,
)
CONTEXT = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            [
                "end_device_ids.dev_eui",
                "end_device_ids.model",
                "end_device_ids.id",
                "application",
                "sensor_id",
                "site",
            ]
        ),
        TAG_TEXT,
        max_size=4,
    ),
)


@st.composite
def an_item(draw: st.DrawFn) -> Item:
    return Item(
        draw(FIELDS),
        draw(TIMES),
        draw(st.none() | st.sampled_from([NOW, 1e300, 5.0])),
        draw(st.none() | st.sampled_from(["s9", "bad id"])),
        draw(st.none() | st.dictionaries(st.sampled_from(["host", "ts"]), TAG_TEXT, max_size=1)),
        draw(st.none() | st.just({}) | st.just({"temperature": "K"})),
        draw(CONTEXT),
        draw(st.none() | st.just([]) | st.just([Rejection("bad_value", "x: an array")])),
        draw(st.none() | st.integers(0, 3)),
    )


def both(rules_text: str, topic: str, parsed_of: Any, limits: Limits) -> None:
    """Apply the rule with each twin (each its own Mapping); the answers must agree."""
    answers: list[Decoded | tuple[type[Exception], str]] = []
    for apply in (readings_py, twin.readings):
        mapping = Mapping(parse(rules_text, "test"))
        matched = mapping.match(topic)
        if matched is None:
            return
        parsed = parsed_of(matched)
        try:
            answers.append(apply(mapping, matched, parsed, NOW, limits))
        except Exception as exc:  # noqa: BLE001 - the twins must fail alike
            answers.append((type(exc), str(exc)))
    want, got = answers
    if not isinstance(want, Decoded):
        assert got == want
        return
    assert isinstance(got, Decoded)
    assert got.rejections == want.rejections
    assert len(got.readings) == len(want.readings)
    for a, b in zip(want.readings, got.readings, strict=True):
        assert a == b
        assert [type(x) for x in a] == [type(x) for x in b]
        assert list(a.values.items()) == list(b.values.items())
        assert a.tags is b.tags or list(a.tags or {}) == list(b.tags or {})
        assert list((a.info or {}).items()) == list((b.info or {}).items())


@given(
    st.sampled_from(RULES),
    st.sampled_from(TOPICS),
    st.lists(an_item(), max_size=3),
    st.sampled_from([Limits(), Limits(max_past_seconds=1, max_future_seconds=1)]),
)
def test_the_twins_agree_on_items_of_every_shape(
    rules_text: str, topic: str, items: list[Item], limits: Limits
) -> None:
    def parsed_of(_matched: object) -> Parsed:
        return Parsed(list(items), [Rejection("bad_shape", "earlier")])

    both(rules_text, topic, parsed_of, limits)


UPLINK = st.fixed_dictionaries(
    {
        "end_device_ids": st.fixed_dictionaries(
            {},
            optional={
                "dev_eui": TAG_TEXT | st.integers() | st.none(),
                "model": TAG_TEXT,
                "id": st.sampled_from(["d1", "bad id", ""]) | st.integers(),
            },
        ),
        "uplink_message": st.fixed_dictionaries(
            {},
            optional={
                "decoded_payload": FIELDS | st.just([]) | st.integers(),
                "received_at": TIMES,
            },
        ),
    }
)


@given(
    st.sampled_from(RULES[:6]),
    st.sampled_from(TOPICS[:2] + TOPICS[4:]),
    UPLINK | st.lists(UPLINK, max_size=3),
)
def test_the_twins_agree_on_parsed_uplinks(rules_text: str, topic: str, doc: object) -> None:
    payload = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if _dumpable(doc) else b"{}"
    limits = Limits(max_past_seconds=10**12, max_future_seconds=10**12)

    def parsed_of(matched: Any) -> Parsed:
        return parse_py(payload, matched.rule, matched.captures, limits)

    both(rules_text, topic, parsed_of, limits)


def _dumpable(doc: object) -> bool:
    try:
        orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


def test_an_uplink_of_the_common_shape_is_read_by_the_compiled_code() -> None:
    mapping = Mapping(parse(TTN, "test"))
    matched = mapping.match(TOPICS[0])
    assert matched is not None
    item = Item(
        {"temperature": 21.5, "hum": 40},
        "2026-11-27T10:00:00.123456789Z",
        context={"end_device_ids.dev_eui": "70B3D57ED0000001"},
    )
    limits = Limits(max_past_seconds=10**9, max_future_seconds=10**9)
    [reading] = twin.readings(mapping, matched, Parsed([item], []), NOW, limits).readings
    assert reading.sensor_id == "dev-1"
    assert reading.tags == {"application": "app@ttn"}
    assert reading.info == {"dev_eui": "70B3D57ED0000001"}
    assert reading.ms == round(datetime(2026, 11, 27, 10, tzinfo=UTC).timestamp() * 1000) + 123
