"""Frozen, typed settings of ``loadgen publish`` and ``loadgen verify``, validated in one place.

Every check raises :class:`ConfigError` with one line naming the flag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal
from urllib.parse import unquote, urlsplit

from ingest.config import read_secret

if TYPE_CHECKING:
    from pathlib import Path

type VerifyMode = Literal["bucket", "timeseries", "both"]
_PREFIX = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_GROUP = re.compile(r"^[A-Za-z0-9_]{1,100}$")  # a Sparkplug group id the daemon keeps as is
PAYLOAD_FORMATS = ("json", "sparkplug")
_TOPIC_PREFIX = re.compile(r"^[^#+\x00]{1,200}$")
_RELATIVE = re.compile(r"^now(?:([+-])(\d+(?:\.\d+)?)([smhd]))?$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_WAIT = 86_400.0  # verify --wait and --settle: a day at most
MAX_PER_MESSAGE = 10_000  # the daemon's default --max-readings-per-message


class ConfigError(ValueError):
    """A bad flag value; the message is one line naming the flag."""


@dataclass(frozen=True, slots=True)
class PublishSettings:
    """Everything ``loadgen publish`` needs."""

    host: str
    port: int
    sensors: int
    rate: float
    duration: float | None
    count: int | None
    per_message: int
    qos: int
    seed: int
    sensor_prefix: str
    topic_prefix: str
    start_ms: int
    step_ms: int
    processes: int
    manifest: str | None = None
    json: bool = False
    progress: bool = True
    max_inflight: int = 1000
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    late_every: int = 0
    payload_format: str = "json"  # json | sparkplug
    untimed_every: int = 0  # every Nth sensor sends no time (payloads.Run.untimed_every)
    repeat_every: int = 0  # every Nth message of a timed sensor is published twice

    @property
    def separator(self) -> str:
        """Between the sensor prefix and the index in the daemon's sensor ids."""
        return "/" if self.payload_format == "sparkplug" else "-"


@dataclass(frozen=True, slots=True)
class VerifySettings:
    """Everything ``loadgen verify`` needs."""

    mongodb_uri: str
    db: str
    mode: VerifyMode
    bucket_collection: str
    timeseries_collection: str
    json: bool = False
    sensors_per_query: int = 100
    wait: float = 0.0  # seconds to wait for the count to match or settle before checking
    settle: float = 5.0  # the count unchanged this long ends the wait


@dataclass(frozen=True, slots=True)
class Broker:
    """Where to publish, and as whom."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def parse_mqtt_url(url: str, password_file: str | None = None) -> Broker:
    """``mqtt://[user[:password]@]host[:port]`` -> :class:`Broker`.

    ``password_file`` (``--mqtt-password-file``) overrides the URL's password; its
    surrounding whitespace (a trailing newline) is dropped. Messages never quote a password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port or 1883
    except ValueError:
        raise ConfigError(
            f"--mqtt-url: bad port in {redact(url)!r} (percent-encode '/', '#' "
            "or '@' in a password)"
        ) from None
    if parts.scheme != "mqtt" or not parts.hostname:
        raise ConfigError(
            f"--mqtt-url: expected mqtt://[user[:password]@]host[:port], got {redact(url)!r}"
        )
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if password_file:
        password = read_secret(password_file, "--mqtt-password-file", ConfigError)
    if password is not None and username is None:
        raise ConfigError("--mqtt-url: a password needs a user name (mqtt://user@host)")
    return Broker(parts.hostname, port, username, password)


def parse_start(text: str, now: float, allow_relative: bool = True) -> int:
    """``--start`` (ISO-8601 with an offset, epoch seconds, ``now``, ``now-6h``) -> epoch ms."""
    match = _RELATIVE.fullmatch(text.strip())
    if match:
        if not allow_relative:
            raise ConfigError(
                f"--start: {text!r} is relative; give the run's absolute start (or use --manifest)"
            )
        sign, amount, unit = match.groups()
        offset = float(amount) * _UNITS[unit] if amount else 0.0
        return round((now + (offset if sign == "+" else -offset)) * 1000)
    try:
        return round(float(text) * 1000)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"--start: expected ISO-8601, epoch seconds or now-6h, got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return round(parsed.timestamp() * 1000)


