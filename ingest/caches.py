"""The bound of the caches that grow with the fleet: entries per sensor, series or topic.

A daemon remembers a little about each sensor and topic it has seen, to skip work the
next message would repeat: a sensor id already checked against its pattern, the last
arrival time given to a sensor, a topic's checksum, a topic's mapping rule and captures.
None of it is needed for correctness (a miss does the work again, or, for arrival times,
keeps what still matters), so each cache holds at most :data:`limit` entries, which
``--max-cached-series`` sets at start: a fleet of any size keeps a bounded daemon.
"""

from __future__ import annotations

DEFAULT_LIMIT = 100_000

# Entries each cache may hold (read by the owners when a cache is full, never per hit).
limit = DEFAULT_LIMIT


def set_limit(entries: int) -> None:
    """Bound every fleet-sized cache of this process to ``entries`` entries."""
    global limit  # noqa: PLW0603 -- one setting of the process, set once at start
    if entries < 1:
        raise ValueError(f"a cache holds at least one entry, not {entries}")
    limit = entries
