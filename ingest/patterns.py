"""What a captured stream looks like: payload formats, topic patterns, proposed rules.

Pure functions over captured ``(topic, payload)`` messages, used by ``ingest discover``:
:func:`payload_kind` names a payload's format, :func:`propose` groups the topics into
patterns (the level that varies most is the device; levels after it name the measurement
of a plain value) and writes each pattern as a mapping rule in TOML, with comments saying
what was guessed. Nothing here does I/O; the proposal is checked by running it through
the real mapping engine (:mod:`ingest.discover`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import orjson

from ingest.decode import Limits, decode

# Last topic levels that carry status, commands or metadata rather than readings.
HOUSEKEEPING = frozenset({"availability", "lwt", "will", "online", "offline", "announce",
                          "debug", "log", "logging", "config", "set", "get", "command",
                          "cmnd", "info", "connected", "birth", "heartbeat"})
# Levels that name a kind of message, never a device.
KIND_WORDS = frozenset({"sensor", "sensors", "tele", "stat", "state", "status", "data",
                        "telemetry", "readings", "events", "event", "up", "json", "value",
                        "values", "measurements", "metrics", "devices", "device", "relay",
                        "switch", "light", "cover", "binary_sensor", "text_sensor"})
# Whole payloads that report a connection rather than a reading.
STATUS_WORDS = frozenset({"online", "offline", "connected", "disconnected", "alive", "dead",
                          "ready", "lost"})
TIME_KEYS = frozenset({"ts", "time", "timestamp", "datetime", "date", "last_seen", "t",
                       "epoch", "utc", "time_iso"})
SENML_KEYS = frozenset({"bn", "bt", "bu", "bv", "bver", "n", "u", "v", "vs", "vb", "vd",
                        "s", "t", "ut"})
# Last levels that say "this is the value" rather than what is measured.
GENERIC_LAST = frozenset({"state", "value", "status", "data", "get", "current"})
MAX_JSON_PATTERNS = 5  # distinct values of a non-device level kept as separate rules
_LINE = re.compile(r"^[^\s,#][^\s,]*(,[^\s=]+=[^\s,]+)* [^\s=]+=[^\s]+( -?\d+)?$")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
_OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")
_NAME = re.compile(r"[^A-Za-z0-9_-]+")


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
    samples: list[bytes] = field(default_factory=list)
    measurement: str | None = None  # value format: the measurement template
    notes: list[str] = field(default_factory=list)


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
    objects = type(doc) is dict or (type(doc) is list and bool(doc)
                                    and all(type(r) is dict for r in doc))
    if not objects:
        return "value"
    if type(doc) is list and _senml(doc):
        return "senml"
    decoded = decode(topic, payload, _now(), Limits())
    return "ingest" if decoded.readings and not decoded.rejections else "json"


def _senml(records: list[dict[str, object]]) -> bool:
    keys = set().union(*records)
    return keys <= SENML_KEYS and bool(keys & {"n", "bn"}) and bool(keys & {"v", "vs", "vb",
                                                                            "vd", "s"})


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


def propose(messages: list[Captured]) -> list[Pattern]:
    """Group the messages' topics into patterns, one per rule to propose."""
    by_topic: dict[str, list[bytes]] = {}
    for msg in messages:
        by_topic.setdefault(msg.topic, []).append(msg.payload)
    kinds: dict[str, str] = {}
    for topic, payloads in by_topic.items():
        counted = Counter(payload_kind(topic, p) for p in payloads)
        counted.pop("empty", None)
        if counted:
            kinds[topic] = counted.most_common(1)[0][0]
    groups: dict[tuple[int, str, bool], list[str]] = {}
    for topic, kind in kinds.items():
        last = topic.rsplit("/", 1)[-1].lower()
        texts = {p.strip().lower() for p in by_topic[topic] if p.strip()}
        chore = (last in HOUSEKEEPING and kind in {"value", "json"}) or (
            kind == "value" and bool(texts) and texts <= {w.encode() for w in STATUS_WORDS})
        groups.setdefault((topic.count("/") + 1, kind, chore), []).append(topic)
    patterns: list[Pattern] = []
    for (_, kind, chore), topics in sorted(groups.items()):
        if chore:
            patterns.extend(_housekeeping(topics, kind))
        else:
            patterns.extend(_patterns(sorted(topics), kind))
    for pattern in patterns:
        for topic in pattern.topics:
            pattern.samples.extend(by_topic[topic][:3])
    # More literal levels first: a general rule must not shadow a specific one.
    patterns.sort(key=lambda p: (-sum(not _variable(x) for x in p.levels), p.levels))
    return patterns


