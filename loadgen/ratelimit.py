"""Rate control on a monotonic clock: a schedule that allows ``rate * elapsed`` readings.

Falling behind (a slow broker, a full socket) is not forgiven: the owed readings are the
*backlog*, sent as soon as possible and reported, so the achieved average rate either
matches the target or the report says by how much it did not.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

# Longest single sleep: short, so a worker notices its deadline and keeps writes smooth.
SLEEP_SLICE = 0.005


class Pacer:
    """How many readings may be sent now; ``rate <= 0`` means no limit."""

    def __init__(
        self, rate: float, clock: Callable[[], float] = time.monotonic, burst: int = 1000
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self.started = clock()
        self.sent = 0

    def restart(self) -> None:
        """Start the schedule now (after connecting, when the run's clock starts)."""
        self.started = self._clock()
        self.sent = 0

    def due(self, now: float) -> int:
        """Readings the schedule allows in total by ``now`` (the first one at once)."""
        return math.floor(self.rate * (now - self.started)) + 1

    def allowance(self, now: float | None = None) -> int:
        """Readings that may be sent now, at most ``burst``; 0 means wait."""
        if self.rate <= 0:
            return self.burst
        now = self._clock() if now is None else now
        return max(0, min(self.burst, self.due(now) - self.sent))

    def record(self, readings: int) -> None:
        """Count readings sent."""
        self.sent += readings

    def wait_time(self, now: float | None = None) -> float:
        """Seconds until the next reading is due, capped at one sleep slice."""
        if self.rate <= 0:
            return 0.0
        now = self._clock() if now is None else now
        next_at = self.started + self.sent / self.rate
        return min(SLEEP_SLICE, max(0.0, next_at - now))

    def backlog(self, now: float | None = None) -> int:
        """Readings owed by the schedule and not yet sent (0 when on time or unlimited)."""
        if self.rate <= 0:
            return 0
        now = self._clock() if now is None else now
        return max(0, self.due(now) - 1 - self.sent)
