"""``ingest check``: what one message would be stored as, or why it would be rejected.

Runs the same decoding as the daemon (the mapping rules, or the default format when
none are given) on a topic and payload from the command line or stdin, and prints one
JSON line per reading that would be stored, one line per rejection, or the rule that
ignores the message. Exit status: 0 if something was accepted or ignored, 1 if
everything was rejected (2 for bad arguments, from the CLI).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import orjson

from ingest.devices.decode import Limits, decode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ingest.devices.mapping import Mapping
    from ingest.model import Decoded, Reading


def reading_line(rule: str | None, reading: Reading) -> str:
    """One reading as the JSON line ``check`` prints."""
    line = {
        "rule": rule,
        "sensor_id": reading.sensor_id,
        "ts": reading.ts.isoformat(timespec="milliseconds"),
        "values": reading.values,
        "tags": reading.tags or {},
        "units": reading.units or {},
    }
    if reading.info:
        line["info"] = reading.info
    return orjson.dumps(line).decode()


def check(
    mapping: Mapping | None,
    topic: str,
    payload_arg: str,
    limits: Limits | None = None,
    earlier: Sequence[tuple[str, str]] = (),
) -> int:
    """Decode one message and print the outcome; return the exit status.

    ``earlier`` (topic, payload) messages are decoded first, in order, and only leave
    their state (a stateful format's: Homie attributes, a Sparkplug BIRTH).
    """
    limits = limits or Limits()
    for before, text in earlier:
        if mapping is not None:
            mapping.decode(before, text.encode("utf-8", "surrogateescape"), time.time(), limits)
    if payload_arg == "-":
        payload = sys.stdin.buffer.read(limits.max_message_bytes + 1)
    else:
        payload = payload_arg.encode("utf-8", "surrogateescape")
    now = time.time()
    rule: str | None = None
    if mapping is None:
        decoded: Decoded = decode(topic, payload, now, limits)
    else:
        for line in mapping.passed_over(topic, payload):
            print(line)  # noqa: T201 - the command's output
        result = mapping.decode(topic, payload, now, limits)
        rule = result.rule.name if result.rule is not None else None
        if result.ignored:
            taken = result.rule
            where = (
                f" (topic filter {mapping.filter_of(taken, topic)})"
                if taken is not None and len(taken.topics) > 1
                else ""
            )
            print(f"ignored by rule {rule}{where}")  # noqa: T201 - the command's output
            return 0
        decoded = result.decoded
        if not decoded.readings and not decoded.rejections:
            print(f"no reading: rule {rule} takes the message as state")  # noqa: T201
            return 0
    for reading in decoded.readings:
        print(reading_line(rule, reading))  # noqa: T201
    for rejection in decoded.rejections:
        where = f" (reading {rejection.index})" if rejection.index is not None else ""
        print(f"rejected{where}: {rejection.reason}: {rejection.detail}")  # noqa: T201
    return 0 if decoded.readings else 1
