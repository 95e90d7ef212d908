"""``json``: one JSON object is one reading; nested objects flatten into one level.

``{"temperature": 21.7, "update": {"state": "idle"}}`` becomes the fields
``temperature`` and ``update_state`` (joined with the rule's ``flatten``). An array of
objects is several readings. Arrays inside a reading, and nesting deeper than
:data:`MAX_DEPTH`, are refused field by field; more than :data:`MAX_FIELDS` fields refuse
the reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from ingest.formats import MAX_DEPTH, MAX_FIELDS, Item, Parsed, refused
from ingest.model import Rejection

if TYPE_CHECKING:
    from ingest.decode import Limits
    from ingest.rules import Rule


_new = tuple.__new__


class _TooMany(Exception):  # noqa: N818 - a signal inside flatten, never seen outside
    pass


def parse(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """Readings from a JSON object or an array of objects."""
    del captures  # json takes nothing from the topic
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        reason = "invalid_json"
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            reason = "invalid_utf8"
        return refused(reason, str(exc).split("\n", 1)[0][:200])
    if type(doc) is dict:
        objects: list[object] = [doc]
    elif type(doc) is list:
        objects = doc
        if not objects:
            return refused("no_readings", "an empty array")
        if len(objects) > limits.max_readings:
            return refused("too_many_readings", f"{len(objects)} readings > {limits.max_readings}")
    else:
        return refused("bad_shape", f"expected a JSON object or an array of objects, got "
                                    f"{type(doc).__name__}")
    out = Parsed([], [])
    several = len(objects) > 1
    for index, obj in enumerate(objects):
        if type(obj) is not dict:
            out.rejections.append(Rejection(
                "bad_shape", f"a reading must be an object, got {type(obj).__name__}",
                index if several else None))
            continue
        fields: dict[str, object] = {}
        problems: list[Rejection] = []
        try:
            _flatten(obj, "", rule.flatten, fields, problems, 1)
        except _TooMany:
            out.rejections.append(Rejection(
                "bad_shape", f"more than {MAX_FIELDS} fields in one reading",
                index if several else None))
            continue
        ts = fields.pop(rule.time.field, None) if rule.time.field is not None else None
        # Positional, through tuple.__new__: the NamedTuple's keyword handling is slow.
        out.items.append(_new(Item, (fields, ts, None, None, None, None, None,
                                     problems or None, index if several else None)))
    return out


def _flatten(obj: dict[str, object], prefix: str, sep: str, out: dict[str, object],
             problems: list[Rejection], depth: int) -> None:
    for key, value in obj.items():
        name = prefix + key if prefix else key
        if type(value) is dict:
            if depth >= MAX_DEPTH:
                problems.append(Rejection("bad_value", f"{name[:80]}: nested deeper than "
                                                       f"{MAX_DEPTH} levels"))
                continue
            _flatten(value, name + sep, sep, out, problems, depth + 1)
            continue
        if len(out) >= MAX_FIELDS:
            raise _TooMany
        out[name] = value
