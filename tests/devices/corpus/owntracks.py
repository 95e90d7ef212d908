"""OwnTracks (location tracker app): JSON with a ``_type`` on ``owntracks/<user>/<device>``.

From owntracks/booklet ``docs/tech/json.md`` (owntracks.org/booklet/tech/json): the
device publishes ``_type=location`` and its last will ``_type=lwt`` on
``owntracks/user/device``, ``cmd`` on ``.../cmd``, ``status`` on ``.../status``,
``waypoints`` on ``.../waypoints``, cards on ``.../info``; ``tst`` is the time (epoch
seconds); units: acc, alt and vac m, vel km/h, batt %, cog °.
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, HOUSEKEEPING, Family, Msg, Truth, js

FAMILY = Family(
    "owntracks",
    ("https://github.com/owntracks/booklet/blob/master/docs/tech/json.md",),
)
UNITS = {"acc": "m", "alt": "m", "vac": "m", "vel": "km/h", "batt": "%", "cog": "°"}


def messages(t: float) -> list[Msg]:
    """Two phones: locations, last wills, commands, status, waypoints, a card."""
    out = []
    for n, (user, device, tid) in enumerate((("jane", "phone", "jp"), ("bob", "tablet", "bt"))):
        base = f"owntracks/{user}/{device}"
        out.append(Msg(base, js({"_type": "lwt", "tst": int(t) - 600 + n}), HOUSEKEEPING))
        for k in range(2):
            tst = int(t) - 120 + 60 * k + n
            values = {
                "lat": 52.5163 + k / 1000,
                "lon": 13.3777 + n / 100,
                "acc": 12 + k,
                "alt": 34,
                "vac": 3,
                "vel": 4 * k,
                "cog": 270,
                "batt": 87 - k,
                "bs": 1,
                "conn": "w",
                "m": 1,
            }
            doc = {"_type": "location", "tid": tid, "tst": tst, "t": "u", **values}
            out.append(
                Msg(base, js(doc), Truth(f"{user}-{device}", values, dict(UNITS), float(tst)))
            )
        out += [
            Msg(f"{base}/cmd", js({"_type": "cmd", "action": "reportLocation"}), HOUSEKEEPING),
            Msg(
                f"{base}/status",
                js(
                    {
                        "_type": "status",
                        "android": {"hib": 1, "bo": 1, "loc": 0, "ps": 0, "wifi": 1},
                    }
                ),
                HOUSEKEEPING,
            ),
            Msg(
                f"{base}/waypoints",
                js(
                    {
                        "_type": "waypoints",
                        "waypoints": [
                            {
                                "_type": "waypoint",
                                "desc": "Home",
                                "lat": 52.5,
                                "lon": 13.4,
                                "rad": 50,
                                "tst": int(t) - 86400,
                            }
                        ],
                    }
                ),
                HOUSEKEEPING,
            ),
            Msg(
                f"{base}/info", js({"_type": "card", "name": user.title(), "tid": tid}), DESCRIPTIVE
            ),
        ]
    return out
