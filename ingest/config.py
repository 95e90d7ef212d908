"""Frozen, typed settings, validated in one place.

Every check raises :class:`ConfigError` with one line that names the flag, so the CLI can
print it without a traceback.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args
from urllib.parse import unquote, urlsplit

from ingest.caches import DEFAULT_LIMIT as DEFAULT_CACHE_LIMIT
from ingest.errors import ConfigError

if TYPE_CHECKING:
    from ingest.devices.mapping import Mapping
    from ingest.tokens import ApiToken

type Mode = Literal["bucket", "timeseries"]
type Granularity = Literal["seconds", "minutes", "hours"]
# What to do with a retained message the broker sends because the daemon subscribed.
type Retained = Literal["ignore", "store"]
MODES: tuple[str, ...] = get_args(Mode.__value__)
GRANULARITIES: tuple[str, ...] = get_args(Granularity.__value__)
RETAINED: tuple[str, ...] = get_args(Retained.__value__)
DEFAULT_COLLECTION: dict[str, str] = {"bucket": "buckets", "timeseries": "readings"}
DEFAULT_BUCKET_SPAN_SECONDS = 3600
# Distinct per mode, so the two daemons can run side by side on one host.
DEFAULT_METRICS_PORT: dict[str, int] = {"bucket": 9108, "timeseries": 9109}
# MQTT 5 caps Receive Maximum at 65535 (a two-byte integer).
MAX_FILTER_BYTES = 65_535  # MQTT: a UTF-8 string of at most 65,535 bytes
MAX_RECEIVE_MAXIMUM = 65535
MAX_TIMESERIES_SPAN = 31_536_000  # MongoDB's limit for bucketMaxSpanSeconds
# expireAfterSeconds limits (src/mongo/db/catalog/index_key_validate.cpp): a TTL index
# takes a 32-bit integer; a time-series (clustered) collection at most the seconds since
# 1970, which 20,000 days (1.728e9 s) stays under from October 2024 on.
MAX_TTL_SECONDS = 2**31 - 1
MAX_TIMESERIES_RETENTION_DAYS = 20_000
MAX_WORKERS = 64  # an explicit --workers; auto stops at ingest.pipeline.workers.AUTO_MAX
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """Where and how to reach the broker."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """Build the TLS context for ``mqtts://``, or None for plain TCP."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the daemon needs, built once by the CLI and handed down."""

    mode: Mode = "bucket"
    mqtt: MqttSettings = field(default_factory=lambda: parse_mqtt_url("mqtt://localhost:1883"))
    topics: tuple[str, ...] = ("sensors/#",)
    shared_group: str | None = None
    client_id: str = "ingest"
    qos: int = 1
    mongodb_uri: str = field(default="mongodb://localhost:27017", repr=False)
    db: str = "iot"
    collection: str = "buckets"
    rejects_collection: str = "rejects"
    rejects_max_bytes: int = 16 * 1024 * 1024
    metrics_host: str = "0.0.0.0"  # noqa: S104 - a daemon's metrics are scraped from outside
    metrics_port: int = 9108
    # /metrics behind a bearer token (--metrics-tokens-file) and/or TLS (the health checks
    # stay open).
    metrics_tokens: tuple[ApiToken, ...] = field(default=(), repr=False)
    metrics_tls_cert: str | None = None
    metrics_tls_key: str | None = None
    batch_size: int = 10_000
    flush_interval: float = 1.0
    write_concurrency: int = 2
    max_buffered_readings: int = 50_000
    max_buffered_bytes: int = 64 * 1024 * 1024
    max_inflight_messages: int = 30_000
    max_cached_series: int = DEFAULT_CACHE_LIMIT  # entries of each cache of sensors or topics
    mqtt_keepalive: int = 60
    bucket_span_seconds: int | None = None
    bucket_max_readings: int = 3600
    granularity: Granularity = "seconds"
    retention_days: float | None = None
    max_message_bytes: int = 1024 * 1024
    max_readings_per_message: int = 10_000
    max_past_seconds: float = 365 * 86400.0
    max_future_seconds: float = 600.0
    shutdown_timeout: float = 10.0
    # A retained message delivered because the daemon subscribed is old state: skipped
    # and counted (ignore), or stored at the time it was first seen (store).
    retained: Retained = "ignore"
    dry_run: bool = False
    # A reading's sensor is the one its topic names: a payload naming another is refused
    # (sensor_id_mismatch; ingest/devices/identity.py).
    sensor_id_from_topic: bool = False
    # Mapping rules (--mapping, --preset), compiled by the CLI; None: the default format.
    mapping: Mapping | None = field(default=None, repr=False, compare=False)
    # Consumer processes (--workers, resolved by the CLI; see ingest/pipeline/workers.py).
    workers: int = 1
    # Take only what the session already holds: subscribe nothing, unsubscribe the
    # subscriptions (a retired worker's session, drained then ended;
    # ingest/pipeline/worker_sessions.py).
    drain_only: bool = False

    @property
    def span_seconds(self) -> int:
        """The bucket document span in bucket mode."""
        return self.bucket_span_seconds or DEFAULT_BUCKET_SPAN_SECONDS

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """Topic filters as subscribed, with the shared-subscription prefix if any."""
        if self.mapping is not None:  # a stateful format may split them (Sparkplug, Homie)
            return self.mapping.shared_subscriptions(self.topics, self.shared_group)
        if self.shared_group is None:
            return self.topics
        return tuple(f"$share/{self.shared_group}/{topic}" for topic in self.topics)

    @property
    def derived_group(self) -> str:
        """The shared group of --workers N > 1 without --shared-group: the client id."""
        return re.sub(r"[^A-Za-z0-9_-]", "-", self.client_id)[:64] or "ingest"

    @property
    def other_subscriptions(self) -> tuple[str, ...]:
        """The other form of each filter, unsubscribed after subscribing.

        A session keeps its subscriptions: after a switch between one worker (plain
        filters) and several (a shared group), the old form would deliver every message
        a second time.
        """
        if self.shared_group is None:
            # What the workers subscribe, including a format's split (Sparkplug DATA
            # shared, BIRTH/DEATH plain): only the shared filters are the other form.
            shared = replace(self, shared_group=self.derived_group).subscriptions
            return tuple(topic for topic in shared if topic.startswith("$share/"))
        subscribed = set(self.subscriptions)
        alone = replace(self, shared_group=None).subscriptions  # a format's split (Homie)
        return tuple(
            topic for topic in dict.fromkeys((*alone, *self.topics)) if topic not in subscribed
        )


