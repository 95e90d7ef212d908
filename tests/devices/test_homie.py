"""The homie format and preset, without network: messages as the Homie convention shows
them (4.0.0 and 5.0 examples copied from github.com/homieiot/convention), through the
real mapping engine; the subscriptions a daemon makes of the preset."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.config import Settings, validate
from ingest.devices.decode import Limits
from ingest.devices.formats import homie as hm
from ingest.devices.mapping import Mapping
from ingest.devices.rules import parse
from ingest.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

LIMITS = Limits()
NOW = 1_795_000_000.0
# Homie 4.0.0, "Devices" to "Property command topic": the super-car, in publishing order.
SUPER_CAR_V4 = [
    ("homie/super-car/$homie", "4.0.0"),
    ("homie/super-car/$name", "Super car"),
    ("homie/super-car/$nodes", "wheels,engine,lights"),
    ("homie/super-car/$implementation", "esp8266"),
    ("homie/super-car/engine/$name", "Car engine"),
    ("homie/super-car/engine/$type", "V8"),
    ("homie/super-car/engine/$properties", "speed,direction,temperature"),
    ("homie/super-car/engine/temperature/$name", "Engine temperature"),
    ("homie/super-car/engine/temperature/$settable", "false"),
    ("homie/super-car/engine/temperature/$unit", "°C"),
    ("homie/super-car/engine/temperature/$datatype", "float"),
    ("homie/super-car/engine/temperature/$format", "-20:120"),
    ("homie/super-car/$state", "ready"),
]
# Homie 5.0, "Device Attributes" and "Property Attributes": the description document.
SUPER_CAR_V5 = {
    "homie": "5.0",
    "name": "Supercar",
    "version": 7,
    "nodes": {
        "engine": {
            "name": "Car engine",
            "properties": {
                "temperature": {
                    "name": "Engine temperature",
                    "unit": "°C",
                    "datatype": "float",
                    "format": "-20:120",
                }
            },
        }
    },
}


def run(mapping: Mapping, messages: Sequence[tuple[str, str | bytes]]) -> list[Any]:
    """Each message's mapping Result, in order."""
    return [
        mapping.decode(
            topic, payload.encode() if isinstance(payload, str) else payload, NOW, LIMITS
        )
        for topic, payload in messages
    ]


def stored(result: Any) -> list[tuple[str, dict[str, Any], dict[str, str] | None]]:
    return [(r.sensor_id, r.values, r.units) for r in result.decoded.readings]


def reasons(result: Any) -> list[str]:
    return [r.reason for r in result.decoded.rejections]


def declare(
    device: str, props: dict[str, tuple[str, str | None, str | None]]
) -> list[tuple[str, str]]:
    """Homie 4 attribute messages: "node/prop" -> (datatype, unit, format)."""
    out = []
    for path, (datatype, unit, form) in props.items():
        out.append((f"homie/{device}/{path}/$datatype", datatype))
        if unit is not None:
            out.append((f"homie/{device}/{path}/$unit", unit))
        if form is not None:
            out.append((f"homie/{device}/{path}/$format", form))
    return out


def test_a_homie_4_device_as_the_convention_shows_it() -> None:
    mapping = Mapping.load(None, ["homie"])
    described = run(mapping, SUPER_CAR_V4)
    # attributes are never readings: the used ones taken as state, the rest ignored
    assert [(r.ignored, r.decoded) for r in described] == [
        (not topic.endswith(("$unit", "$datatype", "$format")), ([], []))
        for topic, _ in SUPER_CAR_V4
    ]
    [value] = run(mapping, [("homie/super-car/engine/temperature", "21.5")])
    assert stored(value) == [
        ("super-car", {"engine_temperature": 21.5}, {"engine_temperature": "°C"})
    ]
    assert value.decoded.readings[0].tags == {}
    # a controller's command and a broadcast: ignored by the rule, never readings
    commands = run(
        mapping,
        [
            ("homie/kitchen-light/light/power/set", "true"),
            ("homie/$broadcast/alert", "Intruder detected"),
        ],
    )
    assert [r.ignored for r in commands] == [True, True]


