"""Hostile templates, captures and match tables: a one-line error or a rule that holds.

For the json measurement from the topic, ``{name#}`` captures, ``[rule.rename]``
templates, ``[rule.match]`` and ``[rule.units]`` with ``"*"``: any generated rule either
loads or is refused with one :class:`ConfigError` line naming the rule; one that loads
decodes any topic and payload without raising, and what it stores stays within the
bounds of tests/devices/test_mapping_fuzz.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse
from ingest.errors import ConfigError
from tests.devices.test_mapping_fuzz import LIMITS, NOW, SETTINGS, dumps, json_value, levels

# Text made of what templates and filters are made of, and a little of everything else.
pieces = st.sampled_from(
    ["{", "}", "#", "/", "+", ".", "_", "x", "y", "p", "{x}", "{p#}", "{x#}", "{{", "}}", "é", " "]
)
hostile = st.one_of(
    st.lists(pieces, max_size=8).map("".join),
    st.text(st.characters(codec="utf-8"), max_size=20),
)


def toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def toml_value(value: Any) -> str:  # noqa: PLR0911 - one return per TOML kind
    """A value written as TOML (inline tables and arrays; NaN and inf as TOML has them)."""
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is float:
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if type(value) is int:
        return str(value)
    if type(value) is str:
        return toml_string(value)
    if type(value) is list:
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


toml_scalar = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
toml_any = st.recursive(
    toml_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "type"]), inner, max_size=3),
    ),
    max_leaves=10,
)
match_table = st.dictionaries(
    st.one_of(st.sampled_from(["type", "_type", "a.b", ""]), st.text(max_size=8)),
    st.one_of(toml_scalar, st.lists(toml_scalar, max_size=3), toml_any),
    max_size=3,
)
# Templates that load more often than hostile text does.
templates = st.sampled_from(["{x}", "{p}", "{x}_{p}", "m", "{{x}}"])
# [rule.units]: "*" (every other measurement), names, globs (refused), hostile keys; units
# literal, templates over captures and payload fields, or hostile.
units_table = st.dictionaries(
    st.one_of(st.sampled_from(["*", "value", "x", "p_value", "x*", "*x", "**"]), hostile),
    st.one_of(templates, st.sampled_from(["V", "{unit}", "{value}", "°C"]), hostile),
    min_size=1,
    max_size=3,
)


def rule_text(
    topic: str,
    fmt: str,
    measurement: str | None,
    rename: str | None,
    match: dict[str, Any] | None,
    ignore: bool,
    units: dict[str, str] | None = None,
) -> str:
    lines = ["[[rule]]", 'name = "gen"', f"topic = {toml_string(topic)}"]
    if ignore:
        lines.append("ignore = true")
    else:
        lines += [f"format = {toml_string(fmt)}", 'sensor_id = "s"']
        if measurement is not None:
            lines.append(f"measurement = {toml_string(measurement)}")
        if rename is not None:
            lines += ["[rule.rename]", f"value = {toml_string(rename)}"]
        if units is not None:
            lines.append("[rule.units]")
            lines += [f"{toml_string(k)} = {toml_string(v)}" for k, v in units.items()]
    if match is not None:
        lines.append("[rule.match]")
        lines += [f"{toml_string(k)} = {toml_value(v)}" for k, v in match.items()]
    lines += ["[[rule]]", 'name = "rest"', 'topic = "#"', "ignore = true"]
    return "\n".join(lines) + "\n"


@SETTINGS
@given(
    topic=st.one_of(
        st.sampled_from(["a/{x}", "N/{x}/{p#}", "a/{p#}", "{x}/+/{p#}", "a/{x}/#"]),
        st.lists(
            st.one_of(pieces, st.sampled_from(["a", "N", "{p#}", "{x}"])), min_size=1, max_size=5
        ).map("/".join),
        hostile,
    ),
    fmt=st.sampled_from(["json", "json", "json", "value", "ingest", "senml", "influx"]),
    measurement=st.one_of(st.none(), templates, hostile),
    rename=st.one_of(st.none(), templates, hostile),
    match=st.one_of(st.none(), match_table),
    ignore=st.booleans(),
    units=st.one_of(st.none(), units_table),
    parts=st.lists(levels, min_size=1, max_size=5),
    payload=json_value,
)
def test_any_generated_rule_is_refused_in_one_line_or_decodes_anything(
    topic: str,
    fmt: str,
    measurement: str | None,
    rename: str | None,
    match: dict[str, Any] | None,
    ignore: bool,
    units: dict[str, str] | None,
    parts: list[str],
    payload: Any,
) -> None:
    text = rule_text(topic, fmt, measurement, rename, match, ignore, units)
    try:
        rules = parse(text, "--mapping gen.toml")
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        assert message.startswith("--mapping gen.toml: ")
        return
    from tests.devices.test_mapping_fuzz import checked  # noqa: PLC0415 - its MAPPING, patched

    mapping = Mapping(rules)
    subject = topic.replace("{p#}", "/".join(parts)).replace("{x#}", "/".join(parts))
    for candidate in (subject, "/".join(parts), topic):
        result = mapping.decode(candidate, dumps(payload), NOW, LIMITS)
        assert result.rule is None or result.rule.name in {"gen", "rest"}
        mapping_fuzz_checked(checked, mapping, candidate, dumps(payload))


def mapping_fuzz_checked(checked: Any, mapping: Mapping, topic: str, payload: bytes) -> None:
    """test_mapping_fuzz.checked's bounds, under this mapping."""
    import tests.devices.test_mapping_fuzz as fuzz  # noqa: PLC0415

    held = fuzz.MAPPING
    fuzz.MAPPING = mapping
    try:
        checked(topic, payload)
    finally:
        fuzz.MAPPING = held


