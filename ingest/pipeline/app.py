"""Wiring and lifecycle: the stages as named tasks, signals, graceful then forced shutdown.

MQTT broker -> MqttSource -> Pipeline.submit (decode, batch) -> write workers -> MongoDB
                   ^                                               |
                   +------------- acks, in arrival order <---------+
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import platform
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from paho.mqtt.client import topic_matches_sub
from pymongo import AsyncMongoClient
from pymongo.errors import ConnectionFailure, PyMongoError

from ingest import __version__, accel, caches
from ingest.config import redact_mongodb_uri, server_tls_context
from ingest.devices.homie_state import attach_store as attach_homie
from ingest.devices.sparkplug_state import attach_store
from ingest.errors import StartupError
from ingest.metrics import Health, Metrics, MetricsServer
from ingest.mqtt.source import MqttSource
from ingest.pipeline import retained
from ingest.pipeline.stages import Pipeline
from ingest.pipeline.subscribed import COLLECTION as SUBSCRIBED_COLLECTION
from ingest.pipeline.subscribed import SubscribedFilters
from ingest.retry import backoff
from ingest.store.deliveries import COLLECTION as DELIVERIES
from ingest.store.deliveries import Deliveries
from ingest.store.schema import BUCKET_SCHEMA_VERSION, Schema
from ingest.store.sharding import shard_collection
from ingest.store.writers import bulk
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.rejects import RejectsWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from ingest.tokens import TokenSet

if TYPE_CHECKING:
    import socket
    from collections.abc import AsyncIterator, Callable, Iterator

    from ingest.config import Settings
    from ingest.store.writers import Writer

logger = logging.getLogger(__name__)
PING_INTERVAL = 5.0
INIT_DB_WAIT_MS = 10_000
SLOW_START = 2.0  # seconds before saying that the daemon waits for MongoDB
DISCONNECT_TIMEOUT = 5.0
# Beyond --shutdown-timeout and the disconnect, how long the watchdog lets the process
# close its clients before it exits anyway.
WATCHDOG_SLACK = 10.0


def metrics_guard(settings: Settings) -> dict[str, Any]:
    """The bearer tokens and TLS of the public /metrics (--metrics-tokens-file, -tls-*)."""
    return {
        "tokens": TokenSet(settings.metrics_tokens) if settings.metrics_tokens else None,
        "tls": server_tls_context(settings.metrics_tls_cert, settings.metrics_tls_key, "--metrics"),
    }


class Shutdown:
    """First signal: stop consuming, flush, ack, exit. Second signal: exit now.

    With ``deadline`` set, the first signal also arms a watchdog thread: if the process
    is still running ``deadline`` seconds later (an await that ignores cancellation, a
    driver call stuck on a server that neither answers nor closes), it logs one line and
    exits with status 1. The graceful path normally ends well before.
    """

    def __init__(
        self, deadline: float | None = None, exit_now: Callable[[int], object] = os._exit
    ) -> None:
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
        self._deadline = deadline
        self._exit_now = exit_now

    def signal(self) -> None:
        """Handle SIGTERM/SIGINT."""
        if self.requested.is_set():
            logger.warning("second signal: exiting without waiting for in-flight writes")
            self.forced.set()
        else:
            logger.info("signal received: draining in-flight batches")
            self.requested.set()
            if self._deadline is not None:
                watchdog = threading.Timer(self._deadline, self._give_up)
                watchdog.daemon = True
                watchdog.start()

    def _give_up(self) -> None:
        logger.error(
            "still running %.0f s after the signal; exiting now (unacknowledged "
            "messages will be redelivered)",
            self._deadline,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit_now(1)


def mongo_client(settings: Settings, **options: Any) -> AsyncMongoClient[dict[str, Any]]:  # noqa: ANN401
    """The driver client, with timezone-aware dates."""
    return AsyncMongoClient(
        settings.mongodb_uri, tz_aware=True, appname="ingest", connect=False, **options
    )


def build_labels() -> tuple[str, str, str]:
    """``ingest_build_info``'s labels: version, Python, whether the accelerators run."""
    return (
        __version__,
        f"{sys.implementation.name} {platform.python_version()}",
        str(accel.accelerated()).lower(),
    )


