"""Victron Venus OS (GX devices, dbus-flashmq): one JSON value per topic,
``N/<portal id>/<service>/<instance>/<D-Bus path>`` with ``{"value": ...}``.

From victronenergy/dbus-flashmq ``README.md`` (commit 1687fb8): notifications on ``N/``,
write requests on ``W/`` (same payload), read requests and the keep-alive on ``R/``
(empty payload or keep-alive options), ``N/<id>/full_publish_completed`` after a full
publish, an empty payload when a device disappears; D-Bus paths and units from
victronenergy/venus wiki ``dbus`` (/Dc/0/Voltage V, /Dc/0/Current A, /Dc/0/Power W,
/Dc/0/Temperature °C, /Soc %, /Yield/Power W, /Pv/V V, /Ac/Consumption/L1/Power W).
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, HOUSEKEEPING, Family, Msg, Truth, js

FAMILY = Family(
    "victron",
    (
        "https://github.com/victronenergy/dbus-flashmq/blob/1687fb82463a2218c637eef60ff220e99118b888/README.md",
        "https://github.com/victronenergy/venus/wiki/dbus",
    ),
)
PORTAL = "c0619ab1a2b3"
VALUES = {
    "battery/512": {
        "Dc/0/Voltage": (53.12, "V"),
        "Dc/0/Current": (-4.2, "A"),
        "Dc/0/Power": (-223, "W"),
        "Dc/0/Temperature": (18.5, "°C"),
        "Soc": (87.5, "%"),
    },
    "solarcharger/279": {
        "Dc/0/Voltage": (54.1, "V"),
        "Yield/Power": (412, "W"),
        "Pv/V": (98.3, "V"),
    },
    "system/0": {"Ac/Consumption/L1/Power": (512, "W"), "Dc/Battery/Soc": (87.5, "%")},
}


def messages(t: float) -> list[Msg]:
    """A keep-alive and its full publish, a read request, a write request, a setting."""
    out = [
        Msg(f"R/{PORTAL}/keepalive", b"", HOUSEKEEPING),
        Msg(
            f"R/{PORTAL}/keepalive", js({"keepalive-options": ["suppress-republish"]}), HOUSEKEEPING
        ),
        Msg(f"R/{PORTAL}/battery/512/Soc", b"", HOUSEKEEPING),
    ]
    for device, paths in VALUES.items():
        service, instance = device.split("/")
        for path, (value, unit) in paths.items():
            name = path.replace("/", "_")
            out.append(
                Msg(
                    f"N/{PORTAL}/{device}/{path}",
                    js({"value": value}),
                    Truth(f"{PORTAL}-{service}-{instance}", {name: value}, {name: unit}),
                )
            )
    out += [
        Msg(
            f"N/{PORTAL}/settings/0/Settings/CGwacs/AcPowerSetPoint",
            js({"max": 1000000, "min": -1000000, "value": 50}),
            DESCRIPTIVE,
        ),
        Msg(f"N/{PORTAL}/pvinverter/20/Ac/L2/Power", js({"value": None}), DESCRIPTIVE),
        Msg(f"N/{PORTAL}/pvinverter/20/Ac/Power", b"", HOUSEKEEPING),
        Msg(
            f"W/{PORTAL}/settings/0/Settings/CGwacs/AcPowerSetPoint",
            js({"value": -200}),
            HOUSEKEEPING,
        ),
        Msg(f"N/{PORTAL}/full_publish_completed", js({"value": int(t)}), HOUSEKEEPING),
    ]
    return out