def test_a_homie_5_device_as_the_convention_shows_it() -> None:
    mapping = Mapping.load(None, ["homie"])
    results = run(
        mapping,
        [
            ("homie/5/super-car/$state", "init"),
            ("homie/5/super-car/$description", json.dumps(SUPER_CAR_V5)),
            ("homie/5/super-car/$state", "ready"),
            ("homie/5/super-car/engine/temperature", "21.5"),
            ("homie/5/super-car/engine/temperature/$target", "22"),
            ("homie/5/super-car/engine/temperature/set", "22"),
            ("homie/5/mydevid/$alert/battery", "Battery is low, at 8%"),
            ("homie/5/my-device/$log/warn", "battery low"),
            ("homie/5/$broadcast/security/alert", "Intruder detected"),
        ],
    )
    assert [r.ignored for r in results] == [True, False, True, False, True, True, True, True, True]
    assert results[1].decoded == ([], [])
    assert stored(results[3]) == [
        ("super-car", {"engine_temperature": 21.5}, {"engine_temperature": "°C"})
    ]


@pytest.mark.parametrize(
    ("datatype", "form", "payload", "value"),
    [
        ("integer", None, "-42", -42),
        ("integer", None, "9223372036854775807", 2**63 - 1),
        ("float", None, "21.5", 21.5),
        ("float", None, "21", 21.0),  # a float property's values are all doubles
        ("float", None, "-1.5e3", -1500.0),
        ("boolean", None, "true", True),
        ("boolean", None, "false", False),
        ("string", None, "0012", "0012"),  # text stays text, even when it looks like a number
        ("string", None, "\0", ""),  # Homie 5's empty string
        ("enum", "car,bike", "car", "car"),
        ("enum", None, "anything", "anything"),
        ("color", "rgb", "255,255,0", "255,255,0"),  # Homie 4
        ("color", "rgb,hsv", "rgb,100,100,100", "rgb,100,100,100"),  # Homie 5
        ("color", "hsv", "hsv,300,50,75", "hsv,300,50,75"),
        ("color", "xyz", "xyz,0.25,0.34", "xyz,0.25,0.34"),
        ("datetime", None, "2024-10-17T12:00:00Z", "2024-10-17T12:00:00Z"),
        ("duration", None, "PT12H5M46S", "PT12H5M46S"),
        ("duration", None, "PT5M", "PT5M"),
        ("json", None, '{"a": [1, 2]}', '{"a": [1, 2]}'),
    ],
)
def test_values_are_typed_by_their_datatype(
    datatype: str, form: str | None, payload: str, value: object
) -> None:
    mapping = Mapping.load(None, ["homie"])
    run(mapping, declare("d", {"n/p": (datatype, None, form)}))
    [result] = run(mapping, [("homie/d/n/p", payload)])
    assert stored(result) == [("d", {"n_p": value}, None)]
    assert type(result.decoded.readings[0].values["n_p"]) is type(value)


@pytest.mark.parametrize(
    ("datatype", "form", "payload"),
    [
        ("integer", None, "21.5"),
        ("integer", None, "1 "),
        ("integer", None, "-"),
        ("integer", None, "9223372036854775808"),
        ("integer", None, ""),
        ("float", None, "NaN"),
        ("float", None, "Infinity"),
        ("float", None, "1e999"),
        ("float", None, "0x10"),
        ("float", None, "21,5"),
        ("boolean", None, "TRUE"),
        ("boolean", None, "1"),
        ("enum", "car,bike", "Car"),
        ("color", "rgb", "red"),
        ("datetime", None, "yesterday"),
        ("duration", None, "5 minutes"),
        ("duration", None, "P"),
        ("json", None, "42"),
        ("json", None, "{"),
    ],
)
def test_a_payload_its_datatype_does_not_allow_is_bad_value(
    datatype: str, form: str | None, payload: str
) -> None:
    mapping = Mapping.load(None, ["homie"])
    run(mapping, declare("d", {"n/p": (datatype, None, form)}))
    [result] = run(mapping, [("homie/d/n/p", payload.encode() or b"\0")])
    assert reasons(result) == ["bad_value"]
    assert result.decoded.readings == []


