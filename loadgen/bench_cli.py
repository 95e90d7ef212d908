"""``loadgen bench`` from parsed arguments: presets, settings, the run, the output files."""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen import sparkplug
from loadgen.bench import MODES, BenchError, BenchSettings, run_bench
from loadgen.config import (
    ConfigError,
    PublishSettings,
    parse_mqtt_url,
    parse_start,
    parse_step,
    redact,
    validate_publish,
)
from loadgen.daemons import free_port
from loadgen.publisher import PublishError
from loadgen.report import SECTIONS, render_json, render_markdown, write_chart
from loadgen.verify import VerifyError

if TYPE_CHECKING:
    import argparse


@dataclass(frozen=True, slots=True)
class Preset:
    """A workload that matters for choosing a mode; small enough for the emulator."""

    sensors: int
    count: int
    per_message: int
    rate: float
    start: str = "now"
    time_step: float | None = None  # None: real time (sensors / rate)
    late_every: int = 0
    about: str = ""


PRESETS = {
    "many-sensors": Preset(
        500, 1000, 1, 500.0, about="many sensors with few readings each (2 per sensor)"
    ),
    "few-sensors": Preset(
        4, 2000, 20, 1000.0, about="few sensors with many readings (500 each, 20 per message)"
    ),
    "late-data": Preset(
        20,
        1000,
        1,
        500.0,
        start="now-2h",
        time_step=144.0,
        late_every=5,
        about="2 hours of history per sensor; every 5th message held back "
        "and sent at the end (late, out of order)",
    ),
}


def publish_of(args: argparse.Namespace, preset: Preset, run_id: str) -> PublishSettings:
    """The publish settings of the bench workload: the preset with the overrides."""
    broker = parse_mqtt_url(args.mqtt_url, args.mqtt_password_file)
    sensors = args.sensors if args.sensors is not None else preset.sensors
    rate = args.rate if args.rate is not None else preset.rate
    step = preset.time_step
    if step is None:
        step = max(0.001, round(sensors / rate, 3)) if rate > 0 else 0.001
    prefix = args.topic_prefix or ("sensors" if args.use_running else f"bench{run_id}")
    if args.format == "sparkplug":  # the daemons subscribe to <prefix>/#
        prefix = sparkplug.NAMESPACE
    return validate_publish(
        PublishSettings(
            host=broker.host,
            port=broker.port,
            username=broker.username,
            password=broker.password,
            sensors=sensors,
            rate=rate,
            duration=None,
            count=args.count if args.count is not None else preset.count,
            per_message=args.per_message if args.per_message is not None else preset.per_message,
            qos=args.qos,
            seed=args.seed if args.seed is not None else secrets.randbelow(2**31),
            sensor_prefix=f"lg{run_id}",
            topic_prefix=prefix,
            start_ms=parse_start(preset.start, time.time()),
            step_ms=parse_step(step),
            processes=1,
            late_every=preset.late_every,
            payload_format=args.format,
        )
    )


def bench_settings(args: argparse.Namespace, preset: Preset) -> BenchSettings:
    """The bench settings, validated."""
    if not args.mongodb_uri.startswith(("mongodb://", "mongodb+srv://")):
        raise ConfigError("--mongodb-uri: expected mongodb://... or mongodb+srv://...")
    for flag, value in (
        ("--query-runs", args.query_runs),
        ("--latency-samples", args.latency_samples),
    ):
        if value < 1:
            raise ConfigError(f"{flag}: must be at least 1")
    if args.wait_timeout <= 0:
        raise ConfigError("--wait-timeout: must be > 0")
    modes = MODES if args.modes == "both" else (args.modes,)
    daemon_url = args.daemon_mqtt_url or args.mqtt_url
    password_file = args.daemon_mqtt_password_file or (
        None if args.daemon_mqtt_url else args.mqtt_password_file
    )
    return BenchSettings(
        mongodb_uri=args.mongodb_uri,
        db=args.db or ("iot" if args.use_running else "loadgen_bench"),
        out=Path(args.out),
        modes=modes,
        collections={"bucket": args.bucket_collection, "timeseries": args.timeseries_collection},
        preset=args.preset,
        start=preset.start,
        use_running=args.use_running,
        metrics_urls={"bucket": args.metrics_url_bucket, "timeseries": args.metrics_url_timeseries},
        daemon_mqtt_url=daemon_url,
        daemon_password_file=password_file,
        daemon_args=(
            *(("--preset", "sparkplug") if args.format == "sparkplug" else ()),
            *args.daemon_arg,
        ),
        query_runs=args.query_runs,
        latency_samples=args.latency_samples,
        wait_timeout=args.wait_timeout,
    )


