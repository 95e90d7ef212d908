"""Z-Wave JS UI (Z-Wave gateway): one JSON time-value per topic, ``{"time": ms, "value": x}``.

Added after discover's rules were written, as a check that they generalise. It found one
gap, closed for every family: a one-value payload whose value is a clock time beside its
own time (``lastActive``) was stored; now it is housekeeping, as ``{"value": <time>}``
was. From zwave-js/zwave-js-ui ``docs/usage/setup.md`` (gateway
type "Named Topics": ``<prefix>/<location>/<node_name>/<class_name>/<property>``,
payload "JSON Time-Value") and ``docs/guide/mqtt.md`` (the node's ``status``,
``lastActive`` and ``nodeinfo`` topics; the gateway's ``_CLIENTS/ZWAVE_GATEWAY-<name>/
status`` and ``version``; writes to ``<value topic>/set``; API calls to
``_CLIENTS/ZWAVE_GATEWAY-<name>/api/<api>/set``); class names from ``api/lib/
Constants.ts`` (sensor_multilevel, battery, switch_binary). Units as zwave-js gives them
(Multilevel Sensor: Air temperature °C, Humidity %, Power W; Battery level %).
"""

from __future__ import annotations

from tests.devices.corpus import DESCRIPTIVE, HOUSEKEEPING, Family, Msg, Truth, js

FAMILY = Family(
    "zwavejsui",
    (
        "https://github.com/zwave-js/zwave-js-ui/blob/master/docs/usage/setup.md",
        "https://github.com/zwave-js/zwave-js-ui/blob/master/docs/guide/mqtt.md",
        "https://github.com/zwave-js/zwave-js-ui/blob/master/api/lib/Constants.ts",
    ),
)
NODES: dict[tuple[str, str], dict[tuple[str, str], tuple[float | bool, str | None]]] = {
    # (location, node name): {(class, property): (value, unit)}
    ("Kitchen", "Multisensor"): {
        ("sensor_multilevel", "Air_temperature"): (21.3, "°C"),
        ("sensor_multilevel", "Humidity"): (48, "%"),
        ("battery", "level"): (90, "%"),
    },
    ("Garage", "Plug"): {
        ("switch_binary", "currentValue"): (True, None),
        ("sensor_multilevel", "Power"): (45.6, "W"),
    },
}
GATEWAY = "zwave/_CLIENTS/ZWAVE_GATEWAY-zui"


def messages(t: float) -> list[Msg]:
    """Two nodes' values, their status and details, the gateway's, a write and an API call."""
    ms = int(t * 1000) - 60_000
    out = [
        Msg(f"{GATEWAY}/status", js({"time": ms, "value": True}), HOUSEKEEPING),
        Msg(f"{GATEWAY}/version", js({"time": ms, "value": "9.27.0"}), DESCRIPTIVE),
    ]
    for n, ((location, name), values) in enumerate(NODES.items()):
        base = f"zwave/{location}/{name}"
        out += [
            Msg(
                f"{base}/status",
                js({"time": ms, "value": True, "status": "Alive", "nodeId": n + 2}),
                HOUSEKEEPING,
            ),
            Msg(f"{base}/lastActive", js({"time": ms, "value": ms - 5000}), HOUSEKEEPING),
            Msg(
                f"{base}/nodeinfo",
                js({"id": n + 2, "name": name, "loc": location, "ready": True}),
                DESCRIPTIVE,
            ),
        ]
        for k in range(2):
            at = ms + 1000 * (10 * n + k)
            for (cls, prop), (value, unit) in values.items():
                v = value + k if type(value) in {int, float} and prop != "level" else value
                out.append(
                    Msg(
                        f"{base}/{cls}/{prop}",
                        js({"time": at, "value": v}),
                        Truth(name, {prop: v}, {prop: unit} if unit else {}, at / 1000),
                    )
                )
    out += [
        Msg("zwave/Garage/Plug/switch_binary/targetValue/set", js({"value": False}), HOUSEKEEPING),
        Msg(f"{GATEWAY}/api/getNodes/set", js({"args": []}), HOUSEKEEPING),
    ]
    return out
