"""ESPEasy (ESP8266/ESP32 firmware): plain values ``%sysname%/%tskname%/%valname%``.

From letscontrolit/ESPEasy ``docs/source/Controller/C005.rst`` (mega-20241222): the
default publish template ``%sysname%/%tskname%/%valname%``, the last will
``%sysname%/LWT`` (Connected / Connection Lost), commands on ``%sysname%/cmd``; units as
the plugins document them (``docs/source/Plugin/P028.rst`` BME280: °C, %, hPa;
``P004.rst`` DS18b20: °C; P002 analog input: raw counts, no unit).
"""

from __future__ import annotations

from tests.devices.corpus import HOUSEKEEPING, Family, Msg, Truth

FAMILY = Family(
    "espeasy",
    (
        "https://github.com/letscontrolit/ESPEasy/blob/mega-20241222/docs/source/Controller/C005.rst",
        "https://github.com/letscontrolit/ESPEasy/blob/mega-20241222/docs/source/Plugin/P028.rst",
    ),
)


def messages(t: float) -> list[Msg]:
    """Two nodes: a BME280 and an analog soil probe, a DS18b20; last wills, a command."""
    values = [
        ("Garden", "BME280", "Temperature", "21.50", 21.5, "°C"),
        ("Garden", "BME280", "Humidity", "48.20", 48.2, "%"),
        ("Garden", "BME280", "Pressure", "1013.25", 1013.25, "hPa"),
        ("Garden", "Soil", "Analog", "512", 512, None),
        ("Garage", "DS18b20", "Temperature", "4.81", 4.81, "°C"),
    ]
    out = [
        Msg("ESP_Easy_Garden/LWT", b"Connected", HOUSEKEEPING),
        Msg("ESP_Easy_Garage/LWT", b"Connection Lost", HOUSEKEEPING),
    ]
    for node, task, name, text, value, unit in values:
        out.append(
            Msg(
                f"ESP_Easy_{node}/{task}/{name}",
                text.encode(),
                Truth(
                    f"ESP_Easy_{node}",
                    {f"{task}_{name}": value},
                    {f"{task}_{name}": unit} if unit else {},
                ),
            )
        )
    out.append(Msg("ESP_Easy_Garden/cmd", b"gpio,12,1", HOUSEKEEPING))
    return out