def test_values_before_their_datatype_are_refused_not_guessed() -> None:
    mapping = Mapping.load(None, ["homie"])
    early = run(mapping, [("homie/d/n/p", "21.5"), ("homie/5/e/n/p", "21.5")])
    assert [reasons(r) for r in early] == [["no_datatype"], ["no_datatype"]]
    assert "no $datatype of homie/d/n/p seen" in early[0].decoded.rejections[0].detail
    assert "no $description of 'homie/5/e' declares n/p" in early[1].decoded.rejections[0].detail
    # a unit alone does not type a value
    [unit, value] = run(mapping, [("homie/d/n/p/$unit", "°C"), ("homie/d/n/p", "21.5")])
    assert unit.decoded == ([], [])
    assert reasons(value) == ["no_datatype"]


def test_attributes_change_cleared_and_refused() -> None:
    mapping = Mapping.load(None, ["homie"])
    results = run(
        mapping,
        [
            *declare("d", {"n/p": ("integer", "W", None)}),
            ("homie/d/n/p", "5"),
            ("homie/d/n/p/$datatype", "float"),  # reconfigured
            ("homie/d/n/p/$unit", ""),  # no unit any more
            ("homie/d/n/p", "5"),
            ("homie/d/n/p", b""),  # a retained value cleared: nothing to store, no rejection
            ("homie/d/n/p/$datatype", "number"),  # not a Homie datatype
            ("homie/d/n/p", "5"),
            ("homie/d/n/p/$unit", b"\xff"),
        ],
    )
    assert stored(results[2]) == [("d", {"n_p": 5}, {"n_p": "W"})]
    assert stored(results[5]) == [("d", {"n_p": 5.0}, None)]
    assert results[6].decoded == ([], [])
    assert reasons(results[7]) == ["bad_value"]
    assert "'number' is not a Homie datatype" in results[7].decoded.rejections[0].detail
    assert reasons(results[8]) == ["no_datatype"]
    assert reasons(results[9]) == ["invalid_utf8"]


def test_a_homie_5_description_replaces_the_devices_properties() -> None:
    mapping = Mapping.load(None, ["homie"])
    topic = "homie/5/car/$description"
    second = {
        "homie": "5.0",
        "version": 8,
        "nodes": {
            "engine": {
                "properties": {
                    "temperature": {"datatype": "integer", "unit": "K"},
                    "bad id!": {"datatype": "float"},
                    "rpm": {"datatype": "number"},
                }
            },
            "lights": {"properties": {"on": {"datatype": "boolean"}}},
            "wheels": [1, 2],
        },
    }
    results = run(
        mapping,
        [
            (topic, json.dumps(SUPER_CAR_V5)),
            ("homie/5/car/engine/temperature", "21.5"),
            (topic, json.dumps(second)),
            ("homie/5/car/engine/temperature", "294"),
            ("homie/5/car/lights/on", "true"),
            ("homie/5/car/engine/rpm", "3000"),
            (topic, b""),  # the device removed
            ("homie/5/car/lights/on", "true"),
            (topic, "{not json"),
            (topic, "[]"),
        ],
    )
    assert stored(results[1]) == [
        ("car", {"engine_temperature": 21.5}, {"engine_temperature": "°C"})
    ]
    # the new description's problems are counted; what it declares well is used
    assert reasons(results[2]) == ["bad_value", "bad_value", "bad_value"]
    assert stored(results[3]) == [("car", {"engine_temperature": 294}, {"engine_temperature": "K"})]
    assert stored(results[4]) == [("car", {"lights_on": True}, None)]
    assert reasons(results[5]) == ["no_datatype"]
    assert results[6].decoded == ([], [])
    assert reasons(results[7]) == ["no_datatype"]
    assert reasons(results[8]) == ["invalid_json"]
    assert reasons(results[9]) == ["bad_shape"]


@pytest.mark.parametrize(
    "topic",
    [
        "homie/d",
        "homie/d/n",
        "homie/d.1/n/p",
        "homie/d/n p/x",
        "homie/d/n/p/x",
        "homie/d/n/p/x/y",
        "homie/5/d",
        "homie/5/d/n",
        "homie/5/d/n/p/x",
        "homie/d/n/",
        "homie/d/_n/p",
        "homie/d/n_/p",
        "homie/d/n/_p",
        "homie/5/d/n/p_",
    ],
)
def test_topics_that_are_not_homie_are_bad_topic(topic: str) -> None:
    [result] = run(Mapping.load(None, ["homie"]), [(topic, "1")])
    assert reasons(result) == ["bad_topic"]


