"""Units that self-describing measurement names imply, from one table with its sources.

``ingest discover`` proposes these as suggestions (a NOTE asks to confirm them), only
for a measurement that no payload unit field, unit attribute or convention gives a unit
for. A name matches by its last word (``Dc_0_Voltage``, ``chargePower``,
``relative_humidity``, ``inside_temp``) after qualifiers such as ``level`` or a channel
number, or by its last two words (``wind_speed``). Some entries ask for evidence in
the values as well: a share in % needs every value seen between 0 and 100; ``batt``
(mV, V or %) needs whole numbers from 0 to 100; ``rssi`` (dBm, or Tasmota's %) needs
negative values; ``acc`` (accuracy, or acceleration) needs a location fix beside it
(a latitude and a longitude). Names whose unit depends on the device rather than the
user's unit system are not in the table: ``energy`` (Wh or kWh), ``uptime`` (s or
min). docs/onboarding.md lists the table.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

# Each name with its unit, where that unit comes from, and the evidence it needs (a key
# of CHECKS, or None). HA stands for Home Assistant: its sensor device classes and their
# units (homeassistant/components/sensor/const.py) and, where a quantity has several,
# its metric unit system (homeassistant/util/unit_system.py METRIC_SYSTEM: °C, km,
# speeds in km/h, wind speed in m/s); Z2M for Zigbee2MQTT's exposes
# (zigbee-herdsman-converters, lib/exposes.ts).
TABLE: dict[str, tuple[str, str, str | None]] = {
    "temperature": ("°C", "Z2M temperature; HA temperature (metric)", None),
    "temp": ("°C", "temperature, short form", None),
    "humidity": ("%", "Z2M humidity; HA humidity", "percent"),
    "pressure": ("hPa", "Z2M pressure; HA pressure (metric)", None),
    "voltage": ("V", "Z2M voltage (electrical measurement); HA voltage", None),
    "current": ("A", "Z2M current; HA current", None),
    "power": ("W", "Z2M power; HA power", None),
    "frequency": ("Hz", "Z2M ac_frequency; HA frequency", None),
    "battery": ("%", "Z2M battery; HA battery", "percent"),
    "batt": ("%", "battery, short form (else mV or V)", "whole_percent"),
    "soc": ("%", "HA battery (state of charge)", "percent"),
    "illuminance": ("lx", "Z2M illuminance; HA illuminance", None),
    "co2": ("ppm", "Z2M co2; HA carbon_dioxide", None),
    "pm25": ("µg/m³", "Z2M pm25; HA pm25", None),
    "moisture": ("%", "Z2M soil_moisture; HA moisture", "percent"),
    "seconds": ("s", "the name says it (uptime_seconds)", None),
    "sec": ("s", "the name says it (Tasmota's UptimeSec)", None),
    "altitude": ("m", "NMEA 0183 GGA altitude (metres); HA distance (metric)", None),
    "alt": ("m", "altitude, short form", None),
    "utilization": ("%", "a share of time or capacity in use (channel_utilization)", "percent"),
    "util": ("%", "utilization, short form (air_util_tx)", "percent"),
    "odometer": ("km", "HA distance (metric: km)", None),
    "speed": ("km/h", "HA speed (metric: km/h)", None),
    "wind_speed": ("m/s", "HA wind_speed (metric: m/s)", None),
    "cog": ("°", "NMEA 0183 RMC course over ground (degrees)", None),
    "course": ("°", "NMEA 0183 RMC course over ground (degrees)", None),
    "heading": ("°", "NMEA 0183 HDT heading (degrees)", None),
    "rssi": ("dBm", "HA signal_strength (Tasmota's RSSI is a %)", "negative"),
    "accuracy": ("m", "W3C Geolocation coords.accuracy; HA gps_accuracy (metres)", "location"),
    "acc": ("m", "accuracy, short form (else acceleration)", "location"),
}
# Words after the quantity that do not change its unit.
QUALIFIERS = frozenset(
    {"level", "value", "avg", "mean", "min", "max", "total", "now", "l1", "l2", "l3", "tx", "rx"}
)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_LATITUDE = frozenset({"lat", "latitude"})
_LONGITUDE = frozenset({"lon", "lng", "long", "longitude"})


def words(name: str) -> list[str]:
    """A name's words, lowercased: ``Dc_0_Voltage`` -> dc, 0, voltage; ``chargePower``."""
    return [w.lower() for w in _WORDS.findall(name)]


def _percent(values: list[float], _names: frozenset[str]) -> bool:
    return bool(values) and all(0 <= v <= 100 for v in values)


def _whole_percent(values: list[float], names: frozenset[str]) -> bool:
    return _percent(values, names) and all(float(v).is_integer() for v in values)


def _negative(values: list[float], _names: frozenset[str]) -> bool:
    return bool(values) and all(v < 0 for v in values)


def _location(_values: list[float], names: frozenset[str]) -> bool:
    said = {w for n in names for w in words(n)}
    return bool(said & _LATITUDE) and bool(said & _LONGITUDE)


# What each check asks, as docs/onboarding.md's table says it.
EVIDENCE = {
    "percent": "every value 0..100",
    "whole_percent": "whole numbers 0..100",
    "negative": "every value below 0",
    "location": "beside a latitude and a longitude",
}
CHECKS: dict[str, Callable[[list[float], frozenset[str]], bool]] = {
    "percent": _percent,
    "whole_percent": _whole_percent,
    "negative": _negative,
    "location": _location,
}


def entry(name: str) -> tuple[str, str, str | None] | None:
    """The table's entry for a measurement name: its last two words, else its last."""
    parts = words(name)
    while parts and (parts[-1] in QUALIFIERS or parts[-1].isdigit()):
        parts.pop()
    if not parts:
        return None
    if len(parts) > 1 and (pair := "_".join(parts[-2:])) in TABLE:
        return TABLE[pair]
    return TABLE.get(parts[-1])


def unit_of(
    name: str, values: Iterable[float] | None = None, names: Iterable[str] = ()
) -> str | None:
    """The unit the table gives a measurement name, or None.

    ``values``: the numbers seen under it (None: not known, so an entry that asks for
    evidence gives nothing); ``names``: every name the same rule stores (a location
    fix is a latitude and a longitude among them).
    """
    found = entry(name)
    if found is None:
        return None
    unit, _, check = found
    if check is None:
        return unit
    if values is None:
        return None
    return unit if CHECKS[check](list(values), frozenset(names)) else None


def units_of(values: Mapping[str, Iterable[float]]) -> dict[str, str]:
    """The table's units for the names it knows, each name with the numbers seen."""
    names = frozenset(values)
    return {n: u for n, vs in values.items() if (u := unit_of(n, vs, names)) is not None}
