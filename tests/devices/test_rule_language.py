"""The rule language for one value per topic and for messages that share a topic.

A json rule's measurement named from the topic (``measurement = "{property}"``), a last
capture of several levels (``{property#}``), ``[rule.rename]`` templates and payload
selection (``[rule.match]``), on the message shapes of Victron Venus OS, OwnTracks and
Meshtastic (docs/mapping.md); their refusals are one line.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest

from ingest.devices.check import check
from ingest.devices.decode import Limits
from ingest.devices.discover import language
from ingest.devices.mapping import Mapping, Result
from ingest.devices.rules import parse
from ingest.errors import ConfigError

LIMITS = Limits()
PORTAL = "c0619ab1a2b3"
RULES = f"""
[[rule]]
name = "victron-mirrors"
topic = "R/#"
ignore = true

[[rule]]
name = "victron"
topic = "N/{PORTAL}/{{service}}/{{instance}}/{{property#}}"
sensor_id = "{{service}}-{{instance}}"
measurement = "{{property}}"
[rule.time]
field = "time"
[rule.units]
Dc_0_Voltage = "V"
Dc_0_Current = "{{unit}}"

[[rule]]
name = "owntracks-lwt"
topic = "owntracks/{{user}}/{{device}}"
ignore = true
[rule.match]
"_type" = "lwt"

[[rule]]
name = "owntracks"
topic = "owntracks/{{user}}/{{device}}"
sensor_id = "{{user}}-{{device}}"
keep = ["lat", "lon", "acc", "batt"]
[rule.time]
field = "tst"
[rule.match]
"_type" = "location"

[[rule]]
name = "mesh-chores"
topic = "msh/{{region}}/2/json/{{channel}}/{{gateway}}"
ignore = true
[rule.match]
type = ["nodeinfo", "text"]

[[rule]]
name = "mesh"
topic = "msh/{{region}}/2/json/{{channel}}/{{gateway}}"
sensor_id = "{{from}}"
root = "payload"
info = ["gateway"]
[rule.time]
field = "timestamp"
[rule.match]
type = ["position", "telemetry"]

