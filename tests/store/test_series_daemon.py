"""Series and instants end to end: a real mosquitto, ``ingest run``, the store, both modes.

Streams shaped as their publishers send them; every value is stored once under a name
and series that tell it apart, and both layouts give the same answer.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson

from ingest.store.schema import BUCKET_VALIDATOR
from loadgen import sparkplug as enc
from loadgen.sparkplug import Metric
from tests.support.mongo import COLLECTION, instants
from tests.support.procs import ROOT, eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

NOW_MS = int(time.time() * 1000) - 600_000


def rejected(proc: Daemon) -> dict[str, float]:
    return {
        k: v
        for k, v in proc.metrics().items()
        if k.startswith("ingest_readings_rejected_total{") and v
    }


async def test_sparkplug_tag_groups_of_one_millisecond_are_one_reading(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    """A device reports two tag groups scanned in the same millisecond (two DDATA, equal
    timestamps, as the specification allows): one reading with every metric. A third
    DDATA at that millisecond changing a metric is refused as ts_conflict."""
    g, t0 = topic_root, NOW_MS
    proc = daemon("--preset", "sparkplug", "--topic", f"spBv1.0/{g}/#")
    await publish(
        [
            (enc.topic(g, "NBIRTH", "Edge"), enc.nbirth([], bd_seq=0, timestamp=t0)),
            (
                enc.topic(g, "DBIRTH", "Edge", "Press"),
                enc.payload(
                    [
                        Metric("Hydraulic Pressure", 1, t0, enc.DOUBLE, is_null=True),
                        Metric("Running", 2, t0, enc.BOOLEAN, is_null=True),
                        Metric("Mode", 3, t0, enc.INT32, is_null=True),
                    ],
                    t0,
                    1,
                ),
            ),
            (
                enc.topic(g, "DDATA", "Edge", "Press"),
                enc.payload(
                    [Metric(alias=1, timestamp=t0 + 5, datatype=enc.DOUBLE, value=153.5)], t0 + 5, 2
                ),
            ),
            (
                enc.topic(g, "DDATA", "Edge", "Press"),
                enc.payload(
                    [
                        Metric(alias=2, timestamp=t0 + 5, datatype=enc.BOOLEAN, value=True),
                        Metric(alias=3, timestamp=t0 + 5, datatype=enc.INT32, value=2),
                    ],
                    t0 + 5,
                    3,
                ),
            ),
            (
                enc.topic(g, "DDATA", "Edge", "Press"),
                enc.payload(
                    [Metric(alias=3, timestamp=t0 + 5, datatype=enc.INT32, value=3)], t0 + 5, 4
                ),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 5)
    await eventually(
        lambda: rejected(proc) == {'ingest_readings_rejected_total{reason="ts_conflict"}': 1}
    )
    tags = (("device", "Press"), ("group", g), ("node", "Edge"))
    assert await instants(db[COLLECTION[mode]], mode) == {
        (f"{g}/Edge/Press", tags, t0 + 5): {"Hydraulic_Pressure": 153.5, "Running": True, "Mode": 2}
    }
    rejects = await db.rejects.find({}).to_list()
    assert [r["reason"] for r in rejects] == ["ts_conflict"]
    assert "already has Mode=2" in rejects[0]["detail"]
    assert proc.stop() == 0


async def test_the_readme_example_stores_both_readings(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    """Two readings of one sensor in one message, neither with its own time: the
    arrival time, a millisecond apart in message order, in both layouts."""
    proc = daemon()
    message = {"sensor_id": "greenhouse-1", "readings": [{"temp": 22.5}, {"temp": 22.7}]}
    await publish([(f"{topic_root}/any/topic", orjson.dumps(message))])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    stored = await instants(db[COLLECTION[mode]], mode)
    assert [fields for _, fields in sorted(stored.items())] == [{"temp": 22.5}, {"temp": 22.7}]
    (first, _, ms1), (_, _, ms2) = sorted(stored)
    assert first == "greenhouse-1"
    assert ms2 == ms1 + 1
    assert rejected(proc) == {}
    assert proc.stop() == 0


async def test_devices_whose_names_differ_stay_different_sensors(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Any
) -> None:
    """Zigbee2MQTT friendly names are the sensor ids, kept exactly: none merge."""
    rules = tmp_path / "z2m.toml"
    rules.write_text(f'[[rule]]\nname = "z2m"\ntopic = "{topic_root}/{{sensor_id}}"\n')
    names = ["Кухня", "Спальня", "客厅", "Küche", "Kèche", "Living Room", "Living_Room"]
    proc = daemon("--mapping", str(rules))
    await publish(
        [
            (f"{topic_root}/{name}", orjson.dumps({"temperature": 20 + i}))
            for i, name in enumerate(names)
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == len(names))
    stored = await instants(db[COLLECTION[mode]], mode)
    assert {sensor: fields["temperature"] for (sensor, _, _), fields in stored.items()} == {
        name: 20 + i for i, name in enumerate(names)
    }
    assert proc.stop() == 0


def ingest(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_collection_of_the_earlier_shape_is_refused_until_migrated(
    daemon: Callable[..., Daemon],
    mongo_uri: str,
    db_name: str,
    db: Any,
    publish: Any,
    topic_root: str,
) -> None:
    """Bucket documents of schema_version 1 (no series tags, the old unique index): the
    daemon refuses to start with one line naming the collection and the command; after
    ``ingest migrate`` it starts and writes, and the old readings keep their series."""
    coll = db.buckets
    # (created with this version's validator: the emulator has no collMod to update one)
    await db.command({"create": "buckets", "validator": BUCKET_VALIDATOR})
    await coll.create_index(
        [("sensor_id", 1), ("readings.ts", 1)], name="sensor_id_1_readings.ts_1", unique=True
    )
    await coll.insert_one(
        {
            "sensor_id": "s1",
            "bucket_start": 0,
            "count": 1,
            "bytes": 60,
            "readings": [{"ts": 1, "t": 1.0}],
            "stats": {},
            "tags": {"z": "1", "a": "2"},
            "schema_version": 1,
        },
        bypass_document_validation=True,
    )
    flags = ("--mongodb-uri", mongo_uri, "--db", db_name, "--mode", "bucket")
    refused = ingest("init-db", *flags)
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert "Traceback" not in refused.stderr
    assert f"{db_name}.buckets holds bucket documents of schema_version 1" in last
    assert f"ingest migrate --db {db_name} --collection buckets" in last
    migrated = ingest("migrate", *flags)
    assert migrated.returncode == 0, migrated.stderr
    assert "1 documents brought to schema_version 2" in migrated.stderr
    again = ingest("migrate", *flags)
    assert "0 documents brought to schema_version 2" in again.stderr
    doc = await coll.find_one({"sensor_id": "s1"})
    assert list(doc["tags"]) == ["a", "z"]
    assert doc["schema_version"] == 2
    assert "sensor_id_1_readings.ts_1" not in await coll.index_information()
    proc = daemon()
    await publish([(f"{topic_root}/s1/x", orjson.dumps({"t": 2.0}))])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await coll.count_documents({"schema_version": 2}) == 2
    assert proc.stop() == 0
