"""Command line: argv and ``INGEST_*`` environment -> settings -> the command.

Every ``ingest`` command (run, init-db, migrate, api, local, check, discover,
device-account) is parsed here, and no other module reads a setting from the environment:
every flag ``--some-flag`` can also be set as ``INGEST_SOME_FLAG``; a flag on the command
line wins. The one other variable, ``INGEST_NO_EXTENSIONS`` (the pure-Python path instead
of the compiled accelerators), is read where the path is chosen, by :mod:`ingest.accel`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ingest import __version__, accel
from ingest.caches import DEFAULT_LIMIT as DEFAULT_CACHE_LIMIT
from ingest.config import (
    DEFAULT_BUCKET_SPAN_SECONDS,
    DEFAULT_COLLECTION,
    DEFAULT_METRICS_PORT,
    GRANULARITIES,
    MODES,
    RETAINED,
    ApiSettings,
    Settings,
    parse_mqtt_url,
    read_secret,
    validate,
    validate_api,
)
from ingest.errors import ConfigError, IncompatibleError, SchemaError, StartupError
from ingest.tokens import read_tokens

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ingest.devices.mapping import Mapping as RuleMapping
    from ingest.local import LocalSettings

ENV_PREFIX = "INGEST_"
TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}
logger = logging.getLogger("ingest")


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, no usage dump.

    A bad value that came from an ``INGEST_*`` variable is reported under the variable's
    name: argparse converts it as the flag's default, and would name the flag alone.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - argparse's
        super().__init__(*args, **kwargs)
        self.env_sources: dict[str, str] = {}  # flag -> the variable that set its default
        self._given: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse, remembering the arguments (to tell a flag given from its variable)."""
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Exit 2 with one line; a bad variable's value named by the variable."""
        flag, sep, problem = message.removeprefix("argument ").partition(": ")
        var = self.env_sources.get(flag)
        if sep and var is not None and not self._was_given(flag):
            message = f"{var}: {problem} (the variable of {flag})"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _was_given(self, flag: str) -> bool:
        """Whether ``flag`` (or an abbreviation argparse accepts) is on the command line."""
        names = (arg.split("=", 1)[0] for arg in self._given if arg.startswith("--"))
        return any(len(name) > 2 and flag.startswith(name) for name in names)


def _number[T: (int, float)](kind: Callable[[str], T]) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a number, got {text!r}") from None

    convert.__name__ = kind.__name__
    return convert


def _flag(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    name: str,
    help_text: str,
    default: object = None,
    **kwargs: object,
) -> None:
    """Add ``--name`` whose default comes from ``INGEST_NAME`` when set."""
    var = ENV_PREFIX + name.upper().replace("-", "_")
    if var in env:
        default = env[var]
        if isinstance(parser, _Parser):
            parser.env_sources[f"--{name}"] = var
        choices = kwargs.get("choices")
        # argparse checks choices on the command line only, not on defaults.
        if choices is not None and default not in choices:  # type: ignore[operator]
            allowed = ", ".join(map(str, choices))  # type: ignore[call-overload]
            raise ConfigError(
                f"--{name}: invalid value {default!r} from {var} (choose from {allowed})"
            )
    parser.add_argument(f"--{name}", default=default, help=f"{help_text} [env {var}]", **kwargs)  # type: ignore[arg-type]


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(ENV_PREFIX + name, "").strip().lower()
    if raw not in TRUE | FALSE:
        raise ConfigError(f"{ENV_PREFIX}{name}: expected true/false, got {raw!r}")
    return raw in TRUE


def _common_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    integer, real = _number(int), _number(float)
    _flag(parser, env, "mode", "storage layout", "bucket", choices=MODES)
    _flag(
        parser,
        env,
        "mongodb-uri",
        "MongoDB connection string (credentials and TLS go here)",
        "mongodb://localhost:27017",
    )
    _flag(parser, env, "mongodb-uri-file", "read the MongoDB URI from this file (Docker secret)")
    _flag(parser, env, "db", "database name", "iot")
    _flag(
        parser,
        env,
        "collection",
        "target collection (default: buckets in bucket mode, readings in timeseries mode)",
    )
    _flag(parser, env, "rejects-collection", "capped collection for rejected input", "rejects")
    _flag(
        parser,
        env,
        "rejects-max-bytes",
        "size of the capped rejects collection",
        16 * 1024 * 1024,
        type=integer,
    )
    _flag(parser, env, "retention-days", "expire data after this many days (TTL)", type=real)
    _flag(
        parser,
        env,
        "bucket-span-seconds",
        "bucket mode: span of one document (default 3600); timeseries mode: custom "
        "bucketing (bucketMaxSpanSeconds = bucketRoundingSeconds)",
        type=integer,
    )
    _flag(
        parser,
        env,
        "granularity",
        "timeseries mode: collection granularity",
        "seconds",
        choices=GRANULARITIES,
    )
    _flag(
        parser,
        env,
        "log-level",
        "logging level",
        "info",
        choices=["debug", "info", "warning", "error"],
    )


