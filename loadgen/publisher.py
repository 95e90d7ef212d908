"""Publish a simulated fleet: worker processes, each with its own MQTT connection.

Sensors are split over ``--processes`` workers (spawned, so nothing is inherited but the
settings). Each worker connects, waits for the common start, then publishes its sensors
round-robin, ``--per-message`` readings per message, paced by a :class:`Pacer` holding its
share of ``--rate``. Counters live in shared memory for the progress line; each worker
sends its result (readings per sensor, acks, errors, timings) back at the end.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadgen.worker import CONNECT_TIMEOUT, FIELDS, StopFlag, Worker, WorkerResult

if TYPE_CHECKING:
    from loadgen.config import PublishSettings


class PublishError(RuntimeError):
    """The run could not start (broker unreachable, a worker died)."""


@dataclass
class Summary:
    """The whole run, as printed and written with ``--json``."""

    settings: PublishSettings
    results: list[WorkerResult] = field(default_factory=list)
    interrupted: bool = False

    @property
    def elapsed(self) -> float:
        """Seconds from the common start to the last worker done (broker caught up)."""
        if not self.results:
            return 0.0
        return max(r.finished for r in self.results) - min(r.started for r in self.results)

    @property
    def sending(self) -> float:
        """Seconds from the common start to the end of sending (the paced window)."""
        if not self.results:
            return 0.0
        return max(r.sent_until for r in self.results) - min(r.started for r in self.results)

    def total(self, name: str) -> int:
        """Sum of one counter over the workers."""
        return sum(int(getattr(r, name)) for r in self.results)

    def counts(self) -> list[int]:
        """Readings published per sensor index (seq 0 .. n-1 each)."""
        out = [0] * self.settings.sensors
        for result in self.results:
            for index, count in result.counts.items():
                out[index] = count
        return out

    @property
    def ok(self) -> bool:
        """No errors, everything acknowledged (QoS 1) and the broker caught up."""
        acked = self.settings.qos == 0 or self.total("acked") == self.total("messages")
        return (
            self.total("errors") == 0
            and acked
            and all(r.drained for r in self.results)
            and bool(self.results)
        )

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-able data."""
        s = self.settings
        elapsed, sending = self.elapsed, self.sending
        readings, messages = self.total("readings"), self.total("messages")
        rate = readings / sending if sending > 0 else 0.0
        return {
            "ok": self.ok,
            "interrupted": self.interrupted,
            "sensor_prefix": s.sensor_prefix,
            "seed": s.seed,
            "sensors": s.sensors,
            "per_message": s.per_message,
            "qos": s.qos,
            "processes": s.processes,
            "readings": readings,
            "messages": messages,
            "acked": self.total("acked") if s.qos == 1 else None,
            "errors": self.total("errors"),
            "lost_messages": self.total("lost_messages"),
            "sending_s": round(sending, 4),
            "elapsed_s": round(elapsed, 4),
            "readings_per_s": round(rate, 1),
            "messages_per_s": round(messages / sending, 1) if sending > 0 else 0.0,
            "confirmed_messages_per_s": round(messages / elapsed, 1) if elapsed > 0 else 0.0,
            "target_rate": s.rate or None,
            "rate_ratio": round(rate / s.rate, 4) if s.rate else None,
            "backlog_readings": self.total("backlog"),
            "broker_caught_up": all(r.drained for r in self.results),
            "manifest": s.manifest,
        }


def worker_main(
    settings: PublishSettings,
    worker: int,
    counters: Any,  # noqa: ANN401
    events: Any,  # noqa: ANN401
    go: Any,  # noqa: ANN401
) -> None:
    """Entry point of a worker process: connect, report ready, wait for go, publish."""
    instance = Worker(settings, worker, counters)
    signal.signal(signal.SIGINT, instance.stop)
    signal.signal(signal.SIGTERM, instance.stop)
    try:
        instance.connect()
    except OSError as exc:
        detail = f"cannot connect to {settings.host}:{settings.port}: {exc}"
        events.put(("error", worker, detail))
        return
    events.put(("ready", worker, None))
    if not go.wait(CONNECT_TIMEOUT) or instance.stop.requested:
        instance.conn.close()
        return
    try:
        result = instance.publish()
    except (OSError, PublishError) as exc:
        events.put(("error", worker, str(exc)))
        return
    events.put(("result", worker, result))


def run_publish(settings: PublishSettings, progress: Any = None) -> Summary:  # noqa: ANN401
    """Run the workers; ``progress(counters_totals)`` is called about twice a second."""
    ctx = mp.get_context("spawn")
    counters = ctx.RawArray("d", settings.processes * FIELDS)
    events = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=worker_main,
            args=(settings, w, counters, events, go),
            name=f"loadgen-{w}",
            daemon=True,
        )
        for w in range(settings.processes)
    ]
    summary = Summary(settings)
    stop = StopFlag()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for proc in procs:
            proc.start()
        _wait_ready(events, procs, stop)
        go.set()
        summary.results = _collect(events, procs, counters, settings.processes, progress, stop)
        summary.interrupted = stop.requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return summary


def _wait_ready(events: Any, procs: list[Any], stop: StopFlag) -> None:  # noqa: ANN401
    ready = 0
    deadline = time.monotonic() + CONNECT_TIMEOUT + 30
    while ready < len(procs):
        if stop.requested or time.monotonic() > deadline:
            raise PublishError(
                "interrupted before the start"
                if stop.requested
                else "workers did not connect in time"
            )
        try:
            kind, worker, detail = events.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise PublishError("a worker process died while starting") from None
            continue
        if kind == "error":
            raise PublishError(f"worker {worker}: {detail}")
        ready += 1


def _collect(
    events: Any,  # noqa: ANN401
    procs: list[Any],
    counters: Any,  # noqa: ANN401
    workers: int,
    progress: Any,  # noqa: ANN401
    stop: StopFlag,
) -> list[WorkerResult]:
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    forwarded = False
    while len(results) + len(errors) < workers:
        if stop.requested and not forwarded:
            _forward_stop(procs)
            forwarded = True
        try:
            kind, worker, detail = events.get(timeout=0.5)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                _drain_events(events, results, errors)
                break
        else:
            _store(kind, worker, detail, results, errors)
        if progress is not None:
            progress(totals(counters, workers))
    if errors:
        raise PublishError("; ".join(errors))
    return [results[w] for w in sorted(results)]


def _forward_stop(procs: list[Any]) -> None:
    """A signal to this process alone (``kill PID``): pass it on so the workers drain."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()


def _drain_events(
    events: Any,  # noqa: ANN401
    results: dict[int, WorkerResult],
    errors: list[str],
) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            kind, worker, detail = events.get(timeout=0.2)
            _store(kind, worker, detail, results, errors)


def _store(
    kind: str,
    worker: int,
    detail: Any,  # noqa: ANN401
    results: dict[int, WorkerResult],
    errors: list[str],
) -> None:
    if kind == "result":
        results[worker] = detail
    elif kind == "error":
        errors.append(f"worker {worker}: {detail}")


def totals(counters: Any, workers: int) -> list[float]:  # noqa: ANN401
    """Counters summed over workers: readings, messages, acked, errors, backlog."""
    return [sum(counters[w * FIELDS + i] for w in range(workers)) for i in range(FIELDS)]
