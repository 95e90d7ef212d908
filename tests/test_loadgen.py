"""The load generator: rate control, payloads, seq accounting, verify, and a run end to end."""

from __future__ import annotations

import io
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymongo import MongoClient

from ingest.devices.decode import Limits, decode
from loadgen import payloads
from loadgen.cli import _progress_printer, main
from loadgen.config import ConfigError, parse_start, parse_step
from loadgen.payloads import message_plan
from loadgen.ratelimit import Pacer
from loadgen.verify import Expected, check_bucket_document
from tests.support.mongo import stored
from tests.support.procs import ROOT, eventually, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.support.procs import Broker, Daemon

START_MS = 1_795_251_600_000  # 2026-11-21T09:00:00Z, an hour boundary
RUN = payloads.Run(
    seed=7, sensor_prefix="lgt", sensors=2, per_message=1, start_ms=START_MS, step_ms=1000
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- rate control -----------------------------------------------------------------------


def test_pacer_allows_the_first_reading_at_once_then_rate_times_elapsed() -> None:
    clock = FakeClock()
    pacer = Pacer(100.0, clock, burst=1000)
    assert pacer.allowance() == 1
    pacer.record(1)
    assert pacer.allowance() == 0
    assert pacer.wait_time() == pytest.approx(0.005)  # capped at one sleep slice
    clock.now += 0.5
    assert pacer.allowance() == 50
    assert pacer.backlog() == 49
    pacer.record(50)
    assert pacer.backlog() == 0
    clock.now += 100
    assert pacer.allowance() == 1000  # a burst at most; the rest stays owed
    assert pacer.backlog() == 10_000 - 1


def test_pacer_without_a_rate_never_waits() -> None:
    pacer = Pacer(0.0, FakeClock(), burst=256)
    pacer.record(10**9)
    assert pacer.allowance() == 256
    assert pacer.wait_time() == 0.0
    assert pacer.backlog() == 0


@pytest.mark.parametrize(
    ("rate", "per_message"), [(50.0, 1), (1000.0, 1), (20_000.0, 10), (333.0, 7)]
)
def test_paced_loop_holds_the_rate_within_two_percent(rate: float, per_message: int) -> None:
    clock = FakeClock()
    pacer = Pacer(rate, clock, burst=1000)
    sent, end = 0, clock.now + 10.0
    while clock.now < end:
        allowance = pacer.allowance()
        if allowance == 0:
            clock.now += max(pacer.wait_time(), 1e-4)
            continue
        batch = 0
        while batch < allowance:  # whole messages, as the worker does
            batch += per_message
        pacer.record(batch)
        sent += batch
        clock.now += 1e-5  # sending costs a little time
    assert sent / 10.0 == pytest.approx(rate, rel=0.02)


# --- payloads ---------------------------------------------------------------------------


def test_single_reading_message_is_one_object_the_daemon_accepts() -> None:
    model = payloads.Model(RUN.seed)
    body = payloads.message(RUN, model, model.shape(1), 3, 1)
    doc = orjson.loads(body)
    assert set(doc) == {"ts", "seq", "hum", "temp"}
    assert doc["seq"] == 3
    assert doc["ts"] == (START_MS + 3000) / 1000
    decoded = decode(RUN.topic(1), body, doc["ts"] + 60, Limits())
    assert not decoded.rejections
    assert decoded.readings[0].sensor_id == "lgt-1"


def test_several_readings_make_an_envelope_with_consecutive_seqs() -> None:
    run = payloads.Run(7, "lgt", 2, 5, START_MS, 250)
    model = payloads.Model(run.seed)
    doc = orjson.loads(payloads.message(run, model, model.shape(0), 10, 5))
    assert set(doc) == {"sensor_id", "readings"}
    assert doc["sensor_id"] == "lgt-0"
    assert [r["seq"] for r in doc["readings"]] == [10, 11, 12, 13, 14]
    assert [r["ts"] for r in doc["readings"]] == [
        (START_MS + s * 250) / 1000 for s in range(10, 15)
    ]
    # The short last message of a sensor is still an envelope.
    short = orjson.loads(payloads.message(run, model, model.shape(0), 15, 2))
    assert len(short["readings"]) == 2


def test_values_are_reproducible_from_the_seed_and_rounded_to_milli_units() -> None:
    first, again, other = payloads.Model(7), payloads.Model(7), payloads.Model(8)
    values = [first.values(first.shape(i), s, RUN.ts_ms(s)) for i in range(3) for s in range(50)]
    assert values == [
        again.values(again.shape(i), s, RUN.ts_ms(s)) for i in range(3) for s in range(50)
    ]
    assert values != [
        other.values(other.shape(i), s, RUN.ts_ms(s)) for i in range(3) for s in range(50)
    ]
    assert all(round(v, 3) == v for pair in values for v in pair)
    hums, temps = zip(*values, strict=True)
    assert 10 < min(temps) < max(temps) < 35
    assert 20 < min(hums) < max(hums) < 80
    assert len(set(temps)) > 100  # noise, not a constant


@given(
    seed=st.integers(0, 2**31),
    index=st.integers(0, 10**6),
    first=st.integers(0, 10**7),
    count=st.integers(1, 5),
    step_ms=st.integers(1, 60_000),
)
def test_what_the_daemon_decodes_is_what_verify_expects(
    seed: int, index: int, first: int, count: int, step_ms: int
) -> None:
    run = payloads.Run(seed, "lgp", index + 1, count, START_MS - 10**9, step_ms)
    model = payloads.Model(seed)
    shape = model.shape(index)
    body = payloads.message(run, model, shape, first, count)
    last_ts = run.ts_ms(first + count - 1) / 1000
    decoded = decode(run.topic(index), body, last_ts, Limits(max_past_seconds=1e12))
    assert not decoded.rejections
    for offset, got in enumerate(decoded.readings):
        seq = first + offset
        hum, temp = model.values(shape, seq, run.ts_ms(seq))
        assert (got.sensor_id, got.seq, got.values) == (
            run.sensor_id(index),
            seq,
            {"hum": hum, "temp": temp},
        )
        # BSON keeps milliseconds: the stored date is exactly the expected one.
        assert got.ts.microsecond % 1000 == 0
        assert round(got.ts.timestamp() * 1000) == run.ts_ms(seq)


def test_values_drift_slowly_plus_noise() -> None:
    model = payloads.Model(3)
    shape = model.shape(0)
    temps = [model.values(shape, s, START_MS + s * 60_000)[1] for s in range(360)]  # 6 hours
    steps = [abs(b - a) for a, b in itertools.pairwise(temps)]
    assert max(steps) < 2.0  # no jumps between neighbouring minutes
    assert max(temps) - min(temps) > 1.0  # but a drift over hours


# --- seq accounting ---------------------------------------------------------------------


@pytest.mark.parametrize("per_message", [1, 3, 10])
def test_every_sensor_publishes_each_seq_once_without_gaps(per_message: int) -> None:
    sensors = [0, 2, 4]
    limits = [10, 7, 0]
    seen: dict[int, list[int]] = {s: [] for s in sensors}
    for pos, first, count in message_plan(sensors, limits, per_message):
        assert 1 <= count <= per_message
        seen[sensors[pos]].extend(range(first, first + count))
    assert seen == {0: list(range(10)), 2: list(range(7)), 4: []}


def test_plan_without_limits_goes_round_robin_forever() -> None:
    plan = message_plan([5, 6], None, 2)
    assert [next(plan) for _ in range(5)] == [(0, 0, 2), (1, 0, 2), (0, 2, 2), (1, 2, 2), (0, 4, 2)]


def test_count_and_sensors_are_split_evenly_over_sensors_and_workers() -> None:
    assert payloads.split_count(10, 4) == [3, 3, 2, 2]
    shares = [payloads.worker_sensors(7, 3, w) for w in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(7))


# --- start and time step ----------------------------------------------------------------


def test_start_accepts_iso_epoch_and_relative_forms() -> None:
    now = 1_800_000_000.0
    assert parse_start("2026-11-21T09:00:00Z", now) == START_MS
    assert parse_start("2026-11-21T10:00:00+01:00", now) == START_MS
    assert parse_start("1795251600.5", now) == START_MS + 500
    assert parse_start("now", now) == 1_800_000_000_000
    assert parse_start("now-6h", now) == 1_800_000_000_000 - 6 * 3_600_000
    assert parse_start("now-90s", now) == 1_800_000_000_000 - 90_000
    with pytest.raises(ConfigError, match="--start"):
        parse_start("yesterday", now)
    with pytest.raises(ConfigError, match="relative"):
        parse_start("now-1h", now, allow_relative=False)


def test_time_step_is_whole_milliseconds_and_gives_each_reading_its_time() -> None:
    assert parse_step(1) == 1000
    assert parse_step(0.25) == 250
    with pytest.raises(ConfigError, match="--time-step"):
        parse_step(0.0004)
    run = payloads.Run(1, "p", 1, 1, parse_start("now-6h", 1_800_000_000.0), parse_step(10))
    assert run.ts_ms(2160) - run.ts_ms(0) == 6 * 3_600_000  # six hours of data at 10 s


def test_publish_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", "--sensors", "3"], env={}) == 2
    assert capsys.readouterr().err.strip() == (
        "loadgen: error: --duration/--count: give exactly one of them"
    )
    assert main(["publish", "--count", "3", "--per-message", "0"], env={}) == 2
    assert main(["publish", "--count", "3"], env={"LOADGEN_QOS": "2"}) == 2
    assert "--qos" in capsys.readouterr().err
    assert main(["verify", "--sensors", "3"], env={}) == 2
    assert "required without --manifest" in capsys.readouterr().err


def test_progress_line_shows_rate_sent_acked_errors_and_backlog() -> None:
    out = io.StringIO()
    show = _progress_printer(out, time.monotonic() - 1.0)
    show([5000.0, 5000.0, 4990.0, 1.0, 20.0])
    line = out.getvalue()
    assert line.startswith("\r")
    assert "\n" not in line
    for part in ("readings/s", "sent 5,000", "acked 4,990", "errors 1", "backlog 20"):
        assert part in line


def test_publish_to_an_absent_broker_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["publish", "--mqtt-url", f"mqtt://127.0.0.1:{free_port()}", "--count", "5"], env={}
    )
    assert code == 2
    assert "cannot connect" in capsys.readouterr().err
    # 1,000 readings a second apart from now end 16 minutes ahead: the daemon would refuse.
    main(
        [
            "publish",
            "--mqtt-url",
            f"mqtt://127.0.0.1:{free_port()}",
            "--count",
            "1000",
            "--sensors",
            "1",
            "--time-step",
            "1",
        ],
        env={},
    )
    assert "outside the daemon's default window" in capsys.readouterr().err


