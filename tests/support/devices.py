"""Device-shaped fixtures: messages as the vendors document them, with the readings expected.

Each ``tests/fixtures/devices/<preset>.json`` holds ``messages``: a topic, a payload (a
string is sent as is; anything else as compact JSON), the rule expected to take it, and
``expect``: a list of readings, ``"ignored"``, or ``{"rejections": [reasons]}``. A reading
names its ``sensor_id``, ``ts`` and ``values``, and its ``tags``, ``units`` and descriptive
``info`` when it has any (none given: it must have none).

Payload times are placeholders filled in relative to a base time ``T`` (whole seconds plus
250 ms, an hour ago) so the fixtures never age out of the accepted window:
``@T_ISO_Z@`` (``...T..:..:..250Z``), ``@T_ISO_PLUS1@`` (the same instant at +01:00),
``"@T_MS@"`` (epoch milliseconds) and ``"@T_S@"`` (epoch seconds, a float); to the
nanosecond as LoRaWAN servers write them, within the same millisecond:
``@T_ISO_NS_Z@`` (``...250339525Z``), ``@T_ISO_NS_UTC@`` (``...250023242+00:00``), and
``@T_LATER_ISO_NS_Z@``, two seconds after ``T`` (a later time in the same message).
A reading's ``ts`` is ``"T"`` (that instant) or ``"arrival"`` (the time it was received).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "devices"
PRESETS = (
    "zigbee2mqtt",
    "tasmota",
    "shelly",
    "esphome",
    "homeassistant",
    "openmqttgateway",
    "rtl_433",
    "ttn",
    "chirpstack",
)


@dataclass(frozen=True)
class Expected:
    """One reading a message must produce."""

    sensor_id: str
    ts: str  # "T" or "arrival"
    values: dict[str, int | float | bool | str]
    tags: dict[str, str] | None
    units: dict[str, str] | None = None
    info: dict[str, str] | None = None


@dataclass(frozen=True)
class Message:
    """One fixture message, its payload rendered for a base time."""

    source: str
    topic: str
    payload: bytes
    rule: str
    readings: tuple[Expected, ...]
    ignored: bool
    rejections: tuple[str, ...]


def base_time(now: float) -> float:
    """``T``: an hour before ``now``, whole seconds plus 250 ms (exact in binary)."""
    return math.floor(now) - 3600 + 0.25


def render(text: str, t: float) -> str:
    """Fill the time placeholders of a payload for base time ``t``."""
    instant = datetime.fromtimestamp(t, UTC)
    plus1 = instant.astimezone(timezone(timedelta(hours=1)))
    second = instant.strftime("%Y-%m-%dT%H:%M:%S")
    later = (instant + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S")
    return (
        text.replace('"@T_MS@"', str(round(t * 1000)))
        .replace('"@T_S@"', f"{t:.2f}")
        .replace("@T_ISO_NS_Z@", f"{second}.250339525Z")
        .replace("@T_ISO_NS_UTC@", f"{second}.250023242+00:00")
        .replace("@T_LATER_ISO_NS_Z@", f"{later}.250773143Z")
        .replace("@T_ISO_Z@", instant.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
        .replace("@T_ISO_PLUS1@", plus1.isoformat(timespec="milliseconds"))
    )


def load(preset: str, t: float) -> list[Message]:
    """The fixture messages of one preset, rendered for base time ``t``."""
    doc = json.loads((FIXTURES / f"{preset}.json").read_text(encoding="utf-8"))
    return [_message(entry, t) for entry in doc["messages"]]


def _message(entry: dict[str, Any], t: float) -> Message:
    raw = entry["payload"]
    text = (
        raw if isinstance(raw, str) else json.dumps(raw, separators=(",", ":"), ensure_ascii=False)
    )
    expect = entry["expect"]
    readings: tuple[Expected, ...] = ()
    rejections: tuple[str, ...] = ()
    if isinstance(expect, list):
        readings = tuple(
            Expected(
                r["sensor_id"], r["ts"], r["values"], r.get("tags"), r.get("units"), r.get("info")
            )
            for r in expect
        )
    elif isinstance(expect, dict):
        rejections = tuple(expect["rejections"])
    return Message(
        entry["source"],
        entry["topic"],
        render(text, t).encode(),
        entry["rule"],
        readings,
        expect == "ignored",
        rejections,
    )


def same_value(got: object, want: object) -> bool:
    """Equal with the same type (``True`` is not ``1``, ``1`` is not ``1.0``)."""
    return type(got) is type(want) and got == want