def workload(args: argparse.Namespace, publish: PublishSettings) -> dict[str, Any]:
    """The workload as the report records it."""
    preset = PRESETS[args.preset]
    return {
        "preset": args.preset,
        "about": preset.about,
        "sensors": publish.sensors,
        "count": publish.count,
        "per_message": publish.per_message,
        "rate": publish.rate,
        "qos": publish.qos,
        "start": preset.start,
        "time_step_s": publish.step_ms / 1000,
        "late_every": publish.late_every,
        "seed": publish.seed,
        "format": publish.payload_format,
        "sensor_prefix": publish.sensor_prefix,
        "topic_prefix": publish.topic_prefix,
        "use_running": args.use_running,
        "mqtt_url": redact(args.mqtt_url),
        "mongodb_uri": redact(args.mongodb_uri),
    }


def notes(report: dict[str, Any], bench: BenchSettings) -> list[str]:
    """The caveats printed under the table."""
    out = [
        (
            "bytes sent / reading is an estimate: the BSON size of the operations the "
            "daemon's writers build for this workload, batched as with the daemon's "
            "defaults (2,000 readings or 1 s); the daemon has no bytes-sent metric"
        ),
        (
            f"latency: {_sampled(report, bench)} sampled, MongoDB polled every "
            f"{bench.poll_interval * 1000:.0f} ms (resolution about one poll interval plus "
            "the query time); send time estimated from the publisher's schedule"
        ),
    ]
    if report["server"]["emulator"]:
        out.append(
            "ran against the mongoeco emulator: storage figures are not meaningful "
            "and query times are not a server's"
        )
    if bench.use_running:
        out.append(
            "--use-running: nothing was dropped; storage and the hourly query cover "
            "the whole collections, other traffic counts in the metric deltas"
        )
    return out


def _sampled(report: dict[str, Any], bench: BenchSettings) -> str:
    """How many readings the latency figures sampled (fewer than asked on a short run)."""
    counts = {m["latency_ms"]["samples"] for m in report["modes"].values() if m.get("latency_ms")}
    if len(counts) != 1:
        return f"up to {bench.latency_samples} readings"
    count = counts.pop()
    if count == bench.latency_samples:
        return f"{count} readings"
    return (
        f"{count} readings (of --latency-samples {bench.latency_samples}: the run has "
        "fewer messages)"
    )


def write_outputs(report: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """Write <stem>.md, <stem>.json and (with matplotlib) <stem>.png into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{stem}.png"
    skipped = write_chart(report, png)
    report["chart"] = None if skipped else png.name
    report["chart_skipped"] = skipped
    if skipped:
        report.setdefault("notes", []).append(f"chart skipped: {skipped}")
    paths = [out / f"{stem}.md", out / f"{stem}.json"]
    paths[0].write_text(render_markdown(report), encoding="utf-8")
    paths[1].write_text(render_json(report), encoding="utf-8")
    return [*paths, *([] if skipped else [png])]


def report_ok(report: dict[str, Any]) -> bool:
    """Every mode complete, written as published, verify passed, every section present."""
    return all(
        m.get("complete")
        and m["written"] == m["published"]
        and m["verify"].get("ok")
        and all(k in m for k in SECTIONS)
        for m in report["modes"].values()
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """``loadgen bench``."""
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + secrets.token_hex(2)
    preset = PRESETS[args.preset]
    publish = publish_of(args, preset, run_id)
    bench = bench_settings(args, preset)
    bench.out.mkdir(parents=True, exist_ok=True)

    def progress(text: str) -> None:
        print(f"loadgen bench: {text}", file=sys.stderr, flush=True)  # noqa: T201

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        report = run_bench(bench, publish, run_id, free_port, progress)
    except (BenchError, PublishError, VerifyError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    report["started_at"] = started_at
    report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["workload"] = workload(args, publish)
    report["notes"] = notes(report, bench)
    paths = write_outputs(report, bench.out, f"bench-{run_id}")
    if args.json:
        print(render_json(report), end="")  # noqa: T201
    else:
        print(render_markdown(report), end="")  # noqa: T201
        print("wrote " + ", ".join(str(p) for p in paths))  # noqa: T201
    return 0 if report_ok(report) else 1