def parse_step(seconds: float) -> int:
    """``--time-step`` seconds -> whole milliseconds (BSON dates hold milliseconds)."""
    step_ms = round(seconds * 1000)
    if step_ms < 1 or abs(step_ms - seconds * 1000) > 1e-6:
        raise ConfigError(f"--time-step: must be a positive multiple of 0.001 s, got {seconds}")
    return step_ms


def validate_publish(settings: PublishSettings) -> PublishSettings:
    """Check a publish configuration; return it unchanged."""
    checks: list[tuple[bool, str]] = [
        (settings.sensors >= 1, "--sensors: must be at least 1"),
        (settings.rate >= 0, "--rate: must be >= 0 (0: as fast as possible)"),
        (
            (settings.duration is None) != (settings.count is None),
            "--duration/--count: give exactly one of them",
        ),
        (settings.duration is None or settings.duration > 0, "--duration: must be > 0"),
        (settings.count is None or settings.count >= 1, "--count: must be at least 1"),
        (
            1 <= settings.per_message <= MAX_PER_MESSAGE,
            f"--per-message: must be between 1 and {MAX_PER_MESSAGE}",
        ),
        (settings.qos in (0, 1), "--qos: must be 0 or 1"),
        (settings.seed >= 0, "--seed: must be >= 0"),
        (
            bool(_PREFIX.fullmatch(settings.sensor_prefix)),
            "--sensor-prefix: must match [A-Za-z0-9_-]{1,100}",
        ),
        (
            bool(_TOPIC_PREFIX.fullmatch(settings.topic_prefix)),
            "--topic-prefix: must be a topic without wildcards",
        ),
        (settings.processes >= 1, "--processes: must be at least 1"),
        (1 <= settings.max_inflight <= 65535, "--max-inflight: must be between 1 and 65535"),
        (1 <= settings.port <= 65535, "--mqtt-url: port out of range"),
        (
            settings.late_every == 0 or settings.late_every >= 2,
            "--late-every: must be 0 (off) or at least 2",
        ),
        (
            settings.late_every == 0 or settings.count is not None,
            "--late-every: needs --count (late messages are sent after all others)",
        ),
        (settings.untimed_every >= 0, "--untimed-every: must be 0 (off) or at least 1"),
        (settings.repeat_every >= 0, "--repeat-every: must be 0 (off) or at least 1"),
        (
            settings.payload_format == "json"
            or not (settings.untimed_every or settings.repeat_every),
            "--untimed-every/--repeat-every: json payloads only",
        ),
        (
            settings.payload_format in PAYLOAD_FORMATS,
            f"--format: must be one of {', '.join(PAYLOAD_FORMATS)}",
        ),
        (
            settings.payload_format != "sparkplug"
            or bool(_GROUP.fullmatch(settings.sensor_prefix)),
            (
                "--sensor-prefix: with --format sparkplug it is the group id and must match "
                "[A-Za-z0-9_]{1,100} (the daemon's sensor ids are <group>/<edge node>)"
            ),
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    return settings


def validate_verify(settings: VerifySettings) -> VerifySettings:
    """Check a verify configuration; return it unchanged."""
    if settings.mode not in ("bucket", "timeseries", "both"):
        raise ConfigError("--mode: choose bucket, timeseries or both")
    if not settings.mongodb_uri.startswith(("mongodb://", "mongodb+srv://")):
        raise ConfigError("--mongodb-uri: expected mongodb://... or mongodb+srv://...")
    if settings.sensors_per_query < 1:
        raise ConfigError("--sensors-per-query: must be at least 1")
    if not 0 <= settings.wait <= MAX_WAIT:
        raise ConfigError(f"--wait: must be between 0 and {MAX_WAIT:.0f} seconds")
    if not 0 < settings.settle <= MAX_WAIT:
        raise ConfigError(f"--settle: must be more than 0 and at most {MAX_WAIT:.0f} seconds")
    return settings


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """Everything ``loadgen bench`` needs besides the publish settings."""

    mongodb_uri: str
    db: str
    out: Path
    modes: tuple[str, ...]
    collections: dict[str, str]
    preset: str
    start: str
    use_running: bool = False
    metrics_urls: dict[str, str] = field(default_factory=dict)
    daemon_mqtt_url: str = ""
    daemon_password_file: str | None = None
    daemon_args: tuple[str, ...] = ()
    bucket_span_seconds: int = 3600
    query_runs: int = 5
    latency_samples: int = 50
    poll_interval: float = 0.1
    wait_timeout: float = 120.0