def _run_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    integer, real = _number(int), _number(float)
    _flag(
        parser,
        env,
        "mqtt-url",
        "broker URL: mqtt://[user[:pass]@]host[:port] or mqtts://",
        "mqtt://localhost:1883",
    )
    _flag(parser, env, "mqtt-password-file", "read the MQTT password from this file")
    _flag(parser, env, "mqtt-ca-file", "CA bundle to verify the broker (mqtts://)")
    _flag(parser, env, "mqtt-cert-file", "client certificate (mqtts://)")
    _flag(parser, env, "mqtt-key-file", "client key (mqtts://)")
    _topic_flag(
        parser,
        "topic filter, repeatable [env INGEST_TOPIC, comma-separated] "
        "(default sensors/#; with --mapping or --preset, the topics of their rules)",
    )
    _flag(parser, env, "shared-group", "subscribe through $share/<group>/<topic>")
    _flag(
        parser,
        env,
        "client-id",
        "MQTT client id; keep it stable for a persistent session "
        "(default ingest-<mode>-<hostname>)",
    )
    _flag(parser, env, "qos", "subscription QoS", 1, type=integer)
    _flag(parser, env, "metrics-host", "address of /metrics, /healthz, /readyz", "0.0.0.0")  # noqa: S104 - scraped from outside; bind to a private address if needed
    _flag(
        parser,
        env,
        "metrics-port",
        "port of /metrics, /healthz, /readyz (0: any; default "
        "9108 in bucket mode, 9109 in timeseries mode)",
        type=integer,
    )
    _flag(
        parser,
        env,
        "metrics-tokens-file",
        "/metrics needs one of these bearer tokens (one "
        'a line, or TOML name = "token"); /healthz and /readyz stay open',
    )
    _flag(
        parser,
        env,
        "metrics-tls-cert",
        "serve /metrics, /healthz, /readyz over HTTPS with this certificate (PEM)",
    )
    _flag(parser, env, "metrics-tls-key", "the private key of --metrics-tls-cert (PEM)")
    _flag(
        parser,
        env,
        "batch-size",
        "close a batch at this many readings (or messages)",
        10_000,
        type=integer,
    )
    _flag(
        parser,
        env,
        "flush-interval",
        "close a batch this many seconds after it opened",
        1.0,
        type=real,
    )
    _flag(parser, env, "write-concurrency", "batches written at once", 2, type=integer)
    _flag(
        parser,
        env,
        "max-buffered-readings",
        "stop reading from the broker when this many readings wait to be written",
        50_000,
        type=integer,
    )
    _flag(
        parser,
        env,
        "max-buffered-bytes",
        "stop reading from the broker when messages taken and not yet written hold this "
        "many bytes (payloads, readings, reject documents; estimated)",
        64 * 1024 * 1024,
        type=integer,
    )
    _flag(
        parser,
        env,
        "max-inflight-messages",
        "MQTT 5 Receive Maximum: unacknowledged messages the broker may send",
        30_000,
        type=integer,
    )
    _flag(
        parser,
        env,
        "max-cached-series",
        "entries each cache of sensors or topics holds (sensor ids checked, arrival "
        "times, topic checksums, topics' rules), per process",
        DEFAULT_CACHE_LIMIT,
        type=integer,
    )
    _flag(
        parser,
        env,
        "mqtt-keepalive",
        "MQTT keepalive in seconds: PINGREQ when the "
        "connection is otherwise idle; no answer within it means the broker is gone",
        60,
        type=integer,
    )
    _flag(
        parser,
        env,
        "bucket-max-readings",
        "bucket mode: most readings in one document",
        3600,
        type=integer,
    )
    _flag(
        parser,
        env,
        "max-message-bytes",
        "reject larger payloads before parsing",
        1024 * 1024,
        type=integer,
    )
    _flag(
        parser,
        env,
        "max-readings-per-message",
        "reject messages with more readings",
        10_000,
        type=integer,
    )
    _flag(
        parser, env, "max-past-seconds", "reject readings older than this", 365 * 86400.0, type=real
    )
    _flag(
        parser,
        env,
        "max-future-seconds",
        "reject readings further ahead than this",
        600.0,
        type=real,
    )
    _flag(
        parser,
        env,
        "shutdown-timeout",
        "seconds to drain on SIGTERM before giving up",
        10.0,
        type=real,
    )
    _flag(
        parser,
        env,
        "retained",
        "a retained message the broker sends because the daemon "
        "subscribed is old state: ignore (acknowledge and count it) or store (at the time "
        "any daemon first saw it; see docs/configuration.md)",
        "ignore",
        choices=RETAINED,
    )
    _flag(
        parser,
        env,
        "workers",
        "consumer processes on one shared subscription group, one "
        "metrics endpoint (auto: the CPUs this process may use, at most 8; see "
        "docs/scaling.md)",
        "auto",
    )
    _mapping_flags(parser, env)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="decode, batch and build writes, send nothing to MongoDB [env INGEST_DRY_RUN]",
    )
    parser.add_argument(
        "--sensor-id-from-topic",
        action="store_true",
        default=None,
        help="a reading's sensor is the one its topic names: refuse a "
        "payload naming another (sensor_id_mismatch); with one broker "
        "account per device, a device cannot write as another "
        "[env INGEST_SENSOR_ID_FROM_TOPIC]",
    )


