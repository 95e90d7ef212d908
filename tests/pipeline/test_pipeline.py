"""The pipeline with a scripted writer: partial failures retry only what failed, refused
readings become rejects, and every message is acknowledged once, in order, after its write."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from ingest.config import Settings
from ingest.errors import RefusedWriteError, WriteError
from ingest.metrics import Health, Metrics
from ingest.model import Inbound, Reading
from ingest.mqtt.source import MqttSource, _Inbox
from ingest.pipeline.app import Shutdown
from ingest.pipeline.stages import Pipeline
from ingest.store.writers import Outcome, Plan
from tests.support.acks import Acks

if TYPE_CHECKING:
    import pytest

NOW = 1_790_000_000.0


class ScriptedWriter:
    """Fails the way it is told to, and records every plan it was asked to write."""

    mode = "bucket"

    def __init__(self, script: list[str]) -> None:
        # per call: "ok", "raise", "landed" (written, then raise) or "half" (retry 1st,
        # refuse 2nd)
        self.script = script
        self.calls: list[list[int]] = []
        self.stored: list[int] = []

    async def ensure_schema(self) -> None:
        return None

    def plan(self, readings: list[Reading]) -> Plan:
        return Plan([r.seq for r in readings], [[r] for r in readings])

    async def write(self, plan: Plan) -> Outcome:
        self.calls.append(list(plan.ops))
        step = self.script.pop(0) if self.script else "ok"
        if step == "raise":
            raise WriteError("connection reset")
        if step == "landed":  # applied, but the answer was lost: the outcome is unknown
            self.stored += list(plan.ops)
            raise WriteError("connection reset after the write")
        if step.startswith("poison"):  # refuse any request holding this seq, whole
            poison = int(step.removeprefix("poison"))
            if poison in plan.ops:
                self.script.insert(0, step)
                raise RefusedWriteError("DocumentTooLarge: update too large")
            self.script.insert(0, step)
        if step == "half":
            retry, refused, rest = plan.groups[0], plan.groups[1], plan.groups[2:]
            self.stored += [g[0].seq for g in rest]  # type: ignore[misc]
            return Outcome(
                written=len(rest),
                retry=retry,
                refused=[(refused[0], "code 121: Document failed validation")],
            )
        # Idempotent, as both real writers are: a reading stored already is a duplicate.
        fresh = [seq for seq in plan.ops if seq not in self.stored]
        self.stored += fresh
        return Outcome(written=len(fresh), duplicates=len(plan.ops) - len(fresh))

    def take_lookups(self) -> tuple[int, float]:
        return 0, 0.0


class Rejects:
    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    async def write(self, docs: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        self.docs += docs
        return len(docs), []


async def run_pipeline(
    writer: ScriptedWriter, count: int, **overrides: Any
) -> tuple[Acks, Rejects, Metrics]:
    settings = Settings(batch_size=4, flush_interval=0.05, **overrides)
    acks, rejects, metrics = Acks(), Rejects(), Metrics("bucket")
    pipeline = Pipeline(settings, writer, rejects, acks, metrics, Health())  # type: ignore[arg-type]
    task = asyncio.create_task(pipeline.run())
    for i in range(count):
        payload = orjson.dumps({"ts": NOW - 10, "seq": i, "v": i})
        await pipeline.submit(Inbound("sensors/a/readings", payload, i + 1, 1, 1, NOW))
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    pipeline.sync_metrics()
    return acks, rejects, metrics


async def test_partial_failure_retries_only_what_failed_and_rejects_the_refused(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("ingest.pipeline.stages.backoff", lambda *_a, **_k: 0.0)
    writer = ScriptedWriter(["half"])
    acks, rejects, metrics = await run_pipeline(writer, 4)
    assert writer.calls[0] == [0, 1, 2, 3]
    assert writer.calls[1] == [0]  # only the transient failure is sent again
    assert sorted(writer.stored) == [0, 2, 3]  # nothing written twice
    assert [d["reason"] for d in rejects.docs] == ["write_rejected"]
    assert rejects.docs[0]["payload"] == orjson.dumps({"ts": NOW - 10, "seq": 1, "v": 1}).decode()
    assert acks.mids == [1, 2, 3, 4]
    assert metrics.readings_written._value.get() == 3
    assert metrics.readings_rejected.labels("write_rejected")._value.get() == 1


async def test_a_failed_write_is_retried_whole_and_acks_wait_for_it(monkeypatch: Any) -> None:
    monkeypatch.setattr("ingest.pipeline.stages.backoff", lambda *_a, **_k: 0.0)
    writer = ScriptedWriter(["raise", "raise"])
    acks, _rejects, metrics = await run_pipeline(writer, 8, write_concurrency=3)
    assert sorted(writer.stored) == list(range(8))
    assert acks.mids == list(range(1, 9))  # in arrival order despite concurrent writers
    assert metrics.write_errors.labels("bucket", "transient")._value.get() == 2


async def test_a_request_refused_for_its_data_is_split_until_the_culprit_is_alone(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr("ingest.pipeline.stages.backoff", lambda *_a, **_k: 0.0)
    writer = ScriptedWriter(["poison5"])
    acks, rejects, metrics = await run_pipeline(writer, 8)
    assert sorted(writer.stored) == [0, 1, 2, 3, 4, 6, 7]  # everything else, once
    assert [d["reason"] for d in rejects.docs] == ["write_rejected"]
    assert '"seq":5' in rejects.docs[0]["payload"]
    assert "DocumentTooLarge" in rejects.docs[0]["detail"]
    assert acks.mids == list(range(1, 9))
    assert metrics.readings_rejected.labels("write_rejected")._value.get() == 1


async def test_a_shutdown_that_hangs_past_its_deadline_exits_anyway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watchdog armed by the first signal: a process still running ``deadline``
    seconds later logs one line and exits 1 (here into a recorder instead of os._exit)."""
    exits: list[int] = []
    shutdown = Shutdown(deadline=0.2, exit_now=exits.append)
    shutdown.signal()
    assert shutdown.requested.is_set()
    await asyncio.sleep(0.1)
    assert exits == []
    await asyncio.sleep(0.4)
    assert exits == [1]
    assert "still running 0 s after the signal; exiting now" in caplog.text
    shutdown.signal()  # a second signal still forces the graceful path's early end
    assert shutdown.forced.is_set()
    assert exits == [1]


