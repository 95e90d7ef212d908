"""Hostile input through the mapping path: nothing raises, nothing unbounded, nothing unsafe.

Whatever a topic or payload says, every accepted reading has a valid sensor id, safe and
bounded field and tag names, scalar values with bounded strings and a time inside the
window; everything else is a counted rejection with a known reason.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.devices.decode import REASONS, Limits
from ingest.devices.formats import MAX_FIELDS
from ingest.devices.mapping import Mapping, Result
from ingest.devices.rules import parse
from ingest.model import MAX_TAG_BYTES, MAX_TAGS, RESERVED_FIELDS

NOW = time.time()
LIMITS = Limits(max_message_bytes=64 * 1024, max_readings=50)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SENSOR = re.compile(r"[^\x00-\x1f\x7f-\x9f]{1,128}")  # kept exactly, no control characters
RULES = """
[[rule]]
name = "ignored"
topic = "z/bridge/#"
ignore = true

[[rule]]
name = "json"
topic = "z/{sensor_id}"
max_string_bytes = 64
[rule.time]
field = "t"

[[rule]]
name = "json-tz"
topic = "tz/{room}/{sensor_id}"
[rule.time]
field = "t"
format = "local"
zone = "Europe/Berlin"

[[rule]]
name = "value"
topic = "v/{sensor_id}/{kind}/{measurement}"
format = "value"
[rule.values]
ON = true

[[rule]]
name = "senml"
topic = "s/#"
format = "senml"

[[rule]]
name = "influx"
topic = "i/{site}"
format = "influx"
sensor_id = "{tag.host}"
measurement = "{measurement}_{field}"

[[rule]]
name = "gateway"
topic = "g/{gw}"
each = "devices"
sensor_id = ["{model}-{id}", "{_key}", "{gw}"]
info = ["model"]
[rule.tags]
model = "{model}"
[rule.units]
temp = "{unit}"
[rule.rename]
seq = "dev_seq"
[rule.time]
field = "meta.t"

