"""Latency sampling for ``loadgen bench``: when published readings become visible.

A few readings spread over the publish order are polled for in MongoDB while the
publisher runs; the time each first shows up, minus its estimated send time, is its
end-to-end latency.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo.errors import PyMongoError

from loadgen import payloads
from loadgen.report import percentile
from loadgen.verify import to_ms

if TYPE_CHECKING:
    from loadgen.config import PublishSettings
    from loadgen.publisher import Summary

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled reading and when, after the publisher's start, it was sent."""

    sensor: int
    seq: int
    offset: int  # readings the publisher sent up to and including this one


def plan_samples(settings: PublishSettings, wanted: int) -> list[Sample]:
    """Readings spread evenly over the publish order (one process; its plan replayed)."""
    s = settings
    limits = payloads.split_count(s.count or 0, s.sensors)
    plan = payloads.message_plan(list(range(s.sensors)), limits, s.per_message)
    order = list(payloads.late_plan(plan, s.per_message, s.late_every))
    step = max(1, len(order) // max(1, wanted))
    sent, out = 0, []
    for index, (pos, first, k) in enumerate(order):
        sent += k
        if index % step == step - 1:
            out.append(Sample(pos, first + k - 1, sent))
    return out[:wanted]


class Sampler(threading.Thread):
    """Polls MongoDB for the sampled readings; records when each first became visible."""

    def __init__(
        self,
        coll: Any,  # noqa: ANN401
        mode: str,
        run: payloads.Run,
        samples: list[Sample],
        interval: float,
    ) -> None:
        super().__init__(name=f"sampler-{mode}", daemon=True)
        self.coll, self.mode = coll, mode
        # Looked up by timestamp, which every payload format carries (Sparkplug has no seq).
        self.published = run
        self.pending = {(run.sensor_id(x.sensor), x.seq): x for x in samples}
        self.seen: dict[Sample, float] = {}
        self.interval = interval
        self.polls: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        """Poll until every sample is seen or ``stop`` is called."""
        while self.pending and not self.stopping.is_set():
            began = time.monotonic()
            try:
                found = self._poll()
            except PyMongoError as exc:
                logger.warning("latency sampling query failed: %s", exc)
                found = set()
            ended = time.monotonic()
            self.polls.append(ended - began)
            for sensor, seq in found:
                sample = self.pending.pop((sensor, seq), None) if seq is not None else None
                if sample is not None:
                    self.seen[sample] = (began + ended) / 2
            self.stopping.wait(max(0.0, self.interval - (ended - began)))

    def _poll(self) -> set[tuple[str, int | None]]:
        ids = sorted({k[0] for k in self.pending})
        times = sorted({_date(self.published.ts_ms(k[1])) for k in self.pending})
        if self.mode == "bucket":
            docs = self.coll.find(
                {"sensor_id": {"$in": ids}, "readings.ts": {"$in": times}},
                {"_id": 0, "sensor_id": 1, "readings.ts": 1},
            )
            return {
                (d["sensor_id"], self.published.seq_of(to_ms(r.get("ts"))))
                for d in docs
                for r in d.get("readings", [])
            }
        docs = self.coll.find(
            {"meta.sensor_id": {"$in": ids}, "ts": {"$in": times}}, {"_id": 0, "meta": 1, "ts": 1}
        )
        return {(d["meta"]["sensor_id"], self.published.seq_of(to_ms(d.get("ts")))) for d in docs}

    def stop(self) -> None:
        """End the polling loop and wait for it."""
        self.stopping.set()
        self.join(timeout=10)


def latency_figures(sampler: Sampler, summary: Summary, samples: int) -> dict[str, Any]:
    """Percentiles of visible time minus estimated send time, in milliseconds.

    The send time of a sample is the publisher's start plus its position in the publish
    order divided by the achieved sending rate (the pacer holds the schedule).
    """
    started = min(r.started for r in summary.results)
    readings = summary.total("readings")
    rate = readings / summary.sending if summary.sending > 0 else 0.0
    values = (
        [max(0.0, (seen - (started + x.offset / rate)) * 1000) for x, seen in sampler.seen.items()]
        if rate
        else []
    )
    polls = sampler.polls
    return {
        "samples": samples,
        "seen": len(values),
        **{f"p{p}": rounded(percentile(values, p)) for p in (50, 90, 99)},
        "max": rounded(max(values)) if values else None,
        "poll_interval_ms": round(sampler.interval * 1000),
        "mean_poll_ms": rounded(1000 * sum(polls) / len(polls)) if polls else None,
    }


def rounded(value: float | None, digits: int = 1) -> float | None:
    """``value`` rounded to ``digits``, or None."""
    return None if value is None else round(value, digits)


def _date(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
