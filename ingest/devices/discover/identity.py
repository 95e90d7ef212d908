"""Device identities that JSON payloads carry: gateways, radio receivers, bridges.

A gateway publishes the readings of many devices on one topic (rtl_433's
``rtl_433/<host>/events``: ``{"model": "Acurite-Tower", "id": 12345, "channel": "A",
...}``; OpenMQTTGateway's ``home/<gateway>/RTL_433toMQTT``) or on a topic per device with
the device's id in the payload too (``home/<gateway>/BTtoMQTT/<MAC>``: ``{"id":
"A4:C1:38:..", "model": "LYWSD03MMC", ...}``), or lists the devices it heard in one
message (``{"devices": [{"id": ..., "temp": ...}, ...]}``, Tasmota's ``{"ZbReceived":
{"0x2916": {...}}}``). The topic level there is not the device, or not all of it:
:func:`container` finds where a message lists its devices (the rule's ``each``), and
:func:`identity` the fields that name the device, proposing ``sensor_id`` templates over
them, most specific first, in rtl_433's device path order (model, subtype, channel, id).
Pure functions; used by :mod:`ingest.devices.discover.propose`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations

import orjson

from ingest.devices.formats.json import template_text, walk

QUALIFIERS = ("model", "subtype", "channel")
IDENTIFIERS = (
    "id",
    "device_id",
    "deviceid",
    "dev_id",
    "mac",
    "serial",
    "serial_number",
    "sn",
    "uid",
    "uuid",
    "eui",
    "dev_eui",
    "deveui",
    "address",
    "addr",
    "node_id",
    "nodeid",
    "from",  # Meshtastic: the sending node (``id`` there is the packet's)
    "src",
    "source",
    "node",
)
# A MAC or EUI-64 names a device on its own; a small number (rtl_433's id) only with the
# model (and channel) beside it.
_GLOBAL = re.compile(r"^(?:[0-9A-Fa-f]{2}[:-]){5,7}[0-9A-Fa-f]{2}$|^[0-9A-Fa-f]{12,16}$")
MAX_TEMPLATES = 4
# rtl_433's field names end in their unit (docs/DATA_FORMAT.md: "<Type>_<Unit>",
# temperature_C, wind_avg_m_s, rain_rate_mm_h, pressure_hPa); humidity and moisture are %.
SUFFIX_UNITS = {
    "_C": "°C",
    "_F": "°F",
    "_V": "V",
    "_mV": "mV",
    "_deg": "°",
    "_m_s": "m/s",
    "_km_h": "km/h",
    "_km": "km",
    "_mi_h": "mi/h",
    "_mm": "mm",
    "_in": "in",
    "_mm_h": "mm/h",
    "_in_h": "in/h",
    "_hPa": "hPa",
    "_kPa": "kPa",
    "_psi": "psi",
    "_lux": "lx",
    "_W": "W",
    "_kW": "kW",
    "_kWh": "kWh",
    "_A": "A",
    "_Hz": "Hz",
    "_dB": "dB",
    "_ppm": "ppm",
    "_ug_m3": "µg/m³",
    "_m": "m",
    "_cm": "cm",
    "_s": "s",
}
PERCENT = frozenset({"humidity", "moisture", "hum"})
# Member names of an object of objects that name devices: a Zigbee short address (0x2916),
# a MAC or EUI-64 (or a member field repeating the name: Tasmota's "Device").
_ADDRESS = re.compile(r"^0x[0-9A-Fa-f]{2,16}$")
_PATH_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a key a rule's each path can name
MAX_DEPTH = 3  # how deep in a payload a list of devices is looked for

type Member = tuple[str | None, dict[str, object]]  # ({_key} or None, the reading's object)


@dataclass
class Identity:
    """How the payloads of a pattern name their device."""

    templates: list[str]  # sensor_id templates, most specific first
    fields: list[str]  # the payload fields they use
    info: list[str] = field(default_factory=list)  # fields kept as descriptive info
    shared: list[str] = field(default_factory=list)  # topics that carry several devices
    example: str = ""  # one rendered sensor id


@dataclass
class Container:
    """Where a message lists its devices: one reading per element (the rule's ``each``)."""

    path: tuple[str, ...]  # (): the payload itself is an array of device objects
    keyed: bool = False  # an object of objects: each member's name is its device ({_key})
    echo: list[str] = field(default_factory=list)  # member fields repeating that name
    most: int = 0  # the most devices one message listed

    @property
    def each(self) -> str | None:
        """The rule's ``each`` path (None for a payload that is an array)."""
        return ".".join(self.path) or None


def _key(value: object) -> str | None:
    """A payload value as a template renders it, if it can be (part of) a sensor id."""
    text = template_text(value)
    return text if text is not None and 0 < len(text) <= 128 else None


def json_docs(payloads: list[bytes]) -> list[object]:
    """The payloads that are JSON, decoded (the others left out)."""
    out = []
    for payload in payloads:
        try:
            out.append(orjson.loads(payload))
        except orjson.JSONDecodeError:
            continue
    return out


def members(doc: object, path: tuple[str, ...] | None = None) -> list[Member]:
    """The objects of one payload that a rule with ``each = path`` makes readings of.

    The elements (or members, with their names) at ``path`` when it is there; else, as
    the json format does, the payload itself, or the elements of a payload array.
    """
    inner = walk(doc, path) if path else None
    if type(inner) is list:
        return [(None, d) for d in inner if type(d) is dict]
    if type(inner) is dict:
        return [(k, d) for k, d in inner.items() if type(d) is dict]
    return [(None, d) for d in (doc if type(doc) is list else [doc]) if type(d) is dict]


def _objects(payloads: list[bytes], path: tuple[str, ...] | None = None) -> list[Member]:
    return [m for doc in json_docs(payloads) for m in members(doc, path)]


def identity(
    by_topic: dict[str, list[bytes]], topic_devices: int, where: Container | None = None
) -> Identity | None:
    """The payload's device identity, if it names at least as many devices as the topics.

    ``topic_devices``: how many devices the topic level guessed as the device names;
    ``where``: the devices a message lists (:func:`container`), if it lists several.
    """
    path = where.path if where is not None else None
    listed = {topic: _objects(payloads, path) for topic, payloads in by_topic.items()}
    if where is not None and where.keyed:
        keys = {t: {k for k, _ in ms} for t, ms in listed.items()}
        first = next((k for ms in listed.values() for k, _ in ms if k), "")
        return Identity(
            ["{_key}"], [], [], sorted(t for t, ks in keys.items() if len(ks) > 1), first
        )
    docs = {topic: [d for _, d in ms] for topic, ms in listed.items()}
    every = [d for ds in docs.values() for d in ds]
    if not every:
        return None
    names = {k.lower(): k for d in every for k in d}
    candidates = [
        names[k]
        for k in IDENTIFIERS
        if k in names and sum(_key(d.get(names[k])) is not None for d in every) * 2 > len(every)
    ]
    if not candidates:
        return None
    # A device id repeats across messages while the measurements change; a field unique
    # to each message (a packet id) is no device id when another candidate repeats.
    repeating = [c for c in candidates if not _per_message(c, every)]
    ident = (repeating or candidates)[0]
    quals = [
        names[q]
        for q in QUALIFIERS
        if q in names and any(_key(d.get(names[q])) is not None for d in every)
    ]
    parts = [*quals, ident]
    tuples = [tuple(_key(d.get(p)) for p in parts) for d in every]
    if len(set(tuples)) < topic_devices:
        return None  # one value for several topic devices: not a device id
    shared = sorted(
        t for t, ds in docs.items() if len({tuple(_key(d.get(p)) for p in parts) for d in ds}) > 1
    )
    model = names.get("model")
    if all(_GLOBAL.match(str(_key(d.get(ident)))) for d in every if _key(d.get(ident))):
        found = Identity([f"{{{ident}}}"], [ident], [model] if model else [], shared)
    else:
        found = Identity(_templates(parts, every), parts, [], shared)
    found.example = next((t for t in (_render(x, every[0]) for x in found.templates) if t), "")
    return found


def _per_message(name: str, docs: list[dict[str, object]]) -> bool:
    """Whether a field takes a new value in (almost) every message: a packet or message id."""
    values = [_key(d.get(name)) for d in docs]
    present = [v for v in values if v is not None]
    return len(present) >= 3 and len(set(present)) >= 0.8 * len(present)


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


def container(by_topic: dict[str, list[bytes]], topic_devices: int = 1) -> Container | None:
    """Where the payloads list several devices, if they do.

    A payload that is an array of objects, else the array of objects (or object of
    objects) found in most payloads, within :data:`MAX_DEPTH` levels, whose elements
    name a device and carry a number or a boolean to store: an element field such as
    ``id`` (:func:`identity`; at least as many devices as ``topic_devices``, the topic
    level's values: an alarm list's ids 1, 2 under every machine name no device), or for
    an object of objects member names that are addresses (``0x2916``, a MAC) or that a
    member field repeats.
    """
    docs = [d for ds in (json_docs(p) for p in by_topic.values()) for d in ds]
    found: Counter[tuple[tuple[str, ...], bool]] = Counter()
    if any(type(d) is list for d in docs):
        found[(), False] = len(docs)
    for doc in docs:
        if type(doc) is dict:
            _candidates(doc, (), found)
    for (path, keyed), _ in sorted(found.items(), key=lambda c: (-c[1], len(c[0][0]), c[0])):
        where = Container(path, keyed)
        listed = [members(doc, path) for doc in docs]
        objects = [m for ms in listed for m in ms]
        where.most = max(len(ms) for ms in listed)
        if keyed:
            where.echo = _echo(objects)
            named = set(where.echo)
            if not all(
                _ADDRESS.match(k or "") or _GLOBAL.match(k or "") or any(v == k for v in d.values())
                for k, d in objects
            ):
                continue
        else:
            ident = identity(by_topic, topic_devices, where)
            if ident is None:
                continue
            named = set(ident.fields)
        if any(
            type(v) in {int, float, bool}
            for _, d in objects
            for f, v in d.items()
            if f not in named
        ):
            return where
    return None


def _candidates(
    obj: dict[str, object], path: tuple[str, ...], found: Counter[tuple[tuple[str, ...], bool]]
) -> None:
    """Paths to arrays of objects and objects of objects in ``obj``, counted."""
    for key, value in obj.items():
        if not _PATH_KEY.match(key):
            continue
        here = (*path, key)
        if type(value) is list and value and all(type(v) is dict for v in value):
            found[here, False] += 1
        elif type(value) is dict and value and all(type(v) is dict for v in value.values()):
            found[here, True] += 1
        elif type(value) is dict and len(here) < MAX_DEPTH:
            _candidates(value, here, found)


def _echo(objects: list[Member]) -> list[str]:
    """Member fields whose value is the member's name wherever they appear."""
    seen: dict[str, bool] = {}
    for name, doc in objects:
        for key, value in doc.items():
            seen[key] = seen.get(key, True) and value == name
    return sorted(k for k, same in seen.items() if same)


def descriptive(
    by_topic: dict[str, list[bytes]], found: Identity, where: Container | None = None
) -> list[str]:
    """Text fields whose value never changes for a device (brand, type): info, not data."""
    seen: dict[str, dict[tuple[str | None, ...], list[object]]] = {}
    skip = {*found.fields, *found.info, *(where.echo if where else ())}
    for payloads in by_topic.values():
        for name, doc in _objects(payloads, where.path if where else None):
            device = (name, *(_key(doc.get(p)) for p in found.fields))
            for key, value in doc.items():
                if key not in skip:
                    seen.setdefault(key, {}).setdefault(device, []).append(
                        value if type(value) is str else None
                    )
    # Seen twice for some device (once proves nothing), the same text every time.
    return sorted(
        k
        for k, devices in seen.items()
        if any(len(vs) > 1 for vs in devices.values())
        and all(len(set(vs)) == 1 and None not in vs for vs in devices.values())
    )


def suffix_units(names: list[str]) -> dict[str, str]:
    """Units that rtl_433-style field names carry (``temperature_C``: °C)."""
    out = {}
    for name in names:
        if name.lower() in PERCENT:
            out[name] = "%"
            continue
        suffix = max(
            (s for s in SUFFIX_UNITS if name.endswith(s) and len(name) > len(s)),
            key=len,
            default=None,
        )
        if suffix is not None:
            out[name] = SUFFIX_UNITS[suffix]
    return out