async def test_batches_waiting_for_a_slow_write_are_written_together_and_acked_in_order() -> None:
    """MongoDB slow: the linger keeps closing small batches; the next write takes all of
    those waiting (up to --batch-size) in one request, and acks still go out in order."""
    gate = asyncio.Event()

    class SlowFirst(ScriptedWriter):
        async def write(self, plan: Plan) -> Outcome:
            if not self.calls:
                self.calls.append(list(plan.ops))
                await gate.wait()
                self.stored += list(plan.ops)
                return Outcome(written=len(plan.ops))
            return await super().write(plan)

    writer = SlowFirst([])
    settings = Settings(batch_size=10, flush_interval=0.05, write_concurrency=1)
    acks, metrics = Acks(), Metrics("bucket")
    pipeline = Pipeline(settings, writer, Rejects(), acks, metrics, Health())  # type: ignore[arg-type]
    task = asyncio.create_task(pipeline.run())
    for i in range(12):
        payload = orjson.dumps({"ts": NOW - 10, "seq": i, "v": i})
        await pipeline.submit(Inbound("sensors/a/readings", payload, i + 1, 1, 1, NOW))
        if i % 3 == 2:
            await asyncio.sleep(0.15)  # the linger closes a batch of 3
    assert writer.calls == [[0, 1, 2]]
    gate.set()
    await asyncio.wait_for(pipeline.drain(), 10)
    task.cancel()
    assert writer.calls == [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9, 10, 11]]
    assert acks.mids == list(range(1, 13))
    assert pipeline.buffered == 0


async def test_a_write_whose_outcome_is_unknown_is_sent_again_and_counted_once(
    monkeypatch: Any,
) -> None:
    """The first attempt landed but its answer was lost: the whole batch is sent again,
    and the writer (idempotent) reports the readings stored already as duplicates."""
    monkeypatch.setattr("ingest.pipeline.stages.backoff", lambda *_a, **_k: 0.0)
    writer = ScriptedWriter(["landed"])
    acks, _rejects, metrics = await run_pipeline(writer, 4)
    assert writer.stored == [0, 1, 2, 3]  # once each
    assert writer.calls == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert acks.mids == [1, 2, 3, 4]
    assert metrics.duplicates._value.get() == 4
    assert metrics.readings_written._value.get() == 0  # the landed answer was lost


