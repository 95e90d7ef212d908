"""WLED (LED controllers): plain values under the device topic ``wled/<name>``.

From Aircoookie/WLED ``wled00/mqtt.cpp`` (v0.15.0) and kno.wled.ge/interfaces/mqtt:
publishes ``<dt>/g`` (brightness 0-255), ``<dt>/c`` (colour, hex), ``<dt>/v`` (the XML
API's state) and the last will ``<dt>/status`` (online/offline); listens on ``<dt>``
(on/off/brightness), ``<dt>/col``, ``<dt>/api`` and the group topic ``wled/all``.
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, HOUSEKEEPING, Family, Msg, Truth

FAMILY = Family(
    "wled",
    (
        "https://github.com/Aircoookie/WLED/blob/v0.15.0/wled00/mqtt.cpp",
        "https://kno.wled.ge/interfaces/mqtt/",
    ),
)


def messages(t: float) -> list[Msg]:
    """Two controllers, their last wills, XML state and commands to them."""
    out = []
    for dt, g, c in (("kitchen", 128, "#FFA000"), ("porch", 255, "#0000FF")):
        out += [
            Msg(f"wled/{dt}/status", b"online", HOUSEKEEPING),
            Msg(f"wled/{dt}/g", str(g).encode(), Truth(dt, {"g": g})),
            Msg(f"wled/{dt}/c", c.encode(), Truth(dt, {"c": c})),
            Msg(
                f"wled/{dt}/v",
                f'<?xml version="1.0" ?><vs><ac>{g}</ac><cl>255</cl><cl>160</cl><cl>0</cl>'
                f"<ns>0</ns><nr>1</nr><nl>0</nl><nf>1</nf><fx>0</fx><sx>128</sx><ix>128</ix>"
                f"<ds>WLED-{dt}</ds></vs>".encode(),
                DESCRIPTIVE,
            ),
        ]
    out += [
        Msg("wled/kitchen/api", b"FX=2&SX=200", HOUSEKEEPING),
        Msg("wled/porch/col", b"#FF0000", HOUSEKEEPING),
        Msg("wled/all", b"ON", HOUSEKEEPING),
    ]
    return out
