"""Payload formats for mapping rules: each turns payload bytes into raw items.

A format only parses. It returns :class:`Item` objects (one per reading, with field names
and values as the payload has them) and whole-message rejections; the mapping engine
(:mod:`ingest.devices.mapping`) then applies the rule: names made safe, keep/drop, values,
strings, time, sensor id, tags. Nothing here does I/O or raises for bad input.
"""

from __future__ import annotations

from typing import NamedTuple

from ingest.model import Rejection

# Bounds that hold whatever a payload says (the payload itself is bounded by
# --max-message-bytes and the readings of one message by --max-readings-per-message).
MAX_FIELDS = 1000  # fields of one reading after flattening
MAX_DEPTH = 16  # nesting of objects flattened into one reading


class Item(NamedTuple):
    """One reading as a format found it, before the rule is applied."""

    fields: dict[str, object]
    ts: object = None  # the raw time value (None: arrival time)
    epoch: float | None = None  # or the time already resolved, in epoch seconds (SenML)
    sensor: str | None = None  # a sensor id the payload names (SenML base name)
    tags: dict[str, str] | None = None  # tags the payload carries (line protocol)
    units: dict[str, str] | None = None  # units by field name (SenML)
    context: dict[str, str] | None = None  # extra template variables ({measurement}, {tag.x})
    problems: list[Rejection] | None = None  # fields the format refused (array, too deep...)
    position: int | None = None  # where in the message (array item, line), for rejections


class Parsed(NamedTuple):
    """What a format made of one payload."""

    items: list[Item]
    rejections: list[Rejection]


def refused(reason: str, detail: str) -> Parsed:
    """A whole payload refused."""
    return Parsed([], [Rejection(reason, detail)])


def text_of(payload: bytes) -> str | None:
    """The payload as UTF-8 text, or None if it is not UTF-8."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
