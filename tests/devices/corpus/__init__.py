"""A corpus of device families that ship no preset, in their vendors' own message shapes.

Each family module gives ``FAMILY``: where its shapes come from (the vendor's file or page
and version), and ``messages(t)``: a capture as the devices publish it, housekeeping
included, each message with its ground truth: the reading it carries (the device, the
measurements with their values and documented units, the time), or why it is no reading.
``tests/devices/test_discover_corpus.py`` scores ``ingest discover``'s proposal on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

# Why a message is not a reading.
HOUSEKEEPING = "housekeeping"  # status, LWT, heartbeat, commands, requests: never stored
DESCRIPTIVE = "descriptive"  # names, addresses, settings: storing them is no error, no value


@dataclass(frozen=True)
class Truth:
    """The reading a message carries."""

    device: str
    values: dict[str, object]
    units: dict[str, str] = field(default_factory=dict)  # measurement -> documented unit
    ts: float | None = None  # the payload's time; None: the arrival time


@dataclass(frozen=True)
class Msg:
    """One captured message and what it is."""

    topic: str
    payload: bytes
    truth: Truth | str  # the reading, or HOUSEKEEPING / DESCRIPTIVE


@dataclass(frozen=True)
class Family:
    """A device family: its sources and a capture of it."""

    name: str
    sources: tuple[str, ...]


def js(doc: object) -> bytes:
    """A payload as the vendor's JSON."""
    return orjson.dumps(doc)


FAMILIES = (
    "opendtu",
    "evcc",
    "teslamate",
    "wled",
    "espeasy",
    "owntracks",
    "meshtastic",
    "victron",
    "zwavejsui",  # added as a check that discover generalises (see its module)
)
