"""Proposed rules that leave the presets' topics to the presets.

A mapping file's rules are tried before any preset's, and the first matching rule takes a
message. A proposed rule whose filter also matches a topic a recommended preset handles
(``{level1}/{sensor_id}/{measurement}`` over ``tele/tasmota_1A2B3C/SENSOR``) would take
that topic from the preset. :func:`separate` narrows such a rule: a variable level is
split into one rule per value the capture showed (``plant/...``, ``barn/...``) until the
rule takes none of the captured topics that belong elsewhere, and, where a split of a few
values can, none that a preset's filter could ever match. What overlap remains (a preset
with a filter as wide as ``+/status/+``) is written as a NOTE naming the preset's rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.devices.discover.patterns import order

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ingest.devices.discover.patterns import Pattern
    from ingest.devices.rules import Rule

MAX_SPLIT = 8  # rules one split may make to avoid a preset's filter (topics not captured)


def _wild(level: str) -> bool:
    return level in {"+", "#"} or level.startswith("{")


def _rest(level: str) -> bool:
    """A last level that takes the rest of the topic.

    ``#``: zero or more levels; a ``{name#}`` capture: one or more.
    """
    return level == "#" or (level.startswith("{") and level.endswith("#}"))


def matches(levels: Sequence[str], topic: str) -> bool:
    """Whether the filter takes topic.

    Levels: literal, ``+``, ``{capture}``, a last ``#`` or ``{capture#}``.
    """
    parts = topic.split("/")
    if _wild(levels[0]) and parts[0].startswith("$"):
        return False
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if _rest(level):
            return i < len(parts)
        if i >= len(parts) or (not _wild(level) and level != parts[i]):
            return False
    return len(parts) == len(levels)


def overlap(a: Sequence[str], b: Sequence[str]) -> str | None:
    """A topic both filters take (``x`` for a level both leave open), or None."""
    if (_wild(a[0]) and b[0].startswith("$")) or (_wild(b[0]) and a[0].startswith("$")):
        return None
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if (x is not None and _rest(x) and x != "#" and y is not None) or (
            y is not None and _rest(y) and y != "#" and x is not None
        ):
            # {name#} takes one or more levels: as # once this level is present
            x = "#" if x is not None and _rest(x) else x
            y = "#" if y is not None and _rest(y) else y
        if x == "#" or y == "#":
            other = y if x == "#" else x
            if other is None or other == "#":
                return "/".join(out) if out else "x"
            rest = (a if x != "#" else b)[i:]
            return "/".join(out + [lv if not _wild(lv) else "x" for lv in rest if lv != "#"])
        if x is None or y is None:
            return None
        if _wild(x) and _wild(y):
            out.append("x")
        elif _wild(x) or _wild(y) or x == y:
            out.append(y if _wild(x) else x)
        else:
            return None
    return "/".join(out)


def _order(pattern: Pattern) -> list[int]:
    """Variable levels in the order to split them: tags and ``+`` first, the device last.

    Never a last ``#``: a Homie domain's rule takes its whole tree.
    """
    levels = pattern.levels
    others = [
        i
        for i, lv in enumerate(levels)
        if _wild(lv) and not _rest(lv) and lv not in {"{sensor_id}", "{measurement}"}
    ]
    return [
        *others,
        *(i for i, lv in enumerate(levels) if lv == "{measurement}"),
        *(i for i, lv in enumerate(levels) if lv == "{sensor_id}"),
    ]


def split(pattern: Pattern, index: int) -> list[Pattern]:
    """One pattern per value the captured topics take at level ``index``."""
    groups: dict[str, set[str]] = {}
    for topic in pattern.topics:
        groups.setdefault(topic.split("/")[index], set()).add(topic)
    out = []
    for value, topics in sorted(groups.items()):
        if any(c in value for c in "+#{}") or not value:
            return [pattern]  # not writable as a literal level
        out.append(pattern.narrowed(index, value, topics))
    return out


def separate(patterns: list[Pattern], presets: Sequence[Rule], taken: set[str]) -> list[Pattern]:
    """The patterns narrowed until none takes a captured topic that is not its own.

    ``taken``: the captured topics the presets' rules take. The result is in rule order
    (:func:`ingest.devices.discover.patterns.order`); a pattern found taking another's topics in
    that order is separated again from exactly those.
    """
    out = [q for p in patterns for q in Separator(presets, taken, patterns).separate(p)]
    for _ in range(3):
        out.sort(key=order)
        stolen: dict[int, set[str]] = {}
        for pattern in out:
            for topic in pattern.topics:
                first = next(i for i, p in enumerate(out) if matches(p.levels, topic))
                if out[first] is not pattern:
                    stolen.setdefault(first, set()).add(topic)
        if not stolen:
            break
        out = [
            q
            for i, p in enumerate(out)
            for q in (Separator(presets, taken | stolen[i], []).separate(p) if i in stolen else [p])
        ]
    return sorted(out, key=order)


class Separator:
    """Splits a proposed pattern away from the topics and filters of other rules."""

    def __init__(
        self, presets: Sequence[Rule], taken: set[str], proposals: Sequence[Pattern]
    ) -> None:
        self.filters = [(f.split("/"), r) for r in presets for f in r.subscriptions]
        self.taken = taken
        self.proposals = proposals

    def _hard(self, pattern: Pattern) -> list[str]:
        """Captured topics it would take from a preset or from a proposal tried after it."""
        later = {t for p in self.proposals if order(p) >= order(pattern) for t in p.topics}
        return [
            t for t in self.taken | later if t not in pattern.topics and matches(pattern.levels, t)
        ]

    def _soft(self, pattern: Pattern) -> list[tuple[Rule, str, str]]:
        out = []
        for levels, rule in self.filters:
            topic = overlap(pattern.levels, levels)
            if topic is not None:
                out.append((rule, topic, "/".join(levels)))
        return out

    def separate(self, pattern: Pattern) -> list[Pattern]:
        """``pattern``, split until it takes no other rule's captured topic."""
        hard, soft = self._hard(pattern), self._soft(pattern)
        if not hard and not soft:
            return [pattern]
        tries = [(i, split(pattern, i)) for i in _order(pattern)]
        tries = [
            (i, parts) for i, parts in tries if len(parts) > 1 or parts[0].levels != pattern.levels
        ]
        for i, parts in tries:
            cheap = pattern.levels[i] != "{sensor_id}" and len(parts) <= MAX_SPLIT
            if cheap and not any(self._hard(p) or self._soft(p) for p in parts):
                return [self._explain(p, pattern, soft) for p in parts]
        if hard:
            for _, parts in tries:
                if sum(len(self._hard(p)) for p in parts) < len(hard):
                    return [
                        q for p in parts for q in self.separate(self._explain(p, pattern, soft))
                    ]
        self._note(pattern, soft)
        return [pattern]

    def _explain(self, part: Pattern, whole: Pattern, soft: list[tuple[Rule, str, str]]) -> Pattern:
        if (
            soft
            and part.levels != whole.levels
            and not any(n.startswith("narrowed from") for n in part.notes)
        ):
            names = sorted({r.source.removeprefix("--") for r, _, _ in soft})
            part.notes.append(
                f"narrowed from {'/'.join(whole.levels)}, which would also "
                f"take topics of {', '.join(names)} (this file's rules are "
                "tried first)"
            )
        return part

    def _note(self, pattern: Pattern, soft: list[tuple[Rule, str, str]]) -> None:
        by_source: dict[str, list[tuple[Rule, str, str]]] = {}
        for rule, topic, shared in soft:
            by_source.setdefault(rule.source.removeprefix("--"), []).append((rule, topic, shared))
        for source, found in sorted(by_source.items()):
            (rule, topic, shared), more = found[0], len(found) - 1
            pattern.notes.append(
                f"a topic such as {topic} would match this rule before {source}'s rule "
                f"{rule.name} ({shared})"
                + (f" and {more} more of its rules" if more else "")
                + "; none was captured"
            )
