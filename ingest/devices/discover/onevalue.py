"""One value per topic in JSON: ``{"value": 21.5}``, ``{"time": ..., "value": 21.5}``.

Victron's Venus OS publishes each D-Bus path on a topic of its own
(``N/<portal>/battery/512/Dc/0/Voltage`` ``{"value": 53.12}``), paths of several depths
under one device. The measurement is in the topic, not the payload: :func:`split`
proposes ONE json rule per tree, the device from the levels that vary with devices
(``{level3}-{level4}``: battery-512), the measurement from the levels after it
(``measurement = "{property}"``, a last capture ``{property#}`` of one or several
levels, joined with ``_``), the time from the payload. Where the mapping cannot name a
json measurement from the topic yet (:mod:`ingest.devices.discover.language`), the
topics are left to the usual grouping. Pure functions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ingest.devices.discover.chores import housekeeping
from ingest.devices.discover.identity import json_docs
from ingest.devices.discover.language import supports
from ingest.devices.discover.patterns import EXTRAS, Captured, Pattern, literal

if TYPE_CHECKING:
    from collections.abc import Sequence


def one_value(payloads: Sequence[bytes]) -> bool:
    """Whether every JSON payload is an object holding one ``value`` (and extras)."""
    docs = json_docs([p for p in payloads if p.strip()])
    return bool(docs) and all(
        type(d) is dict
        and "value" in d
        and set(d) - {"value"} <= EXTRAS
        and all(type(v) not in {dict, list} for v in d.values())
        for d in docs
    )


def split(messages: list[Captured]) -> tuple[list[Pattern], list[Captured]]:
    """Rules for the one-value JSON trees, and the messages they leave to the others."""
    if not supports("json_measurement"):
        return [], messages
    by_topic: dict[str, list[bytes]] = {}
    for msg in messages:
        by_topic.setdefault(msg.topic, []).append(msg.payload)
    roots = {t.split("/", 1)[0] for t in by_topic}
    now = time.time()
    ones = sorted(
        t
        for t, ps in by_topic.items()
        if one_value(ps) and not housekeeping(t, "json", ps, roots, now)
    )
    multi = supports("multi_level")
    trees: dict[tuple[str, int], list[str]] = {}
    for topic in ones:
        levels = topic.split("/")
        if len(levels) > 2:
            trees.setdefault((levels[0], 0 if multi else len(levels)), []).append(topic)
    patterns = [_tree(topics, multi) for topics in trees.values()]
    for pattern in patterns:
        pattern.payloads = {t: by_topic[t][:20] for t in pattern.topics}
    taken = {t for p in patterns for t in p.topics}
    return patterns, [m for m in messages if m.topic not in taken]


def _tree(topics: list[str], multi: bool) -> Pattern:
    """One rule for a tree of one-value topics."""
    rows = [t.split("/") for t in topics]
    shortest = min(len(r) for r in rows)
    values = [sorted({r[i] for r in rows}) for i in range(shortest)]
    varying = [i for i in range(1, shortest - 1) if len(values[i]) > 1]
    device = max(varying, default=shortest - 2)
    levels = [
        f"{{level{i + 1}}}" if i in varying else literal(values[i][0]) for i in range(device + 1)
    ]
    if multi:
        levels.append("{property#}")
        measurement = "{property}"
    else:
        props = [f"{{p{k + 1}}}" for k in range(shortest - device - 1)]
        levels += props
        measurement = "_".join(props)
    pattern = Pattern(levels, "json", set(topics))
    pattern.measurement = measurement
    parts = [f"{{level{i + 1}}}" for i in varying] or [values[device][0]]
    pattern.sensor_id = ["-".join(parts)]
    shown = ", ".join(sorted({"-".join(r[i] for i in varying) for r in rows})[:3])
    pattern.notes.append(
        'one value per topic ({"value": ...}): the measurement is the rest of the topic '
        f"after the device (levels joined with _), the device the levels that vary "
        f"({shown}, ...)"
    )
    return pattern


def merge_values(patterns: list[Pattern]) -> list[Pattern]:
    """Plain-value rules of one device level but several depths, made one.

    ``solar/{sensor_id}/{measurement}`` and ``solar/{sensor_id}/{level3}/{measurement}``
    become ``solar/{sensor_id}/{measurement#}``, where the mapping has such a capture.
    """
    if not supports("multi_level"):
        return patterns
    by_prefix: dict[tuple[str, ...], list[Pattern]] = {}
    out = []
    for pattern in patterns:
        levels = pattern.levels
        device = levels.index("{sensor_id}") if "{sensor_id}" in levels else -1
        after = levels[device + 1 :]
        if (
            pattern.kind == "value"
            and device >= 0
            and after
            and all(lv.startswith("{") for lv in after)
            and not pattern.sensor_id
            and not pattern.tags
        ):
            by_prefix.setdefault(tuple(levels[: device + 1]), []).append(pattern)
        else:
            out.append(pattern)
    for prefix, group in by_prefix.items():
        if len(group) == 1:
            out += group
            continue
        merged = Pattern(
            [*prefix, "{measurement#}"], "value", set().union(*(p.topics for p in group))
        )
        merged.measurement = "{measurement}"
        merged.payloads = {t: ps for p in group for t, ps in p.payloads.items()}
        for p in group:
            merged.units.update(p.units)
            merged.values.update(p.values)
            merged.notes += [n for n in p.notes if n not in merged.notes]
        merged.notes.append(
            "topics of several depths after the device: the measurement is the rest of the "
            "topic, its levels joined with _"
        )
        out.append(merged)
    return out
