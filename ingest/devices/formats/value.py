"""``value``: the payload is one plain value; its name comes from the topic.

``22.5`` and ``-3`` are numbers, ``true``/``false`` (any case) booleans, ``null`` nothing,
a JSON string (``"text"``) its text, anything else the text itself (``on``, ``idle``).
A JSON object or array is refused: that is the json format's job.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import orjson

from ingest.devices.formats import Item, Parsed, refused, text_of

if TYPE_CHECKING:
    from ingest.devices.decode import Limits
    from ingest.devices.rules import Rule

_BOOLEANS = {"true": True, "false": False}


def scalar(text: str) -> object:
    """A plain value from its text: int, float, bool, None or the string itself."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in _BOOLEANS:
        return _BOOLEANS[lowered]
    if lowered == "null":
        return None
    first = stripped[:1]
    if (first.isdigit() or first in {"-", "+", "."}) and "_" not in stripped:
        try:
            return int(stripped)
        except ValueError:
            pass
        try:
            number = float(stripped)
        except ValueError:
            return stripped
        return number if math.isfinite(number) else stripped
    if first == '"':
        try:
            decoded = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return stripped
        return decoded if type(decoded) is str else stripped
    return stripped


def parse(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """One reading holding the payload's value under the rule's measurement name."""
    del limits  # the payload size is checked before any format runs
    text = text_of(payload)
    if text is None:
        return refused("invalid_utf8", "payload is not UTF-8")
    if text.lstrip()[:1] in {"{", "["}:
        return refused("bad_shape", "a JSON object or array, not a plain value "
                                    '(use format = "json")')
    assert rule.measurement is not None  # the rules loader requires one for this format
    name = rule.measurement.render(captures)
    if name is None:
        return refused("bad_field_name", "the measurement template has no value")
    value = scalar(text)
    return Parsed([Item({name: value})], [])
