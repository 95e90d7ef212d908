"""Housekeeping: topics and messages that carry status, commands or metadata, not readings.

:func:`housekeeping` tells a topic apart by its words, its tree and its payloads,
whatever the payload format; :func:`chore_patterns` proposes ignore rules for such
topics, :func:`same_shapes`, :func:`merge_chores`, :func:`merge_tail` and
:func:`list_chores` make them as few as they can be without taking a topic that carries
readings. Pure functions; used by
:mod:`ingest.devices.discover.grouping`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import orjson

from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.language import supports
from ingest.devices.discover.patterns import (
    EXTRAS,
    HOUSEKEEPING,
    HOUSEKEEPING_LEVELS,
    MIRRORS,
    STATUS_WORDS,
    Pattern,
    literal,
    order,
    variable,
)
from ingest.devices.discover.shadowing import matches, overlap
from ingest.devices.rules import MAX_TOPICS
from ingest.devices.rules import covers as filter_covers

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ingest.devices.discover.conventions import Known

# An HTTP API request as a payload (WLED's <device>/api: ``FX=2&SX=200``): key=value
# pairs joined by &, which no reading looks like.
_QUERY = re.compile(rb"^[A-Za-z][A-Za-z0-9_.-]*=[^&=\s]*(&[A-Za-z][A-Za-z0-9_.-]*=[^&=\s]*)*$")
# Payloads that switch a device: a toggle is never a state, on/off beside it are the same
# command (WLED's ON, OFF, T; Tasmota's and Zigbee2MQTT's TOGGLE).
SWITCH_WORDS = frozenset({b"on", b"off", b"t", b"toggle"})
# Shapes of plain values that a command repeats from the state it sets: a colour
# (WLED's #FFA000 on <device>/c, #FF0000 on <device>/col) or a word. Not numbers:
# measurements share prefixes (OpenDTU's power, powerdc, powerfactor).
_SHAPES = {
    "colour": re.compile(rb"^#[0-9A-Fa-f]{6}([0-9A-Fa-f]{2})?$"),
    "word": re.compile(rb"^[A-Za-z][A-Za-z_-]*$"),
}


def housekeeping(topic: str, kind: str, payloads: list[bytes], roots: set[str], now: float) -> bool:
    """Whether a topic carries housekeeping rather than readings, whatever its format.

    By topic word (a last level such as ``status``, ``heartbeat``, ``lwt``, ``set``; a
    level such as ``status`` or ``cmd`` anywhere after the first), by a request/write
    mirror of a notification tree (``R/...``, ``W/...`` beside ``N/...``), by payloads
    that report a connection (online/offline), or by plain values, or one-value JSON
    (``{"time": ..., "value": ...}``), that are all clock times (a last-update or
    heartbeat time: evcc's ``updated``).
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
    if kind in {"json", "ingest"}:
        # {"value": <a clock time>}, also beside its own time or unit: Victron's
        # full_publish_completed, Z-Wave JS UI's lastActive
        docs = json_docs(list(texts))
        texts = {
            orjson.dumps(d["value"])
            for d in docs
            if type(d) is dict and "value" in d and set(d) - {"value"} <= EXTRAS
        }
        if len(texts) < len(docs):
            return False
    return bool(texts) and all(_clock(t, now) for t in texts)


def commands(by_topic: Mapping[str, Sequence[bytes]]) -> dict[str, str]:
    """Topics that carry commands to devices, by their payloads and place, with why.

    A plain value that is an HTTP API request (``FX=2&SX=200``: key=value pairs joined
    by &) asks something of a device. A switch word (ON, OFF, T, TOGGLE) on a topic that
    stands among device trees, a leaf where its siblings are each the root of topics
    below them and never topics themselves (WLED's group topic ``wled/all`` beside
    ``wled/<device>/...``), switches the devices: no device publishes a reading there.
    A topic whose last level extends a sibling's (``col`` beside ``c``), with payloads
    of the sibling's shape (a colour, a word), published for some of the devices that
    publish the sibling but not for all, is the command that sets that state (WLED's
    ``<device>/col``): the devices publish their state alike, commands come to some.
    """
    out = {}
    inner: dict[str, set[str]] = {}  # a parent level -> its children that have topics below
    children: dict[str, set[str]] = {}  # a parent level -> its children that are topics
    parents: dict[str, set[str]] = {}  # a last level -> the parent levels it is under
    for topic in by_topic:
        levels = topic.split("/")
        for depth in range(1, len(levels) - 1):
            inner.setdefault("/".join(levels[:depth]), set()).add(levels[depth])
        parent, _, last = topic.rpartition("/")
        children.setdefault(parent, set()).add(last)
        parents.setdefault(last, set()).add(parent)
    for topic, payloads in by_topic.items():
        texts = {p.strip() for p in payloads if p.strip()}
        if texts and all(_QUERY.match(t) for t in texts):
            out[topic] = "payloads that are HTTP API requests (key=value&...): commands"
            continue
        parent, _, last = topic.rpartition("/")
        sets = _sets(topic, by_topic, children, parents)
        if sets is not None:
            out[topic] = (
                f"payloads shaped like those of {parent}/{sets}, whose name {last!r} "
                f"extends, published for only some of the devices that publish {sets!r}: "
                "commands that set it"
            )
            continue
        siblings = inner.get(parent, set())
        if (
            texts
            and {t.lower() for t in texts} <= SWITCH_WORDS
            and topic not in inner
            and len(siblings) >= 2
            and not any(f"{parent}/{s}" in by_topic for s in siblings)
        ):
            out[topic] = f"switch commands beside the device trees under {parent}/: a group topic"
    return out


def _shape(texts: set[bytes]) -> str | None:
    """The one shape all the texts have (a colour, a word), or None."""
    shapes = {
        next((name for name, shape in _SHAPES.items() if shape.match(t)), None) for t in texts
    }
    return shapes.pop() if len(shapes) == 1 else None


def _sets(
    topic: str,
    by_topic: Mapping[str, Sequence[bytes]],
    children: Mapping[str, set[str]],
    parents: Mapping[str, set[str]],
) -> str | None:
    """The sibling state a topic sets (``c`` for ``<device>/col``), or None.

    ``children``: each parent level's last levels; ``parents``: each last level's
    parents, both over the captured topics.
    """
    parent, _, last = topic.rpartition("/")
    shape = _shape({p.strip() for p in by_topic[topic] if p.strip()})
    if not parent or shape is None:
        return None
    siblings = children.get(parent, set())
    for state in (last[:k] for k in range(1, len(last))):  # the names it extends
        if state not in siblings:
            continue
        if not any(c.isalpha() for c in last[len(state) :]):
            continue  # POWER1 beside POWER: a second channel, not a command
        if _shape({p.strip() for p in by_topic[f"{parent}/{state}"] if p.strip()}) != shape:
            continue
        depth = topic.count("/")
        alike = [p for p in parents[state] if p.count("/") + 1 == depth and p != parent]
        if any(f"{p}/{last}" not in by_topic for p in alike):
            return state
    return None


def _clock(text: bytes, now: float) -> bool:
    """A plain value that is an epoch time within ten years of now."""
    try:
        number = float(text)
    except ValueError:
        return False
    return any(abs(number / 10**d - now) < 10 * 365 * 86400 for d in (0, 3, 6, 9))


def chore_patterns(
    topics: list[str],
    kind: str,
    known: Known,
    roots: set[str] | None = None,
    reasons: Mapping[str, str] | None = None,
) -> list[Pattern]:
    """Ignore rules for housekeeping topics, one per filter shape, each saying why.

    ``reasons``: why a topic is housekeeping where its words do not say it
    (:func:`commands`).
    """
    shapes: dict[tuple[str, ...], set[str]] = {}
    whys: dict[tuple[str, ...], str] = {}
    for topic in topics:
        shape, why = _chore_shape(topic, kind, known, roots or set())
        if reasons and topic in reasons and not why.startswith(("last level", "under")):
            why = reasons[topic]
            if len(shape) <= 2:  # not +/<last>: any first level
                shape = tuple(literal(lv) for lv in topic.split("/"))
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


def same_shapes(patterns: list[Pattern]) -> list[Pattern]:
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
        if i >= len(parts) or not (variable(level) or level == parts[i]):
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


def merge_tail(
    patterns: list[Pattern], taken: set[str], filters: Sequence[Sequence[str]]
) -> list[Pattern]:
    """Ignore rules made one wide rule (``<common levels>/#``), tried last.

    evcc's ``evcc/+/+/+/set`` and ``evcc/status``, ``evcc/updated`` become ``evcc/#``;
    Victron's ``R/#``, ``W/#`` and ``N/+/full_publish_completed``, ``+/<portal>/#``: the
    levels all their topics share, each literal where it is one value, ``+`` where not,
    up to the last literal one (at least one). The first matching rule takes a message,
    so the wide rule, tried after the rules that store, ignores only what no rule before
    it stores. All the ignore rules are made one where they can be, else those of each
    first level. Made only where, in rule order, every captured topic is still taken by
    the rule that took it, and the wide rule takes no topic of a preset (``taken``: the
    captured topics the presets take; ``filters``: their topic filters, none of which may
    overlap it). A rule that says more than that it looks like housekeeping (discovery
    configs it read) stays its own. ``patterns`` and the result are in rule order.
    """
    eligible = [
        p
        for p in patterns
        if p.kind in {"ignore", "binary"}
        and not p.match
        and p.topics
        and all(n.startswith("looks like housekeeping") for n in p.notes)
        and not any(t.startswith("$") for t in p.topics)
    ]
    whole = _widen(patterns, eligible, taken, filters)
    if whole is not None:
        return whole
    groups: dict[str, list[Pattern]] = {}
    for pattern in eligible:
        firsts = {t.split("/", 1)[0] for t in pattern.topics}
        if len(firsts) == 1:
            groups.setdefault(firsts.pop(), []).append(pattern)
    out = list(patterns)
    for group in groups.values():
        out = _widen(out, group, taken, filters) or out
    return out


def _wide_levels(topics: set[str]) -> list[str] | None:
    """The levels all topics share (literal where one value, else ``+``), then ``#``."""
    rows = [t.split("/") for t in topics]
    levels = []
    for i in range(min(len(r) for r in rows)):
        values = {r[i] for r in rows}
        levels.append(literal(values.pop()) if len(values) == 1 else "+")
    while levels and levels[-1] == "+":
        levels.pop()
    return [*levels, "#"] if levels else None


def _widen(
    out: list[Pattern],
    group: list[Pattern],
    taken: set[str],
    filters: Sequence[Sequence[str]],
) -> list[Pattern] | None:
    """``out`` with the group's ignore rules made one wide rule, or None if it cannot."""
    if len(group) < 2:
        return None
    topics = set().union(*(p.topics for p in group))
    levels = _wide_levels(topics)
    if levels is None:
        return None
    wide = Pattern(levels, "ignore", topics)
    trial = sorted([p for p in out if all(p is not g for g in group)] + [wide], key=order)

    def first_rule(rules: list[Pattern], topic: str) -> Pattern | None:
        return next((p for p in rules if matches(p.levels, topic)), None)

    kept = all(
        first_rule(trial, t) is (wide if t in topics else first_rule(out, t))
        for p in out
        for t in p.topics
    )
    if not kept or any(matches(levels, t) for t in taken):
        return None
    if any(overlap(levels, f) is not None for f in filters):
        return None
    lasts = sorted({t.rsplit("/", 1)[-1] for t in topics})
    shown = ", ".join(lasts[:6]) + (f" and {len(lasts) - 6} more" if len(lasts) > 6 else "")
    under = "/".join(levels[:-1])
    wide.notes.append(
        f"looks like housekeeping (topics ending {shown}, and any other topic under "
        f"{under} that no rule before it stores): ignored; delete this rule to store them"
    )
    return trial


def list_chores(patterns: list[Pattern]) -> list[Pattern]:
    """The ignore rules of each first level made one rule that lists their filters.

    WLED's ``wled/+/api``, ``wled/+/col``, ``wled/+/status`` and ``wled/all`` become one
    rule with ``topic = [...]``, each filter keeping its notes, in the place of the
    first of them. Made only where, in rule order, every captured topic is still taken
    by the rule that took it (or by the list, for its own filters), and no filter of the
    list takes another's topics. ``patterns`` and the result are in rule order.
    """
    if not supports("topic_list"):
        return patterns
    groups: dict[str, list[Pattern]] = {}
    for pattern in patterns:
        if (
            pattern.kind == "ignore"
            and not pattern.match
            and not pattern.filters
            and pattern.topics
            and not variable(pattern.levels[0])
            and not any(lv.startswith("{") for lv in pattern.levels)
        ):
            groups.setdefault(pattern.levels[0], []).append(pattern)
    out = list(patterns)
    for members in groups.values():
        group = members[:MAX_TOPICS]
        if len(group) < 2 or any(
            a is not b and filter_covers(a.levels, b.levels) for a in group for b in group
        ):
            continue
        listed = Pattern(
            [*group[0].levels], "ignore", set().union(*(p.topics for p in group)), filters=group
        )
        trial = [listed if p is group[0] else p for p in out if all(p is not g for g in group[1:])]
        before = {t: _first(out, t) for p in out for t in p.topics}
        if all(
            _first(trial, t) is (listed if any(rule is g for g in group) else rule)
            for t, rule in before.items()
        ):
            out = trial
    return out


def _first(rules: list[Pattern], topic: str) -> Pattern | None:
    """The first rule (in order) whose filter, or one of whose filters, takes ``topic``."""
    return next((p for p in rules if any(matches(f.levels, topic) for f in p.filters or [p])), None)
