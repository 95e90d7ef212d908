"""The stages between the MQTT source and MongoDB: decode, batch, write, acknowledge.

Batches are written by ``write_concurrency`` workers and acknowledged strictly in the
order they were opened, so acks go out in the order messages arrived. Memory is bounded:
once ``max_buffered_readings`` readings wait to be written, or the messages taken and not
yet written hold ``max_buffered_bytes`` (their payloads, readings and reject documents,
estimated: a message whose readings are all rejected holds memory too),
:meth:`Pipeline.submit` blocks, the source stops taking messages, unacknowledged
messages pile up at the broker (which stops sending at the MQTT 5 Receive Maximum), and
nothing is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from pymongo.errors import PyMongoError

from ingest.devices.decode import ARRIVALS, Limits, Replayed, decode, sensor_from_topic
from ingest.devices.identity import refuse_others
from ingest.errors import IngestError, RefusedWriteError, SchemaGoneError, WriteError
from ingest.model import Decoded, Rejection
from ingest.pipeline.batcher import Batcher, Intake, IntakeSteps, merged
from ingest.pipeline.redelivered import Ledger
from ingest.pipeline.retained import RetainedPolicy, Steps
from ingest.retry import backoff
from ingest.store.writers.rejects import reject_docs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.config import Settings
    from ingest.metrics import Health, Metrics
    from ingest.model import Inbound, Reading
    from ingest.pipeline._batcher_py import Batch
    from ingest.pipeline.retained import FirstSeen
    from ingest.store.deliveries import Deliveries, Recorded
    from ingest.store.writers import Outcome, Writer
    from ingest.store.writers.rejects import RejectsWriter

logger = logging.getLogger(__name__)
# The ``rule`` label of messages that arrive through a subscription the daemon widened
# and that no rule takes (not a valid rule name, so it never collides with one).
OUTSIDE_RULES = "(outside the rules)"


class Acker(Protocol):
    """Something that acknowledges a message to the broker (the MQTT source)."""

    def ack_all(self, messages: list[Inbound]) -> int:
        """Acknowledge written messages in order; return how many could be."""

    def holds(self, message: Inbound) -> bool:
        """Whether ``message``, offered to the pipeline, may still be taken.

        False once its connection has ended meanwhile (the broker resends it).
        """


class Pipeline:
    """Decode and batch submitted messages; write batches; ack them in order."""

    def __init__(
        self,
        settings: Settings,
        writer: Writer,
        rejects: RejectsWriter,
        acker: Acker,
        metrics: Metrics,
        health: Health,
        first_seen: FirstSeen | None = None,
        deliveries: Deliveries | None = None,
    ) -> None:
        self._settings = settings
        self._writer = writer
        self._rejects = rejects
        self._acker = acker
        self._metrics = metrics
        self._health = health
        self._limits = Limits(
            settings.max_message_bytes,
            settings.max_readings_per_message,
            settings.max_past_seconds,
            settings.max_future_seconds,
        )
        self._batcher = Batcher(settings.batch_size, settings.flush_interval)
        # Each batch goes to both queues with one future: the writer that takes it
        # resolves the future, the acker waits for the futures in dispatch order.
        self._write_queue: asyncio.Queue[tuple[Batch, asyncio.Future[None]]] = asyncio.Queue()
        self._ack_queue: asyncio.Queue[tuple[Batch, asyncio.Future[None]]] = asyncio.Queue()
        # Every batch dispatched and not yet acknowledged, in order (what a stop leaves).
        self._dispatched: deque[tuple[Batch, asyncio.Future[None]]] = deque()
        self._opened = asyncio.Event()
        self._space = asyncio.Condition()
        # --retained: what becomes of a message delivered with RETAIN set.
        self._retained = RetainedPolicy(
            settings,
            metrics,
            health,
            first_seen,
            Steps(self._ready, self._take, self._pass, self._failed, lambda: self._intake.closed),
        )
        # The delivery ledger (None: dry run): the times given to readings without their
        # own, recorded per message, so that a redelivery after a crash gets them again.
        self._ledger = (
            None
            if deliveries is None
            else Ledger(deliveries, metrics, health, self._failed, lambda: self._intake.closed)
        )
        # What the arrivals gave the message being decoded (never filled without a ledger).
        self._given: list[int] = [] if self._ledger is None else self._ledger.given
        metrics.buffer_limit.set(settings.max_buffered_readings)
        metrics.buffer_limit_bytes.set(settings.max_buffered_bytes)
        self._mapping = settings.mapping
        self._from_topic = settings.sensor_id_from_topic
        # What the pipeline holds and has taken (its counts handed to the metrics at
        # scrape time, see sync_metrics), and the way of messages into the open batch:
        # the default format's one compiled call each (Intake.take_now).
        self._intake = Intake(
            self._batcher,
            self._limits,
            settings.max_buffered_readings,
            settings.max_buffered_bytes,
            self._mapping is None and not self._from_topic,
            # Whether messages may need the format's state brought up to date first (I/O).
            self._mapping is not None and bool(self._mapping.stateful),
            IntakeSteps(
                decode,
                ARRIVALS,
                self._given,
                self._take,
                metrics.reject,
                lambda message, rejections: reject_docs(message, rejections, self._writer.mode),
                self._dispatch,
                self._opened.set,
            ),
        )
        # (rule, outcome) -> messages since the last scrape; outcome "ignored" included.
        self._rule_counts: dict[tuple[str, str], int] = {}
        # Subscriptions derived from the rules may be wider than the rules (partly
        # overlapping filters are joined into one): what arrives only through that
        # widening was never asked for, so it is ignored, not rejected as no_rule.
        self._widened = (
            self._mapping is not None and settings.topics == self._mapping.subscriptions()
        )
        if self._ledger is not None:
            ARRIVALS.given = self._given  # the process's, for the default format
            if self._mapping is not None:
                self._mapping.arrivals.given = self._given
        if self._mapping is not None:
            rules = self._mapping.rules
            ignored = [r.name for r in rules if r.ignore]
            metrics.init_rules(
                [r.name for r in rules if not r.ignore],
                [*ignored, OUTSIDE_RULES] if self._widened else ignored,
            )

    @property
    def buffered(self) -> int:
        """Readings decoded and not yet written."""
        return self._intake.buffered

    @property
    def take_now(self) -> Callable[[Inbound], bool | None]:
        """:meth:`submit` without a coroutine, when nothing needs waiting for.

        The intake's (compiled: one C call): it takes the message into the open batch
        (True), or returns None when :meth:`submit` must take it instead (the pipeline is
        full, the format keeps state and may need I/O first, the message is retained or
        a redelivery), False once closed. The source calls it for every message; a
        coroutine each cost more than the batching.
        """
        return self._intake.take_now

    async def submit(self, message: Inbound) -> bool:
        """Decode one message into the open batch; wait while the buffer is full.

        Returns False if the message was not taken (shutting down): it is left
        unacknowledged and the broker redelivers it.
        """
        intake = self._intake
        if intake.closed:
            return False
        if intake.full():
            self._health.saturated = True
            try:
                async with self._space:
                    await self._space.wait_for(lambda: not intake.full())
            finally:
                self._health.saturated = False
            if intake.closed:
                return False
        if message.retained:
            taken = await self._retained.submit(message)
            if taken is not None:
                return taken
        recorded = None
        if message.dup and message.qos and self._ledger is not None:
            # Resent, and not recognised by the source: after a restart, the first
            # delivery's readings may be written; they take the times it gave them.
            recorded = await self._ledger.recorded(message)
            if intake.closed:
                return False
        if not await self._ready(message):
            return False
        self._take(message, recorded)
        return True

    async def _ready(self, message: Inbound) -> bool:
        """Whether a message that waited for I/O may be taken now; brings the state up.

        False when closing, or its connection ended meanwhile (the broker resends it).
        """
        return await self._prepared(message) and self._acker.holds(message)

    async def _prepared(self, message: Inbound) -> bool:
        """Bring a stateful format's state up to date; False if given up (closing)."""
        if self._mapping is not None and self._mapping.stateful:
            # A stateful format (Sparkplug) first brings its state up to date, with I/O:
            # a BIRTH is stored before its message can be acknowledged.
            step = self._mapping.stateful_for(message.topic)
            if step is not None and not await step.prepare(
                message.topic,
                message.payload,
                self._limits,
                lambda: self._intake.closed,
                message.generation,
            ):
                return False
        return True

    def skip(self, message: Inbound) -> bool:
        """Take a message without its readings: acknowledged in turn, never stored.

        For a message that came through a subscription not made today (the source
        counts it); False if the pipeline takes nothing more (stopping).
        """
        if self._intake.closed:
            return False
        self._pass(message)
        return True

    def _pass(self, message: Inbound) -> None:
        """Batch a received message without readings (it is acked with its batch)."""
        intake = self._intake
        intake.received += 1
        intake.received_bytes += len(message.payload)
        intake.put(message, [], [])

    def _take(self, message: Inbound, first_seen: int | Recorded | None = None) -> Batch | None:
        """Decode one message into the open batch (there is room for it).

        ``first_seen``: a retained state's time (epoch ms), used instead of the arrival
        time for readings without their own; or what the first delivery of a resent
        message gave them (:class:`~ingest.store.deliveries.Recorded`). Returns the
        batch this closed, if any.
        """
        intake = self._intake
        payload = message.payload
        intake.received += 1
        intake.received_bytes += len(payload)
        if self._mapping is None:  # the default format: no rule lookup at all
            if first_seen is None:
                readings, rejections = decode(
                    message.topic, payload, message.received_at, self._limits, None, ARRIVALS
                )
            else:
                readings, rejections = self._decoded_at(message, first_seen)
        else:
            readings, rejections = self._mapped(message, first_seen)
        if self._from_topic and readings:
            readings, rejections = self._topic_named(message.topic, readings, rejections)
        return intake.put(message, readings, rejections)

    def _decoded_at(self, message: Inbound, first_seen: int | Recorded) -> Decoded:
        """The default format's readings of a retained state or of a redelivery.

        A retained state's readings without a time take ``first_seen`` (ms) exactly; a
        redelivery's take the times its first delivery gave them, in order.
        """
        if type(first_seen) is int:
            return decode(message.topic, message.payload, first_seen / 1000, self._limits)
        recorded: Recorded = first_seen  # type: ignore[assignment]
        return decode(
            message.topic,
            message.payload,
            recorded.received_at,
            self._limits,
            None,
            Replayed(recorded.times, self._given),
        )

    def _topic_named(
        self, topic: str, readings: list[Reading], rejections: list[Rejection]
    ) -> Decoded:
        """--sensor-id-from-topic: the readings of another sensor than the topic's, refused."""
        expected = (
            sensor_from_topic(topic) if self._mapping is None else self._mapping.topic_sensor(topic)
        )
        return refuse_others(Decoded(readings, rejections), expected, len(readings) == 1)

    def _mapped(self, message: Inbound, first_seen: int | Recorded | None = None) -> Decoded:
        """Decode through the mapping rules, counting each rule's messages."""
        mapping = self._mapping
        assert mapping is not None
        if first_seen is None:
            result = mapping.decode(
                message.topic, message.payload, message.received_at, self._limits
            )
        elif type(first_seen) is int:
            result = mapping.decode_at(message.topic, message.payload, first_seen, self._limits)
        else:  # a redelivery: the rules' arrivals give the times recorded, for this one
            recorded: Recorded = first_seen  # type: ignore[assignment]
            arrivals = mapping.arrivals
            mapping.arrivals = Replayed(recorded.times, arrivals.given)
            try:
                result = mapping.decode(
                    message.topic, message.payload, recorded.received_at, self._limits
                )
            finally:
                mapping.arrivals = arrivals
        if result.rule is None and self._widened and not result.unselected:
            key = (OUTSIDE_RULES, "ignored")
            self._rule_counts[key] = self._rule_counts.get(key, 0) + 1
            return Decoded([], [])
        if result.rule is not None:
            if result.ignored:
                outcome = "ignored"
            else:
                # Nothing stored and nothing refused (a Sparkplug DEATH): handled, accepted.
                decoded = result.decoded
                outcome = "accepted" if decoded.readings or not decoded.rejections else "rejected"
            key = (result.rule.name, outcome)
            self._rule_counts[key] = self._rule_counts.get(key, 0) + 1
        return result.decoded

    def sync_metrics(self) -> None:
        """Move the per-message counts into the metrics (called before each scrape)."""
        metrics = self._metrics
        for (rule, outcome), count in self._rule_counts.items():
            if outcome == "ignored":
                metrics.messages_ignored.labels(rule).inc(count)
            else:
                metrics.rule_messages.labels(rule, outcome).inc(count)
        self._rule_counts.clear()
        if self._mapping is not None:
            for stateful in self._mapping.stateful.values():
                metrics.add_counts(stateful.take_counts())
        intake = self._intake
        metrics.messages_received.inc(intake.received)
        metrics.received_bytes.inc(intake.received_bytes)
        metrics.readings_accepted.inc(intake.accepted)
        intake.received = intake.received_bytes = intake.accepted = 0
        metrics.buffered_readings.set(intake.buffered)
        metrics.buffered_bytes.set(intake.held_bytes)
        checked, seconds = self._writer.take_lookups()
        if checked:
            metrics.duplicate_checked.inc(checked)
            metrics.duplicate_check_seconds.inc(seconds)

    def flush(self) -> None:
        """Close the open batch now (used at shutdown)."""
        batch = self._batcher.take()
        if batch is not None:
            self._dispatch(batch)

    async def drain(self) -> None:
        """Take no more messages, flush the open batch, wait until all is written and acked."""
        self._intake.closed = True
        self.flush()
        await self._write_queue.join()
        await self._ack_queue.join()

    def unwritten_qos0(self) -> int:
        """QoS 0 messages taken and not written yet (a stop now loses them)."""
        held = [batch for batch, done in self._dispatched if not done.done()]
        if self._batcher.current is not None:
            held.append(self._batcher.current)
        return sum(1 for batch in held for message in batch.messages if not message.qos)

    async def run(self) -> None:
        """Run the linger timer, the write workers and the acker until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._linger(), name="linger")
            for i in range(self._settings.write_concurrency):
                group.create_task(self._write_worker(), name=f"writer-{i}")
            group.create_task(self._ack_in_order(), name="acker")

    def _dispatch(self, batch: Batch) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write_queue.put_nowait((batch, done))
        self._ack_queue.put_nowait((batch, done))
        self._dispatched.append((batch, done))

    async def _linger(self) -> None:
        while True:
            deadline = self._batcher.deadline()
            if deadline is None:
                self._opened.clear()
                await self._opened.wait()
                continue
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            batch = self._batcher.due()
            if batch is not None:
                self._dispatch(batch)

    async def _write_worker(self) -> None:
        while True:
            taken = [await self._write_queue.get()]
            # Batches close every --flush-interval even when MongoDB is slow; those
            # waiting here are written together (up to --batch-size readings, or one
            # batch beyond it), so a backlog becomes fewer, larger writes that coalesce
            # more, instead of a queue of small ones.
            size = len(taken[0][0].readings)
            while size < self._settings.batch_size and not self._write_queue.empty():
                taken.append(self._write_queue.get_nowait())
                size += len(taken[-1][0].readings)
            try:
                await self._write_batch(merged([batch for batch, _done in taken]))
            finally:
                for _ in taken:
                    self._write_queue.task_done()
            for _batch, done in taken:
                done.set_result(None)
            self._intake.buffered -= size
            async with self._space:
                self._space.notify_all()

    async def _ack_in_order(self) -> None:
        while True:
            batch, done = await self._ack_queue.get()
            try:
                await done
                self._metrics.messages_acked.inc(self._acker.ack_all(batch.messages))
            finally:
                self._ack_queue.task_done()
                self._dispatched.popleft()
            # The batch (payloads included) is let go only now: until acknowledged, a
            # written batch waits here behind the ones opened before it.
            self._intake.held_bytes -= batch.held_bytes
            async with self._space:
                self._space.notify_all()

    async def _write_batch(self, batch: Batch) -> None:
        started = time.perf_counter()
        rejects = batch.rejects
        if batch.deliveries and self._ledger is not None:
            await self._ledger.record(batch)  # before the readings: see there
        if batch.readings:
            refused = await self._write_readings(batch.readings)
            if refused:
                rejects = rejects + self._refused_docs(batch, refused)
        if rejects:
            await self._write_rejects(rejects)
        self._metrics.batch_write_seconds.observe(time.perf_counter() - started)
        self._metrics.batch_readings.observe(len(batch.readings))

    async def _write_readings(self, readings: list[Reading]) -> list[tuple[Reading, Rejection]]:
        """Write until nothing is left to retry; return the readings refused for good.

        A write retried after its outcome was unknown (or a redelivered message) may hold
        readings stored already: both writers find those themselves (the bucket unique
        index, the time-series lookup before each insert) and count them as duplicates.
        """
        pending, attempt = readings, 0
        refused: list[tuple[Reading, Rejection]] = []
        while pending:
            plan = self._writer.plan(pending)
            if self._settings.dry_run:
                self._count_written(len(plan.ops), len(pending))
                return refused
            try:
                outcome = await self._writer.write(plan)
            except RefusedWriteError as exc:
                self._metrics.write_error("rejected")
                return refused + await self._isolate(pending, exc)
            except WriteError as exc:
                attempt += 1
                await self._failed(exc, attempt)
                continue
            refused.extend(self._settled(len(plan.ops), outcome))
            pending = outcome.retry
            if pending:
                attempt += 1
                await self._failed(
                    outcome.error or WriteError(f"{len(pending)} readings to retry"), attempt
                )
        return refused

    def _settled(self, ops: int, outcome: Outcome) -> list[tuple[Reading, Rejection]]:
        """Count what a write did; return the readings it refused for good."""
        self._health.mongodb_ok = True
        self._count_written(ops, outcome.written)
        if outcome.duplicates:
            self._metrics.duplicates.inc(outcome.duplicates)
        if outcome.refused:
            self._metrics.write_error("rejected")
        return self._refusals(outcome.refused, "write_rejected") + self._refusals(
            outcome.conflicts, "ts_conflict"
        )

    def _refusals(
        self, refused: list[tuple[Reading, str]], reason: str
    ) -> list[tuple[Reading, Rejection]]:
        """Log and count readings refused for good, each with its reason."""
        for _reading, detail in refused:
            logger.warning("refused a reading (%s): %s", reason, detail)
        if refused:
            self._metrics.reject(reason, len(refused))
        return [(reading, Rejection(reason, detail)) for reading, detail in refused]

    async def _isolate(
        self, readings: list[Reading], exc: RefusedWriteError
    ) -> list[tuple[Reading, Rejection]]:
        """A whole request was refused for its data: split it until the culprit is alone."""
        if len(readings) == 1:
            return self._refusals([(readings[0], str(exc)[:300])], "write_rejected")
        half = len(readings) // 2
        return await self._write_readings(readings[:half]) + await self._write_readings(
            readings[half:]
        )

    async def _write_rejects(self, docs: list[dict[str, Any]]) -> None:
        if self._settings.dry_run:
            return
        pending, attempt = docs, 0
        while pending:
            try:
                stored, pending = await self._rejects.write(pending)
            except RefusedWriteError:
                logger.exception("rejects collection refused %d documents", len(pending))
                return
            except WriteError as exc:
                attempt += 1
                await self._failed(exc, attempt)
                continue
            self._metrics.rejects_written.inc(stored)
            if pending:
                attempt += 1
                await self._failed(WriteError(f"{len(pending)} rejects to retry"), attempt)

    def _count_written(self, ops: int, readings: int) -> None:
        self._metrics.write_requests.inc()
        self._metrics.write_ops.inc(ops)
        self._metrics.readings_written.inc(readings)

    async def _failed(self, exc: WriteError, attempt: int) -> None:
        self._health.mongodb_ok = False
        self._metrics.write_error("transient")
        delay = backoff(attempt)
        logger.warning("write failed (attempt %d, retrying in %.2fs): %s", attempt, delay, exc)
        await asyncio.sleep(delay)
        if isinstance(exc, SchemaGoneError):
            await self._ensure_schema()

    async def _ensure_schema(self) -> None:
        """Create the collection and indexes again (someone dropped them); log, never raise.

        A failure here is left to the next write attempt, which fails the same way and
        comes back after a longer backoff.
        """
        logger.warning("an index the writes name is missing; ensuring the schema again")
        try:
            await self._writer.ensure_schema()
        except (PyMongoError, IngestError) as exc:
            logger.error("cannot ensure the schema again: %s", str(exc)[:300])  # noqa: TRY400

    def _refused_docs(
        self, batch: Batch, refused: list[tuple[Reading, Rejection]]
    ) -> list[dict[str, Any]]:
        """Reject documents for readings refused at write time, pointing at their message."""
        owners = batch.origin()
        docs: list[dict[str, Any]] = []
        for reading, rejection in refused:
            docs.extend(reject_docs(owners[id(reading)], [rejection], self._writer.mode))
        return docs
