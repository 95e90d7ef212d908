"""Who may read: bearer tokens from a file, the page's login sessions, a per-caller bound.

The tokens themselves (a file, kept as SHA-256 digests, compared in constant time) are
:mod:`ingest.tokens`, which the daemon's /metrics shares.

The page logs in by POSTing a token to ``/login``: the answer sets an HttpOnly,
SameSite=Strict cookie holding a random session id; the server maps the id's digest to
the token's name and an expiry. Only names ever reach logs.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingest.tokens import digest

if TYPE_CHECKING:
    from collections.abc import Callable

COOKIE = "ingest_session"
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    """A page login: the token's name and when the session ends (monotonic seconds)."""

    name: str
    expires: float


class Sessions:
    """Session ids (kept as digests) -> the token's name, each until its expiry."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._by_digest: dict[bytes, Session] = {}

    def open(self, name: str) -> str:
        """A new session for ``name``; returns its id (the cookie's value)."""
        now = self._clock()
        if len(self._by_digest) >= MAX_SESSIONS:
            self._by_digest = {k: s for k, s in self._by_digest.items() if s.expires > now}
            while len(self._by_digest) >= MAX_SESSIONS:  # the oldest go first
                del self._by_digest[next(iter(self._by_digest))]
        session_id = secrets.token_urlsafe(32)
        self._by_digest[digest(session_id)] = Session(name, now + self.ttl)
        return session_id

    def name_of(self, session_id: str) -> str | None:
        """The token name of a live session, else None (an expired one is forgotten)."""
        key = digest(session_id)
        session = self._by_digest.get(key)
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._by_digest[key]
            return None
        return session.name

    def close(self, session_id: str) -> None:
        """End a session (logout)."""
        self._by_digest.pop(digest(session_id), None)


class CallerSlots:
    """At most ``limit`` queries in flight per caller (a token's name, or an address)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._busy: dict[str, int] = {}

    def take(self, caller: str) -> bool:
        """Take a slot; False when the caller already has ``limit`` queries running."""
        busy = self._busy.get(caller, 0)
        if busy >= self.limit:
            return False
        self._busy[caller] = busy + 1
        return True

    def give_back(self, caller: str) -> None:
        """Return a slot taken by :meth:`take`."""
        busy = self._busy[caller] - 1
        if busy:
            self._busy[caller] = busy
        else:
            del self._busy[caller]