async def test_a_redelivered_message_stored_before_a_crash_counts_as_a_duplicate() -> None:
    writer = ScriptedWriter([])
    settings = Settings(batch_size=10, flush_interval=0.05)
    acks, metrics = Acks(), Metrics("bucket")
    pipeline = Pipeline(settings, writer, Rejects(), acks, metrics, Health())  # type: ignore[arg-type]
    task = asyncio.create_task(pipeline.run())
    writer.stored = [1]  # written before a crash; its PUBACK never reached the broker
    for i in range(3):
        payload = orjson.dumps({"ts": NOW - 10, "seq": i, "v": i})
        await pipeline.submit(Inbound("sensors/a/readings", payload, i + 1, 1, 1, NOW, dup=i == 1))
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    pipeline.sync_metrics()
    assert sorted(writer.stored) == [0, 1, 2]
    assert acks.mids == [1, 2, 3]
    assert metrics.duplicates._value.get() == 1


async def test_take_now_takes_what_fits_and_leaves_waiting_to_submit() -> None:
    # The source's synchronous path: a message is taken at once while there is room,
    # None (submit must take it, waiting) once the pipeline is full, False once closed.
    settings = Settings(batch_size=4, flush_interval=60, max_buffered_readings=4)
    writer, acks = ScriptedWriter([]), Acks()
    pipeline = Pipeline(
        settings,
        writer,
        Rejects(),  # type: ignore[arg-type]
        acks,
        Metrics("bucket"),
        Health(),
    )

    def message(i: int) -> Inbound:
        payload = orjson.dumps({"ts": NOW - 10, "seq": i, "v": i})
        return Inbound("sensors/a/readings", payload, i + 1, 1, 1, NOW)

    assert [pipeline.take_now(message(i)) for i in range(5)] == [True] * 4 + [None]
    assert pipeline.buffered == 4
    waiting = asyncio.create_task(pipeline.submit(message(4)))
    task = asyncio.create_task(pipeline.run())
    assert await asyncio.wait_for(waiting, 30) is True  # written, room again, taken
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    assert writer.stored == [0, 1, 2, 3, 4]
    assert acks.mids == [1, 2, 3, 4, 5]
    assert pipeline.take_now(message(5)) is False


class LostConnection(Acks):
    """A source whose connection ended while the pipeline waited: it holds no QoS 1
    message any more (forgotten: the broker resends it), QoS 0 ones still."""

    def holds(self, message: Inbound) -> bool:
        return not message.qos


async def test_a_message_whose_connection_ended_while_it_waited_is_not_taken() -> None:
    """Taken late, it would be written and never acknowledged (its connection is gone),
    and its redelivery taken as new: the broker resends it, so the pipeline leaves it."""
    settings = Settings(batch_size=4, flush_interval=0.05)
    writer, acks, metrics = ScriptedWriter([]), LostConnection(), Metrics("bucket")
    pipeline = Pipeline(settings, writer, Rejects(), acks, metrics, Health())  # type: ignore[arg-type]
    task = asyncio.create_task(pipeline.run())
    resent = Inbound(
        "sensors/a/readings", orjson.dumps({"ts": NOW, "seq": 1, "v": 1}), 7, 1, 1, NOW, dup=True
    )
    qos0 = Inbound("sensors/a/readings", orjson.dumps({"ts": NOW, "seq": 2, "v": 2}), 0, 0, 1, NOW)
    assert await pipeline.submit(resent) is False
    assert await pipeline.submit(qos0) is True
    await asyncio.wait_for(pipeline.drain(), 30)
    task.cancel()
    assert writer.stored == [2]


async def test_the_source_holds_a_message_only_while_its_connection_lasts() -> None:
    source = MqttSource(Settings(), Metrics("bucket"), Health())
    message = Inbound("a/b", b"{}", 5, 1, 3, NOW)
    assert not source.holds(message)  # no connection yet
    inbox = source._inbox = _Inbox(Settings(), Metrics("bucket"), Health(), 3)
    inbox.current = message  # being offered to the pipeline
    assert source.holds(message)
    assert not source.holds(message._replace(generation=2))  # an earlier connection's
    inbox.close()  # the connection ends: current is forgotten
    assert not source.holds(message)
    assert source.holds(message._replace(qos=0))  # QoS 0: the daemon's only copy