[[rule]]
name = "plain"
topic = "plain/{{sensor_id}}/{{property}}"
[rule.rename]
value = "{{property}}"
"""


def mapping(text: str = RULES) -> Mapping:
    return Mapping(parse(text, "test"))


def decode(m: Mapping, topic: str, payload: bytes) -> Result:
    return m.decode(topic, payload, time.time(), LIMITS)


def values(result: Result) -> list[dict[str, int | float | bool | str]]:
    return [r.values for r in result.decoded.readings]


def test_a_json_measurement_is_named_by_the_topic_and_only_the_value_is_stored() -> None:
    m = mapping()
    now = int(time.time() * 1000)
    result = decode(m, f"N/{PORTAL}/battery/512/Dc/0/Voltage", b'{"value": 53.12}')
    (reading,) = result.decoded.readings
    assert (reading.sensor_id, reading.values, reading.units) == (
        "battery-512",
        {"Dc_0_Voltage": 53.12},
        {"Dc_0_Voltage": "V"},
    )
    assert reading.tags == {}  # service, instance, property name the reading, not tags
    timed = decode(
        m,
        f"N/{PORTAL}/battery/512/Dc/0/Current",
        b'{"time": %d, "value": -4.2, "unit": "A", "min": -100}' % now,
    )
    (reading,) = timed.decoded.readings
    assert (reading.values, reading.units, reading.ms) == (
        {"Dc_0_Current": -4.2},
        {"Dc_0_Current": "A"},
        now,
    )
    setting = decode(
        m,
        f"N/{PORTAL}/settings/0/Settings/CGwacs/AcPowerSetPoint",
        b'{"max": 1000000, "min": -1000000, "value": 50}',
    )
    assert values(setting) == [{"Settings_CGwacs_AcPowerSetPoint": 50}]


def test_a_json_measurement_without_its_value_is_a_counted_rejection() -> None:
    m = mapping()
    topic = f"N/{PORTAL}/pvinverter/20/Ac/L2/Power"
    for payload, reason in (
        (b'{"value": null}', "no_measurements"),
        (b'{"max": 3}', "no_measurements"),
        (b"", "invalid_json"),
        (b"21.5", "bad_shape"),
        (b'{"value": {"a": 1}}', "bad_value"),
        (b'{"value": [1, 2]}', "bad_value"),
    ):
        result = decode(m, topic, payload)
        assert not result.decoded.readings, payload
        assert reason in {r.reason for r in result.decoded.rejections}, (payload, result)
    missing = decode(m, topic, b'{"max": 3}').decoded.rejections[0]
    assert missing.detail == "no field 'value' (the rule's value_field)"


def test_value_field_names_another_field_and_arrays_are_several_readings() -> None:
    m = mapping(
        '[[rule]]\nname = "a"\ntopic = "a/{sensor_id}/{m}"\nmeasurement = "{m}"\n'
        'value_field = "data.v"\n'
    )
    result = decode(m, "a/s1/temp", b'[{"data": {"v": 1}}, {"data": {"v": 2}, "value": 9}]')
    assert values(result) == [{"temp": 1}, {"temp": 2}]


def test_a_rest_capture_joins_its_levels_made_safe_and_subscribes_with_hash() -> None:
    m = mapping()
    assert "N/c0619ab1a2b3/+/+/#" in m.subscriptions()
    deep = decode(m, f"N/{PORTAL}/system/0/Ac/Consumption/L1/Power", b'{"value": 512}')
    assert values(deep) == [{"Ac_Consumption_L1_Power": 512}]
    odd = decode(m, f"N/{PORTAL}/system/0/Dc/Bat tery.x/Soc", b'{"value": 1}')
    assert values(odd) == [{"Dc_Bat_tery_x_Soc": 1}]
    assert decode(m, f"N/{PORTAL}/system/0", b'{"value": 1}').rule is None  # one level at least
    plain = mapping(
        '[[rule]]\nname = "dtu"\ntopic = "solar/{sensor_id}/{measurement#}"\nformat = "value"\n'
    )
    assert plain.subscriptions() == ("solar/+/#",)
    assert values(decode(plain, "solar/116/0/power", b"412.5")) == [{"0_power": 412.5}]
    assert values(decode(plain, "solar/116/status/limit", b"100")) == [{"status_limit": 100}]


def test_a_rename_template_names_the_value_by_the_topic() -> None:
    m = mapping()
    now = int(time.time() * 1000)
    result = decode(m, "plain/s1/temperature", b'{"value": 21.5, "time": %d}' % now)
    assert values(result) == [{"temperature": 21.5, "time": now}]  # no [rule.time]: a value
    assert result.decoded.readings[0].tags == {}  # {property} names a value: not a tag
    clash = decode(m, "plain/s1/temperature", b'{"value": 21.5, "temperature": 3}')
    assert values(clash) == [{"temperature": 3}]
    assert [r.reason for r in clash.decoded.rejections] == ["bad_field_name"]
    reserved = decode(m, "plain/s1/ts", b'{"value": 1}')
    assert [r.reason for r in reserved.decoded.rejections] == [
        "bad_field_name",
        "no_measurements",
    ]


def test_match_selects_among_rules_that_share_a_topic() -> None:
    m = mapping()
    topic = "msh/EU_868/2/json/LongFast/!a1b2c3d4"
    now = int(time.time())

    def packet(kind: str, payload: str) -> bytes:
        return (
            b'{"from": 2130636288, "id": 17, "sender": "!a1b2c3d4", "timestamp": %d, '
            b'"type": "%s", "payload": %s}' % (now, kind.encode(), payload.encode())
        )

    telemetry = decode(m, topic, packet("telemetry", '{"voltage": 4.05, "battery_level": 87}'))
    assert telemetry.rule is not None
    assert telemetry.rule.name == "mesh"
    (reading,) = telemetry.decoded.readings
    assert (reading.sensor_id, reading.values, reading.info) == (
        "2130636288",
        {"voltage": 4.05, "battery_level": 87},
        {"gateway": "!a1b2c3d4"},
    )
    for chore in ("nodeinfo", "text"):
        ignored = decode(m, topic, packet(chore, '{"text": "hello mesh"}'))
        assert ignored.ignored
        assert ignored.rule is not None
        assert ignored.rule.name == "mesh-chores"
    for other in (packet("traceroute", "{}"), b"online", b'{"payload": {}}', b"[1]"):
        refused = decode(m, topic, other)
        assert (refused.rule, refused.unselected) == (None, True)
        (rejection,) = refused.decoded.rejections
        assert rejection.reason == "no_rule"
        assert "the payload matched no [rule.match] " in rejection.detail
        assert "(rules mesh-chores, mesh)" in rejection.detail


def test_match_on_owntracks_ignores_the_last_will_on_the_location_topic() -> None:
    m = mapping()
    tst = int(time.time()) - 60
    lwt = decode(m, "owntracks/jane/phone", b'{"_type": "lwt", "tst": %d}' % tst)
    assert lwt.ignored
    assert lwt.rule is not None
    assert lwt.rule.name == "owntracks-lwt"
    location = decode(
        m,
        "owntracks/jane/phone",
        b'{"_type": "location", "tid": "jp", "tst": %d, "lat": 52.5, "lon": 13.4, "acc": 12}' % tst,
    )
    (reading,) = location.decoded.readings
    assert (reading.sensor_id, reading.values, reading.ms) == (
        "jane-phone",
        {"lat": 52.5, "lon": 13.4, "acc": 12},
        tst * 1000,
    )


@pytest.mark.parametrize(
    ("table", "payload", "taken"),
    [
        ('"n" = 1', b'{"n": 1.0}', True),
        ('"n" = 1', b'{"n": true}', False),  # true is never 1
        ('"n" = true', b'{"n": 1}', False),
        ('"n" = true', b'{"n": true}', True),
        ('"n" = "1"', b'{"n": 1}', False),
        ('"n" = [2.5, "x"]', b'{"n": "x"}', True),
        ('"n" = 1\n"k" = "a"', b'{"n": 1}', False),  # every field must match
        ('"n" = 1\n"k" = "a"', b'{"n": 1, "k": "a"}', True),
        ('"a.b" = 1', b'{"a": {"b": 1}}', False),  # a top-level field's name, not a path
        ('"a.b" = 1', b'{"a.b": 1}', True),
    ],
)
def test_match_values_compare_by_kind(table: str, payload: bytes, taken: bool) -> None:
    m = mapping(f'[[rule]]\nname = "r"\ntopic = "t/{{sensor_id}}"\n[rule.match]\n{table}\n')
    result = decode(m, "t/s1", payload)
    assert (result.rule is not None) is taken


def test_the_default_path_is_untouched_without_match() -> None:
    m = mapping('[[rule]]\nname = "z"\ntopic = "z/{sensor_id}"\n')
    assert m._alone == []
    assert m.match("z/s1").after is None  # type: ignore[union-attr]


def test_check_explains_which_rule_takes_a_message_and_which_match_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    m = mapping()
    topic = "msh/EU_868/2/json/LongFast/!a1b2c3d4"
    payload = '{"from": 7, "type": "telemetry", "payload": {"voltage": 4.1}}'
    assert check(m, topic, payload) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "passed over by rule mesh-chores: [rule.match] not met: 'type' is \"telemetry\" "
        '(wanted "nodeinfo" or "text")'
    )
    assert out[1].startswith('{"rule":"mesh","sensor_id":"7"')
    assert check(m, topic, '{"from": 7, "payload": {}}') == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "passed over by rule mesh-chores: [rule.match] not met: no field 'type'",
        "passed over by rule mesh: [rule.match] not met: no field 'type'",
        (
            "rejected: no_rule: topic 'msh/EU_868/2/json/LongFast/!a1b2c3d4': the payload "
            "matched no [rule.match] (rules mesh-chores, mesh)"
        ),
    ]


def test_a_star_unit_is_the_unit_of_every_other_measurement() -> None:
    """``"*" = "{unit}"``: each one-value payload's unit field gives its measurement's
    unit, whatever the topic names; a named key wins; no unit field, no unit. In a value
    rule, a literal ``"*"`` gives every measurement of the rule its unit."""
    m = mapping(
        '[[rule]]\nname = "meters"\ntopic = "lab/{sensor_id}/{property#}"\n'
        'measurement = "{property}"\n[rule.units]\n"*" = "{unit}"\nSoc = "%"\n'
        '[[rule]]\nname = "plain"\ntopic = "solar/{sensor_id}/{measurement}"\n'
        'format = "value"\n[rule.units]\n"*" = "W"\nvoltage = "V"\n'
    )
    units = [
        r.units
        for topic, payload in (
            ("lab/m1/Dc/0/Voltage", b'{"value": 53.1, "unit": "V"}'),
            ("lab/m1/Dc/0/Current", b'{"value": -4.2, "unit": "A"}'),
            ("lab/m1/Soc", b'{"value": 87.5, "unit": "percent"}'),
            ("lab/m1/Temperature", b'{"value": 18.5}'),
            ("solar/inv1/power", b"123.4"),
            ("solar/inv1/voltage", b"229.8"),
        )
        for r in decode(m, topic, payload).decoded.readings
    ]
    assert units == [
        {"Dc_0_Voltage": "V"},
        {"Dc_0_Current": "A"},
        {"Soc": "%"},
        None,
        {"power": "W"},
        {"voltage": "V"},
    ]


def test_discovers_probes_parse() -> None:
    """The snippets ingest/devices/discover/language.py parses to detect support."""
    assert all(language.supports(feature) for feature in language._PROBES)
    parse(
        '[[rule]]\nname = "p"\ntopic = "a/{x}"\nformat = "json"\nsensor_id = "s"\n'
        'measurement = "{x}"\n',
        "probe",
    )
    parse(
        '[[rule]]\nname = "p"\ntopic = "a/{x#}"\nformat = "json"\nsensor_id = "s"\n'
        'measurement = "{x}"\n',
        "probe",
    )
    parse(
        '[[rule]]\nname = "p"\ntopic = "a/b"\nsensor_id = "s"\n[rule.match]\n"_type" = "x"\n'
        '[[rule]]\nname = "q"\ntopic = "a/c"\nignore = true\n[rule.match]\n'
        '"type" = ["x", "y"]\n',
        "probe",
    )


BASE = '[[rule]]\nname = "r"\n'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            'topic = "a/{x}"\nsensor_id = "s"\nmeasurement = "{y}"\n',
            "measurement = '{y}': {y} is not a capture of the topic (known: {x})",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\nmeasurement = "{payload.x}"\n',
            "{payload.x} is not a capture of the topic",
        ),
        (
            'topic = "a/{x#}/b"\nsensor_id = "s"\n',
            "topic 'a/{x#}/b': {x#} (the rest of the topic) must be the last level",
        ),
        ('topic = "a/{x#}/#"\nsensor_id = "s"\n', "must be the last level, not with '#'"),
        ('topic = "a/b{x#}"\nsensor_id = "s"\n', "must fill a whole level"),
        ('topic = "a/{x}/{x#}"\nsensor_id = "s"\n', "capture {x} used twice"),
        (
            'topic = "spBv1.0/{x#}"\nformat = "sparkplug"\n',
            "a {name#} capture does not apply to format sparkplug",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.rename]\nvalue = "{y}"\n',
            "rename.value = '{y}': {y} is not a capture of the topic",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.rename]\nvalue = "{x"\n',
            "rename.value: template '{x': a '{' or '}' that is not a {name} variable",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.match]\n',
            "match must be a table",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.match]\nt = []\n',
            "match.t: a list of 1 to 64 values",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.match]\nt = {a = 1}\n',
            "match.t: \"{'a': 1}\" is not a string, a finite number or true/false",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.match]\nt = nan\n',
            "match.t: 'nan' is not a string, a finite number or true/false",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.match]\nt = 1979-05-27\n',
            "is not a string, a finite number or true/false",
        ),
        (
            'topic = "a/{measurement}"\nformat = "value"\nsensor_id = "s"\n[rule.match]\nt = 1\n',
            (
                "match reads JSON payloads: it applies to the json and ingest formats and to "
                "ignore rules, not to format value"
            ),
        ),
        (
            'topic = "a/#"\nignore = true\nformat = "json"\n',
            "ignore = true takes no other options than [rule.match] (got format)",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\nvalue_field = "v"\n',
            "value_field applies to json rules with a measurement only",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\nmeasurement = "{x}"\nvalue_field = "a..b"\n',
            "value_field must be a payload field or a path of keys",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\nmeasurement = "{x}"\nroot = "a"\n',
            "root does not apply to a json rule with a measurement",
        ),
        (
            'topic = "a/{x}"\nformat = "senml"\nmeasurement = "{x}"\n',
            "measurement applies to the json, value and influx formats only",
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\n[rule.units]\n"Dc_*" = "V"\n',
            'units.Dc_*: a measurement name, or "*" alone for every other measurement (no globs)',
        ),
        (
            'topic = "a/{x}"\nsensor_id = "s"\nmeasurement = "{x}"\n[rule.units]\n"*" = "{x"\n',
            "template '{x': a '{' or '}' that is not a {name} variable",
        ),
        (
            'topic = "a/{x}"\nformat = "senml"\n[rule.units]\n"*" = "V"\n',
            "units applies to the json and value formats",
        ),
    ],
)
def test_bad_rules_are_refused_in_one_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(BASE + text, "--mapping m.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--mapping m.toml: rule 'r': ")
    assert error in message


def test_the_docs_example_prints_what_the_page_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/mapping.md's one-value and [rule.match] example, its ``ingest check`` lines."""
    page = (Path(__file__).parents[2] / "docs" / "mapping.md").read_text()
    section = page.split("## One value per topic and messages that share a topic", 1)[1]
    rules = section.split("```toml\n", 1)[1].split("```", 1)[0]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0]
    m = mapping(rules)
    commands = shell.split("$ ")[1:]
    assert len(commands) == 4
    for command in commands:
        line, *shown = command.strip().split("\n")
        args = shlex.split(line)
        assert args[:4] == ["ingest", "check", "--mapping", "rules.toml"]
        check(m, args[5], args[6], Limits(max_past_seconds=1e10))  # the page's times, any day
        printed = capsys.readouterr().out.strip().split("\n")
        ts = re.compile(r'"ts":"[^"]*"')
        if "tst" not in args[6] and "timestamp" not in args[6]:  # timed at arrival
            shown = [ts.sub('"ts":""', s) for s in shown]
            printed = [ts.sub('"ts":""', s) for s in printed]
        assert printed == shown
