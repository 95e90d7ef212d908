"""What a captured stream looks like: payload formats and topic patterns.

Pure functions over captured ``(topic, payload)`` messages, used by ``ingest discover``:
:func:`payload_kind` names a payload's format; :func:`topic_patterns` makes a group of
topics (:mod:`ingest.devices.discover.grouping`) a pattern (the level that varies most is
the device; levels after it name the measurement of a plain value). The words that mark
housekeeping are here, its rules in :mod:`ingest.devices.discover.chores`.
:mod:`ingest.devices.discover.propose` completes the patterns with what conventions and
payloads say, :mod:`ingest.devices.discover.proposal` writes them as rules, and
:mod:`ingest.devices.discover.command` checks them through the real mapping engine.
Nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase

import orjson

from ingest.devices.decode import Limits, decode
from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.identity import members as reading_objects

# Last topic levels that carry status, commands or metadata rather than readings.
HOUSEKEEPING = frozenset(
    {
        "availability",
        "lwt",
        "will",
        "online",
        "offline",
        "announce",
        "debug",
        "log",
        "logging",
        "config",
        "set",
        "get",
        "command",
        "cmnd",
        "info",
        "connected",
        "birth",
        "heartbeat",
        "status",
        "cmd",
        "keepalive",
        "request",
        "unit",
        "units",
        "uom",
    }
)
# Levels that mark everything under them as housekeeping, wherever they stand after the
# first (OpenDTU's ``solar/<serial>/status/reachable``, ``.../cmd/limit``).
HOUSEKEEPING_LEVELS = frozenset(
    {"status", "cmd", "cmnd", "command", "lwt", "availability", "heartbeat", "keepalive"}
)
# First levels of a request/write mirror of a notification tree (Victron's dbus-flashmq:
# ``N/<portal>/...`` notifications, ``R/`` read requests and keep-alives, ``W/`` writes).
MIRRORS = {"R": "N", "W": "N"}
# Levels that name a kind of message, never a device.
KIND_WORDS = frozenset(
    {
        "sensor",
        "sensors",
        "tele",
        "stat",
        "state",
        "status",
        "data",
        "telemetry",
        "readings",
        "events",
        "event",
        "up",
        "json",
        "value",
        "values",
        "measurements",
        "metrics",
        "devices",
        "device",
        "relay",
        "switch",
        "light",
        "cover",
        "binary_sensor",
        "text_sensor",
    }
)
# Whole payloads that report a connection rather than a reading.
STATUS_WORDS = frozenset(
    {"online", "offline", "connected", "disconnected", "alive", "dead", "ready", "lost"}
)
SENML_KEYS = frozenset(
    {"bn", "bt", "bu", "bv", "bver", "n", "u", "v", "vs", "vb", "vd", "s", "t", "ut"}
)
# Fields beside "value" that keep a payload one value: its time, unit, range, quality.
EXTRAS = frozenset(
    {"time", "ts", "timestamp", "t", "unit", "units", "min", "max", "quality", "q", "valid"}
)
# Last levels that say "this is the value" rather than what is measured.
GENERIC_LAST = frozenset({"state", "value", "status", "data", "get", "current"})
MAX_JSON_PATTERNS = 5  # distinct values of a non-device level kept as separate rules
SAMPLES = 20  # payloads kept per topic for the analysis
_LINE = re.compile(r"^[^\s,#][^\s,]*(,[^\s=]+=[^\s,]+)* [^\s=]+=[^\s]+( -?\d+)?$")
_NAME = re.compile(r"[^A-Za-z0-9_-]+")
VARIABLE = re.compile(r"\{([^{}]+)\}")


@dataclass
class Captured:
    """One message as the broker delivered it."""

    topic: str
    payload: bytes
    retained: bool = False


@dataclass
class Pattern:
    """Topics of one shape, with what their payloads have in common."""

    levels: list[str]  # literal, "{capture}" or "+"
    kind: str
    topics: set[str] = field(default_factory=set)
    payloads: dict[str, list[bytes]] = field(default_factory=dict)  # the first, by topic
    measurement: str | None = None  # value format: the measurement template
    notes: list[str] = field(default_factory=list)
    sensor_id: list[str] = field(default_factory=list)  # templates; none: the capture
    units: dict[str, str] = field(default_factory=dict)  # stored measurement -> unit
    values: dict[str, bool] = field(default_factory=dict)  # payload text -> boolean
    tags: dict[str, str] = field(default_factory=dict)
    info: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    each: str | None = None  # json: the path of the devices a message lists
    # [rule.match]: payload field -> the values it takes in the messages the rule takes
    match: dict[str, list[str]] = field(default_factory=dict)
    keep: list[str] = field(default_factory=list)  # json: the only fields stored
    # An ignore rule listing several topic filters: one pattern per filter, with its
    # topics and notes (``levels`` and ``topics`` are then the first's and all of them).
    filters: list[Pattern] = field(default_factory=list)

    @property
    def samples(self) -> list[bytes]:
        """The kept payloads of every topic."""
        return [p for topic in sorted(self.topics) for p in self.payloads.get(topic, [])]

    def captures(self, topic: str) -> dict[str, str]:
        """The values the pattern's captures take in ``topic``.

        A last ``{name#}`` takes the rest of the levels, joined with ``_``.
        """
        parts = topic.split("/")
        out = {
            lv[1:-1]: part
            for lv, part in zip(self.levels, parts, strict=False)
            if lv.startswith("{") and not lv.endswith("#}")
        }
        if self.levels and self.levels[-1].endswith("#}"):
            out[self.levels[-1][1:-2]] = "_".join(parts[len(self.levels) - 1 :])
        return out

    def narrowed(self, index: int, value: str, topics: set[str]) -> Pattern:
        """A copy for ``topics`` only, with level ``index`` fixed to ``value``."""
        name = self.levels[index]

        def fill(text: str) -> str:
            return text.replace(name, value) if name.startswith("{") else text

        levels = [*self.levels]
        levels[index] = value
        sensor_id = [fill(t) for t in self.sensor_id]
        if name == "{sensor_id}" and not sensor_id:
            sensor_id = [value]
        measurement = fill(self.measurement) if self.measurement else None
        tags = {k: fill(v) for k, v in self.tags.items()}
        if name[1:-1] in self.info:  # a capture kept as info stays info, as a fixed tag
            tags[name[1:-1]] = value.replace("{", "{{").replace("}", "}}")
        units = self.units
        if measurement is not None:  # the units of the measurements it can still store
            glob = VARIABLE.sub("*", measurement)
            units = {m: u for m, u in units.items() if fnmatchcase(m, glob)}
        return Pattern(
            levels,
            self.kind,
            set(topics),
            {t: self.payloads[t] for t in topics if t in self.payloads},
            measurement,
            [*self.notes],
            sensor_id,
            dict(units),
            dict(self.values),
            tags,
            [*self.info],
            [*self.drop],
            self.each,
            {k: [*v] for k, v in self.match.items()},
            [*self.keep],
        )


def payload_kind(topic: str, payload: bytes) -> str:
    """The payload's format: ingest, senml, json, influx, value, binary or empty."""
    if not payload.strip():
        return "empty"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return "binary"
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return "influx" if lines and all(_LINE.match(line) for line in lines) else "value"
    return _json_kind(topic, payload, doc)


def _json_kind(topic: str, payload: bytes, doc: object) -> str:
    objects = type(doc) is dict or (
        type(doc) is list and bool(doc) and all(type(r) is dict for r in doc)
    )
    if not objects:
        return "value"
    if type(doc) is list and _senml(doc):
        return "senml"
    decoded = decode(topic, payload, epoch_now(), Limits())
    return "ingest" if decoded.readings and not decoded.rejections else "json"


def _senml(records: list[dict[str, object]]) -> bool:
    keys = set().union(*records)
    return (
        keys <= SENML_KEYS
        and bool(keys & {"n", "bn"})
        and bool(keys & {"v", "vs", "vb", "vd", "s"})
    )


def epoch_now() -> float:
    """The time now, as an epoch."""
    return datetime.now().timestamp()  # noqa: DTZ005 - an epoch, no zone involved


def device_score(level: str, position: int) -> int:
    """How much a constant topic level looks like a device id (higher: more)."""
    if position == 0:
        return -3
    lowered = level.lower()
    if lowered in KIND_WORDS or lowered in HOUSEKEEPING:
        return -3
    score = 0
    if any(c.isdigit() for c in level):
        score += 2
    if level.isdigit() and len(level) <= 2:
        score -= 3  # a channel number
    if "-" in level or " " in level or level[:2] == "0x":
        score += 1
    return score


def literal(level: str) -> str:
    """A topic's level as a rule's filter can hold it.

    One with a brace (a capture in a filter) or a wildcard character becomes ``+``.
    """
    return "+" if any(c in level for c in "{}+#") else level


def order(pattern: Pattern) -> tuple[int, bool, list[str]]:
    """Sort key: more literal levels first, a filter ending in ``#`` after the others.

    A general rule must not shadow a specific one.
    """
    levels = pattern.levels
    return -sum(not variable(x) for x in levels), levels[-1] == "#", levels


def variable(level: str) -> bool:
    """A filter level that is no literal: ``+``, ``#`` or a capture."""
    return level in {"+", "#"} or level.startswith("{")


def topic_patterns(topics: list[str], kind: str, device: int = -1) -> list[Pattern]:
    """The pattern (or, split by a level of few values, patterns) of one group of topics."""
    rows = [t.split("/") for t in topics]
    depth = len(rows[0])
    values = [sorted({row[i] for row in rows}) for i in range(depth)]
    plain = kind == "value"
    last_is_measurement = plain and depth > 1
    span = depth - 1 if last_is_measurement else depth
    if not 0 <= device < span:  # not a Homie device
        device = _device_level(values[:span])
    part = _device_part(rows, values, device) if not plain else -1
    levels = [_level(i, values, device, part, plain) for i in range(depth)]
    if "*" in levels:
        return _split(levels, rows, kind)
    if kind == "binary":
        levels = [literal(vs[0]) if len(vs) == 1 else "+" for vs in values]
        return [Pattern(levels, kind, set(topics))]
    pattern = Pattern(levels, kind, set(topics))
    _describe(pattern, device, values)
    if part >= 0:
        pattern.sensor_id = [f"{{sensor_id}}-{{level{part + 1}}}"]
        pattern.notes = [n for n in pattern.notes if not n.startswith("one device seen")]
        pattern.notes.append(
            f"levels {device + 1} and {part + 1} vary together, one value of each per "
            f"device (e.g. {values[device][0]!r} with "
            f"{next(r[part] for r in rows if r[device] == values[device][0])!r}): "
            "together they name the device"
        )
    return [pattern]


def _level(i: int, values: list[list[str]], device: int, part: int, plain: bool) -> str:
    """Level ``i`` of a pattern's filter: device, capture, literal, ``*`` (a split) or ``+``."""
    last_is_measurement = plain and len(values) > 1
    if i == device:
        return "{sensor_id}"
    if i == part:
        return f"{{level{i + 1}}}"
    if last_is_measurement and i == len(values) - 1:
        return "{measurement}" if len(values[i]) > 1 else literal(values[i][0])
    if len(values[i]) == 1:
        return literal(values[i][0])
    if plain or i < device:
        return f"{{level{i + 1}}}"
    return "*" if len(values[i]) <= MAX_JSON_PATTERNS else "+"


def _device_part(rows: list[list[str]], values: list[list[str]], device: int) -> int:
    """A later level that names the device with the device level (OwnTracks' user/device).

    It varies, is no kind or housekeeping word, and its values pair one to one with the
    device level's: a second part of the name, not a kind of message.
    """
    if device < 0 or len(values[device]) < 2:
        return -1
    for i in range(device + 1, len(values)):
        if len(values[i]) < 2 or any(
            v.lower() in KIND_WORDS or v.lower() in HOUSEKEEPING for v in values[i]
        ):
            continue
        pairs = {(row[device], row[i]) for row in rows}
        if len(pairs) == len(values[device]) == len(values[i]):
            return i
    return -1


def _device_level(values: list[list[str]]) -> int:
    """The position of the device id: the level that varies most, else the likeliest."""
    best, best_count = -1, 1
    for i, distinct in enumerate(values):
        if len(distinct) > best_count and device_score(distinct[0], i) > -3:
            best, best_count = i, len(distinct)
    if best >= 0:
        return best
    scores = [(device_score(v[0], i), i) for i, v in enumerate(values)]
    top = max(scores)  # the deepest of the likeliest
    if top[0] > -3:
        return top[1]
    return len(values) - 1  # no better guess: the deepest level before the measurement


def _split(levels: list[str], rows: list[list[str]], kind: str) -> list[Pattern]:
    out: dict[tuple[str, ...], Pattern] = {}
    for row in rows:
        shape = tuple(literal(row[i]) if lv == "*" else lv for i, lv in enumerate(levels))
        out.setdefault(shape, Pattern(list(shape), kind)).topics.add("/".join(row))
    for pattern in out.values():
        device = pattern.levels.index("{sensor_id}")
        values = [
            sorted({t.split("/")[i] for t in pattern.topics}) for i in range(len(pattern.levels))
        ]
        _describe(pattern, device, values)
    return list(out.values())


def _describe(pattern: Pattern, device: int, values: list[list[str]]) -> None:
    if pattern.kind == "value":
        pattern.measurement = _measurement(pattern.levels, device, values)
    only = values[device][0] if len(values[device]) == 1 else None
    if only is not None and (only.lower() in KIND_WORDS or only.lower() in HOUSEKEEPING):
        pattern.notes.append(
            f"the level taken as the device ({only!r}) names a kind of "
            "message, not a device: every reading of these topics lands "
            f"under sensor id {only!r}; set sensor_id to what names the "
            "device"
        )
    elif only is not None:
        pattern.notes.append(f"one device seen ({only!r}): check that this level is the device")


def _measurement(levels: list[str], device: int, values: list[list[str]]) -> str:
    """The measurement template of a plain-value pattern, from the levels after the device.

    The varying levels, and the last one unless it is a generic word (``state``); a channel
    number takes the level before it (relay/0 -> relay_0).
    """
    parts: list[str] = []
    last = len(levels) - 1
    for i in range(device + 1, len(levels)):
        level, before = levels[i], levels[i - 1]
        numbered = all(v.isdigit() for v in values[i]) and not variable(before)
        if level.startswith("{"):
            parts.append(f"{safe(before)}_{level}" if numbered else level)
        elif i == last and level.lower() not in GENERIC_LAST:
            parts.append(f"{safe(before)}_{level}" if numbered else safe(level))
    if parts:
        return "_".join(parts)
    tail = [lv for lv in levels[device + 1 :] if not variable(lv)]
    return safe(tail[-1]) if tail else "value"


def safe(text: str) -> str:
    """A measurement name made of ``[A-Za-z0-9_-]``, 1 to 64 characters."""
    return _NAME.sub("_", text).strip("_")[:64] or "x"


def _flat(doc: object, prefix: str, out: dict[str, object]) -> None:
    if type(doc) is dict:
        for key, value in doc.items():
            _flat(value, f"{prefix}_{key}" if prefix else str(key), out)
    else:
        out[prefix] = doc


def field_values(samples: list[bytes], each: str | None = None) -> dict[str, list[object]]:
    """Flattened field names of JSON samples with the values seen.

    ``each``: the fields of the objects a rule with that ``each`` makes readings of.
    """
    path = tuple(each.split(".")) if each else None
    seen: dict[str, list[object]] = {}
    for doc in json_docs(samples):
        for _, obj in reading_objects(doc, path):
            flat: dict[str, object] = {}
            _flat(obj, "", flat)
            for key, value in flat.items():
                seen.setdefault(key, []).append(value)
    return seen


def quote(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return orjson.dumps(text).decode()