def warn_about(settings: Settings) -> None:
    """Log the settings that work but slow the daemon down (one line each)."""
    enough = settings.batch_size * (settings.write_concurrency + 1)
    if settings.qos == 1 and settings.max_inflight_messages < enough:
        logger.warning(
            "--max-inflight-messages %d is below --batch-size x (--write-concurrency + 1) = "
            "%d: at QoS 1 the broker stops sending before batches of single-reading "
            "messages fill, so they close only at --flush-interval; raise it to %d "
            "(at most 65535) or lower --batch-size",
            settings.max_inflight_messages,
            enough,
            min(enough, 65535),
        )


# A topic of the default format, to ask whether a rule reads it.
DEFAULT_FORMAT_PROBE = "sensors/s1"


def tell_default_topic(settings: Settings) -> None:
    """Say in one line that the rules replace the default topic, when they do.

    With --preset or --mapping and no --topic, the daemon subscribes to the rules'
    filters instead of ``sensors/#``: readings there in the default format are no longer
    stored unless a rule takes them.
    """
    mapping = settings.mapping
    if mapping is None or settings.topics != mapping.subscriptions():
        return
    matched = mapping.match(DEFAULT_FORMAT_PROBE)
    if matched is not None and not matched.rule.ignore:
        return
    covered = matched is not None or any(
        topic_matches_sub(topic, DEFAULT_FORMAT_PROBE) for topic in settings.topics
    )
    logger.warning(
        "--preset/--mapping without --topic: subscribed to the rules' filters (%s) instead "
        "of the default sensors/#, and no rule reads the default format there, so readings "
        "published to sensors/<id> are not stored%s; to keep the default format alongside, "
        'add a --mapping file rule with topic = "sensors/#" and format = "ingest" '
        "(docs/presets.md)",
        ", ".join(settings.topics),
        ' (counted in ingest_messages_ignored_total{rule="(outside the rules)"})'
        if covered
        else "",
    )


def make_schema(settings: Settings, client: AsyncMongoClient[dict[str, Any]]) -> Schema:
    """The collections, validators and indexes of the configured mode."""
    return Schema(
        client[settings.db],
        settings.collection,
        rejects_collection=settings.rejects_collection,
        rejects_max_bytes=settings.rejects_max_bytes,
        retention_days=settings.retention_days,
        span_seconds=settings.span_seconds,
        granularity=settings.granularity,
        custom_span=settings.bucket_span_seconds,
    )


def ledger_of(settings: Settings, client: AsyncMongoClient[dict[str, Any]]) -> Deliveries:
    """The delivery ledger of this daemon's MQTT session (see ingest/store/deliveries.py).

    It keeps the client's last 2 x Receive Maximum entries: a message resent after one
    crash was first delivered at most Receive Maximum - 1 entries before the last, and
    after a crash during the redelivery, at most about twice that.
    """
    return Deliveries(
        client[settings.db][DELIVERIES], settings.client_id, keep=2 * settings.max_inflight_messages
    )


def make_writer(settings: Settings, client: AsyncMongoClient[dict[str, Any]]) -> Writer:
    """The writer for the configured mode."""
    db = client[settings.db]
    schema = make_schema(settings, client)
    problem = bulk.fast_path_problem()
    if problem is not None:
        logger.warning(
            "this pymongo's bulk internals differ (%s): writing through its "
            "public bulk API, at more CPU per reading",
            problem,
        )
    elif (problem := bulk.lean_replies_problem()) is not None and settings.mode == "bucket":
        logger.warning(
            "this pymongo's command runner differs (%s): decoding every upserted "
            "bucket's _id in update replies, at more CPU per new bucket",
            problem,
        )
    if settings.mode == "timeseries":
        # Its claims are the session's: each worker's (and a drain's) own client id.
        return TimeseriesWriter(db[settings.collection], schema, settings.client_id)
    return BucketWriter(
        db[settings.collection], schema, settings.span_seconds, settings.bucket_max_readings
    )


