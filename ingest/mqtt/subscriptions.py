"""Which subscription a message came through: today's, or one an earlier run left behind.

A persistent session keeps every subscription it was ever given, and MQTT has no way to
list them. Two measures keep the daemon to the filters it runs with today:

* Each filter is subscribed with a Subscription Identifier (MQTT 5) derived from the
  filter itself (:func:`identifier`; the same for its plain and shared forms, so a
  change of ``--workers`` or ``--shared-group`` keeps a filter's messages). The broker
  puts into every PUBLISH the identifier of each subscription it matched, messages
  queued while the daemon was away included. A message carrying none of today's
  identifiers came through an old subscription: it is acknowledged, counted and never
  stored (:meth:`Subscriptions.unwanted`), with one exception. Through a remembered
  filter that this start unsubscribes, or that an earlier start unsubscribed in the last
  :data:`RETIRED_DAYS` days (:meth:`Subscriptions.retire`), a message whose topic
  today's filters match is taken: it was queued under the old filter before today's
  existed (published while the daemon was away), so it has no other copy. (Resent after
  a crash, it still carries the old filter's identifier, after the start that
  unsubscribed it: hence the earlier starts' too.)
  (Published in the instant between today's SUBACK and the old filter's UNSUBACK, a
  message comes through both: its readings with a time of their own are one reading
  whatever the copies; one without a time would be two. Unsubscribing first instead
  would lose what is published in between.) An old filter that is not remembered (no
  record, or MongoDB failed) stays subscribed, and every message through it has a copy
  through today's filter too while both are held: skipped.
* The filters each client id subscribed are remembered (:class:`Memory`, a MongoDB
  collection) and, on the next start, those no longer wanted are unsubscribed, so the
  broker stops sending and queueing for them; the record keeps them as retired for
  :data:`RETIRED_DAYS` days.

A message without any identifier came through a subscription made without one (by a
version of ingest before identifiers, or by a broker that does not take them): it is
taken when its topic matches one of today's filters.
"""

from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ingest.config import split_shared
from ingest.metrics import SKIP_REASONS
from ingest.model import Inbound

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ingest.mqtt.wire import Subscription

# The reasons of ingest_messages_skipped_total, both for a topic outside today's filters:
# through a filter not subscribed today (its identifier); through one made without one.
OLD_SUBSCRIPTION, UNIDENTIFIED_SUBSCRIPTION = SKIP_REASONS
MAX_IDENTIFIER = 268_435_455  # MQTT 5: 1 to 2**28 - 1 (a variable byte integer)
# How long a filter unsubscribed stays retired in its session's record: what it queued
# is delivered on the session's next connections, and resent until acknowledged; longer
# than the 7-day session the daemon asks for, as the delivery ledger's TTL.
RETIRED_DAYS = 8


class OldSubscription(Inbound):
    """A message that came through a subscription of a filter not subscribed today."""

    __slots__ = ()


class Unidentified(Inbound):
    """A message without Subscription Identifier whose topic no filter of today's matches."""

    __slots__ = ()


# Why a message of each kind is skipped (the reason label of ingest_messages_skipped_total).
SKIPPED: dict[type[Inbound], str] = {
    OldSubscription: OLD_SUBSCRIPTION,
    Unidentified: UNIDENTIFIED_SUBSCRIPTION,
}


def plain(topic_filter: str) -> str:
    """The filter without its shared-subscription prefix (``$share/<group>/``)."""
    return split_shared(topic_filter)[1]


def filter_pattern(topic_filter: str) -> str:
    """A regular expression that matches (``fullmatch``) exactly the topics the filter does.

    MQTT 5 §4.7: ``+`` is one level, perhaps empty; a final ``#`` is its parent level and
    any number below it; a filter that starts with a wildcard matches no topic that
    starts with ``$``. Any other level is itself, character for character.
    """
    levels = topic_filter.split("/")
    parts = ["[^/]*" if level == "+" else re.escape(level) for level in levels]
    if levels[-1] == "#":
        parts.pop()
        pattern = "/".join(parts) + "(?:/.*)?" if parts else ".*"
    else:
        pattern = "/".join(parts)
    return ("(?!\\$)" if levels[0] in ("+", "#") else "") + pattern


def topic_matcher(filters: Iterable[str]) -> Callable[[str], bool]:
    """Whether a topic matches any of ``filters`` (plain ones): one compiled expression.

    paho's ``topic_matches_sub`` builds a matcher tree per call and leaves a reference
    cycle behind (a recursive closure), garbage for the collector on every message.
    """
    alternatives = [f"(?:{filter_pattern(f)})" for f in filters]
    match = re.compile("|".join(alternatives) or "(?!)", re.DOTALL).fullmatch

    def matches(topic: str) -> bool:
        return match(topic) is not None

    return matches


def identifier(topic_filter: str) -> int:
    """The Subscription Identifier of a filter: from its plain form, the same in every run.

    Two different filters may share one (one chance in 2**28): a message of the other
    is then taken as today's. The remembered filters still end such a subscription.
    """
    return zlib.crc32(plain(topic_filter).encode()) % MAX_IDENTIFIER + 1


class Subscriptions:
    """Today's filters: their identifiers, and the test of a message against them."""

    def __init__(self, filters: Iterable[str]) -> None:
        self.filters = tuple(dict.fromkeys(filters))
        self._plain = tuple(dict.fromkeys(plain(f) for f in self.filters))
        # The identifiers of today's filters: a message carrying one is wanted.
        self.wanted = frozenset(identifier(f) for f in self.filters)
        # Those of remembered filters this process unsubscribed (:meth:`retire`).
        self.retired: frozenset[int] = frozenset()
        self._matches = topic_matcher(self._plain)  # whether one of today's filters does

    def retire(self, filters: Iterable[str]) -> None:
        """Note remembered filters being unsubscribed now.

        What they queued before today's filters existed is taken where today's filters
        match its topic.
        """
        self.retired = self.retired | {identifier(f) for f in filters} - self.wanted

    def unwanted(self, topic: str, subscription: Subscription) -> str | None:
        """Why a message that carries no single identifier of today's is skipped, or None.

        Called only when ``subscription not in wanted`` (the usual message does not get
        here): several identifiers, one of another filter, or none. Through old
        subscriptions only: skipped unless one of them is retired and today's filters
        match its topic. None: the same test.
        """
        if isinstance(subscription, tuple):
            if self.wanted.intersection(subscription):
                return None
            if not self.retired.intersection(subscription):
                return OLD_SUBSCRIPTION
        elif subscription and subscription not in self.retired:
            return OLD_SUBSCRIPTION
        if self._matches(topic):
            return None
        return OLD_SUBSCRIPTION if subscription else UNIDENTIFIED_SUBSCRIPTION


class Recalled(NamedTuple):
    """What a session's record holds (:class:`Memory`)."""

    # The filters the session may hold subscribed.
    filters: list[str]
    # Filters unsubscribed by an earlier start, and when (epoch seconds): what they had
    # queued may still arrive, resent after a crash (:meth:`Subscriptions.retire`).
    retired: dict[str, float]


class Memory(Protocol):
    """Where the filters a client id subscribed are remembered between runs."""

    async def recall(self) -> Recalled | None:
        """The filters last recorded (None: nothing recorded)."""

    async def record(self, filters: list[str], retired: dict[str, float]) -> None:
        """Record the filters the session may hold from now on, and those retired."""
