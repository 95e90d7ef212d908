"""--workers N: N consumer processes, one shared group, one endpoint, stopped together.

The integration tests run the real daemon (``python -m ingest run``) against the real
mosquitto and MongoDB through the driver; switching the worker count in both directions
must neither strand the messages queued while the daemon was down nor deliver them twice.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from ingest.cli import build_parser, settings_from
from ingest.config import Settings
from ingest.errors import ConfigError
from ingest.metrics import Metrics
from ingest.pipeline.worker_sessions import worker_client_id
from ingest.pipeline.workers import (
    AUTO_MAX,
    auto_workers,
    cgroup_cpus,
    worker_settings,
)
from ingest.pipeline.workers_endpoint import merge
from loadgen import sparkplug as enc
from loadgen.daemons import parse_metrics
from loadgen.sparkplug import Metric
from tests.support.mongo import failpoint, stored
from tests.support.procs import eventually, password_broker

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.procs import Daemon


NOW = int(time.time() * 1000)


def reading(topic_root: str, sensor: int, second: int) -> tuple[str, str]:
    payload = {
        "sensor_id": f"s{sensor}",
        "ts": f"2026-01-01T00:00:{second:02d}Z",
        "temp": float(second),
    }
    return f"{topic_root}/s{sensor}", json.dumps(payload)


def batch(topic_root: str, start: int, count: int) -> list[tuple[str, str]]:
    """``count`` readings of 10 sensors, each (sensor, second) unique."""
    return [reading(topic_root, n % 10, n // 10) for n in range(start, start + count)]


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


# --------------------------------------------------------------------------- settings


def test_auto_is_the_cpu_quota_of_the_cgroup_rounded_up(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpus(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path) == 1
    assert 1 <= auto_workers() <= AUTO_MAX


@pytest.mark.parametrize(("given", "expected"), [("3", 3), ("1", 1), ("auto", None)])
def test_workers_flag_and_environment(given: str, expected: int | None) -> None:
    for argv, env in ((["run", "--workers", given], {}), (["run"], {"INGEST_WORKERS": given})):
        settings = settings_from(build_parser(env).parse_args(argv), env)
        assert settings.workers == (expected or auto_workers())


@pytest.mark.parametrize("given", ["0", "65", "many"])
def test_a_bad_workers_value_is_one_line_naming_the_flag(given: str) -> None:
    with pytest.raises(ConfigError, match=r"^--workers: "):
        settings_from(build_parser({}).parse_args(["run", "--workers", given]), {})


def test_worker_ids_and_the_derived_group() -> None:
    settings = Settings(client_id="ingest-bucket-host.example", topics=("a/#", "b/+"), workers=3)
    assert settings.derived_group == "ingest-bucket-host-example"
    zero, two = worker_settings(settings, 0), worker_settings(settings, 2)
    assert zero.client_id == "ingest-bucket-host.example"  # keeps the one-worker session
    assert (
        two.client_id == worker_client_id(settings.client_id, 2) == "ingest-bucket-host.example-w2"
    )
    assert (
        zero.subscriptions
        == two.subscriptions
        == ("$share/ingest-bucket-host-example/a/#", "$share/ingest-bucket-host-example/b/+")
    )
    # Each form unsubscribes the other, which a session of the other worker count holds.
    assert zero.other_subscriptions == ("a/#", "b/+")
    assert settings.other_subscriptions == zero.subscriptions
    given = worker_settings(Settings(shared_group="g", client_id="c", workers=2), 1)
    assert given.subscriptions == ("$share/g/sensors/#",)


def test_merged_metrics_sum_counters_and_histograms_and_apply_the_gauge_rules() -> None:
    texts = []
    for received, connected in ((3, 1), (4, 0)):
        metrics = Metrics("bucket", CollectorRegistry())
        metrics.messages_received.inc(received)
        metrics.batch_write_seconds.observe(0.2)
        metrics.mqtt_connected.set(connected)
        metrics.mongodb_up.set(1)
        metrics.buffered_readings.set(received * 10)
        metrics.info.labels("bucket", "false").set(1)
        texts.append(generate_latest(metrics.registry).decode())
    assert merge(texts[:1]).decode() == texts[0]  # one worker: exactly its own text
    merged = parse_metrics(merge(texts).decode())
    assert merged["ingest_messages_received_total"] == 7
    assert merged['ingest_batch_write_seconds_count{mode="bucket"}'] == 2
    assert merged['ingest_batch_write_seconds_bucket{le="0.25",mode="bucket"}'] == 2
    assert merged["ingest_mqtt_connected"] == 0  # one worker is disconnected
    assert merged["ingest_mongodb_up"] == 1
    assert merged["ingest_buffered_readings"] == 70
    assert merged['ingest_info{dry_run="false",mode="bucket"}'] == 1
    assert merged["ingest_workers"] == 2


# --------------------------------------------------------------------------- the daemon


async def test_two_workers_share_the_stream_behind_one_endpoint_and_stop_together(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    proc = daemon("--workers", "2")
    assert proc.process is not None
    workers = children(proc.process.pid)
    assert len(workers) == 2
    await publish(batch(topic_root, 0, 60))
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 60)
    assert await stored(db, "bucket") == 60
    metrics = proc.metrics()
    assert metrics["ingest_workers"] == 2
    assert metrics["ingest_messages_received_total"] == 60
    assert metrics["ingest_mqtt_connected"] == 1
    assert proc.readyz() == 200
    logs = proc.logs()
    assert f"client ids ingest-{topic_root}, ingest-{topic_root}-w1" in logs
    assert "[worker 1]: connected to 127.0.0.1:" in logs
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
    assert logs.count("in-flight batches written and acknowledged") <= 2
    for pid in workers:
        assert (
            not Path(f"/proc/{pid}").exists()
            or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        )


async def test_readyz_names_the_worker_that_is_not_ready(daemon: Callable[..., Daemon]) -> None:
    proc = daemon("--workers", "2")
    assert proc.process is not None
    second = children(proc.process.pid)[1]
    assert proc.metrics()["ingest_workers"] == 2
    os.kill(second, signal.SIGSTOP)  # alive, but answers nothing
    try:
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/readyz", timeout=20)
        assert answer.value.code == 503
        assert answer.value.read().decode() == "worker 1: no answer\n"
        # Its last answer stands in for it, so the sums do not fall back meanwhile.
        assert proc.metrics()["ingest_workers"] == 2
    finally:
        os.kill(second, signal.SIGCONT)
    assert proc.readyz() == 200
    assert proc.stop() == 0


def signal_worker(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


async def test_a_worker_that_dies_stops_the_others_and_the_daemon_exits_1(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    proc = daemon("--workers", "2")
    assert proc.process is not None
    first, second = children(proc.process.pid)
    signal_worker(second)
    assert proc.wait() == 1
    logs = proc.logs()
    assert "worker 1 exited with status killed by signal 9; stopping the others" in logs
    assert "[worker 0]: in-flight batches written and acknowledged" in logs
    assert (
        not Path(f"/proc/{first}/cmdline").exists()
        or Path(f"/proc/{first}/stat").read_text().split()[2] == "Z"
    )


async def test_one_to_two_workers_takes_the_queue_and_drops_the_plain_subscription(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    proc = await switch_async(daemon, publish, db, topic_root, "1", "2")
    metrics = proc.metrics()
    # Worker 0 resumed the one-worker session (40 queued) and unsubscribed its plain
    # filter: the 40 new messages came once, through the group.
    assert metrics["ingest_messages_received_total"] == 80
    assert metrics['ingest_duplicate_readings_total{mode="bucket"}'] == 0
    assert proc.stop() == 0


async def test_two_to_one_worker_drains_and_ends_the_retired_session(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    # A short shutdown timeout: the process's watchdog (armed by a signal, 16 s here) must
    # not be armed by the end of the drain.
    proc = await switch_async(daemon, publish, db, topic_root, "2", "1", "--shutdown-timeout", "1")
    logs = proc.logs()
    # The group spread the 40 queued messages over both sessions: the retired worker's
    # were taken (by a drain of its session) and the session ended.
    assert f"session ingest-{topic_root}-w1 drained and ended" in logs
    metrics = proc.metrics()
    drained = 40 - (metrics["ingest_messages_received_total"] - 40)
    assert 0 < drained < 40
    assert metrics['ingest_duplicate_readings_total{mode="bucket"}'] == 0
    await asyncio.sleep(17)
    assert proc.process is not None
    assert proc.process.poll() is None, proc.logs()
    assert proc.stop() == 0
    # The next start finds no session left to drain.
    again = daemon("--workers", "1")
    assert again.stop() == 0
    assert "taking the messages queued" not in again.logs()


async def switch_async(
    daemon: Callable[..., Daemon],
    publish: Callable[..., Any],
    db: Any,
    topic_root: str,
    before: str,
    after: str,
    *extra: str,
) -> Daemon:
    """Run with ``before`` workers, stop, publish while down, run with ``after``, publish
    again: every message stored once (the received counts are checked by the caller)."""
    first = daemon("--workers", before)
    await publish(batch(topic_root, 0, 20))
    await eventually(lambda: first.metric("ingest_messages_acked_total") == 20)
    assert first.stop() == 0
    await publish(batch(topic_root, 20, 40))  # queued in the sessions while down
    second = daemon("--workers", after, *extra)
    await publish(batch(topic_root, 60, 40))  # through the subscriptions held now
    deadline = time.monotonic() + 30
    while await stored(db, "bucket") < 100 and time.monotonic() < deadline:
        await eventually(lambda: True, timeout=0.2)
    assert await stored(db, "bucket") == 100
    await eventually(
        lambda: (
            second.metric("ingest_messages_acked_total")
            == second.metric("ingest_messages_received_total")
        )
    )
    return second


@pytest.mark.process
def test_a_start_up_error_of_the_workers_is_one_line_from_the_parent(tmp_path: Path) -> None:
    from tests.pipeline.test_startup import failure_line, ingest  # noqa: PLC0415

    broker = password_broker(tmp_path, "alice", "right")
    broker.start()
    try:
        result = ingest(
            "run",
            "--workers",
            "3",
            "--dry-run",
            "--metrics-port",
            "0",
            "--mqtt-url",
            f"mqtt://alice:wrong@127.0.0.1:{broker.port}",
        )
    finally:
        broker.stop()
    line = failure_line(result, 1)
    assert "refused" in line
    assert result.stderr.count("ingest: error:") == 1


async def test_workers_whose_parent_is_killed_drain_and_exit(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], db: Any, topic_root: str
) -> None:
    proc = daemon("--workers", "2")
    assert proc.process is not None
    workers = children(proc.process.pid)
    await publish(batch(topic_root, 0, 10))
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 10)
    proc.process.kill()
    proc.wait()

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() for pid in workers)

    await eventually(gone, timeout=30)
    logs = proc.logs()
    assert logs.count("the parent process is gone: draining and stopping") == 2
    assert "[worker 1]: stopped" in logs


async def test_sparkplug_and_dry_run_run_in_the_workers(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], topic_root: str
) -> None:
    """The workers share a group, so the preset's BIRTH and DEATH filters are subscribed
    unshared: every worker receives every BIRTH (docs/sparkplug.md, shared groups)."""
    proc = daemon(
        "--workers", "2", "--preset", "sparkplug", "--dry-run", "--topic", f"spBv1.0/{topic_root}/#"
    )
    births = [
        (
            enc.topic(topic_root, "NBIRTH", f"E{n}"),
            enc.nbirth([Metric("Temp", 1, NOW, enc.DOUBLE, 20.5)], bd_seq=0, timestamp=NOW),
        )
        for n in range(6)
    ]
    await publish(births)
    await eventually(lambda: proc.metric("ingest_messages_acked_total") == 12)
    metrics = proc.metrics()
    assert metrics['ingest_sparkplug_messages_total{type="NBIRTH"}'] == 12  # 6 per worker
    assert metrics['ingest_info{dry_run="true",mode="bucket"}'] == 1
    assert metrics["ingest_workers"] == 2
    assert proc.stop() == 0


def test_workers_never_give_a_sensor_the_same_arrival_millisecond() -> None:
    """A device's burst of one-value messages is spread over the workers by the group:
    each worker gives its own residue of milliseconds, so no two readings collide."""
    from ingest.devices.decode import Arrivals  # noqa: PLC0415

    workers = [Arrivals() for _ in range(3)]
    for index, arrivals in enumerate(workers):
        arrivals.spread(index, 3)
    now = math.floor(time.time() * 1000) + 123
    given = [arrivals.next("shelly1pm-84CCA8ADE5E2", now) for arrivals in workers for _ in range(3)]
    assert len(set(given)) == 9
    assert max(given) - now < 9
    assert [g % 3 for g in given] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_the_default_format_and_the_rules_time_a_burst_apart_the_same_way() -> None:
    """Readings without a time of one sensor never meet at one instant, whichever path
    decodes them: each gives the next millisecond of its sensor."""
    from ingest.devices.decode import Arrivals, Limits, decode  # noqa: PLC0415
    from ingest.devices.mapping import Mapping  # noqa: PLC0415

    mapping = Mapping.load(None, ["shelly"])
    now = math.floor(time.time()) + 0.1234
    given: list[Any] = []
    for topic in ("relay/0/power", "relay/0/energy", "temperature"):
        decoded = mapping.decode(f"shellies/shelly-burst/{topic}", b"1.5", now, Limits()).decoded
        given.extend(reading.ms for reading in decoded.readings)
    start = math.floor(now * 1000)
    assert given == list(range(start, start + 3))
    arrivals = Arrivals()
    decoded = decode(
        "sensors/shelly-burst/x", b'[{"t": 1}, {"t": 2}]', now, Limits(), None, arrivals
    )
    decoded_too = decode("sensors/shelly-burst/x", b'{"t": 3}', now, Limits(), None, arrivals)
    assert [r.ms for r in decoded.readings + decoded_too.readings] == [start, start + 1, start + 2]


async def test_a_second_signal_makes_every_worker_exit_without_its_writes(
    daemon: Callable[..., Daemon], publish: Callable[..., Any], mongo: Any, topic_root: str
) -> None:
    proc = daemon("--workers", "2", "--shutdown-timeout", "120")
    async with failpoint(mongo, ["update"]):  # every bucket write fails, and is retried
        await publish(batch(topic_root, 0, 20))
        await eventually(lambda: proc.metric("ingest_messages_received_total") == 20)
        proc.signal(signal.SIGTERM)
        await eventually(lambda: proc.logs().count("draining in-flight batches") == 2)
        assert proc.process is not None
        assert proc.process.poll() is None  # draining: the writes cannot succeed
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    logs = proc.logs()
    assert "signal received: forcing every worker" in logs
    for index in (0, 1):
        assert f"[worker {index}]: second signal: exiting without waiting" in logs
