"""Command line of ``loadgen``: argv and ``LOADGEN_*`` environment -> settings -> run.

``loadgen publish`` simulates a fleet of sensors; ``loadgen verify`` checks in MongoDB that
what a run published arrived exactly once. Every flag ``--some-flag`` can also be set as
``LOADGEN_SOME_FLAG``; the command line wins. Usage and connection errors exit 2 with one
line; a verification mismatch (or a publish run with errors) exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ingest.cli import DefaultsHelpFormatter
from loadgen import bench_cli, bucket_fill, payloads
from loadgen.config import (
    ConfigError,
    PublishSettings,
    VerifySettings,
    parse_mqtt_url,
    parse_start,
    parse_step,
    validate_publish,
    validate_verify,
)
from loadgen.publisher import PublishError, Summary, run_publish
from loadgen.verify import Expected, ModeReport, VerifyError, run_verify

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

ENV_PREFIX = "LOADGEN_"
MANIFEST_VERSION = 1
DAEMON_MAX_PAST, DAEMON_MAX_FUTURE = 365 * 86400.0, 600.0
KEPT_UP = 0.98  # achieved/target below this is reported as not keeping up


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _flag(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    name: str,
    help_text: str,
    default: object = None,
    **kwargs: Any,  # noqa: ANN401
) -> None:
    """Add ``--name`` whose default comes from ``LOADGEN_NAME`` when set."""
    var = ENV_PREFIX + name.upper().replace("-", "_")
    if var in env:
        default = env[var]
        kind = kwargs.get("type")
        if kind is not None:
            try:
                default = kind(default)
            except (ValueError, argparse.ArgumentTypeError):
                raise ConfigError(f"--{name}: bad value {default!r} from {var}") from None
    parser.add_argument(f"--{name}", default=default, help=f"{help_text} [env {var}]", **kwargs)


def _publish_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _mqtt_flags(parser, env)
    _flag(parser, env, "sensors", "simulated sensors", 100, type=int)
    _flag(parser, env, "rate", "total readings/s (0: as fast as possible)", 1000.0, type=float)
    _flag(parser, env, "duration", "publish for this many seconds", type=float)
    _flag(parser, env, "count", "publish this many readings in all", type=int)
    _flag(parser, env, "per-message", "readings per MQTT message (K>1: an envelope)", 1, type=int)
    _flag(parser, env, "qos", "publish QoS (0 or 1)", 0, type=int)
    _flag(parser, env, "seed", "seed of the simulated values (default: random)", type=int)
    _flag(parser, env, "sensor-prefix", "sensor ids are <prefix>-<n> (default: lg<random>)")
    _flag(parser, env, "topic-prefix", "topics are <prefix>/<sensor id>/readings", "sensors")
    _flag(parser, env, "start", "timestamp of seq 0: ISO-8601, epoch seconds, now, now-6h", "now")
    _flag(
        parser,
        env,
        "time-step",
        "seconds between one sensor's readings "
        "(default: the sensor's real interval at --rate, 1 ms with --rate 0)",
        type=float,
    )
    _flag(parser, env, "processes", "worker processes, one connection each", 1, type=int)
    _flag(
        parser, env, "max-inflight", "QoS 1: unacknowledged messages per connection", 1000, type=int
    )
    _flag(
        parser,
        env,
        "late-every",
        "send every Nth message of each sensor after all others "
        "(late, out-of-order data; 0: off; needs --count)",
        0,
        type=int,
    )
    _flag(
        parser,
        env,
        "untimed-every",
        "every Nth sensor (index divisible by N) sends its "
        "readings without a time, as most devices do (0: off; 2: half the fleet)",
        0,
        type=int,
    )
    _flag(
        parser,
        env,
        "repeat-every",
        "publish every Nth message of a sensor that sends "
        "its time twice: the same reading (series and instant) arrives twice, at "
        "different workers of a shared subscription (0: off)",
        0,
        type=int,
    )
    _flag(parser, env, "manifest", "write the run's manifest (for verify) to this file")
    _format_flag(parser, env)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _format_flag(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _flag(
        parser,
        env,
        "format",
        "payloads: json, or sparkplug (a Sparkplug B fleet: group "
        "<sensor prefix>, one edge node per sensor, NBIRTH then NDATA on "
        "spBv1.0/<prefix>/NDATA/<n>; --topic-prefix is not used)",
        "json",
        choices=["json", "sparkplug"],
    )


def _mqtt_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _flag(
        parser,
        env,
        "mqtt-url",
        "broker: mqtt://[user[:password]@]host[:port]",
        "mqtt://localhost:1883",
    )
    _flag(
        parser,
        env,
        "mqtt-password-file",
        "read the MQTT password from this file (overrides the URL's)",
    )


def _verify_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _flag(parser, env, "manifest", "manifest written by publish --manifest")
    _flag(parser, env, "mongodb-uri", "MongoDB connection string", "mongodb://localhost:27017")
    _flag(parser, env, "db", "database", "iot")
    _flag(
        parser,
        env,
        "mode",
        "storage layout(s) to check",
        "bucket",
        choices=["bucket", "timeseries", "both"],
    )
    _flag(parser, env, "collection", "collection (single mode; default buckets / readings)")
    _flag(parser, env, "bucket-collection", "bucket collection with --mode both", "buckets")
    _flag(
        parser, env, "timeseries-collection", "time-series collection with --mode both", "readings"
    )
    _flag(parser, env, "bucket-span-seconds", "the daemon's bucket span", 3600, type=int)
    _flag(
        parser, env, "sensors-per-query", "sensors checked per query (bounds memory)", 100, type=int
    )
    _flag(
        parser,
        env,
        "wait",
        "first wait up to this many seconds for the readings to "
        "arrive: until the stored count reaches the published one or stops changing "
        "(right after publish, the daemons may still be writing)",
        0.0,
        type=float,
    )
    _flag(
        parser,
        env,
        "settle",
        "with --wait: a count that has moved and then stays unchanged "
        "this many seconds (or twice its longest pause, if longer) ends the wait",
        5.0,
        type=float,
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    # Without a manifest: the parameters of a --count run.
    group = parser
    _flag(group, env, "seed", "the run's --seed", type=int)
    _flag(group, env, "sensor-prefix", "the run's --sensor-prefix")
    _flag(group, env, "sensors", "the run's --sensors", type=int)
    _flag(group, env, "count", "the run's --count", type=int)
    _flag(group, env, "per-message", "the run's --per-message", 1, type=int)
    _flag(group, env, "start", "the run's absolute start (ISO-8601 or epoch seconds)")
    _flag(group, env, "time-step", "the run's --time-step", type=float)


def _bench_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _mqtt_flags(parser, env)
    _flag(parser, env, "mongodb-uri", "MongoDB connection string", "mongodb://localhost:27017")
    _flag(parser, env, "db", "database (default: loadgen_bench; iot with --use-running)")
    _flag(parser, env, "out", "folder for the report (Markdown, JSON, PNG)", "bench-out")
    _flag(
        parser,
        env,
        "modes",
        "storage layouts to compare",
        "both",
        choices=["bucket", "timeseries", "both"],
    )
    _flag(parser, env, "preset", "workload", "many-sensors", choices=sorted(bench_cli.PRESETS))
    _flag(parser, env, "sensors", "override the preset's sensors", type=int)
    _flag(parser, env, "count", "override the preset's readings in all", type=int)
    _flag(parser, env, "per-message", "override the preset's readings per message", type=int)
    _flag(
        parser, env, "rate", "override the preset's readings/s (0: as fast as possible)", type=float
    )
    _flag(parser, env, "qos", "publish QoS", 1, type=int)
    _format_flag(parser, env)
    _flag(parser, env, "seed", "seed of the simulated values (default: random)", type=int)
    _flag(
        parser,
        env,
        "topic-prefix",
        "topic prefix (default: bench<run id>, sensors with --use-running)",
    )
    parser.add_argument(
        "--use-running",
        action="store_true",
        default=env.get(ENV_PREFIX + "USE_RUNNING", "") in ("1", "true"),
        help="use running daemons (--metrics-url-*); drop nothing [env LOADGEN_USE_RUNNING]",
    )
    _flag(
        parser,
        env,
        "metrics-url-bucket",
        "--use-running: the bucket daemon's /metrics",
        "http://localhost:9108/metrics",
    )
    _flag(
        parser,
        env,
        "metrics-url-timeseries",
        "--use-running: the timeseries daemon's /metrics",
        "http://localhost:9109/metrics",
    )
    _flag(parser, env, "bucket-collection", "the bucket daemon's collection", "buckets")
    _flag(parser, env, "timeseries-collection", "the timeseries daemon's collection", "readings")
    _flag(parser, env, "daemon-mqtt-url", "started daemons: broker URL (default: --mqtt-url)")
    _flag(
        parser,
        env,
        "daemon-mqtt-password-file",
        "started daemons: password file (default: --mqtt-password-file)",
    )
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for the started daemons (repeatable), e.g. "
        "--daemon-arg=--flush-interval=0.2",
    )
    _flag(parser, env, "query-runs", "runs of each query (the median is reported)", 5, type=int)
    _flag(parser, env, "latency-samples", "readings sampled for end-to-end latency", 50, type=int)
    _flag(
        parser,
        env,
        "wait-timeout",
        "seconds to wait for the daemons to write everything",
        120.0,
        type=float,
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The ``loadgen`` parser with its ``publish``, ``verify`` and ``bench`` commands."""
    parser = _Parser(prog="loadgen", description="Sensor fleet simulator and checker.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    fmt = DefaultsHelpFormatter
    _publish_flags(
        commands.add_parser("publish", help="publish simulated readings", formatter_class=fmt), env
    )
    _verify_flags(
        commands.add_parser(
            "verify", help="check a run's readings in MongoDB", formatter_class=fmt
        ),
        env,
    )
    _bench_flags(
        commands.add_parser(
            "bench", help="compare both storage modes end to end", formatter_class=fmt
        ),
        env,
    )
    _bucket_fill_flags(
        commands.add_parser(
            "bucket-fill",
            help="bucket mode: write time against how full the document is",
            formatter_class=fmt,
        ),
        env,
    )
    return parser


def _bucket_fill_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _flag(parser, env, "mongodb-uri", "MongoDB connection string", "mongodb://localhost:27017")
    _flag(parser, env, "db", "scratch database (dropped afterwards)", "loadgen_bucket_fill")
    _flag(parser, env, "cap", "fill each document to this many readings", 3600, type=int)
    _flag(parser, env, "sensors", "documents filled side by side", 1, type=int)
    _flag(parser, env, "bands", "report the write time in this many bands of fill", 10, type=int)
    parser.add_argument("--json", action="store_true", help="print the bands as JSON")


def publish_settings(args: argparse.Namespace, now: float) -> PublishSettings:
    """Validated publish settings from parsed arguments."""
    broker = parse_mqtt_url(args.mqtt_url, args.mqtt_password_file)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    prefix = args.sensor_prefix or f"lg{secrets.token_hex(4)}"
    step = args.time_step
    if step is None:
        step = args.sensors / args.rate if args.rate > 0 else 0.001
        step = max(0.001, round(step, 3))
    return validate_publish(
        PublishSettings(
            host=broker.host,
            port=broker.port,
            username=broker.username,
            password=broker.password,
            late_every=args.late_every,
            sensors=args.sensors,
            rate=args.rate,
            duration=args.duration,
            count=args.count,
            per_message=args.per_message,
            qos=args.qos,
            seed=seed,
            sensor_prefix=prefix,
            topic_prefix=args.topic_prefix,
            start_ms=parse_start(args.start, now),
            step_ms=parse_step(step),
            processes=args.processes,
            manifest=args.manifest,
            json=args.json,
            max_inflight=args.max_inflight,
            payload_format=args.format,
            untimed_every=args.untimed_every,
            repeat_every=args.repeat_every,
        )
    )


def warn_outside_window(settings: PublishSettings, now: float) -> None:
    """Warn when a ``--count`` run's timestamps leave the daemon's default accepted window."""
    first = settings.start_ms / 1000
    last = first
    if settings.count is not None:
        per_sensor = -(-settings.count // settings.sensors)
        last = (settings.start_ms + (per_sensor - 1) * settings.step_ms) / 1000
    if first < now - DAEMON_MAX_PAST or last > now + DAEMON_MAX_FUTURE:
        print(  # noqa: T201
            "loadgen: warning: timestamps run outside the daemon's default window "
            "(365 days back, 10 minutes ahead): adjust --start/--time-step",
            file=sys.stderr,
        )


def manifest_of(summary: Summary) -> dict[str, Any]:
    """The manifest: everything verify needs to regenerate what was published."""
    s = summary.settings
    return {
        "version": MANIFEST_VERSION,
        "seed": s.seed,
        "sensor_prefix": s.sensor_prefix,
        "sensors": s.sensors,
        "per_message": s.per_message,
        "start_ms": s.start_ms,
        "step_ms": s.step_ms,
        "topic_prefix": s.topic_prefix,
        "qos": s.qos,
        "separator": s.separator,
        "untimed_every": s.untimed_every,
        "readings": summary.total("readings"),
        "counts": summary.counts(),
    }


def expected_from_manifest(path: str) -> Expected:
    """Read a manifest written by ``publish --manifest``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        run = payloads.Run(
            int(data["seed"]),
            str(data["sensor_prefix"]),
            int(data["sensors"]),
            int(data["per_message"]),
            int(data["start_ms"]),
            int(data["step_ms"]),
            str(data.get("topic_prefix", "sensors")),
            str(data.get("separator", "-")),
            int(data.get("untimed_every", 0)),
        )
        counts = tuple(int(c) for c in data["counts"])
    except OSError as exc:
        raise ConfigError(f"--manifest: cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--manifest: {path} is not a loadgen manifest ({exc})") from None
    if len(counts) != run.sensors:
        raise ConfigError(f"--manifest: {path} has {len(counts)} counts for {run.sensors} sensors")
    return Expected(run, counts)


def expected_from_args(args: argparse.Namespace) -> Expected:
    """Regenerate a ``--count`` run from its parameters."""
    for name in ("seed", "sensor_prefix", "sensors", "count", "start", "time_step"):
        if getattr(args, name) is None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag}: required without --manifest")
    if args.sensors < 1 or args.count < 1:
        raise ConfigError("--sensors/--count: must be at least 1")
    run = payloads.Run(
        args.seed,
        args.sensor_prefix,
        args.sensors,
        args.per_message,
        parse_start(args.start, time.time(), allow_relative=False),
        parse_step(args.time_step),
    )
    return Expected(run, tuple(payloads.split_count(args.count, args.sensors)))


def _progress_printer(stream: Any, started: float) -> Callable[[list[float]], None]:  # noqa: ANN401
    last = [started, 0.0]

    def show(totals: list[float]) -> None:
        now = time.monotonic()
        readings, _messages, acked, errors, backlog = totals
        rate = (readings - last[1]) / (now - last[0]) if now > last[0] else 0.0
        last[:] = [now, readings]
        stream.write(
            f"\r{now - started:7.1f}s  {rate:10,.0f} readings/s  sent {readings:,.0f}"
            f"  acked {acked:,.0f}  errors {errors:,.0f}  backlog {backlog:,.0f}  "
        )
        stream.flush()

    return show


def _print_publish(summary: Summary, as_json: bool) -> None:
    data = summary.as_dict()
    if as_json:
        print(json.dumps(data, indent=2))  # noqa: T201
        return
    target = ""
    if data["target_rate"]:
        behind = data["rate_ratio"] < KEPT_UP
        target = (
            f" (target {data['target_rate']:,.0f}, {data['rate_ratio']:.1%}"
            f"{': did NOT keep up' if behind else ''})"
        )
    acked = f", acked {data['acked']:,}" if data["acked"] is not None else ""
    end = (
        f"broker had all {data['elapsed_s']:.2f} s after the start"
        if data["broker_caught_up"]
        else "the broker did NOT confirm it had everything"
    )
    print(  # noqa: T201
        f"published {data['readings']:,} readings in {data['messages']:,} messages "
        f"(QoS {data['qos']}, {_plural(data['processes'], 'process')}) in "
        f"{data['sending_s']:.2f} s: "
        f"{data['readings_per_s']:,.0f} readings/s{target}{acked}, "
        f"errors {data['errors']}, lost messages {data['lost_messages']:,}, "
        f"backlog {data['backlog_readings']:,}, "
        f"{end}; "
        f"sensors {data['sensor_prefix']}-0..{summary.settings.sensors - 1}, "
        f"seed {data['seed']}{' (interrupted)' if data['interrupted'] else ''}"
    )


def cmd_publish(args: argparse.Namespace) -> int:
    """``loadgen publish``."""
    now = time.time()
    settings = publish_settings(args, now)
    warn_outside_window(settings, now)
    tty = sys.stderr.isatty()
    progress = _progress_printer(sys.stderr, time.monotonic()) if tty else None
    try:
        summary = run_publish(settings, progress)
    except PublishError as exc:
        if tty:
            sys.stderr.write("\n")
        print(f"loadgen: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    if tty:
        sys.stderr.write("\n")
    if settings.manifest:
        Path(settings.manifest).write_text(
            json.dumps(manifest_of(summary)) + "\n", encoding="utf-8"
        )
    _print_publish(summary, settings.json)
    return 0 if summary.ok else 1


def _print_verify(reports: list[ModeReport], as_json: bool) -> None:
    if as_json:
        print(  # noqa: T201
            json.dumps(
                {
                    "ok": all(r.ok for r in reports),
                    "modes": [r.as_dict() for r in reports],
                },
                indent=2,
            )
        )
        return
    for r in reports:
        arriving = f" (+{r.arriving:,} while checking)" if r.arriving else ""
        print(  # noqa: T201
            f"{r.mode} ({r.collection}): {r.status}: "
            f"expected {r.expected:,}, found {r.found:,}{arriving}, missing {r.missing:,}, "
            f"duplicated {r.duplicated:,}, wrong {r.wrong:,}, unexpected {r.unexpected:,}; "
            f"documents {r.documents:,}, bad documents {r.bad_documents:,}"
        )
        if r.still_arriving:
            print(  # noqa: T201
                "  the daemons are still writing: run verify again with --wait SECONDS "
                "(it waits until the count reaches the expected one or stops changing)"
            )
            continue
        for example in r.examples:
            print(f"  {example}")  # noqa: T201


def cmd_verify(args: argparse.Namespace) -> int:
    """``loadgen verify``."""
    expected = expected_from_manifest(args.manifest) if args.manifest else expected_from_args(args)
    if args.collection and args.mode == "both":
        raise ConfigError(
            "--collection: give --bucket-collection/--timeseries-collection with --mode both"
        )
    settings = validate_verify(
        VerifySettings(
            mongodb_uri=args.mongodb_uri,
            db=args.db,
            mode=args.mode,
            bucket_collection=args.collection or args.bucket_collection,
            timeseries_collection=args.collection or args.timeseries_collection,
            json=args.json,
            sensors_per_query=args.sensors_per_query,
            wait=args.wait,
            settle=args.settle,
        )
    )
    try:
        reports = run_verify(settings, expected, args.bucket_span_seconds)
    except VerifyError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    _print_verify(reports, settings.json)
    return 0 if all(r.ok for r in reports) else 1


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``loadgen`` command."""
    env = os.environ if env is None else env
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser(env).parse_args(argv)
        commands = {
            "publish": cmd_publish,
            "verify": cmd_verify,
            "bench": bench_cli.cmd_bench,
            "bucket-fill": bucket_fill.cmd_bucket_fill,
        }
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        return 130


def _plural(count: int, noun: str) -> str:
    """``1 process``, ``2 processes``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es"