@contextlib.asynccontextmanager
async def _one_shot_client(settings: Settings) -> AsyncIterator[AsyncMongoClient[dict[str, Any]]]:
    """A client for a one-shot command; an unreachable server is one start-up line."""
    # A one-shot command should not sit silent for the driver's 30 s default.
    quick = (
        {}
        if "serverselectiontimeoutms" in settings.mongodb_uri.lower()
        else {"serverSelectionTimeoutMS": INIT_DB_WAIT_MS}
    )
    client = mongo_client(settings, **quick)
    try:
        yield client
    except ConnectionFailure as exc:
        raise StartupError(
            f"--mongodb-uri: cannot reach MongoDB at "
            f"{redact_mongodb_uri(settings.mongodb_uri)} ({mongo_reason(exc)}); "
            "start it or correct --mongodb-uri"
        ) from None
    finally:
        await client.close()


async def init_db(settings: Settings, shard: bool = False) -> None:
    """Create collections and indexes for the configured mode (and shard), then return."""
    async with _one_shot_client(settings) as client:
        await make_writer(settings, client).ensure_schema()
        if shard:
            await shard_collection(client, settings.mode, settings.db, settings.collection)


async def migrate(settings: Settings) -> None:
    """``ingest migrate``: bring a bucket collection to this version's shape, then return."""
    if settings.mode != "bucket":
        logger.info("time-series collections keep their shape: nothing to migrate")
        return
    async with _one_shot_client(settings) as client:
        schema = make_schema(settings, client)
        changed, dropped = await schema.migrate_buckets()
        logger.info(
            "migrated %s.%s: %d documents brought to schema_version %d; dropped indexes: %s",
            settings.db,
            settings.collection,
            changed,
            BUCKET_SCHEMA_VERSION,
            ", ".join(dropped) or "none",
        )
        await schema.ensure_buckets()


