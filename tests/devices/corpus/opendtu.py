"""OpenDTU (Hoymiles inverters): one plain value per topic under ``solar/``.

Topics and units from tbnobody/OpenDTU ``docs/MQTT_Topics.md`` (v24.11): ``dtu/*`` of the
DTU itself, ``[serial]/[channel]/[field]`` per inverter (channel 0 the AC side, 1..n the
DC strings), ``[serial]/status/*`` state, ``[serial]/cmd/*`` commands (W). The topics table gives
``dtu/rssi`` as a "db value"; the Home Assistant configs OpenDTU publishes for it
(``src/MqttHandleHass.cpp``) say dBm (signal_strength), and ``dtu/uptime`` s.
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, HOUSEKEEPING, Family, Msg, Truth

FAMILY = Family(
    "opendtu",
    (
        "https://github.com/tbnobody/OpenDTU/blob/v24.11.7/docs/MQTT_Topics.md",
        "https://github.com/tbnobody/OpenDTU/blob/v24.11.7/src/MqttHandleHass.cpp",
    ),
)
AC = {
    "power": ("W", 123.4),
    "voltage": ("V", 229.8),
    "current": ("A", 0.54),
    "frequency": ("Hz", 50.01),
    "temperature": ("°C", 31.2),
    "yieldtotal": ("kWh", 13.338),
    "yieldday": ("Wh", 216),
}
DC = {
    "power": ("W", 130.1),
    "voltage": ("V", 33.1),
    "current": ("A", 3.93),
    "irradiation": ("%", 32.5),
}


def messages(t: float) -> list[Msg]:
    """A DTU with two inverters, its status and a command."""
    out = [
        Msg("solar/dtu/status", b"online", HOUSEKEEPING),
        Msg("solar/dtu/ip", b"192.168.110.90", DESCRIPTIVE),
        Msg("solar/dtu/hostname", b"OpenDTU-07F614", DESCRIPTIVE),
        Msg("solar/dtu/rssi", b"-74", Truth("dtu", {"rssi": -74}, {"rssi": "dBm"})),
        Msg("solar/dtu/uptime", b"2125105", Truth("dtu", {"uptime": 2125105}, {"uptime": "s"})),
    ]
    for n, serial in enumerate(("114190641177", "114190641178")):
        out += [
            Msg(f"solar/{serial}/name", f"HM-800 {n}".encode(), DESCRIPTIVE),
            Msg(f"solar/{serial}/status/reachable", b"1", HOUSEKEEPING),
            Msg(f"solar/{serial}/status/producing", b"1", HOUSEKEEPING),
            Msg(f"solar/{serial}/status/last_update", str(int(t)).encode(), HOUSEKEEPING),
            Msg(f"solar/{serial}/status/limit_relative", b"75.00", HOUSEKEEPING),
        ]
        for channel, fields in (("0", AC), ("1", DC)):
            for name, (unit, value) in fields.items():
                v = value + n if isinstance(value, float) else value
                out.append(
                    Msg(
                        f"solar/{serial}/{channel}/{name}",
                        str(v).encode(),
                        Truth(serial, {f"{channel}_{name}": v}, {f"{channel}_{name}": unit}),
                    )
                )
        out.append(Msg(f"solar/{serial}/cmd/limit_persistent_relative", b"80", HOUSEKEEPING))
    return out
