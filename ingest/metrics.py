"""Every metric declared once, plus the small HTTP server for /metrics, /healthz, /readyz."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ingest import accel
from ingest.devices import decode
from ingest.devices.decode import REASONS
from ingest.devices.formats import homie, sparkplug
from ingest.errors import StartupError
from ingest.store import deliveries

if TYPE_CHECKING:
    import socket
    import ssl
    from collections.abc import Awaitable, Callable, Iterator
    from types import TracebackType

    from prometheus_client.metrics_core import Metric

    from ingest.devices.formats.stateful import MetricCounts
    from ingest.devices.mapping import Mapping
    from ingest.tokens import TokenSet

logger = logging.getLogger(__name__)

NAMESPACE = "ingest"
_WRITE_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_BATCH_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10_000, 50_000)
WRITE_ERROR_KINDS = ("transient", "rejected")
RULE_OUTCOMES = ("accepted", "rejected")
# What became of retained messages sent because the daemon subscribed (--retained):
# skipped (ignore), or stored at a time first seen now (new) or recorded earlier (known);
# attribute: a Homie attribute (or /set...) topic, never readings, not subject to --retained.
RETAINED_OUTCOMES = ("skipped", "new", "known", "attribute")
# Why a message was skipped (ingest/mqtt/subscriptions.py): it came through a subscription
# of a filter not subscribed today (its Subscription Identifier says so), or through one
# made without identifier and its topic is outside today's filters.
SKIP_REASONS = ("old_subscription", "unidentified_subscription")
# The *_created series double the output and no dashboard uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    """The daemon's metrics, in their own registry so tests and replicas stay isolated."""

    def __init__(self, mode: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.mode = mode
        r = self.registry
        # process_* (memory, CPU, file descriptors) of this process, read from /proc at
        # each scrape (Linux; elsewhere none): a worker's are its own, labelled by the
        # parent of --workers N (ingest.pipeline.workers_endpoint).
        self._collectors(r)
        self.messages_received = Counter(
            "messages_received", "MQTT messages received.", namespace=NAMESPACE, registry=r
        )
        self.messages_acked = Counter(
            "messages_acked",
            "MQTT messages acknowledged after their write.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.messages_lost = Counter(
            "messages_lost",
            "QoS 0 messages read from the broker and not written because "
            "the daemon stopped first (the broker does not resend QoS 0; QoS 1 messages are "
            "left unacknowledged and resent).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.redeliveries_adopted = Counter(
            "redeliveries_adopted",
            "Messages redelivered after a reconnect while their "
            "write was in flight: acknowledged once written, not written again.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.redeliveries_reacked = Counter(
            "redeliveries_reacked",
            "Messages redelivered (DUP) after their write and "
            "PUBACK, whose PUBACK the broker may not have received: acknowledged again, "
            "not written again.",
            namespace=NAMESPACE,
            registry=r,
        )
        self._ledger(r)
        self.packet_id_reused = Counter(
            "mqtt_packet_id_reused",
            "New QoS 1 messages the broker sent under a packet id "
            "whose earlier message was still unacknowledged: acknowledged after it, in "
            "order.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.received_bytes = Counter(
            "received_bytes", "Payload bytes received.", namespace=NAMESPACE, registry=r
        )
        self.readings_accepted = Counter(
            "readings_accepted",
            "Readings decoded and accepted for writing.",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.readings_written = Counter(
            "readings_written",
            "Readings written to MongoDB (or built, with --dry-run).",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.duplicates = Counter(
            "duplicate_readings",
            "Readings not written because the same reading (sensor, "
            "ts and values) is already stored: redeliveries after a crash, retried writes "
            "whose first attempt landed, or a sensor sending a reading twice (bucket mode).",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.duplicate_checked = Counter(
            "duplicate_checked_readings",
            "Time-series mode: instants looked up before "
            "being inserted (every batch's: what is stored there is left out).",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.duplicate_check_seconds = Counter(
            "duplicate_check_seconds",
            "Time spent in those lookups.",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.readings_rejected = Counter(
            "readings_rejected",
            "Readings rejected, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.messages_ignored = Counter(
            "messages_ignored",
            "Messages matched by a mapping rule with ignore = true, or "
            "on a topic its format does not use (Homie /set, $broadcast, attributes other "
            "than $datatype, $unit, $format, $description): acknowledged, not stored.",
            ["rule"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.retained_messages = Counter(
            "retained_messages",
            "Retained messages the broker sent because the daemon "
            "subscribed (old state, not new readings), by outcome: skipped (--retained "
            "ignore; acknowledged, not stored), or stored (--retained store) at the time it "
            "was first seen, now (new) or by an earlier delivery (known); attribute: a Homie "
            "attribute or command topic, never a reading, taken (as the device's state) "
            "whatever --retained says.",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.messages_skipped = Counter(
            "messages_skipped",
            "Messages that came through a subscription the daemon does "
            "not hold today (a filter of an earlier run, kept by the persistent session): "
            "acknowledged, not stored; by reason.",
            ["reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.rule_messages = Counter(
            "rule_messages",
            "Messages taken by each mapping rule: accepted if at least one "
            "reading was, else rejected.",
            ["rule", "outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.rejects_written = Counter(
            "rejects_written",
            "Documents written to the rejects collection.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.write_ops = Counter(
            "write_ops",
            "Write operations sent to MongoDB (updates or inserted documents).",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.write_requests = Counter(
            "write_requests",
            "Bulk writes (update or insert) sent to MongoDB.",
            ["mode"],
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.write_errors = Counter(
            "write_errors",
            "Failed writes, by kind (transient: retried).",
            ["mode", "kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.batch_write_seconds = Histogram(
            "batch_write_seconds",
            "Time to write one batch, retries included.",
            ["mode"],
            buckets=_WRITE_SECONDS_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.batch_readings = Histogram(
            "batch_readings",
            "Readings per written batch.",
            ["mode"],
            buckets=_BATCH_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        ).labels(mode)
        self.buffered_readings = Gauge(
            "buffered_readings",
            "Readings decoded but not yet written.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.buffer_limit = Gauge(
            "buffer_limit_readings",
            "The configured bound on buffered readings.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.buffered_bytes = Gauge(
            "buffered_bytes",
            "Estimated memory held by messages taken and not yet written: "
            "payloads, decoded readings and reject documents.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.buffer_limit_bytes = Gauge(
            "buffer_limit_bytes",
            "The configured bound on buffered bytes.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.inbox_bytes = Gauge(
            "inbox_bytes",
            "Estimated memory held by messages received from the broker and "
            "not yet taken by the pipeline (payloads, topics, per-message overhead).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.inbox_limit_bytes = Gauge(
            "inbox_limit_bytes",
            "The bound on inbox bytes (a quarter of "
            "--max-buffered-bytes): reading from the broker pauses beyond it.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_paused = Gauge(
            "mqtt_read_paused",
            "1 while reading from the broker is paused because the "
            "inbox is full (TCP and the broker hold the backlog).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_pauses = Counter(
            "mqtt_read_pauses",
            "Times reading from the broker paused (inbox full).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.read_paused_seconds = Counter(
            "mqtt_read_paused_seconds",
            "Seconds reading from the broker was paused.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.mqtt_connected = Gauge(
            "mqtt_connected",
            "1 while connected to the MQTT broker.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.mqtt_reconnects = Counter(
            "mqtt_reconnects",
            "Connection attempts after the first.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.mongodb_up = Gauge(
            "mongodb_up",
            "1 while the last MongoDB operation succeeded.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.workers = Gauge(
            "workers",
            "Consumer processes behind this endpoint (1 per process; the "
            "endpoint of --workers N sums them).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.workers.set(1)
        self.info = Gauge(
            "info",
            "Constant 1, labelled with the daemon's mode.",
            ["mode", "dry_run"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.build_info = Gauge(
            "build_info",
            "Constant 1, labelled with the package version, the Python "
            "implementation and version, and whether the compiled accelerators run "
            '(accelerated="false": the pure-Python path; INGEST_NO_EXTENSIONS or not '
            "built).",
            ["version", "python", "accelerated"],
            namespace=NAMESPACE,
            registry=r,
        )
        self._sparkplug(r)
        self._homie(r)
        for reason in dict.fromkeys((*REASONS, *sparkplug.REASONS, *homie.REASONS)):
            self.readings_rejected.labels(reason)
        for kind in WRITE_ERROR_KINDS:
            self.write_errors.labels(mode, kind)
        for outcome in RETAINED_OUTCOMES:
            self.retained_messages.labels(outcome)
        for reason in SKIP_REASONS:
            self.messages_skipped.labels(reason)

    def _collectors(self, r: CollectorRegistry) -> None:
        """What is read when scraped: the process, the fallbacks, the caches' sizes."""
        ProcessCollector(registry=r)
        r.register(_AcceleratorFallbacks())
        self.caches = _CachedEntries()
        r.register(self.caches)

    def _ledger(self, r: CollectorRegistry) -> None:
        """The delivery ledger's lookups (ingest/pipeline/redelivered.py)."""
        self.redeliveries_retimed = Counter(
            "redeliveries_retimed",
            "Messages resent (DUP) that the process could not "
            "recognise as its own (after a restart): decoded with the arrival times the "
            "delivery ledger recorded for their first delivery (recorded), or as new "
            "messages (unrecorded: the first delivery was not written).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        for outcome in ("recorded", "unrecorded"):
            self.redeliveries_retimed.labels(outcome)

    def _sparkplug(self, r: CollectorRegistry) -> None:
        """The Sparkplug B metrics, each known label value at 0."""
        self.sparkplug_messages = Counter(
            "sparkplug_messages",
            "Sparkplug B messages seen, by message type.",
            ["type"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_seq_gaps = Counter(
            "sparkplug_seq_gaps",
            "Sparkplug B messages whose seq was not the one after the "
            "edge node's previous (expected with a shared subscription).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_stale_deaths = Counter(
            "sparkplug_stale_deaths",
            "Sparkplug B NDEATHs ignored because their bdSeq is not "
            "the current NBIRTH's (an older connection's will).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_skipped = Counter(
            "sparkplug_metrics_skipped",
            "Sparkplug B metrics not stored by rule: null values, transient metrics.",
            ["why"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_lookups = Counter(
            "sparkplug_table_lookups",
            "Alias tables read from MongoDB because they were not "
            "in memory, by outcome (found, missing).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_tables = Gauge(
            "sparkplug_alias_tables",
            "Sparkplug B alias tables held in memory.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.sparkplug_table_metrics = Gauge(
            "sparkplug_alias_table_metrics",
            "Metrics declared in the Sparkplug B alias tables held in memory (at most "
            "1,000,000: the least recently used tables are read again from MongoDB).",
            namespace=NAMESPACE,
            registry=r,
        )
        for kind in sparkplug.MESSAGE_TYPES:
            self.sparkplug_messages.labels(kind)
        for why in sparkplug.SKIPS:
            self.sparkplug_skipped.labels(why)
        for outcome in ("found", "missing"):
            self.sparkplug_lookups.labels(outcome)

    def _homie(self, r: CollectorRegistry) -> None:
        """The Homie metrics, each known label value at 0."""
        self.homie_messages = Counter(
            "homie_messages",
            "Homie messages taken, by kind: value, attribute (taken as "
            "the device's state), cleared (an empty payload on a value topic).",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.homie_lookups = Counter(
            "homie_device_lookups",
            "Homie devices' attributes read from MongoDB because "
            "they were not in memory, by outcome (found, missing).",
            ["outcome"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.homie_devices = Gauge(
            "homie_devices",
            "Homie devices whose attributes are held in memory.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.homie_properties = Gauge(
            "homie_device_properties",
            "Properties of the Homie devices held in memory (at most 1,000,000: the least "
            "recently used devices are read again from MongoDB).",
            namespace=NAMESPACE,
            registry=r,
        )
        for kind in homie.KINDS:
            self.homie_messages.labels(kind)
        for outcome in ("found", "missing"):
            self.homie_lookups.labels(outcome)

    def init_rules(self, names: list[str], ignored: list[str]) -> None:
        """Create every mapping rule's series at 0 (rules are bounded by the configuration)."""
        for name in names:
            for outcome in RULE_OUTCOMES:
                self.rule_messages.labels(name, outcome)
        for name in ignored:
            self.messages_ignored.labels(name)

    def reject(self, reason: str, count: int = 1) -> None:
        """Count rejected readings."""
        self.readings_rejected.labels(reason).inc(count)

    def add_counts(self, counts: MetricCounts) -> None:
        """Add what a stateful format counted (:meth:`Stateful.take_counts`)."""
        for name, value in counts.counters.items():
            metric = getattr(self, name)
            if isinstance(value, dict):
                for label, count in value.items():
                    if count:
                        metric.labels(label).inc(count)
            elif value:
                metric.inc(value)
        for name, gauge in counts.gauges.items():
            getattr(self, name).set(gauge)

    def write_error(self, kind: str) -> None:
        """Count a failed write of the given kind."""
        self.write_errors.labels(self.mode, kind).inc()


class _CachedEntries:
    """``ingest_cached_entries``: the fleet-sized caches' entries (``--max-cached-series``)."""

    def __init__(self) -> None:
        self.mapping: Mapping | None = None  # the daemon's mapping rules, if any

    def sizes(self) -> dict[str, int]:
        """Entries per cache, now (a cache of several parts: their sum)."""
        mapping = self.mapping
        topics = homie.topics_cached() + sparkplug.topics_cached()
        return {
            "sensor_ids": decode.sensors_cached(),
            "arrival_times": decode.ARRIVALS.held() + (mapping.arrivals.held() if mapping else 0),
            "topic_checksums": deliveries.topics_cached(),
            "mapped_topics": topics + (mapping.topics_cached() if mapping else 0),
        }

    def collect(self) -> Iterator[Metric]:
        """One sample per cache."""
        family = GaugeMetricFamily(
            f"{NAMESPACE}_cached_entries",
            "Entries held by the caches that grow with the fleet, by cache: sensor ids "
            "checked (sensor_ids; without the compiled accelerators, which check an id "
            "in C each time), sensors' last arrival times (arrival_times), topics' "
            "checksums (topic_checksums), topics' rules and formats' topic parses "
            "(mapped_topics). Each part holds at most --max-cached-series entries.",
            labels=["cache"],
        )
        for cache, size in self.sizes().items():
            family.add_metric([cache], size)
        yield family


class _AcceleratorFallbacks:
    """``ingest_accelerator_fallbacks_total``, read from :func:`ingest.accel.fallbacks`."""

    def collect(self) -> Iterator[Metric]:
        """One sample per compiled function and cause that handed calls to Python."""
        family = CounterMetricFamily(
            f"{NAMESPACE}_accelerator_fallbacks",
            "Calls a compiled accelerator handed to its Python twin because of an "
            "unexpected exception (a bug in the compiled path: its first is logged), by "
            "function and exception class.",
            labels=["function", "cause"],
        )
        for (function, cause), count in sorted(accel.fallbacks().items()):
            family.add_metric([function, cause], count)
        yield family


@dataclass(slots=True)
class Health:
    """What /readyz reports; each component sets its own flag."""

    mqtt_connected: bool = False
    mongodb_ok: bool = False
    saturated: bool = False
    reading_paused: bool = False  # the MQTT inbox is full: the socket is not read
    stopping: bool = False
    # The broker is contacted once MongoDB is ready: until then MQTT is not "down".
    mqtt_started: bool = False

    def problems(self) -> list[str]:
        """Reasons the daemon is not ready (empty when ready), the store first."""
        mqtt = "mqtt disconnected" if self.mqtt_started else "mqtt not started (waits for mongodb)"
        checks = (
            (not self.mongodb_ok, "mongodb unreachable"),
            (not self.mqtt_connected, mqtt),
            (self.saturated, "buffer saturated"),
            (self.reading_paused, "inbox saturated (reading from the broker paused)"),
            (self.stopping, "shutting down"),
        )
        return [text for failed, text in checks if failed]


type Answer = tuple[bytes, bytes, bytes]  # status line, content type, body


def cannot_listen(host: str, port: int, exc: OSError) -> StartupError:
    """The one-line start-up error for a metrics address that cannot be bound."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return StartupError(
        f"--metrics-port: cannot listen on {host}:{port} ({reason}): another process "
        "uses it (the other mode's daemon?); choose a free --metrics-port (0: any) or "
        "--metrics-host"
    )


class HttpEndpoint:
    """One small HTTP/1.1 endpoint: each GET answered with what ``_route`` gives its path.

    Subclasses start ``self._server`` in ``__aenter__``; leaving the context closes it.
    With ``tokens`` every path but the health checks needs ``Authorization: Bearer``
    (``--metrics-tokens-file``); ``tls`` serves HTTPS (``--metrics-tls-cert``).
    """

    _server: asyncio.Server | None = None
    tokens: TokenSet | None = None
    tls: ssl.SSLContext | None = None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _route(self, path: bytes) -> Answer | Awaitable[Answer]:
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].split(b"?", 1)[0] if b" " in request else b""
            if self.tokens and path not in OPEN_PATHS and not self._authorised(request):
                writer.write(UNAUTHORISED)
                await writer.drain()
                return
            routed = self._route(path)
            status, ctype, body = routed if isinstance(routed, tuple) else await routed
            writer.write(
                b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (status, ctype, len(body), body)
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            # OSError: timeouts, resets, and TLS handshakes that fail (ssl.SSLError)
            logger.debug("metrics request dropped: %s", exc)
        finally:
            writer.close()

    def _authorised(self, request: bytes) -> bool:
        """Whether the request's ``Authorization: Bearer`` header holds an accepted token."""
        assert self.tokens is not None
        for line in request.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                return (
                    scheme.lower() == b"bearer"
                    and self.tokens.name_of(token.strip().decode(errors="replace")) is not None
                )
        return False


# Health checks stay open for probes: they say nothing about the data.
OPEN_PATHS = frozenset({b"/healthz", b"/readyz"})
_DENIED = b"a bearer token is needed (--metrics-tokens-file)\n"
UNAUTHORISED = (
    b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm="ingest"\r\n'
    b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(_DENIED), _DENIED)
)


class MetricsServer(HttpEndpoint):
    """Serves /metrics (Prometheus text), /healthz and /readyz on one port."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Metrics,
        health: Health,
        before_scrape: Callable[[], None] | None = None,
        sock: socket.socket | None = None,
        tokens: TokenSet | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._host, self._port, self._sock = host, port, sock
        self._metrics, self._health = metrics, health
        self._before_scrape = before_scrape
        self._server = None
        self.tokens, self.tls = tokens, tls

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Self:
        if self._sock is not None:  # bound by the parent of --workers N
            self._server = await asyncio.start_server(self._handle, sock=self._sock, ssl=self.tls)
            return self
        try:
            self._server = await asyncio.start_server(
                self._handle, self._host, self._port, ssl=self.tls
            )
        except OSError as exc:
            raise cannot_listen(self._host, self._port, exc) from None
        logger.info(
            "metrics and health on %s://%s:%d/metrics%s",
            "https" if self.tls else "http",
            self._host,
            self.port,
            " (a bearer token needed)" if self.tokens else "",
        )
        return self

    def _route(self, path: bytes) -> tuple[bytes, bytes, bytes]:
        text = b"text/plain; charset=utf-8"
        if path == b"/metrics":
            if self._before_scrape is not None:
                self._before_scrape()
            return b"200 OK", CONTENT_TYPE_LATEST.encode(), generate_latest(self._metrics.registry)
        if path == b"/healthz":
            return b"200 OK", text, b"ok\n"
        if path == b"/readyz":
            problems = self._health.problems()
            if problems:
                return b"503 Service Unavailable", text, ("; ".join(problems) + "\n").encode()
            return b"200 OK", text, b"ready\n"
        return b"404 Not Found", text, b"not found\n"


API_ENDPOINTS = (
    "promql",
    "sensors",
    "readings",
    "series",
    "rejects",
    "info",
    "openapi",
    "page",
    "static",
    "health",
    "metrics",
    "other",
)
API_STATUS_CLASSES = ("2xx", "4xx", "5xx")
_API_SECONDS_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class ApiMetrics:
    """The read API's own metrics (``ingest api``), in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.request_seconds = Histogram(
            "api_request_seconds",
            "Time to answer one read API request, by endpoint and status class.",
            ["endpoint", "status"],
            buckets=_API_SECONDS_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.series_source = Counter(
            "api_series_source",
            "Series answers by where they came from: bucket statistics or raw readings.",
            ["source"],
            namespace=NAMESPACE,
            registry=r,
        )
        for endpoint in API_ENDPOINTS:
            for status in API_STATUS_CLASSES:
                self.request_seconds.labels(endpoint, status)
        for source in ("stats", "readings"):
            self.series_source.labels(source)