def _api_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    integer, real = _number(int), _number(float)
    _flag(parser, env, "mode", "layout of the collection read", "bucket", choices=MODES)
    _flag(
        parser,
        env,
        "mongodb-uri",
        "MongoDB connection string; a read-only user is enough",
        "mongodb://localhost:27017",
    )
    _flag(parser, env, "mongodb-uri-file", "read the MongoDB URI from this file (Docker secret)")
    _flag(parser, env, "db", "database name", "iot")
    _flag(
        parser,
        env,
        "collection",
        "collection read (default: buckets in bucket mode, readings in timeseries mode)",
    )
    _flag(parser, env, "rejects-collection", "the daemons' rejects collection", "rejects")
    _flag(
        parser,
        env,
        "bucket-span-seconds",
        "bucket mode: span of one document, as the daemon writes it",
        DEFAULT_BUCKET_SPAN_SECONDS,
        type=integer,
    )
    _flag(
        parser,
        env,
        "api-host",
        "address of the API, its page and /metrics; an address "
        "other than loopback needs --api-tokens-file (or --api-insecure)",
        "127.0.0.1",
    )
    _flag(
        parser,
        env,
        "api-port",
        "port of the API, its page and /metrics (0: any)",
        8080,
        type=integer,
    )
    _flag(
        parser,
        env,
        "api-tokens-file",
        "the tokens that may read: one a line, or TOML "
        'name = "token" pairs (a Docker or Kubernetes secret file as it is); /api/*, '
        "/openapi.json and /metrics then need Authorization: Bearer <token> or the page's "
        "login",
    )
    parser.add_argument(
        "--api-insecure",
        action="store_true",
        default=None,
        help="serve without tokens on any address (behind a proxy that "
        "authenticates) [env INGEST_API_INSECURE]",
    )
    _flag(parser, env, "api-tls-cert", "serve HTTPS with this certificate (PEM, chain first)")
    _flag(parser, env, "api-tls-key", "the private key of --api-tls-cert (PEM)")
    _flag(
        parser,
        env,
        "api-max-concurrent-queries",
        "queries one caller (a token, or an "
        "address without tokens) may have running; more are answered 429",
        16,
        type=integer,
    )
    _flag(parser, env, "api-session-hours", "how long a login of the page lasts", 12.0, type=real)
    _flag(
        parser,
        env,
        "grafana-url",
        "Grafana's address, for the page's dashboard link (none: no link)",
        "",
    )
    _flag(
        parser,
        env,
        "mapping",
        "the daemon's mapping file: its [page] table orders the page's charts",
    )
    parser.add_argument(
        "--preset",
        action="append",
        default=None,
        help="the daemon's presets, repeatable: their [page] tables order the page's "
        "charts (docs/presets.md) [env INGEST_PRESET, comma-separated]",
    )
    _flag(parser, env, "query-timeout", "seconds one query may run (maxTimeMS)", 10.0, type=real)
    _flag(
        parser,
        env,
        "log-level",
        "logging level",
        "info",
        choices=["debug", "info", "warning", "error"],
    )