[[rule]]
name = "uplink"
topic = "u/{sensor_id}"
root = "up.data"
[rule.time]
field = "at"
"""
MAPPING = Mapping(parse(RULES, "fuzz"))
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def checked(topic: str, payload: bytes, now: float = NOW) -> Result:
    result = MAPPING.decode(topic, payload, now, LIMITS)
    low, high = now - LIMITS.max_past_seconds, now + LIMITS.max_future_seconds
    for rejection in result.decoded.rejections:
        assert rejection.reason in REASONS
        assert len(rejection.detail) < 400
    assert len(result.decoded.readings) <= max(LIMITS.max_readings, 1)
    for reading in result.decoded.readings:
        assert SENSOR.fullmatch(reading.sensor_id)
        assert 0 < len(reading.values) <= MAX_FIELDS
        assert low <= reading.epoch <= high
        assert reading.ms is not None
        assert abs(reading.ts.timestamp() * 1000 - reading.ms) < 1
        for name, value in reading.values.items():
            assert NAME.fullmatch(name)
            assert name not in RESERVED_FIELDS
            assert type(value) in {int, float, bool, str}
            if type(value) is str:
                assert len(value.encode()) <= 256
            if type(value) is int:
                assert -(2**63) <= value < 2**63
            if type(value) is float:
                assert math.isfinite(value)
        for key, tag in (reading.tags or {}).items():
            assert NAME.fullmatch(key)
            assert key not in {"sensor_id", "units", "_id"}
            assert len(tag.encode()) <= MAX_TAG_BYTES
        assert len(reading.tags or {}) <= MAX_TAGS
        for name, unit in (reading.units or {}).items():
            assert name in reading.values
            assert 0 < len(unit) <= 64
        for key, tag in (reading.info or {}).items():
            assert NAME.fullmatch(key)
            assert len(tag.encode()) <= MAX_TAG_BYTES
    return result


levels = st.text(st.characters(codec="utf-8", exclude_characters="/"), max_size=300)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=80), inner, max_size=6)
    ),
    max_leaves=60,
)


def dumps(value: Any) -> bytes:
    """JSON as a device might send it: big integers, NaN and lone surrogates included."""
    return json.dumps(value).encode()


@SETTINGS
@given(
    prefix=st.sampled_from(["z", "tz", "v", "s", "i", "g", "u", "z/bridge", "$SYS", ""]),
    parts=st.lists(levels, max_size=5),
    payload=json_value,
)
def test_any_topic_and_json_payload(prefix: str, parts: list[str], payload: Any) -> None:
    checked("/".join([prefix, *parts]), dumps(payload))


@SETTINGS
@given(devices=json_value, top=st.dictionaries(st.text(max_size=40), json_value, max_size=4))
def test_payload_identities_of_any_gateway_or_uplink(devices: Any, top: dict[str, Any]) -> None:
    """Device ids, tags and units taken from payload fields stay text, bounded and safe."""
    checked("g/gw1", dumps({**top, "devices": devices}))
    checked("u/dev1", dumps({**top, "up": {"data": devices}}))


@SETTINGS
@given(
    obj=st.dictionaries(st.text(max_size=100), json_value, max_size=30),
    t=st.one_of(
        st.integers(-(2**80), 2**80),
        st.floats(),
        st.text(max_size=80),
        st.sampled_from(["2026-11-21T10:00:00", "1795251600500", "nan", ""]),
    ),
)
def test_json_objects_with_any_time_value(obj: dict[str, Any], t: Any) -> None:
    obj["t"] = t
    for topic in ("z/dev", "tz/kitchen/dev"):
        checked(topic, dumps(obj))


@SETTINGS
@given(
    unit=st.sampled_from([1, 1000, 1_000_000, 1_000_000_000]),
    offset=st.floats(-3e7, 500, allow_nan=False),
)
def test_timestamps_in_every_unit_land_where_they_say(unit: int, offset: float) -> None:
    epoch = NOW + offset
    raw = int(epoch * unit)
    (reading,) = checked("z/dev", orjson.dumps({"t": raw, "x": 1})).decoded.readings
    assert abs(reading.epoch - raw / unit) < 1e-3


def test_deep_wide_long_and_huge_payloads_are_bounded() -> None:
    deep: Any = 1
    for _ in range(200):
        deep = {"k": deep}
    result = checked("z/dev", orjson.dumps({"x": 1, "deep": deep}))
    assert [r.reason for r in result.decoded.rejections] == ["bad_value"]
    assert "nested deeper than 16" in result.decoded.rejections[0].detail
    nested_5000 = b'{"a":' * 5000 + b"1" + b"}" * 5000
    assert [r.reason for r in checked("z/dev", nested_5000).decoded.rejections] == ["invalid_json"]
    wide = {f"k{i}": i for i in range(MAX_FIELDS + 1)}
    result = checked("z/dev", orjson.dumps(wide))
    assert [r.reason for r in result.decoded.rejections] == ["bad_shape"]
    long_names = {"x" * 1000: 1, "y" * 64: 2}
    result = checked("z/dev", orjson.dumps(long_names))
    assert result.decoded.readings[0].values == {"y" * 64: 2}
    huge = b'{"x": "' + b"a" * LIMITS.max_message_bytes + b'"}'
    assert [r.reason for r in checked("z/dev", huge).decoded.rejections] == ["too_large"]
    strings = checked("z/dev", orjson.dumps({"s": "é" * 40, "n": 1}))
    assert [r.reason for r in strings.decoded.rejections] == ["bad_value"]  # 80 bytes > 64
    many = orjson.dumps([{"x": i} for i in range(LIMITS.max_readings + 1)])
    assert [r.reason for r in checked("z/dev", many).decoded.rejections] == ["too_many_readings"]


def test_the_topic_cache_stays_bounded(monkeypatch: Any) -> None:
    import ingest.devices.mapping as module  # noqa: PLC0415

    monkeypatch.setattr(module, "TOPIC_CACHE", 50)
    mapping = Mapping(parse(RULES, "fuzz"))
    for i in range(500):
        mapping.decode(f"z/dev{i}", b'{"x": 1}', NOW, LIMITS)
    assert len(mapping._cache) <= 50


@SETTINGS
@given(payload=st.binary(max_size=400), measurement=levels)
def test_any_bytes_as_a_plain_value(payload: bytes, measurement: str) -> None:
    checked(f"v/dev/sensor/{measurement}", payload)


senml_record = st.dictionaries(
    st.sampled_from(
        [
            "bn",
            "bt",
            "bu",
            "bv",
            "bs",
            "bver",
            "n",
            "u",
            "v",
            "vs",
            "vb",
            "vd",
            "s",
            "t",
            "ut",
            "x_",
        ]
    ),
    st.one_of(json_scalar, st.sampled_from(["urn:dev:x:", "temp", "a/b", ""])),
    max_size=8,
)


@SETTINGS
@given(records=st.lists(senml_record, max_size=12))
def test_any_senml_pack(records: list[dict[str, Any]]) -> None:
    checked("s/gw", dumps(records))


line_text = st.text(st.sampled_from(list("ab=, \\\"'#tTfF0123456789.-+eiu\nxé")), max_size=200)


@SETTINGS
@given(text=line_text, site=levels)
def test_any_line_protocol_text(text: str, site: str) -> None:
    checked(f"i/{site}", text.encode())
    checked("i/site", f"m,host=h {text}".encode())


@SETTINGS
@given(
    ms=st.one_of(
        st.integers(-(6 * 10**13), 6 * 10**13), st.integers(3_999_999_999_000, 4_000_000_001_000)
    )
)
def test_millisecond_timestamps_are_exact(ms: int) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from ingest.model import Reading  # noqa: PLC0415

    # A reading keeps its time in milliseconds; its datetime is derived, exactly.
    reading = Reading("s", None, ms / 1000, {"v": 1}, None, ms)
    assert reading.ts == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert reading.ts.tzinfo is UTC


filter_level = st.sampled_from(["a", "b", "$s", "+"])
mqtt_filter = st.builds(
    lambda levels, tail: "/".join(levels + (["#"] if tail else [])),
    st.lists(filter_level, min_size=1, max_size=4),
    st.booleans(),
)
topic_level = st.sampled_from(["a", "b", "c", "$s", ""])


@SETTINGS
@given(
    filters=st.lists(mqtt_filter, min_size=1, max_size=6),
    topics=st.lists(st.lists(topic_level, min_size=1, max_size=5), max_size=30),
)
def test_subscriptions_cover_every_filter_and_never_overlap(
    filters: list[str], topics: list[list[str]]
) -> None:
    from paho.mqtt.client import topic_matches_sub  # noqa: PLC0415

    from ingest.devices.mapping import disjoint_filters  # noqa: PLC0415

    result = disjoint_filters(filters)
    for levels in topics:
        topic = "/".join(levels)
        wanted = any(topic_matches_sub(f, topic) for f in filters)
        got = sum(topic_matches_sub(f, topic) for f in result)
        assert got == (1 if wanted else got)  # each wanted topic: exactly one subscription
        assert got <= 1  # never delivered twice


# --- identity tags and declared kinds under generated rules ------------------------------

RESERVED = {"sensor_id", "units", "_id"}
tag_key = st.one_of(
    st.sampled_from(
        [
            "sensor_id",
            "units",
            "_id",
            "_sensor_id",
            "probe.id",
            "probe_id",
            "probe id",
            "site",
            "zone",
            "k" * 64,
            "k" * 65,
            "x.y" * 22,
        ]
    ),
    st.text(st.sampled_from(list("ab._- é,")), min_size=1, max_size=6),
)
tag_value = st.text(st.sampled_from(list("xyz019")), min_size=1, max_size=4)


def stored_tag_name(key: str) -> str | None:
    """docs/mapping.md, "Tag names from the payload": the name a line's tag is stored
    under, or None when its line is refused for it."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", key)
    if name in RESERVED:
        return "_" + name
    return name if 1 <= len(name) <= 64 else None