def _variable(level: str) -> bool:
    return level == "+" or level.startswith("{")


def _housekeeping(topics: list[str], kind: str) -> list[Pattern]:
    shapes: dict[tuple[str, ...], set[str]] = {}
    for topic in topics:
        levels = topic.split("/")
        varying = [levels[0], *(["+"] * (len(levels) - 2)), levels[-1]] if len(levels) > 2 \
            else (["+", levels[-1]] if len(levels) == 2 else levels)
        shapes.setdefault(tuple(varying), set()).add(topic)
    out = []
    for shape, members in shapes.items():
        pattern = Pattern(list(shape), "ignore", members)
        pattern.notes.append(f"looks like housekeeping (last level {shape[-1]!r}, {kind} "
                             "payloads such as online/offline): ignored; delete this rule "
                             "to store it")
        out.append(pattern)
    return out


def _patterns(topics: list[str], kind: str) -> list[Pattern]:
    rows = [t.split("/") for t in topics]
    depth = len(rows[0])
    values = [sorted({row[i] for row in rows}) for i in range(depth)]
    plain = kind == "value"
    last_is_measurement = plain and depth > 1
    span = depth - 1 if last_is_measurement else depth
    device = _device_level(values[:span], rows)
    levels: list[str] = []
    for i in range(depth):
        if i == device:
            levels.append("{sensor_id}")
        elif last_is_measurement and i == depth - 1:
            levels.append("{measurement}" if len(values[i]) > 1 else values[i][0])
        elif len(values[i]) == 1:
            levels.append(values[i][0])
        elif plain or (i < device):
            levels.append(f"{{level{i + 1}}}")
        elif len(values[i]) <= MAX_JSON_PATTERNS:
            levels.append("*")  # split below: one rule per value
        else:
            levels.append("+")
    if "*" in levels:
        return _split(levels, rows, kind)
    if kind == "binary":
        levels = [vs[0] if len(vs) == 1 else "+" for vs in values]
        return [Pattern(levels, kind, set(topics))]
    pattern = Pattern(levels, kind, set(topics))
    _describe(pattern, device, values)
    return [pattern]


def _device_level(values: list[list[str]], rows: list[list[str]]) -> int:
    """The position of the device id: the level that varies most, else the likeliest."""
    del rows
    best, best_count = -1, 1
    for i, distinct in enumerate(values):
        if len(distinct) > best_count and device_score(distinct[0], i) > -3:
            best, best_count = i, len(distinct)
    if best >= 0:
        return best
    scores = [(device_score(v[0], i), i) for i, v in enumerate(values)]
    top = max(scores)
    if top[0] > 0:
        return top[1]
    return len(values) - 1  # no better guess: the deepest level before the measurement


def _split(levels: list[str], rows: list[list[str]], kind: str) -> list[Pattern]:
    out: dict[tuple[str, ...], Pattern] = {}
    for row in rows:
        shape = tuple(row[i] if lv == "*" else lv for i, lv in enumerate(levels))
        out.setdefault(shape, Pattern(list(shape), kind)).topics.add("/".join(row))
    for pattern in out.values():
        device = pattern.levels.index("{sensor_id}")
        values = [sorted({t.split("/")[i] for t in pattern.topics})
                  for i in range(len(pattern.levels))]
        _describe(pattern, device, values)
    return list(out.values())


def _describe(pattern: Pattern, device: int, values: list[list[str]]) -> None:
    if pattern.kind == "value":
        pattern.measurement = _measurement(pattern.levels, device, values)
    if len(values[device]) == 1:
        pattern.notes.append(f"one device seen ({values[device][0]!r}): check that this "
                             "level is the device")


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
            parts.append(f"{_safe(before)}_{level}" if numbered else level)
        elif i == last and level.lower() not in GENERIC_LAST:
            parts.append(f"{_safe(before)}_{level}" if numbered else _safe(level))
    if parts:
        return "_".join(parts)
    tail = [lv for lv in levels[device + 1:] if not _variable(lv)]
    return _safe(tail[-1]) if tail else "value"


def _safe(text: str) -> str:
    return _NAME.sub("_", text).strip("_")[:64] or "x"


