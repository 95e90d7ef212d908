"""The one extension of the format interface: a format with state across messages.

A plain format is a pure function of one payload. A stateful one (Sparkplug B, whose DATA
messages refer to aliases declared by an earlier BIRTH) is an object, one per format
name, shared by the rules that use it. For each message one of its rules takes, the
pipeline first awaits :meth:`Stateful.prepare` (which may do I/O: store a BIRTH before the
message can be acknowledged, read a table missing from memory), then the mapping calls
:meth:`Stateful.parse`, which is synchronous and pure apart from the state it reads and
updates. Both are called in message order, one message at a time.

:meth:`Stateful.role` says what a topic is to the format before either is called: data
(readings, and state such as a BIRTH), state only (a Homie attribute: the device's
description, taken whatever ``--retained`` says about retained messages), or nothing it
uses (ignored by its rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from ingest.devices.decode import Limits
    from ingest.devices.formats import Parsed


DATA = "data"  # readings (and maybe state): a retained one follows --retained
STATE = "state"  # the device's description only: taken even when retained is ignored
OTHER = "other"  # nothing the format uses: the message is ignored by its rule


class MetricCounts(NamedTuple):
    """What a stateful format counted since it was last asked, by metric attribute name.

    The pipeline adds them to the metrics before each scrape (:meth:`Metrics.add_counts`),
    so the formats count in plain ints and never import the metrics.
    """

    counters: dict[str, dict[str, int] | int]  # per label value, or one count
    gauges: dict[str, int]


class Stateful(Protocol):
    """A payload format that keeps state across messages."""

    def role(self, topic: str) -> str:
        """What messages on ``topic`` are to the format: DATA, STATE or OTHER."""

    async def prepare(
        self,
        topic: str,
        payload: bytes,
        limits: Limits,
        closing: Callable[[], bool],
        generation: int = 0,
    ) -> bool:
        """Bring the state up to date for this message; False if ``closing`` made it give up.

        ``generation`` numbers the MQTT connection the message came on: a change means a
        reconnect, after which messages published meanwhile may be missing.
        """

    def parse(self, topic: str, payload: bytes, limits: Limits) -> Parsed:
        """The message's items and rejections, given the state (which it may update)."""

    def take_counts(self) -> MetricCounts:
        """The format's own counts since the last call (called before each scrape)."""
