"""Device identities that JSON payloads carry: gateways, radio receivers, bridges.

A gateway publishes the readings of many devices on one topic (rtl_433's
``rtl_433/<host>/events``: ``{"model": "Acurite-Tower", "id": 12345, "channel": "A",
...}``; OpenMQTTGateway's ``home/<gateway>/RTL_433toMQTT``) or on a topic per device with
the device's id in the payload too (``home/<gateway>/BTtoMQTT/<MAC>``: ``{"id":
"A4:C1:38:..", "model": "LYWSD03MMC", ...}``). The topic level there is not the device,
or not all of it: :func:`identity` finds the payload fields that name the device and
proposes ``sensor_id`` templates over them, most specific first, in rtl_433's device
path order (model, subtype, channel, id). Pure functions; used by :mod:`ingest.patterns`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import combinations

import orjson

QUALIFIERS = ("model", "subtype", "channel")
IDENTIFIERS = ("id", "device_id", "deviceid", "dev_id", "mac", "serial", "serial_number",
               "sn", "uid", "uuid", "eui", "dev_eui", "deveui", "address", "addr", "node_id",
               "nodeid")
# A MAC or EUI-64 names a device on its own; a small number (rtl_433's id) only with the
# model (and channel) beside it.
_GLOBAL = re.compile(r"^(?:[0-9A-Fa-f]{2}[:-]){5,7}[0-9A-Fa-f]{2}$|^[0-9A-Fa-f]{12,16}$")
MAX_TEMPLATES = 4
# rtl_433's field names end in their unit (docs/DATA_FORMAT.md: "<Type>_<Unit>",
# temperature_C, wind_avg_m_s, rain_rate_mm_h, pressure_hPa); humidity and moisture are %.
SUFFIX_UNITS = {"_C": "°C", "_F": "°F", "_V": "V", "_mV": "mV", "_deg": "°", "_m_s": "m/s",
                "_km_h": "km/h", "_mi_h": "mi/h", "_mm": "mm", "_in": "in", "_mm_h": "mm/h",
                "_in_h": "in/h", "_hPa": "hPa", "_kPa": "kPa", "_psi": "psi", "_lux": "lx",
                "_W": "W", "_kW": "kW", "_kWh": "kWh", "_A": "A", "_Hz": "Hz", "_dB": "dB",
                "_ppm": "ppm", "_ug_m3": "µg/m³", "_m": "m", "_cm": "cm", "_s": "s"}
PERCENT = frozenset({"humidity", "moisture"})


@dataclass
class Identity:
    """How the payloads of a pattern name their device."""

    templates: list[str]  # sensor_id templates, most specific first
    fields: list[str]  # the payload fields they use
    info: list[str] = field(default_factory=list)  # fields kept as descriptive info
    shared: list[str] = field(default_factory=list)  # topics that carry several devices
    example: str = ""  # one rendered sensor id


def _key(value: object) -> str | None:
    """A payload value as a template renders it: text as is, an integer in decimal."""
    if type(value) is str and 0 < len(value) <= 128:
        return value
    if type(value) is int:
        return str(value)
    return None


def _objects(payloads: list[bytes]) -> list[dict[str, object]]:
    out = []
    for payload in payloads:
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        out += [d for d in (doc if type(doc) is list else [doc]) if type(d) is dict]
    return out


def identity(by_topic: dict[str, list[bytes]], topic_devices: int) -> Identity | None:
    """The payload's device identity, if it names at least as many devices as the topics.

    ``topic_devices``: how many devices the topic level guessed as the device names.
    """
    docs = {topic: _objects(payloads) for topic, payloads in by_topic.items()}
    every = [d for ds in docs.values() for d in ds]
    if not every:
        return None
    names = {k.lower(): k for d in every for k in d}
    ident = next((names[k] for k in IDENTIFIERS if k in names
                  and sum(_key(d.get(names[k])) is not None for d in every) * 2 > len(every)),
                 None)
    if ident is None:
        return None
    quals = [names[q] for q in QUALIFIERS if q in names
             and any(_key(d.get(names[q])) is not None for d in every)]
    parts = [*quals, ident]
    tuples = [tuple(_key(d.get(p)) for p in parts) for d in every]
    if len(set(tuples)) < topic_devices:
        return None  # one value for several topic devices: not a device id
    shared = sorted(t for t, ds in docs.items()
                    if len({tuple(_key(d.get(p)) for p in parts) for d in ds}) > 1)
    model = names.get("model")
    if all(_GLOBAL.match(str(_key(d.get(ident)))) for d in every if _key(d.get(ident))):
        found = Identity([f"{{{ident}}}"], [ident], [model] if model else [], shared)
    else:
        found = Identity(_templates(parts, every), parts, [], shared)
    found.example = next((t for t in (_render(x, every[0]) for x in found.templates) if t), "")
    return found


def _templates(parts: list[str], docs: list[dict[str, object]]) -> list[str]:
    """``{model}-{channel}-{id}``, then without the parts some payloads lack."""
    optional = [p for p in parts if any(_key(d.get(p)) is None for d in docs)]
    out: list[str] = []
    for size in range(len(optional), -1, -1):
        for dropped in combinations(optional, len(optional) - size):
            kept = [p for p in parts if p not in dropped]
            if kept and len(out) < MAX_TEMPLATES:
                out.append("-".join(f"{{{p}}}" for p in kept))
    return out


def _render(template: str, doc: dict[str, object]) -> str | None:
    out = template
    for name in re.findall(r"\{([^}]+)\}", template):
        value = _key(doc.get(name))
        if value is None:
            return None
        out = out.replace(f"{{{name}}}", value)
    return out


def descriptive(by_topic: dict[str, list[bytes]], found: Identity) -> list[str]:
    """Text fields whose value never changes for a device (brand, type): info, not data."""
    seen: dict[str, dict[tuple[str | None, ...], list[object]]] = {}
    for payloads in by_topic.values():
        for doc in _objects(payloads):
            device = tuple(_key(doc.get(p)) for p in found.fields)
            for key, value in doc.items():
                if key not in found.fields and key not in found.info:
                    seen.setdefault(key, {}).setdefault(device, []).append(
                        value if type(value) is str else None)
    # Seen twice for some device (once proves nothing), the same text every time.
    return sorted(k for k, devices in seen.items()
                  if any(len(vs) > 1 for vs in devices.values())
                  and all(len(set(vs)) == 1 and None not in vs for vs in devices.values()))


def suffix_units(names: list[str]) -> dict[str, str]:
    """Units that rtl_433-style field names carry (``temperature_C``: °C)."""
    out = {}
    for name in names:
        if name in PERCENT:
            out[name] = "%"
            continue
        suffix = max((s for s in SUFFIX_UNITS if name.endswith(s) and len(name) > len(s)),
                     key=len, default=None)
        if suffix is not None:
            out[name] = SUFFIX_UNITS[suffix]
    return out
