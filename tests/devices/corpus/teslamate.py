"""TeslaMate (Tesla data logger): one plain value per topic under ``teslamate/cars/<id>/``.

Topics and units from teslamate-org/teslamate ``website/docs/integrations/mqtt.md``
(v1.32): battery_level %, inside_temp and outside_temp °C, odometer km, speed km/h,
power kW, est_battery_range_km km; display_name and since describe the car.
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, Family, Msg, Truth

FAMILY = Family(
    "teslamate",
    ("https://github.com/teslamate-org/teslamate/blob/v1.32.0/website/docs/integrations/mqtt.md",),
)
CAR = {
    "battery_level": ("%", 88),
    "inside_temp": ("°C", 21.5),
    "outside_temp": ("°C", 12.0),
    "odometer": ("km", 12345.67),
    "speed": ("km/h", 0),
    "power": ("kW", -11),
    "est_battery_range_km": ("km", 320.5),
    "charger_power": ("kW", 11),
}


def messages(t: float) -> list[Msg]:
    """Two cars."""
    out = []
    for car, state in (("1", "charging"), ("2", "asleep")):
        out += [
            Msg(f"teslamate/cars/{car}/display_name", f"Car {car}".encode(), DESCRIPTIVE),
            Msg(f"teslamate/cars/{car}/since", b"2026-11-29T08:55:01.123Z", DESCRIPTIVE),
            Msg(f"teslamate/cars/{car}/state", state.encode(), Truth(car, {"state": state})),
            Msg(f"teslamate/cars/{car}/healthy", b"true", Truth(car, {"healthy": True})),
        ]
        for name, (unit, value) in CAR.items():
            out.append(
                Msg(
                    f"teslamate/cars/{car}/{name}",
                    str(value).encode(),
                    Truth(car, {name: value}, {name: unit}),
                )
            )
    return out
