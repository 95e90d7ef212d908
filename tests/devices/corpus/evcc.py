"""evcc (EV charging controller): one plain value per topic under ``evcc/``.

Topics from evcc-io/evcc ``server/mqtt.go`` (0.131): the site's values under ``site/``,
each loadpoint's under ``loadpoints/<n>/``, ``<topic>/set`` to write, ``status`` the
last will (online/offline), ``updated`` the time of the last publish; units as the API
documents them (docs.evcc.io/docs/integrations/rest-api: power W, energy Wh, soc %).
"""

from __future__ import annotations

from tests.devices.corpus import HOUSEKEEPING, Family, Msg, Truth

FAMILY = Family(
    "evcc",
    (
        "https://github.com/evcc-io/evcc/blob/0.131.0/server/mqtt.go",
        "https://docs.evcc.io/docs/integrations/rest-api",
    ),
)
SITE = {
    "pvPower": ("W", 4321.5),
    "gridPower": ("W", -1200),
    "homePower": ("W", 980),
    "batteryPower": ("W", 250),
    "batterySoc": ("%", 67),
}
LOADPOINT = {
    "chargePower": ("W", 11000),
    "chargedEnergy": ("Wh", 3500),
    "vehicleSoc": ("%", 54),
    "chargeCurrent": ("A", 16),
}


def messages(t: float) -> list[Msg]:
    """The site, two loadpoints, the last will, the heartbeat and a command."""
    out = [
        Msg("evcc/status", b"online", HOUSEKEEPING),
        Msg("evcc/updated", str(int(t)).encode(), HOUSEKEEPING),
    ]
    for name, (unit, value) in SITE.items():
        out.append(
            Msg(
                f"evcc/site/{name}", str(value).encode(), Truth("site", {name: value}, {name: unit})
            )
        )
    for lp in ("1", "2"):
        for name, (unit, value) in LOADPOINT.items():
            out.append(
                Msg(
                    f"evcc/loadpoints/{lp}/{name}",
                    str(value).encode(),
                    Truth(f"loadpoint-{lp}", {name: value}, {name: unit}),
                )
            )
        out.append(
            Msg(f"evcc/loadpoints/{lp}/mode", b"pv", Truth(f"loadpoint-{lp}", {"mode": "pv"}))
        )
    out.append(Msg("evcc/loadpoints/1/mode/set", b"now", HOUSEKEEPING))
    return out
