"""Messages that share a topic but are not all readings, told apart by a type field.

OwnTracks publishes a device's location and its last will on one topic
(``{"_type": "location", ...}``, ``{"_type": "lwt", "tst": ...}``); a Meshtastic
gateway uplinks telemetry, positions, node info and chat on one topic (``"type":
"telemetry"``, ``"nodeinfo"``, ``"text"``). :func:`select` finds such a field and which
of its values carry readings: a value that is no housekeeping word and whose messages
carry a number beside the identity and the time. The rule then takes those messages
only (``[rule.match]``) and an ignore rule before it takes the rest; where the mapping
has no ``[rule.match]`` yet, ``keep`` lists the readings' fields so that the rest store
nothing (refused as ``no_measurements``, counted). A pattern whose messages are all
housekeeping becomes an ignore rule. Pure functions; used by
:mod:`ingest.devices.discover.propose`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.language import supports
from ingest.devices.discover.patterns import VARIABLE, Pattern, _flat
from ingest.devices.discover.proposal import time_of

if TYPE_CHECKING:
    from collections.abc import Sequence

TYPE_FIELDS = ("_type", "type", "msgtype", "msg_type", "message_type", "kind")
MAX_TYPES = 12
# Type values that name housekeeping, whatever the message carries.
HOUSEKEEPING_TYPES = frozenset(
    {
        "lwt",
        "will",
        "status",
        "cmd",
        "command",
        "request",
        "heartbeat",
        "nodeinfo",
        "node_info",
        "text",
        "card",
        "info",
        "config",
        "configuration",
        "waypoint",
        "waypoints",
        "dump",
        "routing",
        "traceroute",
        "neighborinfo",
        "ack",
        "encrypted",
    }
)


def select(pattern: Pattern, now: float) -> list[Pattern]:
    """The pattern, told which messages are readings; an ignore rule for the others."""
    if pattern.kind != "json" or pattern.each:
        return [pattern]
    docs = [d for d in json_docs(pattern.samples) if type(d) is dict]
    found = _type_field(docs)
    if found is None:
        return [pattern]
    name, by_type = found
    used = {v for t in [*pattern.sensor_id, *pattern.tags.values()] for v in VARIABLE.findall(t)}
    readings = sorted(t for t, ds in by_type.items() if _readings(t, ds, {*used, name}, now))
    chores = sorted(t for t in by_type if t not in readings)
    if not chores:
        return [pattern]
    if not readings:
        return [_ignored(pattern, name, chores)]
    pattern.drop = sorted({*pattern.drop, name})
    if supports("match"):
        pattern.match = {name: readings}
        chore = _ignored(pattern, name, chores)
        chore.match = {name: chores}
        pattern.notes.append(
            f"messages of this topic are told apart by {name!r}: this rule takes "
            f"{', '.join(readings)}; the rule before it ignores {', '.join(chores)}"
        )
        return [chore, pattern]
    others = {k for t in chores for d in by_type[t] for k in _flattened(d)}
    fields = sorted(
        {k for t in readings for d in by_type[t] for k in _flattened(d)} - others - used - {name}
    )
    pattern.keep = fields
    pattern.notes.append(
        f"messages of this topic are told apart by {name!r}: {', '.join(readings)} carry "
        f"readings, {', '.join(chores)} do not. This mapping has no [rule.match] to take "
        f"only {name} = {readings[0]!r}: keep lists the readings' fields, so the others "
        "store nothing (refused as no_measurements, counted)"
    )
    return [pattern]


def _type_field(
    docs: Sequence[dict[str, object]],
) -> tuple[str, dict[str, list[dict[str, object]]]] | None:
    """The payloads' type field and the payloads by its value, if they have one."""
    for name in TYPE_FIELDS:
        having = [d for d in docs if type(d.get(name)) is str]
        if len(having) * 2 <= len(docs):
            continue
        by_type: dict[str, list[dict[str, object]]] = {}
        for doc in having:
            by_type.setdefault(str(doc[name]), []).append(doc)
        if len(by_type) <= MAX_TYPES:
            return name, by_type
    return None


def _flattened(doc: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    _flat(doc, "", out)
    return out


def _readings(kind: str, docs: list[dict[str, object]], skip: set[str], now: float) -> bool:
    """Whether messages of this type carry readings: a number beside identity and time."""
    if kind.lower() in HOUSEKEEPING_TYPES:
        return False
    fields: dict[str, list[object]] = {}
    for doc in docs:
        for key, value in _flattened(doc).items():
            fields.setdefault(key, []).append(value)
    return any(
        any(type(v) in {int, float} for v in values)
        and time_of(key, values, now, by_value=True) is None
        for key, values in fields.items()
        if key not in skip
    )


def _ignored(pattern: Pattern, name: str, kinds: list[str]) -> Pattern:
    levels = ["+" if lv.startswith("{") else lv for lv in pattern.levels]
    chore = Pattern(levels, "ignore", set(pattern.topics))
    chore.notes.append(
        f"looks like housekeeping ({name} {', '.join(kinds)}): ignored; delete this rule "
        "to store it"
    )
    return chore
