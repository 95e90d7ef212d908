# cython: annotation_typing=False
"""A connection's inbox, and the delivery of its PUBLISH packets into it, written once.

Every message passes through here twice: the scan of the read buffer delivers it
(:meth:`Receiver.deliver`: which subscription it came through, its ``Inbound``, the
acknowledgement ledger's account of it, the inbox), and the source's consumer takes it
(:meth:`Inbox.take`). This module runs as it is, and Cython compiles it as
``ingest.mqtt._inbox_c`` with the C types of ``_inbox_c.pxd`` (both classes extension
types, the inbox's put and take C calls from the delivery; setup.py); ingest/mqtt/source.py
picks one of the two. What the inbox and its bounds are for: ingest/mqtt/source.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ingest.model import Inbound
from ingest.mqtt.subscriptions import OLD_SUBSCRIPTION, OldSubscription, Unidentified

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    from ingest.config import Settings
    from ingest.metrics import Health, Metrics
    from ingest.mqtt import paho_hooks
    from ingest.mqtt.subscriptions import Subscriptions
    from ingest.mqtt.wire import Subscription

    # Takes a message now (True), or leaves it to the source: None (it must wait), False.
    # (A TypeAlias, for mypy alone: Cython compiles no ``type`` statement.)
    TakeNow: TypeAlias = Callable[[Inbound], bool | None]  # noqa: UP040

# Compiled, this is cimported (_inbox_c.pxd): the C-level helpers (ingest/_capi.pxd).
_capi: Any = None

INBOX_SHARE = 4  # the inbox holds at most max_buffered_bytes / INBOX_SHARE bytes
# Estimated memory of a received message besides its payload and topic (the Inbound,
# its bytes and str objects, the deque slot); as pipeline.MESSAGE_BYTES.
INBOX_MESSAGE_BYTES = 256
_now = time.time
_new_tuple = tuple.__new__
_TOPIC, _PAYLOAD = Inbound._fields.index("topic"), Inbound._fields.index("payload")


def _size(message: Inbound) -> int:
    """A message's estimated memory: INBOX_MESSAGE_BYTES, its payload and its topic."""
    if not cython.compiled:
        return INBOX_MESSAGE_BYTES + len(message.payload) + len(message.topic)
    # Compiled: the fields by position, in C (a NamedTuple's attribute is found by name).
    fields = _capi.checked_tuple(message)
    return INBOX_MESSAGE_BYTES + len(fields[_PAYLOAD]) + len(fields[_TOPIC])


