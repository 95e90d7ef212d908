"""--sensor-id-from-topic: a payload cannot name another sensor than its topic does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tests.support.mongo import COLLECTION
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.support.procs import Daemon

NOW = 1_790_000_000
# Rules of the ingest format whose topics name the device with a capture.
RULE = """
[[rule]]
name = "readings"
topic = "{root}/{{sensor_id}}/readings"
format = "ingest"

[[rule]]
name = "uplinks"
topic = "{root}/dev/{{sensor_id}}/up"
format = "ingest"
"""


async def sensors_of(db: Any, mode: str) -> list[tuple[str, float]]:
    """(sensor id, temp) of every stored reading."""
    coll = db[COLLECTION[mode]]
    docs = await coll.find({}).to_list()
    if mode == "timeseries":
        return sorted((d["meta"]["sensor_id"], d["temp"]) for d in docs)
    return sorted((d["sensor_id"], r["temp"]) for d in docs for r in d["readings"])


async def test_a_payload_naming_another_sensor_is_refused_with_the_option(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULE.format(root=topic_root))
    proc = daemon(
        "--sensor-id-from-topic",
        "--mapping",
        str(rules),
        "--topic",
        f"{topic_root}/#",
        rule_topics=True,
    )
    own, rule_topic = f"{topic_root}/dev-a/readings", f"{topic_root}/dev/dev-c/up"
    await publish(
        [
            (own, orjson.dumps({"ts": NOW, "temp": 1.0})),
            (own, orjson.dumps({"ts": NOW + 1, "sensor_id": "dev-a", "temp": 2.0})),
            (own, orjson.dumps({"ts": NOW + 2, "sensor_id": "dev-b", "temp": 3.0})),
            (
                own,
                orjson.dumps(
                    {
                        "sensor_id": "dev-b",
                        "readings": [
                            {"ts": NOW + 3, "temp": 4.0},
                            {"ts": NOW + 4, "sensor_id": "dev-a", "temp": 5.0},
                        ],
                    }
                ),
            ),
            (rule_topic, orjson.dumps({"ts": NOW, "temp": 6.0})),
            (rule_topic, orjson.dumps({"ts": NOW + 1, "sensor_id": "dev-a", "temp": 7.0})),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 6)
    assert await sensors_of(db, mode) == [
        ("dev-a", 1.0),
        ("dev-a", 2.0),
        ("dev-a", 5.0),
        ("dev-c", 6.0),
    ]
    assert proc.metric('ingest_readings_rejected_total{reason="sensor_id_mismatch"}') == 3
    rejects = await db.rejects.find({"reason": "sensor_id_mismatch"}).to_list()
    assert len(rejects) == 3
    assert any("names sensor 'dev-b', the topic 'dev-a'" in r["detail"] for r in rejects)
    assert proc.stop() == 0


async def test_without_the_option_a_payload_still_names_its_sensor(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon()
    await publish(
        [
            (
                f"{topic_root}/gateway/readings",
                orjson.dumps({"ts": NOW, "sensor_id": "dev-b", "temp": 3.0}),
            )
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await sensors_of(db, mode) == [("dev-b", 3.0)]
    assert proc.stop() == 0


async def test_the_default_format_with_the_option_keeps_the_topics_sensor(
    daemon: Callable[..., Daemon], mode: str, publish: Any, topic_root: str, db: Any
) -> None:
    proc = daemon("--sensor-id-from-topic")
    own = f"{topic_root}/dev-a/readings"
    await publish(
        [
            (own, orjson.dumps({"ts": NOW, "sensor_id": "dev-a", "temp": 1.0})),
            (own, orjson.dumps({"ts": NOW + 1, "sensor_id": "dev-b", "temp": 2.0})),
            (
                own,
                orjson.dumps(
                    [{"ts": NOW + 2, "temp": 3.0}, {"ts": NOW + 3, "sensor_id": "x", "temp": 4.0}]
                ),
            ),
        ]
    )
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 3)
    assert await sensors_of(db, mode) == [("dev-a", 1.0), ("dev-a", 3.0)]
    rejects = await db.rejects.find({"reason": "sensor_id_mismatch"}).to_list()
    assert sorted(r.get("index", -1) for r in rejects) == [-1, 1]
    assert proc.stop() == 0
