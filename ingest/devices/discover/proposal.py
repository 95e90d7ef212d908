"""Proposed patterns written as a mapping file: one commented ``[[rule]]`` table each.

Pure text: :func:`rule_text` writes a pattern (:class:`ingest.devices.discover.patterns.Pattern`)
with what its payloads showed (arrays to drop, a time field, on/off values, units, the
payload's device identity) and a NOTE comment on every guess. ``ingest discover`` parses
the result as a mapping file and runs the capture through it before printing it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.patterns import field_values, quote
from ingest.model import RESERVED_FIELDS

if TYPE_CHECKING:
    from ingest.devices.discover.patterns import Pattern

TIME_KEYS = frozenset(
    {"ts", "time", "timestamp", "datetime", "date", "last_seen", "t", "epoch", "utc", "time_iso"}
)
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
_OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")


def time_of(name: str, values: list[object], now: float, by_value: bool = False) -> str | None:
    """How a field holds the time: auto (epoch or ISO with offset), local, or None.

    By its name (``ts``, ``timestamp``, ``*_time``), or with ``by_value`` by its values
    alone: epoch seconds, milliseconds, microseconds or nanoseconds within ten years of
    now, or ISO-8601 strings (OwnTracks' ``tst``).
    """
    named = name.lower() in TIME_KEYS or name.lower().endswith(("_ts", "_time"))
    if not named and not by_value:
        return None
    kinds = set()
    for value in values:
        if isinstance(value, int | float) and not isinstance(value, bool):
            size = abs(float(value))
            unit = next(
                (10**d for d in (0, 3, 6, 9) if abs(size / 10**d - now) < 10 * 365 * 86400), None
            )
            kinds.add("auto" if unit else "?")
        elif type(value) is str and _ISO.match(value):
            kinds.add("auto" if _OFFSET.search(value) else "local")
        else:
            kinds.add("?")
    return kinds.pop() if len(kinds) == 1 and "?" not in kinds else None


def rule_text(
    pattern: Pattern, name: str, now: float, summary: str | None = None, stores: str | None = None
) -> str:
    """One pattern as a commented [[rule]] table.

    ``summary``: what it took of the capture; ``stores``: the sensors and measurements
    its readings stored.
    """
    head = summary or f"{len(pattern.topics)} topic(s)"
    lines = [f"# {head}, e.g. {min(pattern.topics)}"] + ([f"# {stores}"] if stores else [])
    if pattern.kind == "binary":
        lines.append("# NOTE: binary payloads (not UTF-8 text): no format reads them; ignored")
    lines += [f"# NOTE: {note}" for note in pattern.notes]
    lines += ["[[rule]]", f"name = {quote(name)}", *_topic(pattern)]
    if pattern.kind in {"ignore", "binary"}:
        lines.append("ignore = true")
        return "\n".join(lines + _match(pattern))
    lines.append(f"format = {quote(pattern.kind)}")
    if pattern.each:
        lines.append(f"each = {quote(pattern.each)}")
    lines += _sensor_id(pattern)
    tables: list[str] = []  # after every key of the rule: a [table] takes the keys below it
    if pattern.kind == "value":
        lines.append(f"measurement = {quote(pattern.measurement or 'value')}")
        texts = {s.decode("utf-8", "replace").strip() for s in pattern.samples}
        tables += _values_table(texts, pattern.values)
    elif pattern.kind == "json":
        if pattern.measurement:  # one value per topic, named by the topic
            lines.append(f"measurement = {quote(pattern.measurement)}")
        keys, tables = _json_options(pattern, now)
        lines += keys
    if pattern.info:
        lines.append(f"info = [{', '.join(quote(n) for n in pattern.info)}]")
    tables += _table("tags", pattern.tags) + _table("units", pattern.units)
    return "\n".join(lines + tables + _match(pattern))


def _topic(pattern: Pattern) -> list[str]:
    """``topic``: the filter, or the list of filters, each with its notes above it."""
    if not pattern.filters:
        return [f"topic = {quote('/'.join(pattern.levels))}"]
    lines = ["topic = ["]
    for member in pattern.filters:
        lines += [f"  # NOTE: {listed(note)}" for note in member.notes]
        lines.append(f"  {quote('/'.join(member.levels))},")
    return [*lines, "]"]


def listed(note: str) -> str:
    """A note about a rule said of one filter of a rule's list."""
    return note.replace("delete this rule to store", "delete this filter's line to store")


def _match(pattern: Pattern) -> list[str]:
    """``[rule.match]``: the payload field values a rule takes (one, or a list of any)."""
    if not pattern.match:
        return []
    out = ["[rule.match]"]
    for name, values in sorted(pattern.match.items()):
        given = quote(values[0]) if len(values) == 1 else f"[{', '.join(map(quote, values))}]"
        out.append(f"{quote(name)} = {given}")
    return out


def _sensor_id(pattern: Pattern) -> list[str]:
    ids = pattern.sensor_id
    if len(ids) == 1:
        return [f"sensor_id = {quote(ids[0])}"]
    if ids:
        return [f"sensor_id = [{', '.join(quote(t) for t in ids)}]"]
    if "{sensor_id}" in pattern.levels or pattern.kind in {"senml", "ingest", "influx", "homie"}:
        return []
    captures = [lv for lv in pattern.levels if lv.startswith("{")]
    return [f"sensor_id = {quote(captures[0])}"] if captures else []


def _table(name: str, table: dict[str, str]) -> list[str]:
    if not table:
        return []
    return [f"[rule.{name}]", *(f"{quote(k)} = {quote(v)}" for k, v in sorted(table.items()))]


def _values_table(texts: set[str], given: dict[str, bool]) -> list[str]:
    pairs = {t: t.lower() == "on" for t in texts if t.lower() in {"on", "off"}}
    pairs.update(given)
    if not pairs:
        return []
    return [
        "[rule.values]",
        *(f"{quote(k)} = {'true' if v else 'false'}" for k, v in sorted(pairs.items())),
    ]


def _json_options(pattern: Pattern, now: float) -> tuple[list[str], list[str]]:
    fields = field_values(pattern.samples, pattern.each)
    used = {
        f
        for t in [*pattern.sensor_id, *pattern.tags.values()]
        for f in re.findall(r"\{([^}]+)\}", t)
    }
    arrays = sorted(k for k, vs in fields.items() if any(type(v) is list for v in vs))
    times = {k: time_of(k, vs, now) for k, vs in fields.items() if k not in used}
    local = sorted(k for k, how in times.items() if how == "local")
    # The time field in the most messages, by name first, else by value.
    auto = sorted((k for k, how in times.items() if how == "auto"), key=lambda k: -len(fields[k]))
    if not auto:
        auto = sorted(
            (
                k
                for k, vs in fields.items()
                if k not in used and time_of(k, vs, now, by_value=True) == "auto"
            ),
            key=lambda k: -len(fields[k]),
        )
    time_field = auto[0] if auto else None
    if time_field is None and pattern.each:  # a time the message gives all its devices
        time_field = next(
            (
                k
                for k, vs in _top(pattern.samples, pattern.each).items()
                if k not in used and time_of(k, vs, now) == "auto"
            ),
            None,
        )
    out: list[str] = []
    if arrays:
        out.append(f"# NOTE: arrays cannot be stored: dropped ({', '.join(arrays)})")
    if local:
        out.append(
            f"# NOTE: {', '.join(local)}: a local time without offset, dropped (the "
            "arrival time is used); to use it add [rule.time] with field = "
            f'{quote(local[0])}, format = "local", zone = "<the devices\' zone>"'
        )
    drop = sorted({*arrays, *local, *pattern.drop})
    if drop:
        out.append(f"drop = [{', '.join(quote(k) for k in drop)}]")
    if pattern.keep:
        out.append(f"keep = [{', '.join(quote(k) for k in pattern.keep)}]")
    onoff = {
        v for vs in fields.values() for v in vs if type(v) is str and v.lower() in {"on", "off"}
    }
    rename = _renames([k for k in fields if k not in {*used, *drop, time_field}], fields)
    names = f"{', '.join(rename)} {'is a name' if len(rename) == 1 else 'are names'}"
    tables = (
        [
            (
                f"# NOTE: {names} the daemon keeps for itself: stored as "
                f"{', '.join(rename.values())} (any other valid name will do)"
            )
        ]
        if rename
        else []
    )
    tables += _table("rename", rename) + _values_table(onoff, pattern.values)
    if time_field is not None:
        tables += ["[rule.time]", f"field = {quote(time_field)}", 'format = "auto"']
    return out, tables


def _renames(names: list[str], fields: dict[str, list[object]]) -> dict[str, str]:
    """Reserved field names (``seq``) -> a name that can be stored (``device_seq``)."""
    out: dict[str, str] = {}
    for name in names:
        if name in RESERVED_FIELDS:
            new, n = f"device_{name.lstrip('_')}", 2
            while new in fields or new in out.values():
                new, n = f"device_{name.lstrip('_')}_{n}", n + 1
            out[name] = new
    return out


def _top(samples: list[bytes], each: str) -> dict[str, list[object]]:
    """The top-level fields of the messages beside the devices they list."""
    first = each.split(".", 1)[0]
    seen: dict[str, list[object]] = {}
    for doc in json_docs(samples):
        for key, value in doc.items() if type(doc) is dict else ():
            if key != first:
                seen.setdefault(key, []).append(value)
    return seen