class Inbox:
    """One connection's received messages not yet taken, and the pause of its reader."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        health: Health,
        generation: int,
    ) -> None:
        self.generation = generation  # of the connection whose messages it holds
        self.messages: deque[Inbound] = deque()
        self.bytes = 0
        self.wake = asyncio.Event()  # set when a message arrives in the empty inbox
        # The message last taken, until the pipeline has said whether it took it.
        self.current: Inbound | None = None
        self.reader: paho_hooks.Reader | None = None
        self.identified = True  # the broker takes Subscription Identifiers (CONNACK)
        self._metrics = metrics
        self._health = health
        self._limit = settings.max_inflight_messages
        self._limit_bytes = max(1, settings.max_buffered_bytes // INBOX_SHARE)
        self._paused_since = 0.0  # monotonic; 0 while reading

    def put(self, message: Inbound) -> None:
        """Append a received message; pause reading past a bound."""
        messages = self.messages
        messages.append(message)
        size = self.bytes + _size(message)
        self.bytes = size
        count = len(messages)
        if count == 1:
            # The consumer clears ``wake`` only once it has emptied the inbox.
            self.wake.set()
        if (
            (count >= self._limit or size >= self._limit_bytes)
            and not self._paused_since
            and self.reader is not None
        ):
            self._pause(self.reader)

    def _pause(self, reader: paho_hooks.Reader) -> None:
        reader.pause()
        self._paused_since = time.monotonic()
        self._health.reading_paused = True
        self._metrics.read_paused.set(1)
        self._metrics.read_pauses.inc()

    def take(self) -> Inbound:
        """The oldest message, now :attr:`current`; resume reading below half of both bounds."""
        message = self.messages.popleft()
        self.current = message
        self.bytes -= _size(message)
        if (
            self._paused_since
            and len(self.messages) <= self._limit // 2
            and self.bytes <= self._limit_bytes // 2
        ):
            self._unpaused()
            if self.reader is not None:
                self.reader.resume()
        return message

    def drain(self, take_now: TakeNow, limit: int) -> Inbound | None:
        """Take up to ``limit`` messages, each as :meth:`take` does, into ``take_now``.

        Returns the first message that ``take_now`` did not take (it answered None or
        False) or that is not an ``Inbound`` (it came through an old subscription), left
        as :attr:`current` for the source to handle; None once ``limit`` were taken or
        the inbox is empty. The source's consumer calls this in its loop: compiled, the
        usual message costs no Python frame.
        """
        messages = self.messages
        taken = 0
        while messages and taken < limit:
            message = self.take()
            if type(message) is not Inbound or take_now(message) is not True:
                return message
            self.current = None
            taken += 1
        return None

    def _unpaused(self) -> None:
        self.sync_metrics()
        self._paused_since = 0.0
        self._health.reading_paused = False
        self._metrics.read_paused.set(0)

    @property
    def paused(self) -> bool:
        """Whether reading from the broker is paused."""
        return bool(self._paused_since)

    def seed(self, messages: list[Inbound]) -> None:
        """Start with messages read on an earlier connection (taken first, in order).

        They count towards the bounds: the first message read past them pauses reading.
        """
        if not messages:
            return
        self.messages.extend(messages)
        self.bytes += sum([_size(message) for message in messages])
        self.wake.set()

    def close(self) -> list[Inbound]:
        """The connection is gone: a pause ends with it (a new connection reads).

        Returns the messages never taken (``current`` and those left), held no more.
        """
        if self._paused_since:
            self._unpaused()
        untaken = [self.current, *self.messages] if self.current else [*self.messages]
        self.messages.clear()
        self.current = None
        self.bytes = 0
        self._metrics.inbox_bytes.set(0)
        return untaken

    def sync_metrics(self) -> None:
        """Move the pause's time so far and the inbox's size into the metrics."""
        if self._paused_since:
            now = time.monotonic()
            self._metrics.read_paused_seconds.inc(now - self._paused_since)
            self._paused_since = now
        self._metrics.inbox_bytes.set(self.bytes)


class Receiver:
    """Delivers one connection's messages into its inbox: :meth:`deliver` is the scan's."""

    def __init__(
        self,
        inbox: Inbox,
        arrived: Callable[[Inbound], bool],
        subscriptions: Subscriptions,
    ) -> None:
        self.inbox = inbox
        self._arrived = arrived  # the acknowledgement ledger's: True if new to the pipeline
        self._wanted = subscriptions.wanted
        self._unwanted = subscriptions.unwanted
        self._generation = inbox.generation

    def deliver(
        self,
        topic: str,
        payload: bytes,
        mid: int,
        qos: int,
        dup: bool,
        retain: bool,
        subscription: Subscription,
    ) -> None:
        """Take one received PUBLISH (as ``wire.scan`` hands it over) into the inbox.

        QoS 1/2 messages are bounded by Receive Maximum at the broker; any message past
        the inbox's bounds pauses the reader, so QoS 0 waits in TCP and at the broker
        instead of being dropped here.
        """
        kind: type[Inbound] = Inbound
        # Not through one of today's filters (where the broker says which it came through)
        if subscription not in self._wanted and self.inbox.identified:
            why = self._unwanted(topic, subscription)
            if why is not None:
                kind = OldSubscription if why == OLD_SUBSCRIPTION else Unidentified
        now = _capi.now() if cython.compiled else _now()  # compiled: no Python call
        items = (topic, payload, mid, qos, self._generation, now, dup, retain)
        # Inbound(...) without its Python-level __new__ (compiled: nor a call)
        message = _capi.tuple_as(kind, items) if cython.compiled else _new_tuple(kind, items)
        if not qos or self._arrived(message):
            self.inbox.put(message)
