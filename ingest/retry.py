"""Capped, jittered exponential backoff shared by reconnects and write retries."""

from __future__ import annotations

import random


def backoff(attempt: int, *, base: float = 0.25, cap: float = 30.0) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): full jitter, capped."""
    return random.uniform(0, min(cap, base * 2 ** min(attempt, 20)))  # noqa: S311 - not crypto
