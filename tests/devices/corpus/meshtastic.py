"""Meshtastic (LoRa mesh): JSON packets a gateway node uplinks, on
``msh/<region>/2/json/<channel>/<gateway id>``.

From meshtastic/firmware ``src/mqtt/MQTT.cpp`` (v2.5.20: ``meshPacketToJson``, the
status topic ``/2/stat/`` with online/offline, the encrypted ``/2/e/`` envelopes) and
meshtastic.org/docs/software/integrations/mqtt: ``from`` is the sending node, ``id`` the
packet id (unique per packet; the same packet heard by two gateways has the same id),
``sender`` the gateway, ``type`` telemetry, position, nodeinfo or text. Units from
``protobufs/meshtastic/telemetry.proto``: voltage V, battery_level, channel_utilization
and air_util_tx %, uptime_seconds s, temperature °C, relative_humidity %,
barometric_pressure hPa; ``mesh.proto`` Position: altitude m, latitude_i 1e-7 degrees.
"""

from __future__ import annotations

from tests.devices.corpus import HOUSEKEEPING, Family, Msg, Truth, js

FAMILY = Family(
    "meshtastic",
    (
        "https://github.com/meshtastic/firmware/blob/v2.5.20.4c97351/src/mqtt/MQTT.cpp",
        "https://github.com/meshtastic/protobufs/blob/v2.5.20/meshtastic/telemetry.proto",
        "https://meshtastic.org/docs/software/integrations/mqtt/",
    ),
)
DEVICE = {
    "voltage": "V",
    "battery_level": "%",
    "channel_utilization": "%",
    "air_util_tx": "%",
    "uptime_seconds": "s",
}
ENVIRONMENT = {"temperature": "°C", "relative_humidity": "%", "barometric_pressure": "hPa"}


def _packet(
    kind: str, node: int, pid: int, gw: str, ts: int, payload: dict[str, object], rssi: int = -98
) -> bytes:
    return js(
        {
            "channel": 0,
            "from": node,
            "hop_start": 3,
            "hops_away": 0,
            "id": pid,
            "payload": payload,
            "rssi": rssi,
            "sender": gw,
            "snr": 6.25,
            "timestamp": ts,
            "to": 4294967295,
            "type": kind,
        }
    )


def messages(t: float) -> list[Msg]:
    """Two nodes heard by two gateways: telemetry, positions, node info, a text."""
    out = [Msg("msh/EU_868/2/stat/!a1b2c3d4", b"online", HOUSEKEEPING)]
    gw1, gw2 = "!a1b2c3d4", "!c0ffee00"
    topic = "msh/EU_868/2/json/LongFast/"
    pid = 1781265290
    for n, node in enumerate((2130636288, 3735928559)):
        ts = int(t) - 300 + 10 * n
        device: dict[str, object] = {
            "voltage": 4.05 - n / 10,
            "battery_level": 87 - n,
            "channel_utilization": 5.9,
            "air_util_tx": 0.32,
            "uptime_seconds": 3600 + n,
        }
        env: dict[str, object] = {
            "temperature": 21.3 + n,
            "relative_humidity": 48.5,
            "barometric_pressure": 1013.2,
        }
        position: dict[str, object] = {
            "altitude": 42,
            "latitude_i": 525163000 + n,
            "longitude_i": 133777000,
            "precision_bits": 13,
        }
        node_id = f"!{node:08x}"
        out += [
            Msg(
                topic + gw1,
                _packet("telemetry", node, pid + 10 * n, gw1, ts, device),
                Truth(str(node), device, dict(DEVICE), float(ts)),
            ),
            # the same packet heard by a second gateway: no second reading
            Msg(
                topic + gw2,
                _packet("telemetry", node, pid + 10 * n, gw2, ts, device, -110),
                Truth(str(node), device, dict(DEVICE), float(ts)),
            ),
            Msg(
                topic + gw1,
                _packet("telemetry", node, pid + 10 * n + 1, gw1, ts + 1, env),
                Truth(str(node), env, dict(ENVIRONMENT), float(ts + 1)),
            ),
            Msg(
                topic + gw1,
                _packet(
                    "position", node, pid + 10 * n + 2, gw1, ts + 2, {**position, "time": ts + 2}
                ),
                Truth(str(node), position, {"altitude": "m"}, float(ts + 2)),
            ),
            Msg(
                topic + gw1,
                _packet(
                    "nodeinfo",
                    node,
                    pid + 10 * n + 3,
                    gw1,
                    ts + 3,
                    {
                        "hardware": 43,
                        "id": node_id,
                        "longname": f"Node {n}",
                        "shortname": f"N{n}",
                        "role": 0,
                    },
                ),
                HOUSEKEEPING,
            ),
        ]
    out += [
        Msg(
            topic + gw1,
            _packet("text", 2130636288, pid + 99, gw1, int(t) - 5, {"text": "hello mesh"}),
            HOUSEKEEPING,
        ),
        # the encrypted ServiceEnvelope of the same packets (protobuf): no JSON reading
        Msg(
            "msh/EU_868/2/e/LongFast/" + gw1,
            b"\n\x1d\r\x00\xee\xfe\x7f\x15\xff\xff\xff\xff"
            b'"\x02\x08C5\x8a\x1a+j=\x00\x00\x00\x00H\x03X\x03\x12\x08LongFast\x1a\t!a1b2c3d4',
            HOUSEKEEPING,
        ),
    ]
    return out
