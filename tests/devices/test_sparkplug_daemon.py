"""Sparkplug B end to end: real mosquitto, the daemon with --preset sparkplug, MongoDB.

Payloads are built by ``loadgen.sparkplug`` (a wire-format encoder independent of the
daemon's protobuf schema).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from loadgen import sparkplug as enc
from loadgen.cli import main as loadgen_main
from loadgen.sparkplug import Metric
from tests.support.mongo import COLLECTION, failpoint
from tests.support.procs import eventually, http_status
from tests.support.proxy import Proxy

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

NOW_MS = int(time.time() * 1000) - 600_000


def ms(value: datetime) -> int:
    return int(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)


async def readings(db: Any, mode: str) -> list[tuple[str, int, dict[str, Any]]]:
    """(sensor_id, ts ms, values) of every stored reading, sorted, in either layout."""
    out = []
    if mode == "timeseries":
        for d in await db[COLLECTION[mode]].find({}).to_list():
            values = {k: v for k, v in d.items() if k not in ("_id", "ts", "meta", "units")}
            out.append((d["meta"]["sensor_id"], ms(d["ts"]), values))
    else:
        for d in await db[COLLECTION[mode]].find({}).to_list():
            out.extend(
                (d["sensor_id"], ms(r["ts"]), {k: v for k, v in r.items() if k != "ts"})
                for r in d["readings"]
            )
    return sorted(out, key=lambda r: (r[0], r[1]))


def start(daemon: Callable[..., Daemon], group: str, *extra: str, **options: Any) -> Daemon:
    return daemon("--preset", "sparkplug", "--topic", f"spBv1.0/{group}/#", *extra, **options)


def data(alias: int, at: int, raw: bytes) -> Metric:
    return Metric(alias=alias, timestamp=at, raw_value=raw)


def double(value: float) -> bytes:
    return enc.tag(13, 1) + struct.pack("<d", value)


async def test_birth_data_rebirth_death_and_hostile_payloads(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = start(daemon, topic_root, "--max-message-bytes", "65536")
    g, t0 = topic_root, NOW_MS
    node, dev = f"{g}/E1", f"{g}/E1/D.1"
    deep = enc.metric(Metric("leaf", None, t0, enc.INT32, 1))
    for _ in range(150):
        deep = enc.metric(
            Metric("t", None, t0, enc.TEMPLATE, raw_value=enc.blob(18, enc.blob(2, deep)))
        )
    await publish(
        [
            # DATA before any BIRTH: not guessed
            (enc.topic(g, "NDATA", "E1"), enc.payload([data(1, t0, double(1.0))], t0, 252)),
            (
                enc.topic(g, "NBIRTH", "E1"),
                enc.nbirth(
                    [
                        Metric(
                            "Inputs/Temp", 1, t0, enc.DOUBLE, 20.5, properties={"engUnit": "degC"}
                        ),
                        Metric("Running", 2, t0, enc.BOOLEAN, value=True),
                        Metric("Mode", 3, t0, enc.STRING, "auto"),
                        Metric("Table", 4, t0, enc.DATASET, raw_value=enc.blob(17, enc.uint(1, 0))),
                    ],
                    bd_seq=1,
                    timestamp=t0,
                    seq=253,
                ),
            ),
            (
                enc.topic(g, "DBIRTH", "E1", "D.1"),
                enc.payload([Metric("Level", 10, t0, enc.INT16, -3)], t0, 254),
            ),
            # seq 255 then 0: the wrap is no gap
            (
                enc.topic(g, "NDATA", "E1"),
                enc.payload(
                    [data(1, t0 + 1000, double(21.0)), data(2, t0 + 1000, enc.uint(14, 0))],
                    t0 + 1000,
                    255,
                ),
            ),
            (
                enc.topic(g, "DDATA", "E1", "D.1"),
                enc.payload([data(10, t0 + 1000, enc.uint(10, (-7) & 0xFFFFFFFF))], t0 + 1000, 0),
            ),
            # an alias no BIRTH declared, next to a good one; seq 5: a gap
            (
                enc.topic(g, "NDATA", "E1"),
                enc.payload(
                    [data(1, t0 + 2000, double(22.0)), data(99, t0 + 2000, double(5.0))],
                    t0 + 2000,
                    5,
                ),
            ),
            # hostile payloads: truncated, garbage, deep nesting, far too large, wrong type
            (enc.topic(g, "NDATA", "E1"), b"\x12\x10\x10\x01"),
            (enc.topic(g, "NDATA", "E1"), b"\xff" * 64),
            (enc.topic(g, "NBIRTH", "E9"), enc.blob(2, deep)),
            (enc.topic(g, "NDATA", "E1"), enc.payload([data(1, t0, double(1.0))] * 5000, t0, 6)),
            (
                enc.topic(g, "NDATA", "E1"),
                enc.payload([data(1, t0 + 3000, enc.text(15, "not a double"))], t0 + 3000, 6),
            ),
            # rebirth: alias 1 now names another metric
            (
                enc.topic(g, "NBIRTH", "E1"),
                enc.nbirth(
                    [Metric("Speed", 1, t0 + 4000, enc.FLOAT, 3.5)], bd_seq=1, timestamp=t0 + 4000
                ),
            ),
            (
                enc.topic(g, "NDATA", "E1"),
                enc.payload(
                    [data(1, t0 + 5000, enc.tag(12, 5) + struct.pack("<f", 4.5))], t0 + 5000, 1
                ),
            ),
            (
                enc.topic(g, "DDATA", "E1", "D.1"),
                enc.payload([data(10, t0 + 5000, enc.uint(10, 1))], t0 + 5000, 2),
            ),
            # a stale will, then the real NDEATH; DATA after it is refused
            (enc.topic(g, "NDEATH", "E1"), enc.ndeath(0)),
            (enc.topic(g, "NDEATH", "E1"), enc.ndeath(1)),
            (
                enc.topic(g, "NDATA", "E1"),
                enc.payload([data(1, t0 + 6000, double(9.0))], t0 + 6000, 3),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 17, timeout=30)
    assert await readings(db, mode) == [
        (node, t0, {"Inputs_Temp": 20.5, "Running": True, "Mode": "auto"}),
        (node, t0 + 1000, {"Inputs_Temp": 21.0, "Running": False}),
        (node, t0 + 2000, {"Inputs_Temp": 22.0}),
        (node, t0 + 4000, {"Speed": 3.5}),
        (node, t0 + 5000, {"Speed": 4.5}),
        (dev, t0, {"Level": -3}),
        (dev, t0 + 1000, {"Level": -7}),
    ]
    rejects = await db.rejects.find({}, {"reason": 1, "topic": 1}).to_list()
    assert sorted(r["reason"] for r in rejects) == sorted(
        [
            "no_birth",
            "unsupported_type",
            "unknown_alias",
            "invalid_protobuf",
            "invalid_protobuf",
            "invalid_protobuf",
            "too_large",
            "bad_value",
            "no_birth",
            "no_birth",
        ]
    )
    births = {d["_id"]: d async for d in db.sparkplug_births.find()}
    assert births[f"{g}/E1"]["online"] is False
    assert births[f"{g}/E1"]["bd_seq"] == 1
    assert [m["name"] for m in births[f"{g}/E1"]["metrics"]] == [
        "bdSeq",
        "Node Control/Rebirth",
        "Speed",
    ]
    assert births[f"{g}/E1/D.1"]["online"] is False
    assert births[f"{g}/E1/D.1"]["metrics"] == [{"name": "Level", "datatype": "Int16", "alias": 10}]
    metrics = proc.metrics()
    assert metrics['ingest_sparkplug_messages_total{type="NDEATH"}'] == 2
    assert metrics["ingest_sparkplug_stale_deaths_total"] == 1
    # seq: 252 (no birth yet), 253 birth, 254, 255, 0, then 5 (a gap), 6 (the payloads
    # refused before parsing have none), the rebirth at 0, 1, 2, and 3 after the death
    # (the death ended the node's counter: no gap)
    assert metrics["ingest_sparkplug_seq_gaps_total"] == 1
    assert metrics['ingest_readings_rejected_total{reason="no_birth"}'] == 3
    assert metrics['ingest_rule_messages_total{outcome="rejected",rule="sparkplug-node"}'] == 7
    assert metrics['ingest_rule_messages_total{outcome="rejected",rule="sparkplug-device"}'] == 1
    assert http_status(proc.metrics_port, "/healthz") == 200
    assert proc.stop() == 0


async def test_units_tags_and_transient_metrics_are_stored_as_documented(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = start(daemon, topic_root)
    g, t0 = topic_root, NOW_MS
    await publish(
        [
            (
                enc.topic(g, "NBIRTH", "E"),
                enc.nbirth(
                    [
                        Metric(
                            "Temp", 1, t0, enc.FLOAT, is_null=True, properties={"engUnit": "degC"}
                        ),
                        Metric("Debug", 2, t0, enc.INT32, 1, is_transient=True),
                    ],
                    bd_seq=0,
                    timestamp=t0,
                ),
            ),
            (
                enc.topic(g, "NDATA", "E"),
                enc.payload(
                    [
                        data(1, t0 + 10, enc.tag(12, 5) + struct.pack("<f", 1.25)),
                        Metric(
                            alias=2, timestamp=t0 + 10, is_transient=True, raw_value=enc.uint(10, 2)
                        ),
                        Metric(
                            alias=1,
                            timestamp=t0 - 60_000,
                            is_historical=True,
                            raw_value=enc.tag(12, 5) + struct.pack("<f", 0.5),
                        ),
                    ],
                    t0 + 10,
                    1,
                ),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 2)
    assert await readings(db, mode) == [
        (f"{g}/E", t0 - 60_000, {"Temp": 0.5}),
        (f"{g}/E", t0 + 10, {"Temp": 1.25}),
    ]
    doc = await db[COLLECTION[mode]].find_one({})
    if mode == "bucket":
        assert doc["tags"] == {"group": g, "node": "E"}
        assert doc["units"] == {"Temp": "degC"}
    else:
        assert doc["meta"] == {"sensor_id": f"{g}/E", "group": g, "node": "E"}
        assert doc["units"] == {"Temp": "degC"}
    metrics = proc.metrics()
    assert metrics['ingest_sparkplug_metrics_skipped_total{why="transient"}'] == 2
    assert metrics['ingest_sparkplug_metrics_skipped_total{why="null"}'] == 1
    assert proc.stop() == 0


@pytest.mark.parametrize("mode", ["bucket"])
async def test_a_birth_reaches_every_daemon_of_a_shared_group_and_serves_a_restart(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    g, t0 = topic_root, NOW_MS
    group = f"g{topic_root}"
    procs = [start(daemon, g, "--shared-group", group, client_id=f"{group}-{i}") for i in range(2)]
    await publish(
        [
            (
                enc.topic(g, "NBIRTH", "E"),
                enc.nbirth([Metric("v", 1, t0, enc.INT64, is_null=True)], bd_seq=3, timestamp=t0),
            )
        ]
    )
    await eventually(lambda: db.sparkplug_births.count_documents({"_id": f"{g}/E"}))
    await publish(
        [
            (enc.topic(g, "NDATA", "E"), enc.payload([data(1, t0 + i, enc.uint(11, i))], t0 + i, i))
            for i in range(1, 21)
        ]
    )
    # each daemon acks the BIRTH, and its share of the DATA
    await eventually(lambda: sum(p.metric("ingest_messages_acked_total") for p in procs) == 22)
    assert [r[2]["v"] for r in await readings(db, mode)] == list(range(1, 21))
    assert await db.rejects.count_documents({}) == 0
    # Both daemons got the BIRTH (unshared): neither had to read the table from MongoDB.
    assert [p.metric('ingest_sparkplug_table_lookups_total{outcome="found"}') for p in procs] == [
        0,
        0,
    ]
    for p in procs:
        assert p.stop() == 0
    # A restarted daemon has no tables in memory: it reads them back.
    again = start(daemon, g, client_id=f"{group}-again")
    await publish(
        [
            (
                enc.topic(g, "NDATA", "E"),
                enc.payload([data(1, t0 + 30, enc.uint(11, 30))], t0 + 30, 21),
            )
        ]
    )
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 1)
    assert again.metric('ingest_sparkplug_table_lookups_total{outcome="found"}') == 1
    assert (await readings(db, mode))[-1][2] == {"v": 30}
    assert again.stop() == 0


@pytest.mark.parametrize("mode", ["timeseries"])
async def test_a_birth_is_acked_only_after_its_alias_table_is_stored(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    proc = start(daemon, topic_root)
    g, t0 = topic_root, NOW_MS
    # time-series writes are inserts: only the BIRTH's store (an update) fails
    async with failpoint(mongo, ["update"]):
        await publish(
            [
                (
                    enc.topic(g, "NBIRTH", "E"),
                    enc.nbirth([Metric("v", 1, t0, enc.INT32, 5)], bd_seq=0, timestamp=t0),
                )
            ]
        )
        await eventually(lambda: "cannot store a BIRTH" in proc.logs())
        assert proc.metric("ingest_messages_acked_total") == 0
        assert await db.sparkplug_births.count_documents({}) == 0
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await db.sparkplug_births.count_documents({"_id": f"{g}/E"}) == 1
    assert await readings(db, mode) == [(f"{g}/E", t0, {"v": 5})]
    assert proc.stop() == 0


async def test_a_shared_group_follows_a_rebirth_that_moves_aliases_storing_everything_once(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    g, t0 = topic_root, NOW_MS
    procs = [start(daemon, g, "--shared-group", f"g{g}", client_id=f"g{g}-{i}") for i in range(2)]

    def ndata(seq: int, first: int, second: int) -> tuple[str, bytes]:
        return enc.topic(g, "NDATA", "E"), enc.payload(
            [data(1, t0 + seq, enc.uint(10, first)), data(2, t0 + seq, enc.uint(10, second))],
            t0 + seq,
            seq,
        )

    await publish(
        [
            (
                enc.topic(g, "NBIRTH", "E"),
                enc.nbirth(
                    [Metric("a", 1, t0, enc.INT32, 100), Metric("b", 2, t0, enc.INT32, 200)],
                    bd_seq=0,
                    timestamp=t0,
                ),
            ),
            *[ndata(seq, seq, -seq & 0xFFFFFFFF) for seq in range(1, 11)],
            # rebirth: the aliases of "a" and "b" swap; DATA follows at once
            (
                enc.topic(g, "NBIRTH", "E"),
                enc.nbirth(
                    [
                        Metric("b", 1, t0 + 100, enc.INT32, 300),
                        Metric("a", 2, t0 + 100, enc.INT32, 400),
                    ],
                    bd_seq=0,
                    timestamp=t0 + 100,
                ),
            ),
            *[ndata(100 + seq, -seq & 0xFFFFFFFF, seq) for seq in range(1, 11)],
        ]
    )
    await eventually(lambda: sum(p.metric("ingest_messages_acked_total") for p in procs) == 24)
    stored = await readings(db, mode)
    assert [(ts - t0, values) for _, ts, values in stored] == [
        (0, {"a": 100, "b": 200}),
        *[(seq, {"a": seq, "b": -seq}) for seq in range(1, 11)],
        (100, {"a": 400, "b": 300}),
        *[(100 + seq, {"a": seq, "b": -seq}) for seq in range(1, 11)],
    ]
    assert await db.rejects.count_documents({}) == 0
    # Every daemon received both BIRTHs and took part of the DATA; each BIRTH's readings
    # were stored by one of them, not read back from MongoDB by the other.
    for p in procs:
        assert p.metric('ingest_sparkplug_messages_total{type="NBIRTH"}') == 2
        assert p.metric('ingest_sparkplug_messages_total{type="NDATA"}') > 0
        assert p.metric('ingest_sparkplug_table_lookups_total{outcome="found"}') == 0
    assert (
        sum(p.metric('ingest_sparkplug_metrics_skipped_total{why="other_daemon"}') for p in procs)
        == 2 * 4
    )  # two BIRTHs of bdSeq, Node Control/Rebirth, a, b
    for p in procs:
        assert p.stop() == 0


async def test_a_loadgen_sparkplug_fleet_arrives_exactly_once(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Any,
    topic_root: str,
    mongo_uri: str,
    db_name: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = f"g{topic_root}"
    proc = start(daemon, group)
    manifest = tmp_path / "run.json"
    count = 240
    publish = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "publish",
            "--format",
            "sparkplug",
            "--mqtt-url",
            broker.url,
            "--sensor-prefix",
            group,
            "--sensors",
            "4",
            "--count",
            str(count),
            "--per-message",
            "3",
            "--qos",
            "1",
            "--rate",
            "0",
            "--processes",
            "2",
            "--start",
            "now-1h",
            "--time-step",
            "5",
            "--manifest",
            str(manifest),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert publish.returncode == 0, publish.stderr
    await eventually(
        lambda: proc.metric(f'ingest_readings_written_total{{mode="{mode}"}}') >= count
    )
    code = loadgen_main(
        [
            "verify",
            "--manifest",
            str(manifest),
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--mode",
            mode,
        ],
        env={},
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"expected {count}, found {count}, missing 0, duplicated 0, wrong 0" in out
    assert proc.metric('ingest_sparkplug_messages_total{type="NBIRTH"}') == 4
    assert proc.metric("ingest_sparkplug_seq_gaps_total") == 0
    assert proc.stop() == 0


@pytest.mark.parametrize("mode", ["bucket"])
async def test_a_daemon_that_missed_a_rebirth_while_disconnected_reads_it_back(
    daemon: Callable[..., Daemon], mode: str, publish: Any, broker: Any, topic_root: str, db: Any
) -> None:
    g, t0 = topic_root, NOW_MS
    proxy = Proxy("127.0.0.1", broker.port).start()
    try:
        away = start(
            daemon,
            g,
            "--shared-group",
            f"g{g}",
            client_id=f"g{g}-away",
            broker_url=f"mqtt://127.0.0.1:{proxy.port}",
        )
        other = start(daemon, g, "--shared-group", f"g{g}", client_id=f"g{g}-other")
        await publish(
            [
                (
                    enc.topic(g, "NBIRTH", "E"),
                    enc.nbirth(
                        [Metric("a", 1, t0, enc.INT32, is_null=True)], bd_seq=0, timestamp=t0
                    ),
                )
            ]
        )
        await eventually(
            lambda: (
                away.metric("ingest_sparkplug_alias_tables") == 1
                and other.metric("ingest_sparkplug_alias_tables") == 1
            )
        )
        # A partition: the rebirth (QoS 0, as edge nodes publish it) reaches only "other".
        proxy.cut()
        await publish(
            [
                (
                    enc.topic(g, "NBIRTH", "E"),
                    enc.nbirth(
                        [Metric("b", 1, t0 + 100, enc.INT32, is_null=True)],
                        bd_seq=0,
                        timestamp=t0 + 100,
                    ),
                )
            ],
            qos=0,
        )
        await eventually(lambda: other.metric("ingest_messages_acked_total") == 2)
        proxy.drop()
        proxy.heal()
        await eventually(
            lambda: (
                away.metric("ingest_mqtt_reconnects_total") >= 1
                and away.metric("ingest_mqtt_connected") == 1
            )
        )
        await publish(
            [
                (
                    enc.topic(g, "NDATA", "E"),
                    enc.payload([data(1, t0 + 100 + seq, enc.uint(10, seq))], t0 + 100 + seq, seq),
                )
                for seq in range(1, 11)
            ]
        )
        await eventually(
            lambda: (
                away.metric("ingest_messages_acked_total")
                + other.metric("ingest_messages_acked_total")
                == 13
            )
        )
        assert [r[2] for r in await readings(db, mode)] == [{"b": seq} for seq in range(1, 11)]
        assert away.metric('ingest_sparkplug_messages_total{type="NDATA"}') > 0
        assert away.metric('ingest_sparkplug_table_lookups_total{outcome="found"}') == 1
        assert await db.rejects.count_documents({}) == 0
        for p in (away, other):
            assert p.stop() == 0
    finally:
        proxy.stop()


@pytest.mark.parametrize("refusal", ["too_many_readings", "too_large", "invalid_protobuf"])
async def test_a_refused_rebirth_ends_the_old_session_also_across_a_restart(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, refusal: str
) -> None:
    """A rebirth the daemon cannot use still ends the session it follows: the next DATA's
    alias 1 (now "pressure") is never stored as "temp", before or after a restart."""
    g, t0 = topic_root, NOW_MS
    limits = ("--max-readings-per-message", "6", "--max-message-bytes", "4096")
    proc = start(daemon, g, *limits)
    node, dev = f"{g}/E", f"{g}/E/D"

    def ndata(seq: int, value: float) -> tuple[str, bytes]:
        return enc.topic(g, "NDATA", "E"), enc.payload(
            [data(1, t0 + seq, double(value))], t0 + seq, seq
        )

    def ddata(seq: int, value: int) -> tuple[str, bytes]:
        return enc.topic(g, "DDATA", "E", "D"), enc.payload(
            [data(7, t0 + seq, enc.uint(10, value))], t0 + seq, seq
        )

    moved = [Metric("pressure", 1, t0 + 10, enc.DOUBLE, 1013.0)]
    refused = {  # the rebirth, refused whole for each reason
        "too_many_readings": enc.nbirth(
            moved + [Metric(f"x{i}", 10 + i, t0 + 10, enc.DOUBLE, 0.0) for i in range(6)],
            bd_seq=1,
            timestamp=t0 + 10,
        ),
        "too_large": enc.nbirth(
            [*moved, Metric("note", 2, t0 + 10, enc.STRING, "x" * 5000)],
            bd_seq=1,
            timestamp=t0 + 10,
        ),
        "invalid_protobuf": enc.nbirth(moved, bd_seq=1, timestamp=t0 + 10)[:-3],
    }[refusal]
    await publish(
        [
            (
                enc.topic(g, "NBIRTH", "E"),
                enc.nbirth([Metric("temp", 1, t0, enc.DOUBLE, 20.5)], bd_seq=0, timestamp=t0),
            ),
            (
                enc.topic(g, "DBIRTH", "E", "D"),
                enc.payload([Metric("level", 7, t0, enc.INT16, 1)], t0, 1),
            ),
            ndata(2, 21.0),
            (enc.topic(g, "NBIRTH", "E"), refused),
            ndata(11, 1013.0),  # alias 1 of the refused rebirth: "pressure", not "temp"
            ddata(12, 2),  # the device belonged to the session that ended
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 6)
    before = [(node, t0, {"temp": 20.5}), (node, t0 + 2, {"temp": 21.0}), (dev, t0, {"level": 1})]
    assert sorted(await readings(db, mode)) == sorted(before)
    why = f"its last NBIRTH was refused ({refusal}); waiting for a usable BIRTH"
    births = {d["_id"]: d async for d in db.sparkplug_births.find()}
    assert {k: (d["online"], d.get("closed_by")) for k, d in births.items()} == {
        f"{g}/E": (False, why),
        f"{g}/E/D": (False, why),
    }
    assert proc.stop() == 0
    # A restarted daemon reads the tables from MongoDB: the old session does not come back.
    again = start(daemon, g, *limits)
    await publish([ndata(13, 1014.0), ddata(14, 3)])
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 2)
    assert sorted(await readings(db, mode)) == sorted(before)
    rejects = await db.rejects.find({}, {"reason": 1, "detail": 1}).to_list()
    assert sorted(r["reason"] for r in rejects) == sorted([refusal] + ["no_birth"] * 4)
    assert all(why in r["detail"] for r in rejects if r["reason"] == "no_birth"), rejects
    # The next usable BIRTH opens a new session with its own aliases.
    await publish(
        [
            (enc.topic(g, "NBIRTH", "E"), enc.nbirth(moved, bd_seq=1, timestamp=t0 + 20)),
            ndata(21, 1015.0),
        ]
    )
    await eventually(lambda: again.metric("ingest_messages_acked_total") == 4)
    assert sorted(await readings(db, mode)) == sorted(
        [*before, (node, t0 + 10, {"pressure": 1013.0}), (node, t0 + 21, {"pressure": 1015.0})]
    )
    assert again.stop() == 0


@pytest.mark.parametrize("mode", ["bucket"])
async def test_a_refused_dbirth_ends_its_devices_session_only(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    g, t0 = topic_root, NOW_MS
    proc = start(daemon, g, "--max-readings-per-message", "3")
    await publish(
        [
            (enc.topic(g, "NBIRTH", "E"), enc.nbirth([], bd_seq=0, timestamp=t0)),
            (
                enc.topic(g, "DBIRTH", "E", "D"),
                enc.payload([Metric("level", 7, t0, enc.INT16, 1)], t0, 1),
            ),
            (
                enc.topic(g, "DBIRTH", "E", "D"),
                enc.payload(
                    [Metric(f"m{i}", 7 + i, t0 + 5, enc.INT16, 1) for i in range(4)], t0 + 5, 2
                ),
            ),
            (
                enc.topic(g, "DDATA", "E", "D"),
                enc.payload([data(7, t0 + 6, enc.uint(10, 9))], t0 + 6, 3),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 4)
    assert await readings(db, mode) == [(f"{g}/E/D", t0, {"level": 1})]
    births = {d["_id"]: d["online"] async for d in db.sparkplug_births.find()}
    assert births == {f"{g}/E": True, f"{g}/E/D": False}
    assert sorted([r["reason"] async for r in db.rejects.find()]) == [
        "no_birth",
        "too_many_readings",
    ]
    assert proc.stop() == 0
