"""Units that self-describing measurement names imply, from one table with its sources.

``ingest discover`` proposes these as suggestions (a NOTE asks to confirm them), only
for a measurement that no payload unit field, unit attribute or convention gives a unit
for. A name matches by its last word (``Dc_0_Voltage``, ``chargePower``,
``relative_humidity``) after qualifiers such as ``level`` or a channel number, or whole
(``battery_level``). Names that could mean several units (``temp``: °C or °F; ``batt``:
mV, V or %) are not in the table. docs/onboarding.md lists the table.
"""

from __future__ import annotations

import re

# Each word with its unit and where that unit comes from. HA stands for Home Assistant's
# sensor device classes and their default units (SensorDeviceClass in its developer
# docs); Z2M for Zigbee2MQTT's exposes (zigbee-herdsman-converters, lib/exposes.ts).
TABLE: dict[str, tuple[str, str]] = {
    "temperature": ("°C", "Z2M temperature; HA temperature (metric)"),
    "humidity": ("%", "Z2M humidity; HA humidity"),
    "pressure": ("hPa", "Z2M pressure; HA pressure (metric)"),
    "voltage": ("V", "Z2M voltage (electrical measurement); HA voltage"),
    "current": ("A", "Z2M current; HA current"),
    "power": ("W", "Z2M power; HA power"),
    "energy": ("kWh", "Z2M energy; HA energy"),
    "frequency": ("Hz", "Z2M ac_frequency; HA frequency"),
    "battery": ("%", "Z2M battery; HA battery"),
    "soc": ("%", "HA battery (state of charge)"),
    "illuminance": ("lx", "Z2M illuminance; HA illuminance"),
    "co2": ("ppm", "Z2M co2; HA carbon_dioxide"),
    "pm25": ("µg/m³", "Z2M pm25; HA pm25"),
    "moisture": ("%", "Z2M soil_moisture; HA moisture"),
    "seconds": ("s", "the name says it (uptime_seconds)"),
    "altitude": ("m", "NMEA 0183 GGA altitude (metres); HA distance (metric)"),
    "utilization": ("%", "a share of time or capacity in use (channel_utilization)"),
}
# Words after the quantity that do not change its unit.
QUALIFIERS = frozenset(
    {"level", "value", "avg", "mean", "min", "max", "total", "now", "l1", "l2", "l3"}
)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def words(name: str) -> list[str]:
    """A name's words, lowercased: ``Dc_0_Voltage`` -> dc, 0, voltage; ``chargePower``."""
    return [w.lower() for w in _WORDS.findall(name)]


def unit_of(name: str) -> str | None:
    """The unit the table gives a measurement name, or None."""
    parts = words(name)
    while parts and (parts[-1] in QUALIFIERS or parts[-1].isdigit()):
        parts.pop()
    if not parts:
        return None
    found = TABLE.get(parts[-1])
    return found[0] if found else None


def units_of(names: list[str]) -> dict[str, str]:
    """The table's units for the names it knows."""
    return {n: u for n in names if (u := unit_of(n)) is not None}