def _flat(doc: object, prefix: str, out: dict[str, object]) -> None:
    if type(doc) is dict:
        for key, value in doc.items():
            _flat(value, f"{prefix}_{key}" if prefix else str(key), out)
    else:
        out[prefix] = doc


def _fields(samples: list[bytes]) -> dict[str, list[object]]:
    """Flattened field names of JSON samples with the values seen."""
    seen: dict[str, list[object]] = {}
    for payload in samples:
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        for obj in doc if type(doc) is list else [doc]:
            flat: dict[str, object] = {}
            _flat(obj, "", flat)
            for key, value in flat.items():
                seen.setdefault(key, []).append(value)
    return seen


def time_of(name: str, values: list[object], now: float) -> str | None:
    """How a field holds the time: auto (epoch or ISO with offset), local, or None."""
    if name.lower() not in TIME_KEYS and not name.lower().endswith(("_ts", "_time")):
        return None
    kinds = set()
    for value in values:
        if isinstance(value, int | float) and not isinstance(value, bool):
            size = abs(float(value))
            unit = next((10**d for d in (0, 3, 6, 9)
                         if abs(size / 10**d - now) < 10 * 365 * 86400), None)
            kinds.add("auto" if unit else "?")
        elif type(value) is str and _ISO.match(value):
            kinds.add("auto" if _OFFSET.search(value) else "local")
        else:
            kinds.add("?")
    return kinds.pop() if len(kinds) == 1 and "?" not in kinds else None


def _quote(text: str) -> str:
    return orjson.dumps(text).decode()


def rule_text(pattern: Pattern, name: str, now: float) -> str:
    """One pattern as a commented [[rule]] table."""
    lines = [f"# {len(pattern.topics)} topic(s), e.g. {min(pattern.topics)}"]
    lines += [f"# NOTE: {note}" for note in pattern.notes]
    topic = "/".join(pattern.levels)
    lines += ["[[rule]]", f"name = {_quote(name)}", f"topic = {_quote(topic)}"]
    if pattern.kind in {"ignore", "binary"}:
        if pattern.kind == "binary":
            lines.insert(1, "# NOTE: binary payloads (not UTF-8 text): no format reads them; "
                            "ignored")
        lines.append("ignore = true")
        return "\n".join(lines)
    lines.append(f"format = {_quote(pattern.kind)}")
    if "{sensor_id}" not in pattern.levels and pattern.kind != "senml":
        lines.append('sensor_id = "{level1}"')
    if pattern.kind == "value":
        lines.append(f"measurement = {_quote(pattern.measurement or 'value')}")
        texts = {s.decode("utf-8", "replace").strip() for s in pattern.samples}
        lines += _values_table(texts)
    elif pattern.kind == "json":
        lines += _json_options(pattern, now)
    return "\n".join(lines)


def _values_table(texts: set[str]) -> list[str]:
    pairs = [(t, "true" if t.lower() == "on" else "false") for t in sorted(texts)
             if t.lower() in {"on", "off"}]
    if not pairs:
        return []
    return ["[rule.values]", *(f"{_quote(k)} = {v}" for k, v in pairs)]


def _json_options(pattern: Pattern, now: float) -> list[str]:
    fields = _fields(pattern.samples)
    arrays = sorted(k for k, vs in fields.items() if any(type(v) is list for v in vs))
    times = {k: time_of(k, vs, now) for k, vs in fields.items()}
    local = sorted(k for k, how in times.items() if how == "local")
    time_field = next((k for k, how in times.items() if how == "auto"), None)
    out: list[str] = []
    if arrays:
        out.append(f"# NOTE: arrays cannot be stored: dropped ({', '.join(arrays)})")
    if local:
        out.append(f"# NOTE: {', '.join(local)}: a local time without offset, dropped (the "
                   "arrival time is used); to use it add [rule.time] with field = "
                   f'{_quote(local[0])}, format = "local", zone = "<the devices\' zone>"')
    if arrays or local:
        out.append(f"drop = [{', '.join(_quote(k) for k in sorted({*arrays, *local}))}]")
    onoff = {v for vs in fields.values() for v in vs
             if type(v) is str and v.lower() in {"on", "off"}}
    out += _values_table(onoff)
    if time_field is not None:
        out += ["[rule.time]", f"field = {_quote(time_field)}", 'format = "auto"']
    return out