def parse_mqtt_url(url: str) -> MqttSettings:
    """Parse ``mqtt://[user[:pass]@]host[:port]`` or ``mqtts://...``."""
    if "://" not in url:
        raise ConfigError(
            f"--mqtt-url: {_redact_url(url)!r} has no scheme: use "
            "mqtt://host:port (or mqtts://host:port for TLS)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # The driver's message may quote the password (an unencoded '/' or '#' in it
        # shifts the parse), so say only what is wrong.
        raise ConfigError(_bad_port(url)) from None
    if parts.scheme not in {"mqtt", "mqtts"}:
        raise ConfigError(
            f"--mqtt-url: scheme must be mqtt:// or mqtts://, got {parts.scheme or 'none'!r}"
        )
    if not parts.hostname:
        raise ConfigError(f"--mqtt-url: no host in {_redact_url(url)!r}")
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise ConfigError(
            "--mqtt-url: must not have a path, query or fragment (topics go in --topic)"
        )
    if port == 0:
        raise ConfigError("--mqtt-url: port must be between 1 and 65535")
    tls = parts.scheme == "mqtts"
    return MqttSettings(
        host=parts.hostname,
        port=port if port is not None else (8883 if tls else 1883),
        tls=tls,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def _bad_port(url: str) -> str:
    """What is wrong with a URL whose port urlsplit cannot read, in one line."""
    unparsable = (
        "--mqtt-url: cannot parse the host and port (percent-encode reserved "
        "characters such as '/', '#' or '@' in the password)"
    )
    try:
        parts = urlsplit(url)
    except ValueError:
        return unparsable
    host_port = parts.netloc.rpartition("@")[2]
    # Only a netloc that really ends the authority (no '@' after it, which would make it
    # part of a password with an unencoded '/', '#' or '?') is quoted.
    match = re.fullmatch(r"(\[[^\]]*\]|[^:\[\]]*):([^:]*)", host_port)
    if match and "@" not in url.partition(parts.netloc)[2]:
        port = match.group(2)
        if port.isdigit():
            return f"--mqtt-url: port {port} is out of range: it must be between 1 and 65535"
        return f"--mqtt-url: port {port!r} is not a number"
    return unparsable


def _redact_url(url: str) -> str:
    """Hide the password of a URL so it can appear in an error message."""
    return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)


def read_secret(path: str, flag: str, error: type[Exception] = ConfigError) -> str:
    """The stripped text of a secret file (a Docker secret, a password file)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise error(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{flag}: {path} is not UTF-8 text") from None


def redact_mongodb_uri(uri: str) -> str:
    """Hide credentials in a MongoDB URI for logs and messages."""
    return re.sub(r"(//)[^/@]*@", r"\1***@", uri)


def validate(settings: Settings) -> Settings:
    """Check cross-field rules; returns the settings unchanged when valid."""
    _check_positive(settings)
    if settings.mode not in MODES:
        raise ConfigError(f"--mode: must be one of {', '.join(MODES)}, got {settings.mode!r}")
    if settings.granularity not in GRANULARITIES:
        raise ConfigError(f"--granularity: must be one of {', '.join(GRANULARITIES)}")
    if settings.retained not in RETAINED:
        raise ConfigError(
            f"--retained: must be one of {', '.join(RETAINED)}, got {settings.retained!r}"
        )
    # QoS 2 is refused: paho answers PUBREC on arrival, so a message received but not yet
    # written would be lost on a crash. At QoS 1 the broker downgrades QoS 2 publishes and
    # we get at-least-once with the ack after the write.
    if settings.qos not in (0, 1):
        raise ConfigError(
            f"--qos: must be 0 or 1 (QoS 2 publishes arrive as QoS 1), got {settings.qos}"
        )
    _check_topics(settings)
    if settings.shared_group is not None and not _NAME.match(settings.shared_group):
        raise ConfigError("--shared-group: use letters, digits, '_' or '-' (no '/', '+', '#')")
    _check_split(settings)
    _check_store(
        settings.mongodb_uri, settings.db, settings.collection, settings.rejects_collection
    )
    if settings.max_inflight_messages > MAX_RECEIVE_MAXIMUM:
        raise ConfigError(f"--max-inflight-messages: at most {MAX_RECEIVE_MAXIMUM} (MQTT 5)")
    if settings.mqtt_keepalive > MAX_RECEIVE_MAXIMUM:
        raise ConfigError(f"--mqtt-keepalive: at most {MAX_RECEIVE_MAXIMUM} seconds (MQTT 5)")
    if settings.max_buffered_readings < settings.batch_size:
        raise ConfigError("--max-buffered-readings: must be at least --batch-size")
    if (
        settings.mode == "timeseries"
        and settings.bucket_span_seconds is not None
        and settings.bucket_span_seconds > MAX_TIMESERIES_SPAN
    ):
        raise ConfigError(
            f"--bucket-span-seconds: at most {MAX_TIMESERIES_SPAN} "
            "(one year) for a time-series collection"
        )
    _check_retention(settings)
    _check_server_tls(settings.metrics_tls_cert, settings.metrics_tls_key, "--metrics")
    if not 0 <= settings.metrics_port <= 65535:
        raise ConfigError("--metrics-port: must be between 0 and 65535")
    if not 1 <= settings.workers <= MAX_WORKERS:
        raise ConfigError(f"--workers: must be between 1 and {MAX_WORKERS}, or auto")
    _check_tls(settings.mqtt)
    return settings


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """A filter's shared-subscription group and its plain form (``$share/<group>/<filter>``).

    ``(None, topic_filter)`` for a filter that is not shared, or whose ``$share/`` prefix
    lacks its group or its filter.
    """
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) == 3:
            return parts[1], parts[2]
    return None, topic_filter


def filter_problem(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a topic filter MQTT 5 allows (§4.7), or None.

    The broker refuses such a subscription; said at start instead, with what to fix.
    """
    group, text = split_shared(topic_filter)
    group_ok = not topic_filter.startswith("$share/") or (
        bool(group) and not {"+", "#"} & set(group or "")
    )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    levels = text.split("/")
    problems = (
        (
            not group_ok,
            "a shared subscription is $share/<group>/<filter>, its group without '+' or '#'",
        ),
        (not text, "the filter is empty"),
        ("\x00" in text, "a filter may not hold the character U+0000"),
        (size < 0, "a filter must be valid UTF-8"),
        (size > MAX_FILTER_BYTES, f"a filter has at most {MAX_FILTER_BYTES} bytes of UTF-8"),
        (any("#" in level and level != "#" for level in levels), "'#' must be a level of its own"),
        (any("+" in level and level != "+" for level in levels), "'+' must be a level of its own"),
        ("#" in levels[:-1], "'#' must be the last level"),
    )
    return next((why for bad, why in problems if bad), None)


def _check_topics(settings: Settings) -> None:
    if not settings.topics or any(not t for t in settings.topics):
        raise ConfigError("--topic: at least one non-empty topic filter is required")
    for topic in settings.topics:
        problem = filter_problem(topic)
        if problem is not None:
            raise ConfigError(f"--topic {topic!r}: {problem} (MQTT 5, 4.7)")


def _check_split(settings: Settings) -> None:
    """A format that splits shared filters (Sparkplug) must be able to split these."""
    group = settings.shared_group or (settings.derived_group if settings.workers > 1 else None)
    if group is None or settings.mapping is None:  # workers share a group too
        return
    try:
        settings.mapping.shared_subscriptions(settings.topics, group)
    except ConfigError as exc:
        if settings.shared_group is not None:
            raise
        raise ConfigError(
            str(exc).replace("--shared-group:", "--workers: several workers share a group;", 1)
        ) from None


def _check_retention(settings: Settings) -> None:
    """--retention-days within what MongoDB accepts as expireAfterSeconds."""
    if settings.retention_days is None:
        return
    if settings.mode == "timeseries":
        most = float(MAX_TIMESERIES_RETENTION_DAYS)
    else:  # the TTL index expires a bucket one span after its retention
        most = (MAX_TTL_SECONDS - settings.span_seconds) // 86400
    if settings.retention_days > most:
        raise ConfigError(
            f"--retention-days: at most {most:.0f} in {settings.mode} mode "
            "(MongoDB's limit on expireAfterSeconds)"
        )


def _check_tls(mqtt: MqttSettings) -> None:
    """Refuse TLS files that cannot be used, naming the flag, before anything starts."""
    files = {
        "--mqtt-ca-file": mqtt.ca_file,
        "--mqtt-cert-file": mqtt.cert_file,
        "--mqtt-key-file": mqtt.key_file,
    }
    given = [flag for flag, path in files.items() if path]
    if given and not mqtt.tls:
        raise ConfigError(f"{given[0]}: TLS files need an mqtts:// --mqtt-url")
    if mqtt.key_file and not mqtt.cert_file:
        raise ConfigError("--mqtt-key-file: give the certificate too (--mqtt-cert-file)")
    for flag, path in files.items():
        if path and not Path(path).is_file():
            raise ConfigError(f"{flag}: {path} is not a readable file")
    if not mqtt.tls:
        return
    try:
        context = ssl.create_default_context(cafile=mqtt.ca_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--mqtt-ca-file: cannot load {mqtt.ca_file} ({_ssl_reason(exc)}); give a PEM CA bundle"
        ) from None
    if mqtt.cert_file:
        try:
            # No interactive prompt for an encrypted key: the daemon has no passphrase.
            context.load_cert_chain(mqtt.cert_file, mqtt.key_file, password=b"")
        except (OSError, ValueError) as exc:
            flags = "--mqtt-cert-file/--mqtt-key-file" if mqtt.key_file else "--mqtt-cert-file"
            reason = (
                "not a PEM certificate, or the key does not match it"
                if isinstance(exc, ssl.SSLError)
                else _ssl_reason(exc)
            )
            raise ConfigError(
                f"{flags}: cannot load the client certificate ({reason}); "
                "give a PEM certificate and its matching key"
            ) from None


def _ssl_reason(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc)


def _check_positive(settings: Settings) -> None:
    positive = {
        "--batch-size": settings.batch_size,
        "--flush-interval": settings.flush_interval,
        "--write-concurrency": settings.write_concurrency,
        "--max-buffered-readings": settings.max_buffered_readings,
        "--max-buffered-bytes": settings.max_buffered_bytes,
        "--max-inflight-messages": settings.max_inflight_messages,
        "--max-cached-series": settings.max_cached_series,
        "--mqtt-keepalive": settings.mqtt_keepalive,
        "--bucket-max-readings": settings.bucket_max_readings,
        "--max-message-bytes": settings.max_message_bytes,
        "--max-readings-per-message": settings.max_readings_per_message,
        "--max-past-seconds": settings.max_past_seconds,
        "--max-future-seconds": settings.max_future_seconds,
        "--shutdown-timeout": settings.shutdown_timeout,
        "--rejects-max-bytes": settings.rejects_max_bytes,
    }
    if settings.bucket_span_seconds is not None:
        positive["--bucket-span-seconds"] = settings.bucket_span_seconds
    if settings.retention_days is not None:
        positive["--retention-days"] = settings.retention_days
    for flag, value in positive.items():
        if not (value > 0 and math.isfinite(value)):  # also refuses NaN and infinity
            raise ConfigError(f"{flag}: must be a finite number greater than 0, got {value}")


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """What ``ingest api`` needs: where to read, which layout, where to listen, who may."""

    mode: Mode = "bucket"
    mongodb_uri: str = field(default="mongodb://localhost:27017", repr=False)
    db: str = "iot"
    collection: str = "buckets"
    rejects_collection: str = "rejects"
    bucket_span_seconds: int = DEFAULT_BUCKET_SPAN_SECONDS
    host: str = "127.0.0.1"
    port: int = 8080
    grafana_url: str = ""  # none: the page shows no Grafana link
    # the [page] tables of the daemon's presets and mapping file: (first, last) patterns
    page_order: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    query_timeout: float = 10.0
    tokens: tuple[ApiToken, ...] = ()
    insecure: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    max_concurrent_queries: int = 16
    session_hours: float = 12.0


def _check_store(uri: str, db: str, collection: str, rejects: str) -> None:
    """The MongoDB URI's scheme and the database and collection names."""
    if not uri.startswith(("mongodb://", "mongodb+srv://")):
        raise ConfigError("--mongodb-uri: must start with mongodb:// or mongodb+srv://")
    for flag, name in (
        ("--db", db),
        ("--collection", collection),
        ("--rejects-collection", rejects),
    ):
        if not _NAME.match(name):
            raise ConfigError(f"{flag}: use letters, digits, '_' or '-', got {name!r}")


def validate_api(settings: ApiSettings) -> ApiSettings:
    """Check the API's settings; returns them unchanged when valid."""
    if settings.mode not in MODES:
        raise ConfigError(f"--mode: must be one of {', '.join(MODES)}, got {settings.mode!r}")
    _check_store(
        settings.mongodb_uri, settings.db, settings.collection, settings.rejects_collection
    )
    if not 0 <= settings.port <= 65535:
        raise ConfigError("--api-port: must be between 0 and 65535")
    for flag, value in (
        ("--bucket-span-seconds", settings.bucket_span_seconds),
        ("--query-timeout", settings.query_timeout),
    ):
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag}: must be a finite number greater than 0, got {value}")
    if settings.grafana_url and not settings.grafana_url.startswith(("http://", "https://", "/")):
        raise ConfigError("--grafana-url: must start with http://, https:// or /")
    if settings.max_concurrent_queries < 1:
        raise ConfigError(
            "--api-max-concurrent-queries: must be 1 or more, got "
            f"{settings.max_concurrent_queries}"
        )
    if not (settings.session_hours > 0 and math.isfinite(settings.session_hours)):
        raise ConfigError(
            "--api-session-hours: must be a finite number greater than 0, got "
            f"{settings.session_hours}"
        )
    _check_server_tls(settings.tls_cert, settings.tls_key)
    if not settings.tokens and not settings.insecure and not is_loopback(settings.host):
        raise ConfigError(
            f"--api-host {settings.host}: not a loopback address, and no --api-tokens-file: "
            "make a token with python -c 'import secrets; print(secrets.token_urlsafe(32))' "
            "> tokens and pass --api-tokens-file tokens (or --api-insecure behind a proxy "
            "that authenticates)"
        )
    return settings


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface


def _check_server_tls(cert: str | None, key: str | None, prefix: str = "--api") -> None:
    """Both TLS files or neither, each readable (``prefix``: --api or --metrics)."""
    if (cert is None) != (key is None):
        raise ConfigError(f"{prefix}-tls-cert and {prefix}-tls-key: give both or neither")
    for flag, path in ((f"{prefix}-tls-cert", cert), (f"{prefix}-tls-key", key)):
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"{flag}: cannot read {path}")


def server_tls_context(
    cert: str | None,
    key: str | None,
    prefix: str = "--api",
) -> ssl.SSLContext | None:
    """A server's TLS context from its certificate and key files (TLS 1.2 at least)."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{prefix}-tls-cert/{prefix}-tls-key: cannot load {cert} and {key} ({exc})"
        ) from None
    return context
