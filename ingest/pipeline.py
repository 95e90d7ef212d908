"""The stages between the MQTT source and MongoDB: decode, batch, write, acknowledge.

Batches are written by ``write_concurrency`` workers and acknowledged strictly in the
order they were opened, so acks go out in the order messages arrived. Memory is bounded:
once ``max_buffered_readings`` readings wait to be written, :meth:`Pipeline.submit`
blocks, the source stops reading, unacknowledged messages pile up at the broker (which
stops sending at the MQTT 5 Receive Maximum), and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from ingest.batcher import Batch, Batcher, merged
from ingest.decode import Limits, decode
from ingest.errors import RefusedWriteError, WriteError
from ingest.model import Rejection
from ingest.retry import backoff
from ingest.writers.rejects import reject_docs

if TYPE_CHECKING:
    from ingest.config import Settings
    from ingest.metrics import Health, Metrics
    from ingest.model import Decoded, Inbound, Reading
    from ingest.writers import Writer
    from ingest.writers.rejects import RejectsWriter

logger = logging.getLogger(__name__)


class Acker(Protocol):
    """Something that acknowledges a message to the broker (the MQTT source)."""

    def ack_all(self, messages: list[Inbound]) -> int:
        """Acknowledge written messages in order; return how many could be."""


class Pipeline:
    """Decode and batch submitted messages; write batches; ack them in order."""

    def __init__(self, settings: Settings, writer: Writer, rejects: RejectsWriter,
                 acker: Acker, metrics: Metrics, health: Health) -> None:
        self._settings = settings
        self._writer = writer
        self._rejects = rejects
        self._acker = acker
        self._metrics = metrics
        self._health = health
        self._limits = Limits(settings.max_message_bytes, settings.max_readings_per_message,
                              settings.max_past_seconds, settings.max_future_seconds)
        self._batcher = Batcher(settings.batch_size, settings.flush_interval)
        # Each batch goes to both queues with one future: the writer that takes it
        # resolves the future, the acker waits for the futures in dispatch order.
        self._write_queue: asyncio.Queue[tuple[Batch, asyncio.Future[None]]] = asyncio.Queue()
        self._ack_queue: asyncio.Queue[tuple[Batch, asyncio.Future[None]]] = asyncio.Queue()
        self._opened = asyncio.Event()
        self._space = asyncio.Condition()
        self._buffered = 0
        self._received = self._received_bytes = self._accepted = 0
        self._closed = False
        metrics.buffer_limit.set(settings.max_buffered_readings)
        self._mapping = settings.mapping
        # (rule, outcome) -> messages since the last scrape; outcome "ignored" included.
        self._rule_counts: dict[tuple[str, str], int] = {}
        if self._mapping is not None:
            rules = self._mapping.rules
            metrics.init_rules([r.name for r in rules if not r.ignore],
                               [r.name for r in rules if r.ignore])

    @property
    def buffered(self) -> int:
        """Readings decoded and not yet written."""
        return self._buffered

    async def submit(self, message: Inbound) -> bool:
        """Decode one message into the open batch; wait while the buffer is full.

        Returns False if the message was not taken (shutting down): it is left
        unacknowledged and the broker redelivers it.
        """
        if self._closed:
            return False
        if self._buffered >= self._settings.max_buffered_readings:
            self._health.saturated = True
            try:
                async with self._space:
                    await self._space.wait_for(
                        lambda: self._buffered < self._settings.max_buffered_readings)
            finally:
                self._health.saturated = False
            if self._closed:
                return False
        # Per-message counts are kept as plain ints and handed to the metrics at scrape
        # time (sync_metrics): a Prometheus counter takes a lock on every inc().
        self._received += 1
        self._received_bytes += len(message.payload)
        if self._mapping is None:  # the default format: no rule lookup at all
            decoded = decode(message.topic, message.payload, message.received_at, self._limits)
        else:
            decoded = self._mapped(message)
        for rejection in decoded.rejections:
            self._metrics.reject(rejection.reason)
        self._accepted += len(decoded.readings)
        self._buffered += len(decoded.readings)
        docs = (reject_docs(message, decoded.rejections, self._writer.mode)
                if decoded.rejections else [])
        had_open = self._batcher.deadline() is not None
        full = self._batcher.add(message, decoded.readings, docs)
        if full is not None:
            self._dispatch(full)
        elif not had_open:
            self._opened.set()
        return True

    def _mapped(self, message: Inbound) -> Decoded:
        """Decode through the mapping rules, counting each rule's messages."""
        assert self._mapping is not None
        result = self._mapping.decode(message.topic, message.payload, message.received_at,
                                      self._limits)
        if result.rule is not None:
            if result.ignored:
                outcome = "ignored"
            else:
                outcome = "accepted" if result.decoded.readings else "rejected"
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
        metrics.messages_received.inc(self._received)
        metrics.received_bytes.inc(self._received_bytes)
        metrics.readings_accepted.inc(self._accepted)
        self._received = self._received_bytes = self._accepted = 0
        metrics.buffered_readings.set(self._buffered)

    def flush(self) -> None:
        """Close the open batch now (used at shutdown)."""
        batch = self._batcher.take()
        if batch is not None:
            self._dispatch(batch)

    async def drain(self) -> None:
        """Take no more messages, flush the open batch, wait until all is written and acked."""
        self._closed = True
        self.flush()
        await self._write_queue.join()
        await self._ack_queue.join()

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
            self._buffered -= size
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

    async def _write_batch(self, batch: Batch) -> None:
        started = time.perf_counter()
        rejects = batch.rejects
        if batch.readings:
            refused = await self._write_readings(batch.readings)
            if refused:
                rejects = rejects + self._refused_docs(batch, refused)
        if rejects:
            await self._write_rejects(rejects)
        self._metrics.batch_write_seconds.observe(time.perf_counter() - started)
        self._metrics.batch_readings.observe(len(batch.readings))

    async def _write_readings(self, readings: list[Reading]) -> list[tuple[Reading, Rejection]]:
        """Write until nothing is left to retry; return the readings refused for good."""
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
            self._health.mongodb_ok = True
            self._count_written(len(plan.ops), outcome.written)
            if outcome.duplicates:
                self._metrics.duplicates.inc(outcome.duplicates)
            refused.extend(self._refusals(outcome.refused, "write_rejected"))
            refused.extend(self._refusals(outcome.conflicts, "ts_conflict"))
            if outcome.refused:
                self._metrics.write_error("rejected")
            pending = outcome.retry
            if pending:
                attempt += 1
                await self._failed(WriteError(f"{len(pending)} readings to retry"), attempt)
        return refused

    def _refusals(self, refused: list[tuple[Reading, str]], reason: str
                  ) -> list[tuple[Reading, Rejection]]:
        """Log and count readings refused for good, each with its reason."""
        for _reading, detail in refused:
            logger.warning("refused a reading (%s): %s", reason, detail)
        if refused:
            self._metrics.reject(reason, len(refused))
        return [(reading, Rejection(reason, detail)) for reading, detail in refused]

    async def _isolate(self, readings: list[Reading], exc: RefusedWriteError
                       ) -> list[tuple[Reading, Rejection]]:
        """A whole request was refused for its data: split it until the culprit is alone."""
        if len(readings) == 1:
            return self._refusals([(readings[0], str(exc)[:300])], "write_rejected")
        half = len(readings) // 2
        return (await self._write_readings(readings[:half])
                + await self._write_readings(readings[half:]))

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

    def _refused_docs(self, batch: Batch, refused: list[tuple[Reading, Rejection]]
                      ) -> list[dict[str, Any]]:
        """Reject documents for readings refused at write time, pointing at their message."""
        owners = batch.origin()
        docs: list[dict[str, Any]] = []
        for reading, rejection in refused:
            docs.extend(reject_docs(owners[id(reading)], [rejection], self._writer.mode))
        return docs