VICTRON = Mapping(
    parse(
        '[[rule]]\nname = "v"\ntopic = "N/{portal}/{service}/{instance}/{property#}"\n'
        'sensor_id = "{service}-{instance}"\nmeasurement = "{property}"\n'
        '[rule.time]\nfield = "time"\n[rule.units]\nDc_0_Voltage = "{unit}"\n'
        '[[rule]]\nname = "m"\ntopic = "msh/{gw}"\nignore = true\n[rule.match]\n'
        'type = ["nodeinfo", "text"]\n'
        '[[rule]]\nname = "t"\ntopic = "msh/{gw}"\nsensor_id = "{from}"\nroot = "payload"\n'
        '[rule.match]\ntype = ["telemetry", 1, true]\n'
        '[[rule]]\nname = "r"\ntopic = "x/{sensor_id}/{p#}"\n[rule.rename]\nvalue = "{p}"\n',
        "fuzz",
    )
)


@SETTINGS
@given(
    root=st.sampled_from(["N/c0619ab1a2b3", "msh", "x/dev", "N"]),
    parts=st.lists(levels, max_size=7),
    value=json_value,
    extra=st.dictionaries(
        st.sampled_from(["time", "unit", "type", "from", "payload", "value"]),
        json_value,
        max_size=4,
    ),
    whole=st.booleans(),
)
def test_hostile_captures_and_payloads_through_the_new_rules(
    root: str, parts: list[str], value: Any, extra: dict[str, Any], whole: bool
) -> None:
    """Any levels under a {name#} capture, any value, time, unit or type field."""
    from tests.devices.test_mapping_fuzz import checked  # noqa: PLC0415

    payload = {"value": value, **extra} if not whole else value
    mapping_fuzz_checked(checked, VICTRON, "/".join([root, *parts]), dumps(payload))


# Topic lists (``topic = [...]``): entries of filter pieces, hostile text and other kinds.
filter_levels = st.sampled_from(["a", "b", "+", "{x}", "{p}", "#", "{p#}", "$sys", ""])
filters = st.lists(filter_levels, min_size=1, max_size=4).map("/".join)
topic_lists = st.one_of(
    st.lists(st.one_of(filters, filters, hostile), max_size=5),
    st.lists(st.one_of(filters, toml_scalar, st.lists(filters, max_size=2)), max_size=4),
)


def list_rule_text(topics: list[Any], fmt: str) -> str:
    lines = ["[[rule]]", 'name = "gen"', f"topic = {toml_value(topics)}"]
    if fmt == "ignore":
        lines.append("ignore = true")
    else:
        lines += [f"format = {toml_string(fmt)}", 'sensor_id = "s"']
        if fmt == "value":
            lines.append('measurement = "m"')
    return "\n".join([*lines, "[[rule]]", 'name = "rest"', 'topic = "#"', "ignore = true"]) + "\n"


@SETTINGS
@given(
    topics=topic_lists,
    fmt=st.sampled_from(["ignore", "json", "value", "ingest", "sparkplug", "homie"]),
    parts=st.lists(st.sampled_from(["a", "b", "c", "$sys", "", "x/y"]), min_size=1, max_size=5),
    payload=json_value,
)
def test_any_topic_list_is_refused_in_one_line_or_takes_exactly_its_filters_topics(
    topics: list[Any], fmt: str, parts: list[str], payload: Any
) -> None:
    """A list rule either loads or is refused in one line naming the rule; one that loads
    takes a topic exactly when one of its subscribed filters matches it (as MQTT matches),
    before the catch-all rule after it, and decodes any payload without raising."""
    try:
        rules = parse(list_rule_text(topics, fmt), "--mapping gen.toml")
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        assert message.startswith(
            ("--mapping gen.toml: rule 'gen': ", "--mapping gen.toml: not valid TOML")
        )
        return
    from tests.devices.test_mapping_fuzz import checked  # noqa: PLC0415

    gen = rules[0]
    assert gen.topics == tuple(topics)
    if fmt in {"sparkplug", "homie"}:
        assert len(topics) == 1  # their own topic trees: one filter
        return
    assert len(set(gen.subscriptions)) == len(topics)
    mapping = Mapping(rules)
    topic = "/".join(parts)
    matched = mapping.match(topic)
    by_mqtt = any(
        _mqtt_takes(sub, topic)
        and not (t.endswith("#}") and sub.count("/") == topic.count("/") + 1)
        for t, sub in zip(gen.topics, gen.subscriptions, strict=True)
    )
    taken = matched is not None and matched.rule.name == "gen"
    assert taken == by_mqtt, (gen.topics, topic)
    if matched is None:  # the catch-all '#' takes every topic but those starting with $
        assert topic.startswith("$")
    mapping_fuzz_checked(checked, mapping, topic, dumps(payload))


def _mqtt_takes(sub: str, topic: str) -> bool:
    from paho.mqtt.client import topic_matches_sub  # noqa: PLC0415

    return bool(topic_matches_sub(sub, topic))
