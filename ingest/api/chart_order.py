"""Which of a sensor's measurements the page charts first: what a person looks for.

Patterns are shell-style (``*`` any characters, ``?`` one), matched against a whole
measurement name, ignoring case. The page puts a measurement that matches a ``last``
pattern (housekeeping: battery, link quality, signal) after every other, in the order of
those patterns; else one that matches a ``first`` pattern before the rest, in the order of
those; the rest by name between them. A preset's or mapping file's ``[page]`` table
(``ingest api --preset``) comes before these defaults (docs/presets.md).
"""

from __future__ import annotations

DEFAULT_FIRST = (
    "temperature",
    "*_temperature",
    "temp",
    "*_temp",
    "tempc",
    "humidity",
    "*_humidity",
    "hum",
    "power",
    "*_power",
    "apower",
    "energy",
    "*_energy",
    "*energy_total",
    "pressure",
    "*_pressure",
    "co2",
    "*_co2",
    "voc",
    "pm25",
    "pm10",
    "illuminance*",
    "lux",
    "current",
    "voltage",
    "occupancy",
    "presence",
    "motion",
    "contact",
    "water_leak",
    "smoke",
    "state",
)
DEFAULT_LAST = (
    "battery*",
    "*_battery*",
    "linkquality",
    "*rssi*",
    "*signal*",
    "snr",
    "device_temperature",
    "uptime*",
    "heap",
    "loadavg",
    "vcc",
)


def measurement_order(preset: tuple[tuple[str, ...], tuple[str, ...]]) -> dict[str, list[str]]:
    """The page's ``first`` and ``last`` patterns: the presets' own, then the defaults."""
    first, last = preset
    return {
        "first": list(dict.fromkeys((*first, *DEFAULT_FIRST))),
        "last": list(dict.fromkeys((*last, *DEFAULT_LAST))),
    }
