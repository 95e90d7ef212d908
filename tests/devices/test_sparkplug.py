"""Sparkplug B format and state rules, without network.

Payloads come from ``loadgen.sparkplug``, an encoder written from the protobuf wire
format, not from the decoder's schema.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.config import Settings, validate
from ingest.devices.decode import Limits
from ingest.devices.formats import sparkplug as spb
from ingest.devices.mapping import Mapping
from ingest.errors import ConfigError
from loadgen import sparkplug as enc
from loadgen.sparkplug import Metric

T0 = 1_795_000_000_123
LIMITS = Limits()


def birth(
    state: spb.SparkplugFormat,
    metrics: list[Metric],
    bd_seq: int = 0,
    seq: int = 0,
    node: str = "E1",
    group: str = "G1",
):
    return state.parse(
        enc.topic(group, "NBIRTH", node), enc.nbirth(metrics, bd_seq, T0, seq), LIMITS
    )


def ndata(
    state: spb.SparkplugFormat, metrics: list[Metric], seq: int, node: str = "E1", group: str = "G1"
):
    return state.parse(enc.topic(group, "NDATA", node), enc.payload(metrics, T0 + 1, seq), LIMITS)


def reasons(parsed) -> list[str]:
    return [r.reason for r in parsed.rejections]


TEMP = Metric("Inputs/Temp", 1, T0, enc.DOUBLE, 21.5, properties={"engUnit": "°C"})
RUN = Metric("Outputs/Running", 2, T0, enc.BOOLEAN, value=True)


def test_birth_then_data_by_alias():
    state = spb.SparkplugFormat()
    born = birth(state, [TEMP, RUN])
    assert born.rejections == []
    [item] = born.items
    # bdSeq and Node Control/Rebirth are the protocol's, not measurements
    assert item.fields == {"Inputs/Temp": 21.5, "Outputs/Running": True}
    assert item.ts == T0
    assert item.sensor == "G1/E1"
    assert item.tags is None  # the rule's topic captures are the tags
    assert item.units == {"Inputs/Temp": "°C"}
    parsed = ndata(
        state,
        [
            Metric(
                alias=1,
                timestamp=T0 + 500,
                value=None,
                datatype=None,
                raw_value=enc.tag(13, 1) + struct.pack("<d", 22.25),
            ),
            Metric(alias=2, timestamp=T0 + 500, raw_value=enc.uint(14, 0)),
        ],
        seq=1,
    )
    assert parsed.rejections == []
    [item] = parsed.items
    assert item.fields == {"Inputs/Temp": 22.25, "Outputs/Running": False}
    assert item.ts == T0 + 500
    assert state.counts.seq_gaps == 0
    assert state.counts.messages["NBIRTH"] == 1
    assert state.counts.messages["NDATA"] == 1


@pytest.mark.parametrize(
    ("datatype", "value", "expected"),
    [
        (enc.INT8, -5, -5),
        (enc.INT16, -300, -300),
        (enc.INT32, -1, -1),
        (enc.INT64, -(2**40), -(2**40)),
        (enc.UINT8, 200, 200),
        (enc.UINT32, 2**32 - 1, 2**32 - 1),
        (enc.UINT64, 2**64 - 1, float(2**64 - 1)),
        (enc.FLOAT, 1.5, 1.5),
        (enc.DOUBLE, -0.1, -0.1),
        (enc.BOOLEAN, True, True),
        (enc.STRING, "on", "on"),
        (enc.TEXT, "x y", "x y"),
        (enc.UUID, "4b5c", "4b5c"),
        (enc.DATETIME, T0, T0),
    ],
)
def test_datatypes(datatype, value, expected):
    state = spb.SparkplugFormat()
    parsed = birth(state, [Metric("m", 5, T0, datatype, value)])
    assert parsed.rejections == []
    assert parsed.items[0].fields == {"m": expected}
    assert type(parsed.items[0].fields["m"]) is type(expected)


def test_data_without_birth_is_not_guessed():
    state = spb.SparkplugFormat()
    parsed = ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 1)
    assert parsed.items == []
    assert reasons(parsed) == ["no_birth"]


def test_unknown_alias_rejected_rest_stored():
    state = spb.SparkplugFormat()
    birth(state, [TEMP])
    parsed = ndata(
        state,
        [
            Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=3.0),
            Metric(alias=9, timestamp=T0, datatype=enc.DOUBLE, value=4.0),
        ],
        1,
    )
    assert [i.fields for i in parsed.items] == [{"Inputs/Temp": 3.0}]
    assert reasons(parsed) == ["unknown_alias"]
    assert parsed.rejections[0].index == 1
    assert "alias 9" in parsed.rejections[0].detail


def test_rebirth_replaces_aliases_and_forgets_devices():
    state = spb.SparkplugFormat()
    birth(state, [TEMP, RUN])
    state.parse(
        enc.topic("G1", "DBIRTH", "E1", "D1"),
        enc.payload([Metric("p", 7, T0, enc.INT32, 1)], T0, 1),
        LIMITS,
    )
    # Rebirth: alias 1 is now another metric.
    birth(state, [Metric("Speed", 1, T0, enc.FLOAT, 2.0)], seq=0)
    parsed = ndata(
        state,
        [
            Metric(alias=1, timestamp=T0, datatype=enc.FLOAT, value=3.0),
            Metric(alias=2, timestamp=T0, datatype=enc.BOOLEAN, value=True),
        ],
        1,
    )
    assert [i.fields for i in parsed.items] == [{"Speed": 3.0}]
    assert reasons(parsed) == ["unknown_alias"]
    device = state.parse(
        enc.topic("G1", "DDATA", "E1", "D1"),
        enc.payload([Metric(alias=7, timestamp=T0, datatype=enc.INT32, value=2)], T0, 2),
        LIMITS,
    )
    assert reasons(device) == ["no_birth"]


def test_sequence_wraps_at_255_and_gaps_are_counted():
    state = spb.SparkplugFormat()
    birth(state, [TEMP], seq=253)
    for seq in (254, 255, 0, 1):
        ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], seq)
    assert state.counts.seq_gaps == 0
    ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 5)
    assert state.counts.seq_gaps == 1
    parsed = ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 300)
    assert state.counts.seq_gaps == 2
    assert parsed.items  # a bad seq is counted, the data still stored


def test_deaths_close_tables_and_stale_deaths_are_ignored():
    state = spb.SparkplugFormat()
    birth(state, [TEMP], bd_seq=4)
    stale = state.parse(enc.topic("G1", "NDEATH", "E1"), enc.ndeath(3), LIMITS)
    assert stale.items == []
    assert stale.rejections == []
    assert state.counts.stale_deaths == 1
    assert ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 1).items
    state.parse(enc.topic("G1", "NDEATH", "E1"), enc.ndeath(4), LIMITS)
    assert state.counts.messages["NDEATH"] == 2
    parsed = ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 2)
    assert reasons(parsed) == ["no_birth"]
    assert "DEATH" in parsed.rejections[0].detail
    state.parse(
        enc.topic("G1", "DBIRTH", "E2", "D"),
        enc.payload([Metric("x", 1, T0, enc.INT8, 1)], T0, 0),
        LIMITS,
    )
    state.parse(enc.topic("G1", "DDEATH", "E2", "D"), enc.payload([], T0, 1), LIMITS)
    dd = state.parse(
        enc.topic("G1", "DDATA", "E2", "D"),
        enc.payload([Metric(alias=1, timestamp=T0, datatype=enc.INT8, value=2)], T0, 2),
        LIMITS,
    )
    assert reasons(dd) == ["no_birth"]


def test_null_transient_historical():
    state = spb.SparkplugFormat()
    birth(state, [TEMP, RUN, Metric("c", 3, T0, enc.INT32, 1)])
    parsed = ndata(
        state,
        [
            Metric(alias=1, timestamp=T0 + 5, is_null=True, datatype=enc.DOUBLE),
            Metric(alias=2, timestamp=T0 + 5, is_transient=True, datatype=enc.BOOLEAN, value=True),
            Metric(alias=3, timestamp=T0 - 60_000, is_historical=True, datatype=enc.INT32, value=7),
        ],
        1,
    )
    assert parsed.rejections == []
    assert [(i.ts, i.fields) for i in parsed.items] == [(T0 - 60_000, {"c": 7})]
    assert state.counts.skipped == {"null": 1, "transient": 1, "other_daemon": 0}


def test_complex_types_refused_whole():
    state = spb.SparkplugFormat()
    dataset = enc.blob(
        17,
        enc.uint(1, 1)
        + enc.text(2, "a")
        + enc.uint(3, enc.INT32)
        + enc.blob(4, enc.blob(1, enc.uint(1, 5))),
    )
    template = enc.blob(
        18,
        enc.text(1, "v1")
        + enc.blob(2, enc.metric(Metric("inner", None, T0, enc.INT32, 1)))
        + enc.text(4, "Motor"),
    )
    parsed = birth(
        state,
        [
            Metric("ds", 1, T0, enc.DATASET, raw_value=dataset),
            Metric("tpl", 2, T0, enc.TEMPLATE, raw_value=template),
            Metric("arr", 3, T0, enc.INT32_ARRAY, struct.pack("<2i", -1, 2)),
            Metric("raw", 4, T0, enc.BYTES, b"\x00\x01"),
            Metric("ok", 5, T0, enc.INT16, 9),
        ],
    )
    assert [i.fields for i in parsed.items] == [{"ok": 9}]
    assert reasons(parsed) == ["unsupported_type"] * 4
    assert "DataSet" in parsed.rejections[0].detail


def test_value_in_the_wrong_member_is_refused():
    state = spb.SparkplugFormat()
    parsed = birth(
        state,
        [
            Metric("m", 1, T0, enc.DOUBLE, raw_value=enc.text(15, "x")),
            Metric("n", 2, T0, enc.FLOAT, raw_value=enc.uint(12, 5)),
        ],
    )
    assert reasons(parsed) == ["bad_value", "bad_value"]
    assert parsed.items == []


@pytest.mark.parametrize(
    "payload",
    [
        b"\x12\x05\x0a\x03ab",  # truncated metric
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # endless varint
        b"\x12\xff\xff\xff\xff\x0f",  # a length far beyond the payload
        b"\x0f",  # invalid wire type 7
        bytes(range(256)),
    ],
)
def test_hostile_bytes_are_refused(payload):
    state = spb.SparkplugFormat()
    parsed = state.parse(enc.topic("G", "NBIRTH", "E"), payload, LIMITS)
    assert parsed.items == []
    assert reasons(parsed) == ["invalid_protobuf"]


def test_deep_nesting_is_refused():
    inner = enc.metric(Metric("leaf", None, T0, enc.INT32, 1))
    for _ in range(200):  # templates inside templates, far beyond protobuf's depth limit
        inner = enc.metric(
            Metric("t", None, T0, enc.TEMPLATE, raw_value=enc.blob(18, enc.blob(2, inner)))
        )
    payload = enc.blob(2, inner) + enc.uint(3, 0)
    parsed = spb.SparkplugFormat().parse(enc.topic("G", "NBIRTH", "E"), payload, LIMITS)
    assert parsed.items == []
    assert reasons(parsed) == ["invalid_protobuf"]


def test_wrong_wire_types_and_bad_utf8_do_not_crash():
    # alias sent as a string, value as a length-delimited blob, name not UTF-8
    weird = enc.blob(
        2,
        enc.text(1, "m") + enc.blob(2, b"xx") + enc.uint(4, enc.DOUBLE) + enc.blob(13, b"12345678"),
    )
    bad_name = enc.blob(
        2, enc.blob(1, b"\xff\xfe") + enc.uint(2, 1) + enc.uint(4, enc.INT32) + enc.uint(10, 1)
    )
    parsed = spb.SparkplugFormat().parse(
        enc.topic("G", "NBIRTH", "E"), weird + bad_name + enc.uint(3, 0), LIMITS
    )
    assert parsed.items == []
    assert sorted(reasons(parsed)) == ["bad_field_name", "bad_value"]


def test_limits_and_topics():
    state = spb.SparkplugFormat()
    small = Limits(max_message_bytes=100, max_readings=2)
    big = enc.nbirth([Metric(f"m{i}", i + 1, T0, enc.INT32, i) for i in range(10)], 0, T0)
    assert reasons(state.parse(enc.topic("G", "NBIRTH", "E"), big, small)) == ["too_large"]
    three = enc.payload([Metric(f"m{i}", i, None, enc.INT8, 1) for i in range(3)])
    assert reasons(state.parse(enc.topic("G", "NBIRTH", "E"), three, small)) == [
        "too_many_readings"
    ]
    for topic in (
        "spBv1.0/G/NDATA",
        "spBv1.0/G/NDATA/E/D",
        "spBv1.0/G/DDATA/E",
        "spBv1.0/G/XDATA/E",
        "spAv1.0/G/NDATA/E",
        "spBv1.0//NDATA/E",
    ):
        assert reasons(state.parse(topic, b"", LIMITS)) == ["bad_topic"], topic
    for topic in ("spBv1.0/STATE/host", "spBv1.0/G/NCMD/E", "spBv1.0/G/DCMD/E/D"):
        assert state.parse(topic, b'{"online": true}', LIMITS) == ([], [])


def test_sensor_ids_are_the_topic_ids_exactly_and_keep_their_parts_apart():
    topic = spb.parse_topic("spBv1.0/Plant 1/DDATA/Line-3/PLC.7")
    assert topic is not None
    assert spb.sensor_id(topic) == "Plant 1/Line-3/PLC.7"
    node = spb.parse_topic("spBv1.0/G/NDATA/E")
    assert node is not None
    assert spb.sensor_id(node) == "G/E"
    # ids that a "safe" spelling would merge stay apart
    ids = {
        spb.sensor_id(spb.parse_topic(f"spBv1.0/G/NDATA/{n}"))  # type: ignore[arg-type]
        for n in ("Line 3", "Line_3", "Line-3", "Линия")
    }
    assert len(ids) == 4


def test_tables_are_bounded():
    state = spb.SparkplugFormat(max_tables=3)
    for n in range(5):
        birth(state, [TEMP], node=f"E{n}")
    assert list(state.tables) == ["G1/E2", "G1/E3", "G1/E4"]
    assert reasons(
        ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0)], 1, node="E0")
    ) == ["no_birth"]


def test_tables_are_bounded_by_the_metrics_they_declare():
    state = spb.SparkplugFormat(max_metrics=12)
    wide = [Metric(f"m{i}", 10 + i, T0, enc.DOUBLE, 1.0) for i in range(4)]
    for n in range(5):
        birth(state, wide, node=f"E{n}")  # 4 metrics, bdSeq and Node Control/Rebirth each
        assert state.metrics_held <= 12
    assert list(state.tables) == ["G1/E3", "G1/E4"]
    assert state.metrics_held == 12
    birth(state, [TEMP], node="E4")  # a rebirth replaces its table's metrics
    assert state.metrics_held == 6 + 3
    state.forget_all()
    assert (state.tables, state.metrics_held) == ({}, 0)


def test_loadgen_fleet_payloads_decode_to_loadgen_readings():
    state = spb.SparkplugFormat()
    born = state.parse(enc.fleet_topic("lg1", 3, "NBIRTH"), enc.fleet_birth(T0), LIMITS)
    assert born.items == []  # null values only
    assert born.rejections == []
    parsed = state.parse(
        enc.fleet_topic("lg1", 3),
        enc.fleet_data([(T0, 45.5, 21.25), (T0 + 10, 46.0, 21.5)], 1),
        LIMITS,
    )
    assert parsed.rejections == []
    assert [(i.sensor, i.ts, i.fields) for i in parsed.items] == [
        ("lg1/3", T0, {"hum": 45.5, "temp": 21.25}),
        ("lg1/3", T0 + 10, {"hum": 46.0, "temp": 21.5}),
    ]
    assert state.counts.skipped["null"] == 2


def test_the_preset_turns_metrics_into_readings_through_the_mapping():
    from ingest.devices.mapping import Mapping  # noqa: PLC0415

    mapping = Mapping.load(None, ["sparkplug"])
    assert set(mapping.subscriptions()) >= {"spBv1.0/+/+/+", "spBv1.0/+/+/+/+"}
    result = mapping.decode(
        enc.topic("Plant 1", "NBIRTH", "E"),
        enc.nbirth(
            [
                Metric("Inputs/Temp A", 1, T0, enc.DOUBLE, 20.5, properties={"engUnit": "degC"}),
                Metric("Mode", 2, T0, enc.STRING, "auto"),
            ],
            0,
            T0,
        ),
        T0 / 1000,
        LIMITS,
    )
    assert result.rule is not None
    assert result.decoded.rejections == []
    [reading] = result.decoded.readings
    assert reading.sensor_id == "Plant 1/E"
    assert reading.ms == T0
    assert reading.values == {"Inputs_Temp_A": 20.5, "Mode": "auto"}
    assert reading.tags == {"group": "Plant 1", "node": "E"}
    assert reading.units == {"Inputs_Temp_A": "degC"}
    data = mapping.decode(
        enc.topic("Plant 1", "NDATA", "E"),
        enc.payload([Metric(alias=1, timestamp=T0 + 1, datatype=enc.DOUBLE, value=21.0)], T0, 1),
        T0 / 1000,
        LIMITS,
    )
    assert [r.values for r in data.decoded.readings] == [{"Inputs_Temp_A": 21.0}]
    device = mapping.decode(
        enc.topic("Plant 1", "DBIRTH", "E", "D 1"),
        enc.payload([Metric("x", 7, T0, enc.INT8, 1)], T0, 2),
        T0 / 1000,
        LIMITS,
    )
    [reading] = device.decoded.readings
    assert reading.sensor_id == "Plant 1/E/D 1"
    assert reading.tags == {"group": "Plant 1", "node": "E", "device": "D 1"}
    state = mapping.decode("spBv1.0/STATE/host1", b'{"online": true}', T0 / 1000, LIMITS)
    assert state.ignored


VALID = [
    enc.nbirth([TEMP, RUN, Metric("c", 3, T0, enc.INT8, -1)], 0, T0),
    enc.payload(
        [
            Metric(alias=1, timestamp=T0, datatype=enc.DOUBLE, value=1.0),
            Metric(alias=3, timestamp=T0, datatype=enc.INT8, value=2),
        ],
        T0,
        1,
    ),
]


@given(
    kind=st.sampled_from(["NBIRTH", "NDATA", "NDEATH", "DBIRTH", "DDATA", "DDEATH"]),
    base=st.sampled_from(VALID),
    cut=st.integers(0, 200),
    flips=st.lists(st.tuples(st.integers(0, 199), st.integers(0, 255)), max_size=4),
    noise=st.binary(max_size=64),
)
def test_mangled_payloads_never_crash_and_never_invent_metrics(kind, base, cut, flips, noise):
    state = spb.SparkplugFormat()
    birth(state, [TEMP, RUN, Metric("c", 3, T0, enc.INT8, -1)])
    payload = bytearray(base[:cut] + noise)
    for pos, byte in flips:
        if pos < len(payload):
            payload[pos] = byte
    device = "D" if kind[0] == "D" else None
    parsed = state.parse(enc.topic("G1", kind, "E1", device), bytes(payload), LIMITS)
    declared = {"Inputs/Temp", "Outputs/Running", "c"}
    for item in parsed.items:
        if kind == "NDATA":  # resolved through the BIRTH: only names it declared
            assert set(item.fields) <= declared
        assert item.sensor == ("G1/E1/D" if device else "G1/E1")
    assert all(
        r.reason in (*spb.REASONS, "bad_value", "bad_field_name", "too_large", "too_many_readings")
        for r in parsed.rejections
    )


def test_an_alias_declared_twice_is_not_used_for_the_second_metric():
    state = spb.SparkplugFormat()
    born = birth(state, [Metric("a", 1, T0, enc.INT32, 1), Metric("b", 1, T0, enc.INT32, 2)])
    assert [i.fields for i in born.items] == [{"a": 1, "b": 2}]
    assert reasons(born) == ["unknown_alias"]
    assert "declared twice" in born.rejections[0].detail
    parsed = ndata(state, [Metric(alias=1, timestamp=T0, datatype=enc.INT32, value=5)], 1)
    assert [i.fields for i in parsed.items] == [{"a": 5}]


def test_a_shared_group_subscribes_births_and_deaths_unshared_and_data_shared() -> None:
    preset = Mapping.load(None, ["sparkplug"])
    assert preset.shared_subscriptions(preset.subscriptions(), "g") == (
        "$share/g/spBv1.0/STATE/+",
        "spBv1.0/+/NBIRTH/+",
        "$share/g/spBv1.0/+/NDATA/+",
        "spBv1.0/+/NDEATH/+",
        "$share/g/spBv1.0/+/NCMD/+",
        "spBv1.0/+/DBIRTH/+/+",
        "$share/g/spBv1.0/+/DDATA/+/+",
        "spBv1.0/+/DDEATH/+/+",
        "$share/g/spBv1.0/+/DCMD/+/+",
    )
    assert preset.shared_subscriptions(["spBv1.0/P1/#", "spBv1.0/+/NDATA/+", "plant/#"], "g") == (
        "spBv1.0/P1/NBIRTH/+",
        "$share/g/spBv1.0/P1/NDATA/+",
        "spBv1.0/P1/NDEATH/+",
        "$share/g/spBv1.0/P1/NCMD/+",
        "spBv1.0/P1/DBIRTH/+/+",
        "$share/g/spBv1.0/P1/DDATA/+/+",
        "spBv1.0/P1/DDEATH/+/+",
        "$share/g/spBv1.0/P1/DCMD/+/+",
        "$share/g/spBv1.0/+/NDATA/+",
        "$share/g/plant/#",
    )
    with pytest.raises(ConfigError, match=r"--shared-group: topic filter '#' also takes "):
        preset.shared_subscriptions(["#"], "g")
    # no stateful format: every filter shared as given
    json_only = Mapping.load(None, ["tasmota"])
    assert json_only.shared_subscriptions(["#"], "g") == ("$share/g/#",)


def test_settings_subscriptions_split_only_when_a_shared_group_is_in_effect() -> None:
    preset = Mapping.load(None, ["sparkplug"])
    topics = preset.subscriptions()
    assert Settings(topics=topics, mapping=preset).subscriptions == topics
    shared = Settings(topics=topics, mapping=preset, shared_group="g").subscriptions
    assert "spBv1.0/+/NBIRTH/+" in shared
    assert "$share/g/spBv1.0/+/DDATA/+/+" in shared
    with pytest.raises(ConfigError, match="--shared-group: topic filter '#'"):
        validate(Settings(topics=("#",), mapping=preset, shared_group="g"))
    with pytest.raises(
        ConfigError, match="--workers: several workers share a group; topic filter '#'"
    ):
        validate(Settings(topics=("#",), mapping=preset, workers=2))  # a derived group


def test_a_switch_between_one_and_several_workers_unsubscribes_the_split_filters() -> None:
    # A session of the other worker count holds the other form of each filter; with the
    # Sparkplug split that form is the shared DATA filters, not "$share/<group>/<topic>".
    preset = Mapping.load(None, ["sparkplug"])
    topics = preset.subscriptions()
    one = Settings(topics=topics, mapping=preset, client_id="c")
    several = Settings(topics=topics, mapping=preset, client_id="c", shared_group="c")
    assert set(one.other_subscriptions) == {
        topic for topic in several.subscriptions if topic.startswith("$share/")
    }
    assert "$share/c/spBv1.0/+/NDATA/+" in one.other_subscriptions
    # ...and the plain BIRTH/DEATH filters the workers keep are not unsubscribed.
    assert set(several.other_subscriptions) == set(topics) - set(several.subscriptions)
    assert not set(several.other_subscriptions) & set(several.subscriptions)


@given(stamp=st.integers(0, 2**64 - 1), rest=st.binary(max_size=32))
def test_a_refused_payloads_timestamp_is_read_when_it_comes_first(stamp, rest):
    payload = enc.payload([], stamp) + rest
    assert spb.leading_timestamp(payload) == stamp
    assert spb.leading_timestamp(enc.payload([TEMP], None, 1)) is None
    assert spb.leading_timestamp(b"\x08" + b"\xff" * 12) is None  # a varint never ending
    assert spb.leading_timestamp(b"") is None


def test_a_refused_rebirth_closes_the_node_and_its_devices_in_memory():
    state = spb.SparkplugFormat()
    birth(state, [TEMP])
    state.parse(
        enc.topic("G1", "DBIRTH", "E1", "D"),
        enc.payload([Metric("x", 7, T0, enc.INT8, 1)], T0, 1),
        LIMITS,
    )
    refused = state.parse(
        enc.topic("G1", "NBIRTH", "E1"), enc.nbirth([TEMP] * 3, 0, T0 + 5), Limits(max_readings=2)
    )
    assert [r.reason for r in refused.rejections] == ["too_many_readings"]
    why = {
        enc.topic("G1", "NDATA", "E1"): "its last NBIRTH was refused (too_many_readings)",
        enc.topic("G1", "DDATA", "E1", "D"): "no BIRTH seen",
    }  # the device's forgotten
    for topic, detail in why.items():
        parsed = state.parse(topic, VALID[1], LIMITS)
        assert parsed.items == []
        assert [(r.reason, detail in r.detail) for r in parsed.rejections] == [("no_birth", True)]
    table = state.table("G1/E1")
    assert table is not None
    assert table.closed_ms == T0 + 5
