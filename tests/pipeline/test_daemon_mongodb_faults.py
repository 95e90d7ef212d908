"""The daemon against MongoDB faults on the write path: a real process, the real broker,
the real driver over the wire, the server's failCommand fail point (see
docs/mongodb-errors.md, whose table names these tests)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from ingest.store.schema import BUCKET_INDEX
from tests.support.mongo import failpoint, stored, stored_values
from tests.support.procs import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon

NOW = time.time()


def one(topic_root: str, sensor: str, i: int) -> tuple[str, bytes]:
    payload = {"ts": NOW - 600 + i / 10, "seq": i, "temp": 20 + i / 10}
    return f"{topic_root}/{sensor}/readings", orjson.dumps(payload)


def alive(proc: Daemon) -> bool:
    assert proc.process is not None
    return proc.process.poll() is None


async def test_a_settle_lookup_refused_for_a_missing_privilege_is_retried_not_fatal(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    """The same readings published again collide with the stored ones; the lookup that
    settles them (an aggregate) is refused with 13 Unauthorized, as with a role that
    lacks ``find``. The daemon stays up, unready, retrying with backoff, and settles
    them once the privilege is back: no crash loop on the redelivery."""
    proc = daemon()
    messages = [one(topic_root, "s1", i) for i in range(3)]
    await publish(messages)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 3)
    async with failpoint(mongo, ["aggregate"], code=13):
        await publish(messages)
        await eventually(
            lambda: proc.metric('ingest_write_errors_total{kind="transient",mode="bucket"}') >= 2
        )
        assert alive(proc)
        await eventually(lambda: proc.readyz() == 503)
        assert proc.metric("ingest_messages_acked_total") == 3
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 6)
    assert proc.metric('ingest_duplicate_readings_total{mode="bucket"}') == 3
    assert await stored_values(db, "bucket", "seq") == [0, 1, 2]
    assert alive(proc)
    assert "code 13" in proc.logs()


async def test_a_dropped_index_is_created_again_and_no_reading_goes_to_rejects(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any
) -> None:
    """The upserts name their index in a ``hint``; with the index dropped the server
    refuses each one with BadValue. That is the schema gone, not bad data."""
    proc = daemon()
    await publish([one(topic_root, "s1", 0)])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    await db.buckets.drop_index(BUCKET_INDEX)
    await publish([one(topic_root, f"s{i}", i) for i in range(1, 4)])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 4)
    assert await stored(db, "bucket") == 4
    assert await db.rejects.count_documents({}) == 0
    assert proc.metric('ingest_readings_rejected_total{reason="write_rejected"}') == 0
    assert BUCKET_INDEX in await db.buckets.index_information()
    assert "ensuring the schema again" in proc.logs()


def rss_bytes(proc: Daemon) -> int:
    assert proc.process is not None
    with Path(f"/proc/{proc.process.pid}/status").open(encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("qos", [1, 0])
async def test_messages_with_no_accepted_reading_are_bounded_in_bytes_during_an_outage(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any, mongo: Any, qos: int
) -> None:
    """250 invalid 200 KB messages (50 MB) while MongoDB refuses every insert: none has
    a reading, so only the byte bound stops the pipeline taking them. It holds at most
    the bound plus one message, says so in ``ingest_buffered_bytes`` and ``/readyz``.
    Receive Maximum (30,000 by default) does not stop the broker sending them, and QoS 0
    has no flow control at all: the inbox's own byte bound (a quarter of the bound) stops
    the daemon reading. The process grows by at most the two bounds and a packet, not
    by the 50 MB published, and nothing is lost."""
    bound, size, count = 2 << 20, 200_000, 250
    proc = daemon("--max-buffered-bytes", str(bound), "--batch-size", "10")
    before = rss_bytes(proc)
    bad = [(f"{topic_root}/s1/readings", b"{" + b"x" * size) for _ in range(count)]
    async with failpoint(mongo, ["insert"]):
        await publish(bad, qos=qos)
        await eventually(lambda: proc.readyz() == 503)
        await eventually(lambda: proc.metric("ingest_mqtt_read_paused") == 1)
        time.sleep(1.0)
        metrics = proc.metrics()
        assert metrics["ingest_buffer_limit_bytes"] == bound
        assert bound <= metrics["ingest_buffered_bytes"] <= bound + size + 4096
        assert metrics["ingest_messages_received_total"] <= bound // size + 1
        assert metrics["ingest_buffered_readings"] == 0
        assert metrics["ingest_inbox_limit_bytes"] == bound // 4
        assert metrics["ingest_inbox_bytes"] <= bound // 4 + size + 4096
        grown = rss_bytes(proc) - before
        print(  # noqa: T201
            f"\n{count} x {size} B invalid messages at QoS {qos} during an outage: "
            f"ingest_buffered_bytes {metrics['ingest_buffered_bytes']:.0f} "
            f"(bound {bound}), ingest_inbox_bytes {metrics['ingest_inbox_bytes']:.0f}, "
            f"RSS {before / 2**20:.1f} -> {(before + grown) / 2**20:.1f} MiB"
        )
        assert grown < bound + bound // 4 + size + (8 << 20)
    await eventually(lambda: proc.metric("ingest_messages_received_total") == count, timeout=90)
    await eventually(lambda: proc.metric("ingest_rejects_written_total") == count, timeout=90)
    assert await db.rejects.count_documents({"reason": "invalid_json"}) == count
    await eventually(lambda: proc.readyz() == 200)
    assert proc.metric("ingest_buffered_bytes") == 0
    assert proc.metric("ingest_mqtt_reconnects_total") == 0


async def test_a_start_refused_for_a_missing_privilege_waits_unready_instead_of_exiting(
    daemon: Callable[..., Daemon], publish: Any, topic_root: str, db: Any, mongo: Any
) -> None:
    """listCollections refused with 13 Unauthorized (a role without the privilege): the
    daemon stays up, unready, retrying with backoff and saying why, and starts once the
    privilege is granted: no crash loop."""
    async with failpoint(mongo, ["listCollections"], code=13):
        proc = daemon(wait_ready=False)
        await eventually(lambda: "cannot prepare MongoDB collections" in proc.logs())
        await eventually(lambda: proc.logs().count("cannot prepare MongoDB collections") >= 2)
        assert alive(proc)
        assert proc.readyz() == 503
    proc.wait_ready(timeout=30)
    await publish([one(topic_root, "s1", 0)])
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 1)
    assert await stored(db, "bucket") == 1