def mongo_reason(exc: BaseException) -> str:
    """A driver error in one short line (server selection appends a topology dump)."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc).split(", Timeout:", 1)[0].split(" (configured timeouts:", 1)[0]
    return redact_mongodb_uri(text.replace("\n", " "))[:200] or type(exc).__name__


async def run(
    settings: Settings,
    shutdown: Shutdown | None = None,
    metrics: Metrics | None = None,
    metrics_sock: socket.socket | None = None,
) -> None:
    """Run the daemon until a signal (or ``shutdown``, when given by a caller) stops it.

    ``metrics_sock``: serve /metrics on this listening socket instead of binding
    --metrics-host/--metrics-port (a worker of ``--workers N``).
    """
    if shutdown is None:
        shutdown = Shutdown(settings.shutdown_timeout + DISCONNECT_TIMEOUT + WATCHDOG_SLACK)
        install_signal_handlers(shutdown)
    warn_about(settings)
    metrics = _bound_caches(settings, metrics or Metrics(settings.mode))
    metrics.info.labels(settings.mode, str(settings.dry_run).lower()).set(1)
    metrics.build_info.labels(*build_labels()).set(1)
    health = Health(mongodb_ok=settings.dry_run)
    client = mongo_client(settings)
    try:
        writer = make_writer(settings, client)
        if settings.mapping is not None and not settings.dry_run:
            attach_store(
                settings.mapping.stateful,
                client[settings.db],
                None
                if settings.shared_group is None
                else (settings.collection, settings.client_id),
            )
            attach_homie(settings.mapping.stateful, client[settings.db])
        memory = (
            None
            if settings.dry_run
            else SubscribedFilters(
                client[settings.db][SUBSCRIBED_COLLECTION],
                settings.client_id,
                f"{settings.mqtt.host}:{settings.mqtt.port}",
            )
        )
        source = MqttSource(settings, metrics, health, memory=memory)
        rejects = RejectsWriter(client[settings.db][settings.rejects_collection])
        first_seen = retained.record_of(settings, client[settings.db])
        pipeline = Pipeline(
            settings,
            writer,
            rejects,
            source,
            metrics,
            health,
            first_seen,
            None if settings.dry_run else ledger_of(settings, client),
        )
        server = MetricsServer(
            settings.metrics_host,
            settings.metrics_port,
            metrics,
            health,
            before_scrape=functools.partial(_sync_metrics, pipeline, source),
            sock=metrics_sock,
            **metrics_guard(settings),
        )
        async with server, contextlib.AsyncExitStack() as stack:
            if not settings.dry_run:
                await _prepare(writer, health, metrics, shutdown, settings.mongodb_uri)
            if shutdown.requested.is_set():
                logger.info("stopped before consuming anything")
                return
            stack.enter_context(_fewer_collections())
            group = await stack.enter_async_context(asyncio.TaskGroup())
            helpers = []
            if not settings.dry_run:
                helpers.append(
                    group.create_task(_watch_mongodb(client, health, metrics), name="mongodb-ping")
                )
            helpers.append(group.create_task(pipeline.run(), name="pipeline"))
            consumer = group.create_task(
                source.run(pipeline.submit, pipeline.take_now, pipeline.skip), name="mqtt-source"
            )
            await shutdown.requested.wait()
            deadline = asyncio.get_running_loop().time() + settings.shutdown_timeout
            await _drain(settings, source, pipeline, shutdown)
            # The clean MQTT disconnect comes out of the same time budget.
            left = max(0.0, min(DISCONNECT_TIMEOUT, deadline - asyncio.get_running_loop().time()))
            if not shutdown.forced.is_set():
                await asyncio.wait({consumer}, timeout=left)
            for task in (*helpers, consumer):
                task.cancel()
    except BaseExceptionGroup as group:
        startup = group.subgroup(StartupError)
        if startup is None:
            raise
        raise _first_leaf(startup) from None  # one line for the CLI, not a task dump
    finally:
        await client.close()
    logger.info("stopped")


# Allocations (net, of container objects) between two young-generation collections.
GC_THRESHOLD = 400_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the garbage collector less often while consuming; restore it afterwards.

    Every reading allocates a few tuples and dicts, and with the default threshold (2,000)
    the collector ran hundreds of times a second, its full passes walking every buffered
    reading and every object of start-up: 15% of the daemon's CPU. Start-up objects are
    frozen (never walked again) and young collections wait for 400,000 allocations (net
    of what was freed): more than the messages and readings the bounds let be in flight
    hold (30,000 messages and 50,000 readings by default, a few containers each), so a
    collection rarely finds the pipeline's live data to walk and promote. At 100,000 a
    timeseries drain of 100,000 sensors still spent 0.9 µs a reading in young
    collections (timed by a gc.callbacks hook, as bench.profile installs one). The
    pipeline's data is freed by reference counting, not by the collector, and the path
    of a message makes no reference cycle, so what waits longer is cyclic garbage from
    elsewhere only, 400,000 objects at most.
    """
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _prepare(
    writer: Writer, health: Health, metrics: Metrics, shutdown: Shutdown, uri: str
) -> None:
    """Make sure collections and indexes exist, waiting for MongoDB if it is not up yet.

    Returns early when a signal arrives: one attempt can wait for server selection
    (30 s by default), longer than the shutdown timeout.
    """
    attempt = 0
    where = redact_mongodb_uri(uri)
    stop = asyncio.create_task(shutdown.requested.wait(), name="prepare-stop")
    try:
        while not shutdown.requested.is_set():
            step = asyncio.create_task(writer.ensure_schema(), name="ensure-schema")
            # Server selection waits up to 30 s: say at once what the daemon waits for.
            await asyncio.wait(
                {step, stop}, timeout=SLOW_START, return_when=asyncio.FIRST_COMPLETED
            )
            if not step.done() and not stop.done() and attempt == 0:
                logger.warning(
                    "waiting for MongoDB at %s (no answer yet; /readyz says "
                    "'mongodb unreachable' until it answers); MQTT starts after it",
                    where,
                )
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                return
            try:
                step.result()
            except PyMongoError as exc:
                attempt += 1
                delay = backoff(attempt, base=1.0)
                logger.warning(
                    "cannot prepare MongoDB collections at %s (%s); retrying in %.1fs",
                    where,
                    mongo_reason(exc),
                    delay,
                )
                await asyncio.wait({stop}, timeout=delay)
            else:
                health.mongodb_ok = True
                metrics.mongodb_up.set(1)
                logger.info("MongoDB ready at %s", where)
                return
    finally:
        stop.cancel()


