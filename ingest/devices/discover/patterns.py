"""What a captured stream looks like: payload formats and topic patterns.

Pure functions over captured ``(topic, payload)`` messages, used by ``ingest discover``:
:func:`payload_kind` names a payload's format, :func:`group` groups the topics into
patterns (the level that varies most is the device; levels after it name the measurement
of a plain value; housekeeping topics are ignored). :mod:`ingest.devices.discover.propose`
completes the patterns with what conventions and payloads say,
:mod:`ingest.devices.discover.proposal` writes them as rules, and
:mod:`ingest.devices.discover.command` checks them through the real mapping engine. Nothing here
does I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import orjson

from ingest.devices.decode import Limits, decode
from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.identity import members as reading_objects

if TYPE_CHECKING:
    from ingest.devices.discover.conventions import Known

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
    decoded = decode(topic, payload, _now(), Limits())
    return "ingest" if decoded.readings and not decoded.rejections else "json"


def _senml(records: list[dict[str, object]]) -> bool:
    keys = set().union(*records)
    return (
        keys <= SENML_KEYS
        and bool(keys & {"n", "bn"})
        and bool(keys & {"v", "vs", "vb", "vd", "s"})
    )


def _now() -> float:
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


def group(messages: list[Captured], known: Known) -> list[Pattern]:
    """The messages' topics grouped into patterns, one per rule to propose.

    Each keeps the first payloads of its topics. ``known``: what the conventions say
    (Homie devices, Home Assistant's availability and command topics).
    """
    by_topic: dict[str, list[bytes]] = {}
    for msg in messages:
        by_topic.setdefault(msg.topic, []).append(msg.payload)
    kinds: dict[str, str] = {}
    for topic, payloads in by_topic.items():
        counted = Counter(payload_kind(topic, p) for p in payloads)
        counted.pop("empty", None)
        if counted:
            kinds[topic] = counted.most_common(1)[0][0]
        if kinds.get(topic) == "ingest" and topic in known.entities:
            kinds[topic] = "json"  # Home Assistant names its fields: units need the json format
    roots = {topic.split("/", 1)[0] for topic in by_topic}
    groups: dict[tuple[int, str, bool, int], list[str]] = {}
    now = _now()
    for topic, kind in kinds.items():
        chore = housekeeping(topic, kind, by_topic[topic], roots, now) or topic in known.chores
        key = (topic.count("/") + 1, kind, chore, _homie_device(topic, known))
        groups.setdefault(key, []).append(topic)
    patterns: list[Pattern] = []
    for (_, kind, chore, device), topics in sorted(groups.items()):
        if chore:
            patterns.extend(_housekeeping(topics, kind, known, roots))
        else:
            patterns.extend(_patterns(sorted(topics), kind, device))
    data = {t for (_, _, chore, _), ts in groups.items() if not chore for t in ts}
    patterns = merge_chores(_same_shapes(patterns), data)
    for pattern in patterns:
        pattern.payloads = {t: by_topic[t][:SAMPLES] for t in pattern.topics}
    return patterns


def housekeeping(topic: str, kind: str, payloads: list[bytes], roots: set[str], now: float) -> bool:
    """Whether a topic carries housekeeping rather than readings, whatever its format.

    By topic word (a last level such as ``status``, ``heartbeat``, ``lwt``, ``set``; a
    level such as ``status`` or ``cmd`` anywhere after the first), by a request/write
    mirror of a notification tree (``R/...``, ``W/...`` beside ``N/...``), by payloads
    that report a connection (online/offline), or by plain values that are all clock
    times (a last-update or heartbeat time: evcc's ``updated``).
    """
    levels = topic.split("/")
    last = levels[-1].lower()
    if last in HOUSEKEEPING or last.startswith("$"):
        return True
    if any(level.lower() in HOUSEKEEPING_LEVELS for level in levels[1:]):
        return True
    if MIRRORS.get(levels[0]) in roots:
        return True
    texts = {p.strip().lower() for p in payloads if p.strip()}
    if kind == "value" and texts and texts <= {w.encode() for w in STATUS_WORDS}:
        return True
    if kind in {"json", "ingest"}:  # {"value": <a clock time>}: Victron's full_publish_completed
        docs = json_docs(list(texts))
        texts = {
            orjson.dumps(d["value"])
            for d in docs
            if type(d) is dict and len(d) == 1 and "value" in d
        }
        if len(texts) < len(docs):
            return False
    return bool(texts) and all(_clock(t, now) for t in texts)


def _clock(text: bytes, now: float) -> bool:
    """A plain value that is an epoch time within ten years of now."""
    try:
        number = float(text)
    except ValueError:
        return False
    return any(abs(number / 10**d - now) < 10 * 365 * 86400 for d in (0, 3, 6, 9))


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
    return -sum(not _variable(x) for x in levels), levels[-1] == "#", levels


def _homie_device(topic: str, known: Known) -> int:
    """The device level of a topic under a Homie device (``homie/<device>/...``), or -1."""
    levels = topic.split("/")
    for depth in range(2, len(levels)):
        if "/".join(levels[:depth]) in known.homie_devices:
            return depth - 1
    return -1


def _variable(level: str) -> bool:
    return level in {"+", "#"} or level.startswith("{")


def _housekeeping(
    topics: list[str], kind: str, known: Known, roots: set[str] | None = None
) -> list[Pattern]:
    shapes: dict[tuple[str, ...], set[str]] = {}
    whys: dict[tuple[str, ...], str] = {}
    for topic in topics:
        shape, why = _chore_shape(topic, kind, known, roots or set())
        shapes.setdefault(shape, set()).add(topic)
        whys.setdefault(shape, why)
    out = []
    for shape, members in shapes.items():
        pattern = Pattern(list(shape), "ignore", members)
        pattern.notes.append(
            f"looks like housekeeping ({whys[shape]}): ignored; delete this rule to store it"
        )
        out.append(pattern)
    return out


def _chore_shape(
    topic: str, kind: str, known: Known, roots: set[str]
) -> tuple[tuple[str, ...], str]:
    """The ignore rule's filter for a housekeeping topic, and why it is housekeeping."""
    levels = [literal(lv) for lv in topic.split("/")]
    mirrored = MIRRORS.get(levels[0])
    if mirrored in roots and len(levels) > 1:
        return (levels[0], "#"), (
            f"{levels[0]}/ mirrors the notification tree {mirrored}/: requests and writes "
            "to the device, not readings"
        )
    inner = next(
        (i for i, lv in enumerate(levels[1:-1], 1) if lv.lower() in HOUSEKEEPING_LEVELS), None
    )
    if inner is not None:
        shape = (levels[0], *(["+"] * (inner - 1)), levels[inner], "#")
        return shape, f"under the level {levels[inner]!r}"
    varying = (
        [levels[0], *(["+"] * (len(levels) - 2)), levels[-1]]
        if len(levels) > 2
        else (["+", levels[-1]] if len(levels) == 2 else levels)
    )
    if varying[-1].startswith("$"):
        why = f"a Homie attribute ({varying[-1]})"
    elif topic in known.chores:
        why = "availability or command topics of Home Assistant discovery configs"
    elif varying[-1].lower() in HOUSEKEEPING:
        why = f"last level {varying[-1]!r}"
    elif kind == "value":
        why = f"payloads such as online/offline, or clock times, on last level {varying[-1]!r}"
    else:
        why = f"last level {varying[-1]!r}"
    return tuple(varying), why


def _same_shapes(patterns: list[Pattern]) -> list[Pattern]:
    """Ignore rules of one filter (from topics of several depths or formats) made one."""
    out: list[Pattern] = []
    seen: dict[tuple[str, ...], Pattern] = {}
    for pattern in patterns:
        key = tuple(pattern.levels)
        if pattern.kind == "ignore" and key in seen:
            seen[key].topics |= pattern.topics
            continue
        if pattern.kind == "ignore":
            seen[key] = pattern
        out.append(pattern)
    wide = [p for p in out if p.kind == "ignore" and p.levels[-1] == "#" and not p.match]
    return [
        p
        for p in out
        if not (
            p.kind == "ignore"
            and not p.match
            and any(w is not p and all(covers(w.levels, t) for t in p.topics) for w in wide)
        )
    ]


def covers(levels: list[str], topic: str) -> bool:
    """Whether a filter (``+``, ``{capture}``, a last ``#``) takes a topic, as MQTT does."""
    parts = topic.split("/")
    for i, level in enumerate(levels):
        if level == "#" or level.endswith("#}"):
            return i <= len(parts) - (0 if level == "#" else 1)
        if i >= len(parts) or not (_variable(level) or level == parts[i]):
            return False
    return len(parts) == len(levels)


def merge_chores(patterns: list[Pattern], data: set[str]) -> list[Pattern]:
    """Ignore rules that differ in the last level only, made one where it can be.

    ``homie/+/+/+/+`` for ``$name``, ``$unit``..., if it takes none of the topics that
    carry readings.
    """
    by_parent: dict[tuple[str, ...], list[Pattern]] = {}
    out = []
    for pattern in patterns:
        if pattern.kind == "ignore":
            by_parent.setdefault(tuple(pattern.levels[:-1]), []).append(pattern)
        else:
            out.append(pattern)
    for parent, group in by_parent.items():
        levels = [*parent, "+"]
        wide = len(group) > 1 and not any(_takes(levels, t) for t in data)
        if not wide:
            out += group
            continue
        lasts = ", ".join(sorted(p.levels[-1] for p in group)[:6])
        merged = Pattern(levels, "ignore", set().union(*(p.topics for p in group)))
        merged.notes.append(
            f"looks like housekeeping (last levels {lasts}): ignored; "
            "delete this rule to store them"
        )
        out.append(merged)
    return out


def _takes(levels: list[str], topic: str) -> bool:
    parts = topic.split("/")
    return (
        len(parts) == len(levels)
        and all(lv in {"+", part} for lv, part in zip(levels, parts, strict=True))
        and not (levels[0] == "+" and parts[0].startswith("$"))
    )


def _patterns(topics: list[str], kind: str, device: int = -1) -> list[Pattern]:
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
        numbered = all(v.isdigit() for v in values[i]) and not _variable(before)
        if level.startswith("{"):
            parts.append(f"{safe(before)}_{level}" if numbered else level)
        elif i == last and level.lower() not in GENERIC_LAST:
            parts.append(f"{safe(before)}_{level}" if numbered else safe(level))
    if parts:
        return "_".join(parts)
    tail = [lv for lv in levels[device + 1 :] if not _variable(lv)]
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