# --- verify -----------------------------------------------------------------------------


def _date(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _stored(run: payloads.Run, index: int, seq: int) -> dict[str, Any]:
    model = payloads.Model(run.seed)
    hum, temp = model.values(model.shape(index), seq, run.ts_ms(seq))
    return {"ts": _date(run.ts_ms(seq)), "seq": seq, "hum": hum, "temp": temp}


def _bucket(sensor_id: str, readings: list[dict[str, Any]]) -> dict[str, Any]:
    stats = {}
    for name in ("hum", "temp"):
        column = [r[name] for r in readings]
        stats[name] = {
            "count": len(column),
            "sum": sum(column),
            "min": min(column),
            "max": max(column),
        }
    stamps = [r["ts"] for r in readings]
    return {
        "sensor_id": sensor_id,
        "tags": {},
        "bucket_start": _date(START_MS),
        "readings": readings,
        "count": len(readings),
        "stats": stats,
        "first_ts": min(stamps),
        "last_ts": max(stamps),
        "schema_version": 2,
    }


@pytest.fixture
def sync_db(mongo_uri: str, db_name: str) -> Iterator[Any]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    yield client[db_name]
    client.drop_database(db_name)
    client.close()


def _damaged_state(sync_db: Any) -> None:
    """Sensor 0: seq 2 missing, seq 3 twice, seq 4 wrong; sensor 1: one bad bucket count."""
    good0 = [_stored(RUN, 0, s) for s in (0, 1, 3)]
    wrong = _stored(RUN, 0, 4) | {"temp": 99.999}
    # One stray reading of another run's sensor: not this run's business.
    stray = _bucket("other-0", [_stored(RUN, 0, 0)])
    bad = _bucket("lgt-1", [_stored(RUN, 1, s) for s in range(5)])
    bad["stats"]["temp"]["max"] += 1
    sync_db.buckets.insert_many(
        [_bucket("lgt-0", [*good0, wrong]), _bucket("lgt-0", [_stored(RUN, 0, 3)]), bad, stray]
    )
    docs = [*good0, wrong, _stored(RUN, 0, 3)]
    ts_docs = [{"ts": d["ts"], "meta": {"sensor_id": "lgt-0"}, **d} for d in docs]
    ts_docs += [
        {"ts": d["ts"], "meta": {"sensor_id": "lgt-1"}, **d}
        for d in (_stored(RUN, 1, s) for s in range(5))
    ]
    sync_db.readings.insert_many(ts_docs)


def _write_manifest(path: Path, counts: list[int]) -> str:
    manifest = {
        "version": 1,
        "seed": RUN.seed,
        "sensor_prefix": RUN.sensor_prefix,
        "sensors": RUN.sensors,
        "per_message": 1,
        "start_ms": RUN.start_ms,
        "step_ms": RUN.step_ms,
        "counts": counts,
    }
    path.write_text(json.dumps(manifest))
    return str(path)


def test_verify_counts_missing_duplicated_wrong_and_bad_buckets(
    sync_db: Any, mongo_uri: str, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _damaged_state(sync_db)
    manifest = _write_manifest(tmp_path / "m.json", [5, 5])
    code = main(
        [
            "verify",
            "--manifest",
            manifest,
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--mode",
            "both",
            "--json",
        ],
        env={},
    )
    assert code == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["ok"]
    bucket, series = result["modes"]
    for report in (bucket, series):
        assert (report["expected"], report["found"]) == (10, 10)
        assert (report["missing"], report["duplicated"], report["wrong"], report["unexpected"]) == (
            1,
            1,
            1,
            0,
        )
    assert bucket["documents"] == 3
    assert bucket["bad_documents"] == 1
    assert any("stats.temp.min/max" in e for e in bucket["examples"])
    assert series["bad_documents"] == 0


def test_verify_passes_on_exact_data_and_flags_readings_beyond_the_run(
    sync_db: Any, mongo_uri: str, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sync_db.buckets.insert_many(
        [
            _bucket("lgt-0", [_stored(RUN, 0, s) for s in range(3)]),
            _bucket("lgt-1", [_stored(RUN, 1, s) for s in range(2)]),
        ]
    )
    args = [
        "verify",
        "--mongodb-uri",
        mongo_uri,
        "--db",
        db_name,
        "--seed",
        "7",
        "--sensor-prefix",
        "lgt",
        "--sensors",
        "2",
        "--count",
        "5",
        "--start",
        "2026-11-21T09:00:00Z",
        "--time-step",
        "1",
    ]
    assert main(args, env={}) == 0
    assert "bucket (buckets): OK" in capsys.readouterr().out
    assert main([*args[:-6], "--count", "4", *args[-4:]], env={}) == 1  # seq 2 of lgt-0 extra
    assert "unexpected 1" in capsys.readouterr().out


def test_verify_exits_2_when_mongodb_is_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _write_manifest(tmp_path / "m.json", [1, 1])
    code = main(
        [
            "verify",
            "--manifest",
            manifest,
            "--mongodb-uri",
            f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=300",
        ],
        env={},
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("loadgen: cannot reach MongoDB")
    assert err.count("\n") == 1


def _trickle(sync_db: Any, docs: list[dict[str, Any]], every: float) -> threading.Thread:
    """Insert ``docs`` one by one, ``every`` seconds apart, as a daemon that lags would."""

    def insert() -> None:
        for doc in docs:
            time.sleep(every)
            sync_db.readings.insert_one(doc)

    thread = threading.Thread(target=insert, daemon=True)
    thread.start()
    return thread


def _series(counts: list[int]) -> list[dict[str, Any]]:
    return [
        {"meta": {"sensor_id": f"lgt-{i}"}, **_stored(RUN, i, seq)}
        for i, n in enumerate(counts)
        for seq in range(n)
    ]


def test_verify_tells_readings_still_arriving_from_missing_ones_and_waits_for_them(
    sync_db: Any, mongo_uri: str, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Right after a publish the daemon is still writing: not a MISMATCH but STILL
    ARRIVING; --wait polls until every reading is there, then checks."""
    manifest = _write_manifest(tmp_path / "m.json", [5, 5])
    args = [
        "verify",
        "--manifest",
        manifest,
        "--mongodb-uri",
        mongo_uri,
        "--db",
        db_name,
        "--mode",
        "timeseries",
    ]
    sync_db.readings.insert_one(_series([1])[0])
    trickle = _trickle(sync_db, _series([5, 5])[1:], every=0.4)
    assert main(args, env={}) == 1
    out = capsys.readouterr().out
    assert "timeseries (readings): STILL ARRIVING: expected 10, found " in out, out
    assert "while checking)" in out
    assert "run verify again with --wait SECONDS" in out
    assert "MISMATCH" not in out
    started = time.monotonic()
    assert main([*args, "--wait", "60", "--json"], env={}) == 0
    assert time.monotonic() - started < 30  # done when the count matched, not at 60 s
    report = json.loads(capsys.readouterr().out)["modes"][0]
    assert (report["found"], report["missing"], report["still_arriving"]) == (10, 0, False)
    trickle.join()


def test_verify_wait_ends_when_the_count_stops_changing_and_a_loss_is_a_mismatch(
    sync_db: Any, mongo_uri: str, db_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon that stops short: the count moves, then no more; the wait ends at once."""
    docs = _series([3, 5])
    sync_db.readings.insert_many(docs[:6])
    manifest = _write_manifest(tmp_path / "m.json", [5, 5])
    trickle = _trickle(sync_db, docs[6:], every=0.3)
    started = time.monotonic()
    code = main(
        [
            "verify",
            "--manifest",
            manifest,
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db_name,
            "--mode",
            "timeseries",
            "--wait",
            "120",
            "--settle",
            "1",
        ],
        env={},
    )
    assert time.monotonic() - started < 30
    trickle.join()
    out = capsys.readouterr().out
    assert code == 1
    assert "timeseries (readings): MISMATCH: expected 10, found 8, missing 2," in out
    assert "lgt-0: 2 of 5 readings missing (first seq 3)" in out


@pytest.mark.parametrize(
    ("flag", "value"), [("--wait", "-1"), ("--settle", "0"), ("--wait", "nan")]
)
def test_verify_refuses_a_bad_wait_in_one_line(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _write_manifest(tmp_path / "m.json", [1, 1])
    assert main(["verify", "--manifest", manifest, flag, value], env={}) == 2
    assert capsys.readouterr().err.startswith(f"loadgen: error: {flag}: must be ")


def test_bucket_document_checks_are_exact_except_for_the_sum() -> None:
    readings = [_stored(RUN, 0, s) for s in range(4)]
    doc = _bucket("lgt-0", readings)
    doc["stats"]["hum"]["sum"] *= 1 + 1e-12  # another order of addition
    assert check_bucket_document(doc, 3_600_000) == []
    doc["count"] = 5
    doc["stats"]["hum"]["sum"] += 0.01
    doc["last_ts"] = _date(START_MS)
    problems = check_bucket_document(doc, 3_600_000)
    assert len(problems) == 3


def test_expected_from_a_count_run_matches_the_publisher_split() -> None:
    expected = Expected(RUN, tuple(payloads.split_count(5, 2)))
    assert expected.counts == (3, 2)
    assert expected.total == 5


# --- end to end -------------------------------------------------------------------------


def publish_command(
    broker: Broker,
    topic_root: str,
    manifest: Path,
    *,
    sensors: int,
    count: int,
    per_message: int,
    rate: int,
    start: str = "now-2h",
    time_step: str = "1",
    processes: int = 1,
) -> list[str]:
    """``loadgen publish`` of a counted QoS 1 run that writes its manifest, as JSON."""
    return [
        sys.executable,
        "-m",
        "loadgen",
        "publish",
        "--mqtt-url",
        broker.url,
        "--topic-prefix",
        topic_root,
        "--sensors",
        str(sensors),
        "--count",
        str(count),
        "--per-message",
        str(per_message),
        "--qos",
        "1",
        "--rate",
        str(rate),
        "--processes",
        str(processes),
        "--start",
        start,
        "--time-step",
        time_step,
        "--manifest",
        str(manifest),
        "--json",
    ]


async def test_published_run_arrives_exactly_once(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    mongo_uri: str,
    db_name: str,
    tmp_path: Path,
    sync_db: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = daemon()
    manifest = tmp_path / "run.json"
    count = 300
    started = time.monotonic()
    publish = subprocess.run(
        publish_command(
            broker,
            topic_root,
            manifest,
            sensors=6,
            count=count,
            per_message=4,
            rate=0,
            time_step="30",
            processes=2,
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert publish.returncode == 0, publish.stderr
    summary = json.loads(publish.stdout)
    # 50 readings per sensor: 12 messages of 4 and one of 2.
    assert (summary["readings"], summary["acked"], summary["errors"]) == (count, 6 * 13, 0)
    assert json.loads(manifest.read_text())["counts"] == [50] * 6

    # As a user runs it right after the publish: --wait until the daemon has written all.
    code = main(
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
            "--wait",
            "30",
        ],
        env={},
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"expected {count}, found {count}, missing 0, duplicated 0, wrong 0" in out
    assert time.monotonic() - started < 30
    assert proc.stop() == 0


async def test_sensors_without_a_time_and_repeated_messages_pass_verify(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    mongo_uri: str,
    db_name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--untimed-every 2: half the fleet sends no time (timed at arrival, checked by value);
    --repeat-every 1: every message of the other half twice (one reading each, stored once)."""
    proc = daemon()
    manifest = tmp_path / "run.json"
    count = 48
    command = publish_command(
        broker, topic_root, manifest, sensors=4, count=count, per_message=2, rate=0, time_step="30"
    )
    publish = subprocess.run(
        [*command, "--untimed-every", "2", "--repeat-every", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert publish.returncode == 0, publish.stderr
    summary = json.loads(publish.stdout)
    # 12 readings per sensor, 6 messages each; sensors 1 and 3 send every message twice.
    assert (summary["readings"], summary["messages"], summary["errors"]) == (count, 36, 0)
    assert json.loads(manifest.read_text())["untimed_every"] == 2
    await eventually(lambda: proc.metric("ingest_messages_acked_total") >= 36)
    code = main(
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
    assert proc.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}') == count / 2
    assert proc.stop() == 0


def test_every_nth_sensor_publishes_no_ts() -> None:
    run = payloads.Run(7, "s", 2, 1, 1_000_000, 1000, untimed_every=2)
    model = payloads.Model(7)
    untimed, timed = (payloads.reading(run, model, model.shape(i), 3) for i in (0, 1))
    assert (sorted(untimed), sorted(timed)) == (
        ["hum", "seq", "temp"],
        ["hum", "seq", "temp", "ts"],
    )
    assert timed["ts"] == 1_003


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_stopped_mid_stream_then_restarted_loses_nothing(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    mongo_uri: str,
    db_name: str,
    tmp_path: Path,
    db: Any,
    sig: signal.Signals,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stream of 1,200 readings; the daemon is stopped while it writes and restarted
    (same client id): verify finds nothing missing. SIGTERM writes and acks what it
    holds before exiting 0, so nothing is written twice in either mode; after SIGKILL
    bucket mode counts nothing twice, and time-series mode may store the readings of the
    writes in flight twice (the number is printed; see docs/delivery.md)."""
    # SIGTERM must write and ack everything it holds: give the drain all the time the
    # emulator needs under load (the default --shutdown-timeout, 10 s, can expire first,
    # and the messages of the writes then in flight come back as redeliveries).
    proc = daemon("--batch-size", "50", "--shutdown-timeout", "120")
    manifest = tmp_path / "run.json"
    count = 1200
    publisher = subprocess.Popen(
        publish_command(
            broker,
            topic_root,
            manifest,
            sensors=8,
            count=count,
            per_message=2,
            rate=300,
            start="now-1h",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        await eventually(lambda: proc.metric("ingest_messages_acked_total") >= 150)
        proc.signal(sig)
        assert proc.wait(timeout=150) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        if sig == signal.SIGTERM:
            assert "shutdown timeout" not in proc.logs().lower(), proc.logs()[-2000:]
        again = daemon("--batch-size", "50")
        out, err = publisher.communicate(timeout=60)
    finally:
        publisher.kill()
    assert publisher.returncode == 0, err
    assert json.loads(out)["readings"] == count
    await eventually(
        lambda: (
            again.metric("ingest_buffered_readings") == 0
            and again.metric("ingest_messages_received_total")
            == again.metric("ingest_messages_acked_total")
        ),
        timeout=90,
    )
    await eventually(lambda: _at_least(stored(db, mode), count), timeout=60)
    code = main(
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
    report = capsys.readouterr().out
    match = re.search(
        r"expected ([\d,]+), found ([\d,]+), missing ([\d,]+), "
        r"duplicated ([\d,]+), wrong ([\d,]+)",
        report,
    )
    assert match, report
    expected, _found, missing, duplicated, wrong = (int(g.replace(",", "")) for g in match.groups())
    assert (expected, missing, wrong) == (count, 0, 0), report
    if mode == "bucket" or sig == signal.SIGTERM:
        assert (code, duplicated) == (0, 0), report
    with capsys.disabled():
        print(  # noqa: T201
            f"\n{mode}: {sig.name} mid-stream: missing 0, duplicated {duplicated}, "
            f"{again.metric(f'ingest_duplicate_readings_total{{mode="{mode}"}}'):.0f} "
            "redelivered readings recognised as stored"
        )


async def test_three_daemons_on_one_shared_subscription_pass_verify(
    daemon: Callable[..., Daemon],
    mode: str,
    broker: Broker,
    topic_root: str,
    mongo_uri: str,
    db_name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Scale-out in miniature: three daemon processes in one shared group against one
    mosquitto; each gets a share of a loadgen run, and verify finds every reading once."""
    group = f"g{topic_root}"
    procs = [daemon("--shared-group", group, client_id=f"{group}-{i}") for i in range(3)]
    manifest = tmp_path / "run.json"
    count = 900
    publish = subprocess.run(
        publish_command(
            broker, topic_root, manifest, sensors=30, count=count, per_message=1, rate=0
        ),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert publish.returncode == 0, publish.stderr
    await eventually(
        lambda: sum(p.metric("ingest_messages_acked_total") for p in procs) == count, timeout=60
    )
    shares = [p.metric("ingest_messages_received_total") for p in procs]
    assert sum(shares) == count
    assert all(share >= count / 10 for share in shares), shares  # each gets a real share
    code = main(
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
    with capsys.disabled():
        print(  # noqa: T201
            f"\n{mode}: shares of {count} messages over 3 daemons: {[int(x) for x in shares]}"
        )


async def _at_least(value: Any, floor: int) -> bool:
    return int(await value) >= floor


def test_a_timed_run_writes_a_manifest_of_what_it_sent(broker: Broker, tmp_path: Path) -> None:
    manifest = tmp_path / "run.json"
    publish = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "publish",
            "--mqtt-url",
            broker.url,
            "--topic-prefix",
            "lgtimed",
            "--sensors",
            "5",
            "--duration",
            "0.5",
            "--rate",
            "400",
            "--per-message",
            "3",
            "--qos",
            "1",
            "--processes",
            "2",
            "--seed",
            "11",
            "--manifest",
            str(manifest),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert publish.returncode == 0, publish.stderr
    summary = json.loads(publish.stdout)
    data = json.loads(manifest.read_text())
    assert data["seed"] == 11
    assert data["sensor_prefix"] == summary["sensor_prefix"]
    assert sum(data["counts"]) == summary["readings"] > 0
    # Round-robin: a sensor is at most a message (3) behind another of its worker, and
    # the two workers start and stop within a message or so of each other.
    assert max(data["counts"]) - min(data["counts"]) <= 6
    assert summary["acked"] == summary["messages"]
    assert summary["errors"] == 0


def test_the_publish_summary_line_counts_processes_in_words(
    broker: Broker, topic_root: str, tmp_path: Path
) -> None:
    """``1 process``, not ``1 processes``: the line a user reads after a publish."""
    for processes, words in ((1, "1 process)"), (2, "2 processes)")):
        command = publish_command(
            broker,
            topic_root,
            tmp_path / f"m{processes}.json",
            sensors=2,
            count=2,
            per_message=1,
            rate=0,
            processes=processes,
        )
        result = subprocess.run(
            command[:-1], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        assert words in result.stdout