# Ids of a few characters, '_' and '-' among them, so that joins meet often.
homie_id = st.text(st.sampled_from("ab_-"), min_size=1, max_size=5)


@given(first=st.tuples(homie_id, homie_id), second=st.tuples(homie_id, homie_id))
def test_two_properties_a_device_may_hold_never_share_a_measurement_name(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    """The topics of two properties either are refused or give two names (one-to-one)."""
    names = []
    for node, prop in (first, second):
        topic = hm.topic_of(f"homie/d/{node}/{prop}")
        if topic.kind == "value":
            assert (topic.node, topic.prop) == (node, prop)
            names.append(((node, prop), hm.measurement_name(node, prop)))
        else:  # only an id starting or ending with '_' is refused
            assert topic.kind == "bad"
            assert any(i.startswith("_") or i.endswith("_") for i in (node, prop))
    if len(names) == 2 and names[0][1] == names[1][1]:
        assert names[0][0] == names[1][0]


def test_node_and_property_ids_holding_an_underscore_keep_their_properties_apart() -> None:
    """Node ``a_b``/property ``c`` (°C) and node ``a``/property ``b_c`` (%): two
    measurements, each with its own unit; ids as the convention has them keep their name."""
    mapping = Mapping.load(None, ["homie"])
    results = run(
        mapping,
        [
            ("homie/d/a_b/c/$datatype", "float"),
            ("homie/d/a_b/c/$unit", "°C"),
            ("homie/d/a/b_c/$datatype", "integer"),
            ("homie/d/a/b_c/$unit", "%"),
            ("homie/d/a-b/c-d/$datatype", "integer"),
            ("homie/d/a_b/c", "21.5"),
            ("homie/d/a/b_c", "40"),
            ("homie/d/a-b/c-d", "1"),
        ],
    )
    got = [(r.values, r.units) for result in results for r in result.decoded.readings]
    assert got == [
        ({"a__b_c": 21.5}, {"a__b_c": "°C"}),
        ({"a_b__c": 40}, {"a_b__c": "%"}),
        ({"a-b_c-d": 1}, None),
    ]


def test_rule_options_apply_to_the_measurement_names_and_values() -> None:
    [rule] = parse(
        '[[rule]]\nname = "h"\ntopic = "home/#"\nformat = "homie"\n'
        'drop = ["*_signal"]\n[rule.values]\nopen = 1\nclosed = 0\n',
        "test",
    )
    mapping = Mapping([rule])
    run(
        mapping,
        [
            ("home/d/door/state/$datatype", "enum"),
            ("home/d/door/state/$format", "open,closed"),
            ("home/d/radio/signal/$datatype", "integer"),
        ],
    )
    results = run(
        mapping,
        [
            ("home/d/door/state", "closed"),
            ("home/d/radio/signal", "-70"),
            ("homie/d/door/state", "open"),
        ],
    )
    assert stored(results[0]) == [("d", {"door_state": 0}, None)]
    assert reasons(results[1]) == ["no_measurements"]
    assert results[2].rule is None  # another domain: not this rule's


def test_state_is_bounded() -> None:
    state = hm.HomieFormat(max_devices=3)
    for n in range(5):
        state.parse(f"homie/d{n}/n/p/$datatype", b"integer", LIMITS)
    assert list(state.devices) == ["homie/d2", "homie/d3", "homie/d4"]
    assert state.parse("homie/d0/n/p", b"1", LIMITS).rejections[0].reason == "no_datatype"
    many = {
        "nodes": {
            "n": {
                "properties": {f"p{i}": {"datatype": "float"} for i in range(hm.MAX_PROPERTIES + 1)}
            }
        }
    }
    refused = state.parse("homie/5/big/$description", json.dumps(many).encode(), LIMITS)
    assert [r.reason for r in refused.rejections] == ["too_many_readings"]
    for i in range(hm.MAX_PROPERTIES + 1):
        last = state.parse(f"homie/wide/n/p{i}/$datatype", b"float", LIMITS)
    assert [r.reason for r in last.rejections] == ["too_many_readings"]
    assert len(state.devices["homie/wide"].props) == hm.MAX_PROPERTIES


def test_state_is_bounded_by_the_properties_held() -> None:
    state = hm.HomieFormat(max_properties=5)
    for n in range(4):
        for p in ("a", "b"):
            state.parse(f"homie/d{n}/n/{p}/$datatype", b"integer", LIMITS)
            assert state.properties_held <= 5
    assert list(state.devices) == ["homie/d2", "homie/d3"]
    assert state.properties_held == 4
    state.parse("homie/d3/n/a/$datatype", b"", LIMITS)  # cleared
    assert state.properties_held == 3
    for p in ("a", "c", "d"):  # the last one is the 6th: d2 goes
        state.parse(f"homie/d3/n/{p}/$datatype", b"float", LIMITS)
    assert (list(state.devices), state.properties_held) == (["homie/d3"], 4)
    state.forget_all()
    assert (list(state.devices), state.properties_held) == ([], 0)


def test_the_daemon_subscribes_to_the_attributes_first_and_nothing_it_does_not_use() -> None:
    preset = Mapping.load(None, ["homie"])
    topics = preset.subscriptions()
    assert topics == ("homie/#",)
    attributes = ("homie/+/+/+/$datatype", "homie/+/+/+/$unit", "homie/+/+/+/$format")
    # alone: homie/+/+/+ also brings Homie 5's $description, before any Homie 5 value
    assert Settings(topics=topics, mapping=preset).subscriptions == (
        *attributes,
        "homie/+/+/+",
        "homie/5/+/+/+",
    )
    # shared: every attribute to every daemon, each value to one
    shared = Settings(topics=topics, mapping=preset, shared_group="g")
    assert shared.subscriptions == (
        *attributes,
        "homie/5/+/$description",
        "$share/g/homie/+/+/+",
        "$share/g/homie/5/+/+/+",
    )
    # a switch between one worker and several unsubscribes the other form
    alone = Settings(topics=topics, mapping=preset, client_id="c")
    assert alone.other_subscriptions == ("$share/c/homie/+/+/+", "$share/c/homie/5/+/+/+")
    assert shared.other_subscriptions == ("homie/+/+/+", "homie/5/+/+/+", "homie/#")
    assert preset.shared_subscriptions(["homie/5/#"], "g") == (
        "homie/5/+/$description",
        "$share/g/homie/5/+/+/+",
    )
    assert preset.shared_subscriptions(["homie/car/#"], None) == (
        "homie/car/+/+/$datatype",
        "homie/car/+/+/$unit",
        "homie/car/+/+/$format",
        "homie/car/+/+",
    )


def test_a_filter_a_homie_rule_does_not_own_is_kept_whole() -> None:
    rules = parse(
        '[[rule]]\nname = "special"\ntopic = "homie/special/#"\nsensor_id = "special"\n', "mine"
    )
    mapping = Mapping([*rules, *Mapping.load(None, ["homie", "tasmota"]).rules])
    topics = mapping.subscriptions()
    # an earlier rule takes some of homie/#: subscribing only the Homie pieces would lose it
    assert "homie/#" in Settings(topics=topics, mapping=mapping).subscriptions
    with pytest.raises(
        ConfigError,
        match=r"--shared-group: topic filter 'homie/#' also "
        "takes Homie attribute topics of rule 'homie'",
    ):
        validate(Settings(topics=topics, mapping=mapping, shared_group="g"))
    with pytest.raises(ConfigError, match=r"--workers: several workers share a group; "):
        validate(Settings(topics=topics, mapping=mapping, workers=2))
    # other filters are shared as they are
    homie_only = Mapping.load(None, ["homie", "tasmota"])
    assert "$share/g/tele/+/SENSOR" in homie_only.shared_subscriptions(
        homie_only.subscriptions(), "g"
    )


def test_a_wider_filter_is_kept_whole_after_the_attribute_topics_subscribed_apart() -> None:
    # ESPHome's filters start with a wildcard level: joined with homie/# they make +/#.
    for presets in (["homie", "esphome"], ["esphome", "homie"], ["homie", "shelly"]):
        mapping = Mapping.load(None, presets)
        assert mapping.subscriptions() == ("+/#",)
        attributes = (
            "homie/+/+/+/$datatype",
            "homie/+/+/+/$unit",
            "homie/+/+/+/$format",
            "homie/5/+/$description",
        )
        assert mapping.shared_subscriptions(["+/#"], None) == (*attributes, "+/#")
        assert mapping.shared_subscriptions(["+/#"], "g") == (*attributes, "$share/g/+/#")
    homie = Mapping.load(None, ["homie"])
    assert homie.shared_subscriptions(["#"], "g") == (*attributes, "$share/g/#")
    # only the topics of the rule's own filter
    [rule] = parse('[[rule]]\nname = "h5"\ntopic = "homie/5/#"\nformat = "homie"\n', "test")
    assert Mapping([rule]).shared_subscriptions(["#"], "g") == (
        "homie/5/+/$description",
        "$share/g/#",
    )


def test_a_custom_domain_and_a_wildcard_domain() -> None:
    [rule] = parse('[[rule]]\nname = "any"\ntopic = "{domain}/#"\nformat = "homie"\n', "test")
    mapping = Mapping([rule])
    assert mapping.shared_subscriptions(mapping.subscriptions(), "g") == (
        "+/+/+/+/$datatype",
        "+/+/+/+/$unit",
        "+/+/+/+/$format",
        "+/5/+/$description",
        "$share/g/+/+/+/+",
        "$share/g/+/5/+/+/+",
    )
    run(mapping, [("myhome/d/n/p/$datatype", "integer")])
    [result] = run(mapping, [("myhome/d/n/p", "7")])
    assert stored(result) == [("d", {"n_p": 7}, None)]
    assert result.decoded.readings[0].tags == {"domain": "myhome"}


def test_discover_proposes_the_preset_for_a_homie_fleet_captured_on_hash() -> None:
    from ingest.devices.discover.command import finish  # noqa: PLC0415
    from ingest.devices.discover.patterns import Captured  # noqa: PLC0415

    # What subscribing to # brings first: the retained messages, each topic before its
    # children (a value before its attributes); then live values.
    retained = [
        ("homie/thermo/$name", "Thermostat"),
        ("homie/thermo/$state", "ready"),
        ("homie/thermo/$nodes", "climate"),
        ("homie/thermo/climate/$properties", "temp,hum"),
        ("homie/thermo/climate/temp", "21.5"),
        ("homie/thermo/climate/temp/$name", "Temp"),
        ("homie/thermo/climate/temp/$datatype", "float"),
        ("homie/thermo/climate/temp/$unit", "°C"),
        ("homie/thermo/climate/hum", "40"),
        ("homie/thermo/climate/hum/$datatype", "integer"),
        ("homie/thermo/climate/hum/$unit", "%"),
        ("homie/thermo/climate/hum/$settable", "false"),
    ]
    live = [
        ("homie/thermo/climate/temp", "21.6"),
        ("homie/thermo/climate/hum", "41"),
        ("homie/thermo/climate/temp/set", "22"),
    ]
    captured = [Captured(t, p.encode(), retained=True) for t, p in retained]
    captured += [Captured(t, p.encode()) for t, p in live]
    out, err = io.StringIO(), io.StringIO()
    assert finish(captured, [], [], out, err, NOW) == 0
    assert "use --preset homie" in out.getvalue()
    assert "[[rule]]" not in out.getvalue()  # nothing left to propose
    report = err.getvalue()
    assert "2 Homie value(s) came before their property's attributes" in report


@pytest.mark.process
def test_check_shows_a_value_after_its_attributes() -> None:
    from tests.devices.test_mapping_cli import ingest  # noqa: PLC0415

    done = ingest(
        "check",
        "--preset",
        "homie",
        "--earlier",
        "homie/car/engine/temperature/$datatype",
        "float",
        "--earlier",
        "homie/car/engine/temperature/$unit",
        "°C",
        "--topic-name",
        "homie/car/engine/temperature",
        "21.5",
    )
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert (line["sensor_id"], line["values"], line["units"]) == (
        "car",
        {"engine_temperature": 21.5},
        {"engine_temperature": "°C"},
    )
    done = ingest(
        "check", "--preset", "homie", "--topic-name", "homie/car/engine/temperature/$unit", "°C"
    )
    assert done.returncode == 0
    assert done.stdout == b"no reading: rule homie takes the message as state\n"
