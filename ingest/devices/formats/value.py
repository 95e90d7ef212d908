"""``value``: the payload is one plain value; its name comes from the topic.

``22.5`` and ``-3`` are numbers, ``true``/``false`` (any case) booleans, ``null`` nothing,
a JSON string (``"text"``) its text, anything else the text itself (``on``, ``idle``).
A JSON object or array is refused: that is the json format's job. A measurement the rule
declares a string (``[rule.types]``) keeps the payload's text (``0012``, ``true``).
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
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
        return refused(
            "bad_shape", 'a JSON object or array, not a plain value (use format = "json")'
        )
    assert rule.measurement is not None  # the rules loader requires one for this format
    name = rule.measurement.render(captures)
    if name is None:
        return refused("bad_field_name", "the measurement template has no value")
    value = scalar(text)
    if rule.types and value is not None and type(value) is not str and _text_kind(rule, name):
        value = _text(text)  # declared a string: "0012" and "true" stay text
    return Parsed([Item({name: value})], [])


def _text_kind(rule: Rule, name: str) -> bool:
    """Whether ``[rule.types]`` declares the measurement a string (first match wins)."""
    return next((kind for glob, kind in rule.types if fnmatchcase(name, glob)), "") == "string"


def _text(text: str) -> str:
    """The payload as text: a JSON string's own text, else the text stripped."""
    stripped = text.strip()
    if stripped[:1] == '"':
        try:
            decoded = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return stripped
        if type(decoded) is str:
            return decoded
    return stripped