async def _watch_mongodb(
    client: AsyncMongoClient[dict[str, Any]], health: Health, metrics: Metrics
) -> None:
    """Ping MongoDB so /readyz tells the truth even when no data flows."""
    while True:
        try:
            await asyncio.wait_for(client.admin.command("ping"), PING_INTERVAL)
        except (PyMongoError, TimeoutError) as exc:
            if health.mongodb_ok:
                logger.warning(
                    "MongoDB ping failed: %s",
                    f"no answer within {PING_INTERVAL:.0f} s"
                    if isinstance(exc, TimeoutError)
                    else mongo_reason(exc),
                )
            health.mongodb_ok = False
        else:
            health.mongodb_ok = True
        metrics.mongodb_up.set(1 if health.mongodb_ok else 0)
        await asyncio.sleep(PING_INTERVAL)


def _bound_caches(settings: Settings, metrics: Metrics) -> Metrics:
    """Bound this process's fleet-sized caches (--max-cached-series); show their sizes."""
    caches.set_limit(settings.max_cached_series)
    metrics.caches.mapping = settings.mapping
    return metrics


def _sync_metrics(pipeline: Pipeline, source: MqttSource) -> None:
    """Move the per-message counts into the metrics, before each scrape."""
    pipeline.sync_metrics()
    source.sync_metrics()


async def _drain(
    settings: Settings, source: MqttSource, pipeline: Pipeline, shutdown: Shutdown
) -> None:
    """Stop consuming, write and ack what is in flight, then disconnect."""
    source.stop_consuming()
    drained = asyncio.create_task(_hand_over_and_drain(source, pipeline), name="drain")
    forced = asyncio.create_task(shutdown.forced.wait(), name="forced")
    done, _ = await asyncio.wait(
        {drained, forced}, timeout=settings.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if drained in done:
        logger.info("in-flight batches written and acknowledged")
    else:
        lost = pipeline.unwritten_qos0()
        source.count_lost(lost)
        logger.warning(
            "shutdown timeout or second signal: %d buffered readings not written "
            "(their QoS 1 messages are unacknowledged and will be redelivered; "
            "%d QoS 0 messages among them are lost, counted in "
            "ingest_messages_lost_total)",
            pipeline.buffered,
            lost,
        )
    for task in (drained, forced):
        task.cancel()
    source.release()


async def _hand_over_and_drain(source: MqttSource, pipeline: Pipeline) -> None:
    """The QoS 0 messages read and not taken yet first (nothing would resend them)."""
    await source.hand_over(pipeline.submit)
    await pipeline.drain()


def install_signal_handlers(shutdown: Shutdown) -> None:
    """First SIGTERM/SIGINT drains, a second forces (see :class:`Shutdown`)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, shutdown.signal)