def escaped(text: str) -> str:
    """A tag key or value as line protocol writes it."""
    return text.replace(",", "\\,").replace(" ", "\\ ").replace("=", "\\=")


@SETTINGS
@given(
    tags=st.dictionaries(tag_key, tag_value, max_size=6),
    capture=st.booleans(),
    constant=st.booleans(),
    by_tag=st.booleans(),
    site=tag_value,
)
def test_every_line_tag_is_kept_under_a_name_of_its_own_or_the_line_refused(
    tags: dict[str, str], capture: bool, constant: bool, by_tag: bool, site: str
) -> None:
    """Under a generated influx rule (a topic capture, a constant tag, the sensor id from
    a tag or from host), every tag of a line is stored under its documented name, one
    name per tag, or the line is refused as ``bad_tag_name``: never a tag left out."""
    tags.pop("host", None)
    tags.pop("dev", None)
    rule = (
        '[[rule]]\nname = "gen"\nformat = "influx"\n'
        + ('topic = "i2/{site}"\n' if capture else 'topic = "i2/+"\n')
        + ('sensor_id = "{tag.dev}"\n' if by_tag else "")
        + ('[rule.tags]\nzone = "z1"\n' if constant else "")
    )
    mapping = Mapping(parse(rule, "gen"))
    line_tags = {"host": "h", "dev": "d", **tags}
    text = "m," + ",".join(f"{escaped(k)}={escaped(v)}" for k, v in line_tags.items())
    result = mapping.decode(f"i2/{site}", f"{text} value=1".encode(), NOW, LIMITS)
    topic_tags = {**({"site": site} if capture else {}), **({"zone": "z1"} if constant else {})}
    kept = {k: v for k, v in line_tags.items() if k != ("dev" if by_tag else "host")}
    names = [stored_tag_name(k) for k in kept]
    stored_names = [n for n in names if n is not None]
    refused = (
        len(stored_names) < len(names)  # a tag without a name of its own
        or len(set(stored_names)) < len(stored_names)
        or any(topic_tags.get(n, v) != v for n, v in zip(stored_names, kept.values(), strict=True))
    )
    if refused:
        assert result.decoded.readings == []
        assert [r.reason for r in result.decoded.rejections] == ["bad_tag_name"]
        return
    assert result.decoded.rejections == []
    (reading,) = result.decoded.readings
    assert reading.sensor_id == ("d" if by_tag else "h")
    assert reading.tags == {**topic_tags, **dict(zip(stored_names, kept.values(), strict=True))}


