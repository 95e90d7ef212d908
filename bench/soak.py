"""Soak benchmark: one daemon writing to MongoDB under a steady QoS 1 load for minutes.

It starts its own mosquitto (no persistence), the MongoDB emulator unless --mongodb-uri is
given, one ``ingest run`` (its own database) and ``loadgen publish --qos 1`` at a steady
rate for the duration. Every --interval seconds it samples the daemon's RSS and CPU
(/proc) and its /metrics counters. After the publisher ends it waits for the daemon to
catch up (buffer empty, readings written == published), stops it with SIGTERM and runs
``loadgen verify`` on the run's manifest. The RSS slope is a least-squares fit over the
samples taken while publishing, after --warmup seconds. Exit 1 if verify finds anything
wrong (missing, duplicated...) or the daemon did not catch up, 2 if something did not start.

    .venv/bin/python -m bench.soak --minutes 10 --rate 300 --sensors 50 --mode bucket \
        [--mongodb-uri URI] [--out deploy/bench-out/soak]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.procs import ROOT, Broker, Daemon, start_emulator

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def sample(daemon: Daemon, mode: str, t0: float, *, publishing: bool) -> dict[str, Any]:
    assert daemon.process is not None
    pid = daemon.process.pid
    metrics = daemon.metrics()
    return {
        "t": round(time.monotonic() - t0, 2),
        "publishing": publishing,
        "rss_mb": round(rss_mb(pid), 2),
        "cpu_s": cpu_seconds(pid),
        "written": metrics.get(f'ingest_readings_written_total{{mode="{mode}"}}', 0.0),
        "buffered": metrics.get("ingest_buffered_readings", 0.0),
        "received": metrics.get("ingest_messages_received_total", 0.0),
        "acked": metrics.get("ingest_messages_acked_total", 0.0),
        "write_s": metrics.get(f'ingest_batch_write_seconds_sum{{mode="{mode}"}}', 0.0),
        "batches": metrics.get(f'ingest_batch_write_seconds_count{{mode="{mode}"}}', 0.0),
    }


def add_rates(samples: list[dict[str, Any]]) -> None:
    """Readings/s and CPU% over the interval before each sample (none before the first)."""
    for first in samples[:1]:
        first["readings_per_s"], first["cpu_pct"], first["ms_per_batch"] = 0, 0.0, None
    for before, s in itertools.pairwise(samples):
        dt = s["t"] - before["t"]
        s["readings_per_s"] = round((s["written"] - before["written"]) / dt) if dt else 0
        s["cpu_pct"] = round(100 * (s["cpu_s"] - before["cpu_s"]) / dt, 1) if dt else 0.0
        batches = s["batches"] - before["batches"]
        s["ms_per_batch"] = (
            round(1000 * (s["write_s"] - before["write_s"]) / batches) if batches else None
        )


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 60 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def soak(
    args: argparse.Namespace,
    daemon: Daemon,
    publisher: subprocess.Popen[str],
) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """Sample until the publisher is done and the daemon has written everything."""
    t0 = next_at = time.monotonic()
    samples: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    deadline = 0.0
    while True:
        now = time.monotonic()
        if now >= next_at:
            samples.append(sample(daemon, args.mode, t0, publishing=summary is None))
            s = samples[-1]
            print(
                f"  {s['t']:7.0f} s  RSS {s['rss_mb']:6.1f} MB  written {s['written']:,.0f}"
                f"  buffered {s['buffered']:,.0f}",
                file=sys.stderr,
            )
            next_at += args.interval
        if summary is None and publisher.poll() is not None:
            assert publisher.stdout is not None
            summary = json.loads(publisher.stdout.read() or "{}")
            deadline = now + args.catch_up_timeout
            if not summary:
                raise RuntimeError(f"loadgen publish exited with {publisher.returncode}")
        if summary is not None:
            s = sample(daemon, args.mode, t0, publishing=False)
            if s["buffered"] == 0 and s["written"] >= summary["readings"]:
                samples.append(s)
                return samples, summary, True
            if now > deadline:
                samples.append(s)
                return samples, summary, False
        time.sleep(0.5)


def run(args: argparse.Namespace, out: Path, tmp: Path, uri: str) -> dict[str, Any]:
    run_id = time.strftime("%Y%m%d%H%M%S")
    db, prefix = f"soak_{run_id}", f"soak{run_id}"
    uri_file = tmp / "mongodb-uri"  # keeps a password out of `ps`
    uri_file.write_text(uri)
    uri_file.chmod(0o600)
    manifest = out / f"manifest-{args.mode}-{run_id}.json"
    broker = Broker(tmp)
    broker.start()
    # One process, whose RSS and CPU are sampled; --daemon-arg=--workers=N overrides.
    daemon = Daemon(
        [
            "--workers",
            "1",
            "--mode",
            args.mode,
            "--mqtt-url",
            broker.url,
            "--topic",
            f"{prefix}/#",
            "--mongodb-uri-file",
            str(uri_file),
            "--db",
            db,
            "--client-id",
            f"soak-{run_id}",
            "--log-level",
            "warning",
            *args.daemon_arg,
        ],
        out / f"daemon-{args.mode}-{run_id}.log",
    )
    try:
        daemon.start()
        publisher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadgen",
                "publish",
                "--mqtt-url",
                broker.url,
                "--sensors",
                str(args.sensors),
                "--rate",
                str(args.rate),
                "--duration",
                str(args.minutes * 60),
                "--qos",
                "1",
                "--seed",
                str(args.seed),
                "--sensor-prefix",
                prefix,
                "--topic-prefix",
                prefix,
                "--manifest",
                str(manifest),
                "--json",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            samples, summary, caught_up = soak(args, daemon, publisher)
        finally:
            if publisher.poll() is None:
                publisher.terminate()
                publisher.wait()
        exit_code = daemon.stop()
    finally:
        daemon.stop()
        broker.stop()
    env = {**os.environ, "LOADGEN_MONGODB_URI": uri}
    started = time.monotonic()
    verify = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "verify",
            "--manifest",
            str(manifest),
            "--db",
            db,
            "--mode",
            args.mode,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )
    result = json.loads(verify.stdout) if verify.stdout.strip() else {"error": verify.stderr}
    add_rates(samples)
    load = [s for s in samples if s["publishing"]]
    rss = [s["rss_mb"] for s in samples]
    span = load[-1]["t"] - load[0]["t"] if len(load) > 1 else 0
    return {
        "mode": args.mode,
        "minutes": args.minutes,
        "rate": args.rate,
        "sensors": args.sensors,
        "mongodb": "emulator" if not args.mongodb_uri else "given",
        "db": db,
        "caught_up": caught_up,
        "daemon_exit": exit_code,
        "publish": summary,
        "duration_s": samples[-1]["t"],
        "rss_first_mb": rss[0],
        "rss_last_mb": rss[-1],
        "rss_max_mb": max(rss),
        "rss_slope_mb_per_min": slope_per_minute(
            [(s["t"], s["rss_mb"]) for s in load if s["t"] >= args.warmup]
        ),
        "readings_per_s": round((load[-1]["written"] - load[0]["written"]) / span) if span else 0,
        "verify": result,
        "verify_s": round(time.monotonic() - started, 1),
        "samples": samples,
    }


def markdown(r: dict[str, Any]) -> str:
    p, slope = r["publish"], r["rss_slope_mb_per_min"]
    head = (
        f"Soak, {r['mode']} mode, MongoDB {r['mongodb']}: {r['sensors']} sensors at "
        f"{r['rate']:,.0f} readings/s (QoS 1) for {r['minutes']} min; published "
        f"{p['readings']:,} readings ({p['readings_per_s']:,.0f}/s, "
        f"{p['rate_ratio']:.1%} of the target)."
    )
    lines = [
        head,
        "",
        "| t (s) | RSS (MB) | CPU % | readings/s | buffered | write ms/batch |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['t']:.0f} | {s['rss_mb']:.1f} | {s['cpu_pct']:.0f} "
        f"| {s['readings_per_s']:,} | {s['buffered']:,.0f} | {s['ms_per_batch'] or '-'} |"
        for s in r["samples"]
    ]
    lines += [
        "",
        f"RSS first {r['rss_first_mb']:.1f} MB, last {r['rss_last_mb']:.1f} MB, max "
        f"{r['rss_max_mb']:.1f} MB, slope "
        + (f"{slope:+.2f} MB/min" if slope is not None else "n/a (too few samples)")
        + f"; mean {r['readings_per_s']:,} readings/s written while publishing; "
        f"caught up: {r['caught_up']}, after {r['duration_s']:.0f} s; daemon exit "
        f"{r['daemon_exit']}.",
    ]
    for m in r["verify"].get("modes", []):
        lines.append(
            f"verify ({m['collection']}): {'OK' if m['ok'] else 'MISMATCH'}: expected "
            f"{m['expected']:,}, found {m['found']:,}, missing {m['missing']:,}, "
            f"duplicated {m['duplicated']:,}, wrong {m['wrong']:,}, unexpected "
            f"{m['unexpected']:,}, bad documents {m['bad_documents']:,} "
            f"({r['verify_s']} s)"
        )
    if "error" in r["verify"]:
        lines.append(f"verify failed: {r['verify']['error'].strip()}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=300.0, help="readings/s in all")
    parser.add_argument("--sensors", type=int, default=50)
    parser.add_argument("--mode", choices=["bucket", "timeseries"], default="bucket")
    parser.add_argument("--mongodb-uri", help="default: the mongoeco emulator")
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "bench-out" / "soak")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds left out of the slope")
    parser.add_argument("--catch-up-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for the daemon (repeatable)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    emulator = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            uri = args.mongodb_uri
            if uri is None:
                emulator, uri = start_emulator()
            result = run(args, args.out, Path(tmp), uri)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"soak: {exc}", file=sys.stderr)
            return 2
        finally:
            if emulator is not None:
                emulator.terminate()
                emulator.wait(timeout=30)
    stamp = result["db"].removeprefix("soak_")
    text = markdown(result)
    (args.out / f"soak-{args.mode}-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"soak-{args.mode}-{stamp}.md").write_text(text + "\n")
    print(text)
    modes = result["verify"].get("modes", [])
    ok = bool(modes) and all(m["ok"] for m in modes) and result["caught_up"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
