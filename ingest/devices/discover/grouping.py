"""The captured topics grouped into patterns, one per rule to propose.

Topics of one depth, payload format and role (readings or housekeeping) form a group;
readings become patterns (:mod:`ingest.devices.discover.patterns`), housekeeping ignore
rules (:mod:`ingest.devices.discover.chores`). Pure functions.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ingest.devices.discover.chores import (
    chore_patterns,
    commands,
    housekeeping,
    merge_chores,
    same_shapes,
)
from ingest.devices.discover.patterns import (
    SAMPLES,
    Captured,
    Pattern,
    epoch_now,
    payload_kind,
    topic_patterns,
)

if TYPE_CHECKING:
    from ingest.devices.discover.conventions import Known


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
    now = epoch_now()
    asked = commands(by_topic)
    for topic, kind in kinds.items():
        chore = (
            housekeeping(topic, kind, by_topic[topic], roots, now)
            or topic in known.chores
            or (kind == "value" and topic in asked)
        )
        key = (topic.count("/") + 1, kind, chore, _homie_device(topic, known))
        groups.setdefault(key, []).append(topic)
    patterns: list[Pattern] = []
    for (_, kind, chore, device), topics in sorted(groups.items()):
        if chore:
            patterns.extend(chore_patterns(topics, kind, known, roots, asked))
        else:
            patterns.extend(topic_patterns(sorted(topics), kind, device))
    data = {t for (_, _, chore, _), ts in groups.items() if not chore for t in ts}
    patterns = merge_chores(same_shapes(patterns), data)
    for pattern in patterns:
        pattern.payloads = {t: by_topic[t][:SAMPLES] for t in pattern.topics}
    return patterns


def _homie_device(topic: str, known: Known) -> int:
    """The device level of a topic under a Homie device (``homie/<device>/...``), or -1."""
    levels = topic.split("/")
    for depth in range(2, len(levels)):
        if "/".join(levels[:depth]) in known.homie_devices:
            return depth - 1
    return -1