def api_settings_from(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ApiSettings:
    """Validated settings of ``ingest api``."""
    env = {} if env is None else env
    mongodb_uri = args.mongodb_uri
    if args.mongodb_uri_file:
        mongodb_uri = read_secret(args.mongodb_uri_file, "--mongodb-uri-file")
    insecure = (
        args.api_insecure if args.api_insecure is not None else _env_bool(env, "API_INSECURE")
    )
    return validate_api(
        ApiSettings(
            mode=args.mode,
            mongodb_uri=mongodb_uri,
            db=args.db,
            collection=args.collection or DEFAULT_COLLECTION.get(args.mode, "buckets"),
            rejects_collection=args.rejects_collection,
            bucket_span_seconds=args.bucket_span_seconds,
            host=args.api_host,
            port=args.api_port,
            grafana_url=args.grafana_url,
            page_order=load_page_order(args, env),
            query_timeout=args.query_timeout,
            tokens=read_tokens(args.api_tokens_file) if args.api_tokens_file else (),
            insecure=insecure,
            tls_cert=args.api_tls_cert,
            tls_key=args.api_tls_key,
            max_concurrent_queries=args.api_max_concurrent_queries,
            session_hours=args.api_session_hours,
        )
    )


def _mapping_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    _flag(parser, env, "mapping", "mapping rules file (TOML; see docs/mapping.md)")
    parser.add_argument(
        "--preset",
        action="append",
        default=None,
        help="shipped mapping preset, repeatable, after --mapping's rules "
        "[env INGEST_PRESET, comma-separated]",
    )


def _topic_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--topic", action="append", default=None, help=help_text)


def topic_filters(
    args: argparse.Namespace, env: Mapping[str, str], rules: RuleMapping | None
) -> tuple[str, ...]:
    """The filters of --topic, else of INGEST_TOPIC (comma-separated), else the rules'."""
    if args.topic:
        return tuple(args.topic)
    if ENV_PREFIX + "TOPIC" in env:
        return tuple(t.strip() for t in env[ENV_PREFIX + "TOPIC"].split(","))
    return rules.subscriptions() if rules is not None else ("sensors/#",)


def preset_names(args: argparse.Namespace, env: Mapping[str, str]) -> list[str]:
    """The presets of --preset, else of INGEST_PRESET (comma-separated)."""
    return args.preset or [p.strip() for p in env.get("INGEST_PRESET", "").split(",") if p.strip()]


def load_page_order(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The page's measurement order from the [page] tables of --mapping and --preset."""
    from ingest.devices import page_order  # noqa: PLC0415 - only ingest api needs it

    return page_order.load(args.mapping, preset_names(args, env))


def load_mapping(args: argparse.Namespace, env: Mapping[str, str]) -> RuleMapping | None:
    """The compiled rules of --mapping and --preset, or None when neither is given."""
    presets = preset_names(args, env)
    if not args.mapping and not presets:
        return None
    from ingest.devices.mapping import Mapping as RuleMapping  # noqa: PLC0415 - only with rules

    return RuleMapping.load(args.mapping, presets)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show a flag's default, unless it has none (its help then says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class _DescribedDefaults(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """Show defaults, keep the description's own line breaks."""


INIT_DB_HELP = """\
Create the mode's collection (validator, indexes, TTL) and the capped rejects
collection; safe to run again. Daemons do the same at start; run it once ahead
with --shard on a sharded cluster, connected to a mongos.

--shard shards the collection with a key of high cardinality that does not grow
with time, so a fleet's writes spread over all shards:
  bucket mode      {sensor_id: "hashed"}  one shard holds all of a sensor's
                   documents: each upsert goes to one shard, and the unique
                   {sensor_id, readings.ts} index stays enforceable.
  timeseries mode  {meta.sensor_id: 1}    MongoDB 8.0 deprecates sharding a
                   time-series collection on its time field; its claims
                   collection on {_id: "hashed"}, which keeps each claim's
                   _id unique across shards.
On a replica set or a standalone server --shard changes nothing and says so.
"""


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The ``ingest`` parser and its commands."""
    parser = _Parser(prog="ingest", description="MQTT to MongoDB time-series ingestion.")
    parser.add_argument("--version", action="version", version=f"ingest {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    fmt = DefaultsHelpFormatter
    run = commands.add_parser("run", help="consume MQTT and write to MongoDB", formatter_class=fmt)
    _common_flags(run, env)
    _run_flags(run, env)
    init = commands.add_parser(
        "init-db",
        help="create collections and indexes (and shard them), then exit",
        formatter_class=_DescribedDefaults,
        description=INIT_DB_HELP,
    )
    _common_flags(init, env)
    api = commands.add_parser(
        "api", help="serve the read API, its page and its metrics (read-only)", formatter_class=fmt
    )
    _api_flags(api, env)
    migrate = commands.add_parser(
        "migrate",
        help="bring a bucket collection written by an earlier version to this "
        "version's document shape, once, then exit",
        formatter_class=_DescribedDefaults,
        description=MIGRATE_HELP,
    )
    _common_flags(migrate, env)
    init.add_argument(
        "--shard",
        action="store_true",
        default=None,
        help="also shard the collection (on a mongos; a no-op with a "
        "warning elsewhere) [env INGEST_SHARD]",
    )
    local = commands.add_parser(
        "local",
        help="try it on one machine: a local mosquitto, an embedded store (not "
        "MongoDB), both daemons and the read API",
        formatter_class=_DescribedDefaults,
        description=LOCAL_HELP,
    )
    _local_flags(local, env)
    check = commands.add_parser(
        "check",
        help="show what a message would be stored as (or why it is rejected)",
        formatter_class=fmt,
    )
    _mapping_flags(check, env)
    check.add_argument("--topic-name", required=True, help="the message's MQTT topic")
    check.add_argument(
        "--earlier",
        nargs=2,
        action="append",
        default=[],
        metavar=("TOPIC", "PAYLOAD"),
        help="a message decoded before, for the state it leaves (Homie "
        "attributes, a Sparkplug BIRTH); repeatable, in order; its outcome "
        "is not shown",
    )
    check.add_argument(
        "payload", nargs="?", default="-", help="the payload; '-' or nothing reads it from stdin"
    )
    _discover_parser(commands, env)
    account = commands.add_parser(
        "device-account",
        help="add a device's own MQTT account to a mosquitto password "
        "file (or give it a new password)",
        formatter_class=_DescribedDefaults,
        description=DEVICE_ACCOUNT_HELP,
    )
    account.add_argument(
        "name",
        help="the device's name: its user name, and the topic "
        "level it may publish under (sensors/<name>/...)",
    )
    account.add_argument(
        "--passwd", required=True, help="the mosquitto password file (deploy/mosquitto/passwd)"
    )
    account.add_argument(
        "--password-file",
        help="read the password from this file (default: make a random one and print it once)",
    )
    return parser


DEVICE_ACCOUNT_HELP = """\
Add an account for one device to a mosquitto password file, or replace its password.
With the ACL of deploy/mosquitto/acl (pattern write sensors/%u/#) the device may publish
only under sensors/<name>/, so one device cannot write as another. Without
--password-file a random password is made and printed once on stdout: give it to the
device. Restart the broker, or send it SIGHUP, to load the file.
"""


MIGRATE_HELP = """\
Bring the bucket collection (--db, --collection) to the document shape this version
writes (schema_version 2: the series' tags in every document's key), then exit. The
daemon refuses to start on a collection holding an earlier shape and names this
command. Stop every daemon writing to the collection first; running it twice changes
nothing the second time. Time-series collections need no migration.
"""
DEFAULT_MQTT_PORT = 1883
LOCAL_HELP = """\
Start a mosquitto broker, an embedded MongoDB-compatible store, the daemon in both
modes and the read API with its page, print where to publish and how to look at the
data, and stop them all on Ctrl-C. --mapping and --preset go to every daemon.

The embedded store is the mongoeco emulator on SQLite (pip install 'iot-ingest[local]'):
it is NOT MongoDB and not for production. --mongodb-uri uses a real MongoDB instead, and
--mqtt-url a broker you run.

Each flag is also an INGEST_* variable. The daemons and the API get every setting as a
flag from ingest local and no INGEST_* variable: any other (INGEST_COLLECTION, ...)
applies to no part, and ingest local names it at start.
"""


def _local_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    integer = _number(int)
    _flag(parser, env, "data-dir", "where the store and the broker keep their data", "ingest-data")
    _flag(parser, env, "mode", "which daemons to run", "both", choices=["both", *MODES])
    _flag(parser, env, "mqtt-url", "use this broker instead of starting mosquitto")
    _flag(
        parser,
        env,
        "mqtt-port",
        "port of the started mosquitto, on 127.0.0.1 (default "
        "1883; a broker already listening there is used instead)",
        type=integer,
    )
    _flag(parser, env, "mosquitto", "the mosquitto binary (default: found on PATH or in /usr/sbin)")
    _flag(parser, env, "mongodb-uri", "use this MongoDB instead of the embedded store")
    _flag(
        parser, env, "store-port", "port of the embedded store (on 127.0.0.1)", 27017, type=integer
    )
    _flag(
        parser,
        env,
        "metrics-port",
        "bucket daemon's metrics port; timeseries uses the next one (default 9108 and 9109)",
        type=integer,
    )
    _flag(
        parser,
        env,
        "api-port",
        "port of the read API and its page (on 127.0.0.1)",
        8080,
        type=integer,
    )
    _flag(parser, env, "db", "database name", "iot")
    _topic_flag(
        parser,
        "topic filter the daemons subscribe to, repeatable [env INGEST_TOPIC, "
        "comma-separated] (default sensors/#; with --mapping or --preset, the topics "
        "of their rules)",
    )
    _mapping_flags(parser, env)
    _flag(
        parser,
        env,
        "log-level",
        "logging level",
        "info",
        choices=["debug", "info", "warning", "error"],
    )


def local_settings(args: argparse.Namespace, env: Mapping[str, str]) -> LocalSettings:
    """Settings of ``ingest local``, checked with the daemon's and the API's own rules."""
    from ingest.local import LocalSettings  # noqa: PLC0415 - only this command needs it

    if args.mqtt_url is not None:
        parse_mqtt_url(args.mqtt_url)
    modes = MODES if args.mode == "both" else (args.mode,)
    rules = load_mapping(args, env)  # an unknown preset or a bad file stops here
    topics = topic_filters(args, env, rules)
    local = LocalSettings(
        data_dir=Path(args.data_dir).resolve(),
        modes=modes,
        mqtt_url=args.mqtt_url,
        mqtt_port=args.mqtt_port if args.mqtt_port is not None else DEFAULT_MQTT_PORT,
        mqtt_port_given=args.mqtt_port is not None,
        mongodb_uri=args.mongodb_uri,
        store_port=args.store_port,
        metrics_port=args.metrics_port,
        db=args.db,
        topics=topics,
        mapping=str(Path(args.mapping).resolve()) if args.mapping else None,
        presets=tuple(preset_names(args, env)),
        api_port=args.api_port,
        mosquitto=args.mosquitto,
        log_level=args.log_level,
        # The parts get every setting as a flag; an INGEST_* variable left in their
        # environment would set what ingest local leaves at the default (INGEST_COLLECTION:
        # one name for a bucket and a time-series collection, and an API reading neither).
        child_env={k: v for k, v in env.items() if not k.startswith(ENV_PREFIX)}
        | accel.inherited(env),
        ignored_env=tuple(
            sorted(
                k
                for k in env
                if k.startswith(ENV_PREFIX)
                and k.removeprefix(ENV_PREFIX).lower() not in vars(args)
                and k != accel.ENV
            )
        ),
    )
    uri = local.mongodb_uri or "mongodb://127.0.0.1"
    for mode in modes:  # the flags the daemons will get, validated as theirs are
        validate(
            Settings(
                mode=mode,  # type: ignore[arg-type]
                mongodb_uri=uri,
                db=local.db,
                topics=topics,
                metrics_port=local.metrics_port_of(mode),
                mapping=rules,
            )
        )
    validate_api(ApiSettings(mode=local.api_mode, mongodb_uri=uri, db=local.db))
    for flag, port in (
        ("--mqtt-port", local.mqtt_port),
        ("--store-port", local.store_port),
        ("--api-port", local.api_port),
    ):
        if not 1 <= port <= 65535:
            raise ConfigError(f"{flag}: must be between 1 and 65535")
    local.check_ports()
    return local


def _discover_parser(commands: argparse._SubParsersAction[_Parser], env: Mapping[str, str]) -> None:
    integer, real = _number(int), _number(float)
    discover = commands.add_parser(
        "discover",
        help="listen to a broker and propose a mapping file for what it sees",
        formatter_class=DefaultsHelpFormatter,
        description="Prints a proposed mapping file on stdout and, on stderr, what each "
        "rule would accept, reject or ignore of the messages heard.",
    )
    _flag(
        discover,
        env,
        "mqtt-url",
        "broker URL: mqtt://[user[:pass]@]host[:port] or mqtts://",
        "mqtt://localhost:1883",
    )
    _flag(discover, env, "mqtt-password-file", "read the MQTT password from this file")
    _flag(discover, env, "mqtt-ca-file", "CA bundle to verify the broker (mqtts://)")
    discover.add_argument(
        "--topic",
        action="append",
        default=None,
        help="topic filter to listen to, repeatable (default #)",
    )
    discover.add_argument("--seconds", type=real, default=30.0, help="how long to listen")
    discover.add_argument(
        "--max-messages",
        type=integer,
        default=10_000,
        help="stop listening after this many messages",
    )
    _mapping_flags(discover, env)


def settings_from(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """Validated settings from parsed arguments and the environment."""
    mongodb_uri = args.mongodb_uri
    if args.mongodb_uri_file:
        mongodb_uri = read_secret(args.mongodb_uri_file, "--mongodb-uri-file")
    common = {
        "mode": args.mode,
        "mongodb_uri": mongodb_uri,
        "db": args.db,
        "collection": args.collection or DEFAULT_COLLECTION.get(args.mode, "buckets"),
        "rejects_collection": args.rejects_collection,
        "rejects_max_bytes": args.rejects_max_bytes,
        "retention_days": args.retention_days,
        "bucket_span_seconds": args.bucket_span_seconds,
        "granularity": args.granularity,
    }
    if args.command != "run":
        return validate(Settings(**common))
    mqtt = parse_mqtt_url(args.mqtt_url)
    password = mqtt.password
    if args.mqtt_password_file:
        password = read_secret(args.mqtt_password_file, "--mqtt-password-file")
    mqtt = type(mqtt)(
        mqtt.host,
        mqtt.port,
        mqtt.tls,
        mqtt.username,
        password,
        args.mqtt_ca_file,
        args.mqtt_cert_file,
        args.mqtt_key_file,
    )
    mapping = load_mapping(args, env)
    topics = topic_filters(args, env, mapping)
    dry_run = args.dry_run if args.dry_run is not None else _env_bool(env, "DRY_RUN")
    return validate(
        Settings(
            **common,
            mqtt=mqtt,
            topics=topics,
            shared_group=args.shared_group,
            client_id=args.client_id or f"ingest-{args.mode}-{socket.gethostname()}",
            qos=args.qos,
            metrics_host=args.metrics_host,
            metrics_tokens=(
                read_tokens(args.metrics_tokens_file, "--metrics-tokens-file")
                if args.metrics_tokens_file
                else ()
            ),
            metrics_tls_cert=args.metrics_tls_cert,
            metrics_tls_key=args.metrics_tls_key,
            metrics_port=(
                args.metrics_port
                if args.metrics_port is not None
                else DEFAULT_METRICS_PORT[args.mode]
            ),
            batch_size=args.batch_size,
            flush_interval=args.flush_interval,
            write_concurrency=args.write_concurrency,
            max_buffered_readings=args.max_buffered_readings,
            max_buffered_bytes=args.max_buffered_bytes,
            max_inflight_messages=args.max_inflight_messages,
            max_cached_series=args.max_cached_series,
            mqtt_keepalive=args.mqtt_keepalive,
            bucket_max_readings=args.bucket_max_readings,
            max_message_bytes=args.max_message_bytes,
            max_readings_per_message=args.max_readings_per_message,
            max_past_seconds=args.max_past_seconds,
            max_future_seconds=args.max_future_seconds,
            shutdown_timeout=args.shutdown_timeout,
            retained=args.retained,
            dry_run=dry_run,
            sensor_id_from_topic=(
                args.sensor_id_from_topic
                if args.sensor_id_from_topic is not None
                else _env_bool(env, "SENSOR_ID_FROM_TOPIC")
            ),
            mapping=mapping,
            workers=_workers(args.workers),
        )
    )


def _workers(text: str) -> int:
    """--workers: a number, or auto (the CPUs this process may use, capped)."""
    from ingest.pipeline.workers import auto_workers  # noqa: PLC0415 - only `run` needs it

    if text.strip().lower() == "auto":
        return auto_workers()
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--workers: expects a number or auto, got {text!r}") from None


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``ingest`` command."""
    env = os.environ if env is None else env
    try:
        args = build_parser(env).parse_args(argv)
        if args.command in _COMMANDS:
            return _COMMANDS[args.command](args, env)
        if args.command == "local":
            local = local_settings(args, env)
        else:
            settings = settings_from(args, env)
    except ConfigError as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)  # noqa: T201 - before logging exists
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "local":
        return _execute_local(local)
    logging.getLogger("ingest.mqtt.client").setLevel(max(logging.WARNING, logging.root.level))
    shard = getattr(args, "shard", None)
    return _execute(
        args.command, settings, shard=shard if shard is not None else _env_bool(env, "SHARD")
    )


def _discover(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ingest.devices.discover.command import main as discover  # noqa: PLC0415 - its own command

    return discover(args, env)


def _api(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    return _execute_api(api_settings_from(args, env), args.log_level)


def _check(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from ingest.devices.check import check  # noqa: PLC0415 - a separate, short-lived command

    return check(
        load_mapping(args, env),
        args.topic_name,
        args.payload,
        earlier=[(t, p) for t, p in args.earlier],
    )


def _device_account(args: argparse.Namespace, _env: Mapping[str, str]) -> int:
    from ingest.mqtt import accounts  # noqa: PLC0415 - its own short command

    if args.password_file is None:
        password, show = accounts.new_password(), True
    else:
        password, show = read_secret(args.password_file, "--password-file"), False
    new = accounts.set_account(Path(args.passwd), args.name, password)
    if show:
        print(password)  # noqa: T201 - the one place it is shown
    print(  # noqa: T201
        f"ingest: {'added' if new else 'changed the password of'} {args.name!r} in "
        f"{args.passwd}; reload the broker (SIGHUP) to use it",
        file=sys.stderr,
    )
    return 0


# Commands that need no logging set up first (they set up their own, or print only).
_COMMANDS: dict[str, Callable[[argparse.Namespace, Mapping[str, str]], int]] = {
    "discover": _discover,
    "api": _api,
    "check": _check,
    "device-account": _device_account,
}


def _execute_local(local: LocalSettings) -> int:
    from ingest import local as local_run  # noqa: PLC0415 - keeps --help fast

    try:
        return local_run.main(local)
    except StartupError as exc:
        print(f"ingest local: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1


def _execute_api(settings: ApiSettings, log_level: str) -> int:
    import uvloop  # noqa: PLC0415 - only the running server needs it

    from ingest.api import server  # noqa: PLC0415 - keeps --help and config errors fast

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        uvloop.run(server.serve(settings))
    except ConfigError as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except StartupError as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _execute(command: str, settings: Settings, shard: bool = False) -> int:
    import uvloop  # noqa: PLC0415 - only the running daemon needs it

    from ingest.pipeline import app  # noqa: PLC0415 - keeps --help and config errors fast

    status = 0
    try:
        if command == "init-db":
            uvloop.run(app.init_db(settings, shard=shard))
            logger.info("collections and indexes ready in %s", settings.db)
        elif command == "migrate":
            uvloop.run(app.migrate(settings))
        else:
            status = _run_daemon(settings)
    except ConfigError as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except StartupError as exc:
        print(f"ingest: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    except SchemaError as exc:
        logger.error("%s", exc)  # noqa: TRY400 - a clear refusal, not a crash
        return 1
    except IncompatibleError as exc:
        logger.error("%s", exc)  # noqa: TRY400 - a clear refusal, not a crash
        return 1
    except KeyboardInterrupt:
        return 130
    return status


def accelerators() -> str:
    """Which twins run, compiled or Python (accel.describe).

    Said once every module that picks one is imported: the daemon's, the mapping formats'.
    """
    for module in (
        "ingest.devices.mapping",
        "ingest.devices.formats.json",
        "ingest.pipeline.app",
    ):  # app: the rest
        importlib.import_module(module)
    return accel.describe()


def _run_daemon(settings: Settings) -> int:
    """``ingest run``: one daemon, or the parent of its workers; the exit status."""
    import uvloop  # noqa: PLC0415 - as in _execute

    from ingest.mqtt import client_lock  # noqa: PLC0415 - as app
    from ingest.pipeline.worker_sessions import worker_client_id  # noqa: PLC0415 - as app

    # Every session this daemon uses, for as long as it runs (forked workers inherit the
    # locks): a second daemon with the same client ids refuses to start.
    held = client_lock.claim_all(
        settings, [worker_client_id(settings.client_id, index) for index in range(settings.workers)]
    )
    logger.info("%s", accelerators())
    from ingest.pipeline.app import tell_default_topic  # noqa: PLC0415 - as app

    tell_default_topic(settings)
    try:
        if settings.workers > 1:
            from ingest.pipeline import workers  # noqa: PLC0415 - only several workers need it

            return workers.supervise(settings)
        from ingest.pipeline.workers import run_one  # noqa: PLC0415 - as app

        uvloop.run(run_one(settings))
        return 0
    finally:
        client_lock.release(held)