kind_name = st.sampled_from(["t", "h", "o", "s", "x"])
kind_value = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["ON", "OFF", "warm", "NaN", "21.5", "", "é" * 30]),
    st.lists(st.integers(), max_size=2),
)
FITS = {"number": (int, float), "boolean": (bool,), "string": (str,)}


@SETTINGS
@given(
    declared=st.dictionaries(kind_name, st.sampled_from(list(FITS)), max_size=5),
    wildcard=st.sampled_from([None, *FITS]),
    strings=st.sampled_from(["keep", "drop", "reject"]),
    mapped=st.booleans(),
    fields=st.dictionaries(kind_name, kind_value, min_size=1),
)
def test_declared_kinds_hold_for_any_value_under_any_generated_rule(
    declared: dict[str, str],
    wildcard: str | None,
    strings: str,
    mapped: bool,
    fields: dict[str, Any],
) -> None:
    """Under a generated json rule with ``[rule.types]`` (names, then maybe ``*``), a
    value map and any ``strings``: a declared measurement is stored only with its kind,
    every other value of it is refused as ``bad_value`` naming it; undeclared ones as
    without the table."""
    by_kind: dict[str, list[str]] = {}
    for name, declared_kind in declared.items():
        by_kind.setdefault(declared_kind, []).append(name)
    if wildcard is not None:
        by_kind.setdefault(wildcard, []).append("*")
    table = "".join(f"{kind} = {json.dumps(names)}\n" for kind, names in by_kind.items())
    values = "[rule.values]\nON = true\nOFF = 0\n" if mapped else ""
    rule = (
        f'[[rule]]\nname = "gen"\ntopic = "k/{{sensor_id}}"\nstrings = "{strings}"\n'
        f"max_string_bytes = 32\n{values}" + (f"[rule.types]\n{table}" if table else "")
    )
    mapping = Mapping(parse(rule, "gen"))
    result = mapping.decode("k/dev", dumps(fields), NOW, LIMITS)
    stored = result.decoded.readings[0].values if result.decoded.readings else {}
    refused = {r.detail.split(":")[0] for r in result.decoded.rejections if r.reason == "bad_value"}
    kinds = [(n, k) for k, names in by_kind.items() for n in names]
    for name, value in fields.items():
        kind = next((k for glob, k in kinds if glob in {name, "*"}), None)
        if kind is None:
            continue
        given: object = (
            {"ON": True, "OFF": 0}.get(value, value) if (mapped and type(value) is str) else value
        )
        if type(given) not in FITS[kind]:
            assert name not in stored
            assert name in refused, (name, given, kind, result.decoded.rejections)
        elif kind == "string" and strings == "drop":  # as an undeclared string
            assert name not in stored
            assert name not in refused
        elif (
            kind == "string"
            and isinstance(given, str)
            and (strings == "reject" or len(given.encode()) > 32)
        ) or (kind == "number" and isinstance(given, int | float) and abs(given) > 1e300):
            assert name not in stored
            assert name in refused
        else:  # an integer beyond 64 bits is stored as a double
            big = type(given) is int and not -(2**63) <= given < 2**63
            assert stored[name] == (float(given) if type(given) is int and big else given)
            assert type(stored[name]) in FITS[kind]
