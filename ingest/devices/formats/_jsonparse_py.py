# cython: annotation_typing=False
"""The ``json`` format's rules, written once (see ingest/devices/formats/json.py).

This module runs as it is (the pure-Python path) and is compiled by Cython as
``ingest.devices.formats._jsonparse_c`` with the types of ``_jsonparse_c.pxd`` (setup.py);
json.py picks one of the two. :func:`parse` reads the whole payload; where the selective
scanner is built (the kernel ``_json_c.pyx``), :func:`parse_selective` has it prune the
payload to what a rule with ``root`` or ``each`` reads, then applies the same rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import orjson

from ingest import accel
from ingest.devices.formats import MAX_DEPTH, MAX_FIELDS, Item, Parsed, refused
from ingest.model import Rejection

if TYPE_CHECKING:
    from ingest.devices.decode import Limits
    from ingest.devices.rules import Rule


_new = tuple.__new__


class _TooMany(Exception):  # noqa: N818 - a signal inside flatten, never seen outside
    pass


def parse(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """Readings from a JSON object or an array of objects (the whole payload parsed)."""
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
        return refused(
            "bad_shape", f"expected a JSON object or an array of objects, got {type(doc).__name__}"
        )
    if rule.paths:
        return _parse_paths(objects, rule, captures, limits)
    out = _new(Parsed, ([], []))
    several = len(objects) > 1
    for index, obj in enumerate(objects):
        if type(obj) is not dict:
            out.rejections.append(
                Rejection(
                    "bad_shape",
                    f"a reading must be an object, got {type(obj).__name__}",
                    index if several else None,
                )
            )
            continue
        fields: dict[str, object] = {}
        problems: list[Rejection] = []
        try:
            _flatten(obj, "", rule.flatten, fields, problems, 1)
        except _TooMany:
            out.rejections.append(
                Rejection(
                    "bad_shape",
                    f"more than {MAX_FIELDS} fields in one reading",
                    index if several else None,
                )
            )
            continue
        ts = fields.pop(rule.time_flat, None) if rule.time_flat is not None else None
        # Positional, through tuple.__new__: the NamedTuple's keyword handling is slow.
        out.items.append(
            _new(
                Item,
                (
                    fields,
                    ts,
                    None,
                    None,
                    None,
                    None,
                    None,
                    problems or None,
                    index if several else None,
                ),
            )
        )
    return out


def walk(obj: object, path: tuple[str, ...]) -> object:
    """The value at ``path`` (keys of nested objects), or ``ABSENT`` (also for discover)."""
    for key in path:
        if type(obj) is not dict:
            return ABSENT
        obj = obj.get(key, ABSENT)
        if obj is ABSENT:
            return ABSENT
    return obj


ABSENT = object()  # what walk() gives for a path the payload does not have


def _readings(doc: dict[str, object], rule: Rule) -> list[tuple[object, str | None]] | Rejection:
    """The objects of one payload object that are readings, with their ``{_key}``."""
    if rule.root is not None:
        obj = walk(doc, rule.root)
        if type(obj) is not dict:
            return Rejection("no_measurements", f"no object at {'.'.join(rule.root)}")
        return [(obj, None)]
    if rule.each is None:
        return [(doc, None)]
    inner = walk(doc, rule.each)
    if inner is ABSENT:  # not a gateway's message: the payload is one reading
        return [(doc, None)]
    if type(inner) is list:
        return [(obj, None) for obj in inner]
    if type(inner) is dict:
        return [(obj, key) for key, obj in inner.items()]
    return Rejection(
        "bad_shape",
        f"{'.'.join(rule.each)}: expected an array or an object, got {type(inner).__name__}",
    )


def template_text(value: object) -> str | None:
    """A payload value as a template renders it: strings as they are, integers in decimal.

    None for anything else (a float, a boolean, null, an object, an array): absent.
    """
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if kind is int:
        return str(value)
    return None


def _parse_paths(
    objects: list[object], rule: Rule, captures: dict[str, str], limits: Limits
) -> Parsed:
    """:func:`parse` for rules with ``root``, ``each``, payload variables or a time path."""
    items: list[Item] = []
    rejections: list[Rejection] = []
    found: list[tuple[object, str | None, dict[str, object]]] = []
    for index, top in enumerate(objects):
        if type(top) is not dict:
            rejections.append(
                Rejection(
                    "bad_shape",
                    f"a reading must be an object, got {type(top).__name__}",
                    index if len(objects) > 1 else None,
                )
            )
            continue
        readings = _readings(top, rule)
        if type(readings) is Rejection:
            rejections.append(
                Rejection(readings.reason, readings.detail, index if len(objects) > 1 else None)
            )
            continue
        for obj, key in readings:  # type: ignore[union-attr]
            found.append((obj, key, top))
    if len(found) > limits.max_readings:
        return refused("too_many_readings", f"{len(found)} readings > {limits.max_readings}")
    several = len(found) > 1
    sep = rule.flatten
    for index, (obj, key, top) in enumerate(found):
        position = index if several else None
        if type(obj) is not dict:
            rejections.append(
                Rejection(
                    "bad_shape", f"a reading must be an object, got {type(obj).__name__}", position
                )
            )
            continue
        fields: dict[str, object] = {}
        problems: list[Rejection] = []
        try:
            _flatten(obj, "", sep, fields, problems, 1)
        except _TooMany:
            rejections.append(
                Rejection("bad_shape", f"more than {MAX_FIELDS} fields in one reading", position)
            )
            continue
        ts: object = None
        if rule.time_path is not None:
            ts = fields.pop(rule.time_flat, ABSENT)  # type: ignore[arg-type]
            if ts is ABSENT:
                ts = None if obj is top else walk(top, rule.time_path)
                ts = None if ts is ABSENT else ts
        context: dict[str, str] | None = None
        if rule.variables or key is not None:
            context = dict(captures)
            if key is not None:
                context["_key"] = key
            for name, path in rule.variables:
                if name in context:
                    continue
                value = walk(obj, path)
                if value is not ABSENT:
                    fields.pop(sep.join(path), None)  # identity, not a measurement
                elif obj is not top:
                    value = walk(top, path)
                text = template_text(value)
                if text is not None:
                    context[name] = text
        items.append(
            _new(Item, (fields, ts, None, None, None, None, context, problems or None, position))
        )
    return _new(Parsed, (items, rejections))


def _flatten(
    obj: dict[str, object],
    prefix: str,
    sep: str,
    out: dict[str, object],
    problems: list[Rejection],
    depth: int,
) -> None:
    for key, value in obj.items():
        name = prefix + key if prefix else key
        if type(value) is dict:
            if depth >= MAX_DEPTH:
                problems.append(
                    Rejection("bad_value", f"{name[:80]}: nested deeper than {MAX_DEPTH} levels")
                )
                continue
            _flatten(value, name + sep, sep, out, problems, depth + 1)
            continue
        if len(out) >= MAX_FIELDS:
            raise _TooMany
        out[name] = value


class Selection(Protocol):
    """The compiled selective scanner (``_json_c.Selection``) of a rule's payload paths."""

    def pruned(self, payload: bytes) -> dict[str, object] | None:
        """The payload object with only the paths, or None: not sure (parse it whole)."""


def no_selection(paths: tuple[tuple[str, ...], ...]) -> Selection | None:  # noqa: ARG001
    """What the pure-Python path has of the selective scanner: nothing."""
    return None


# Built where a C compiler is: the kernel that reads only what a rule with root or each
# needs (ingest/devices/formats/_json_c.pyx); no_selection on the pure-Python path.
_Selection = accel.pick(no_selection, "ingest.devices.formats._json_c", "Selection")
_selections: dict[Rule, Selection | None] = {}
_MAX_SELECTIONS = 1024  # rules remembered (a process has a fixed set)


def _selection(rule: Rule) -> Selection | None:
    """The scanner of the paths :func:`_parse_paths` reads, or None: parse the whole object."""
    target = rule.root if rule.root is not None else rule.each
    if target is None:
        return None  # the payload object itself is a reading: all of it is read
    paths = (target, *((rule.time_path,) if rule.time_path else ()))
    try:
        return _Selection(paths + tuple(path for _name, path in rule.variables))
    except ValueError:  # a key of no UTF-8 form, or too many keys: parsed whole
        return None


def parse_selective(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """:func:`parse`, building only what a rule with ``root`` or ``each`` reads.

    The compiled scanner prunes the payload object to the rule's paths; anything it is
    not sure of, and a gateway's ``each`` that is absent (the whole object is then the
    reading), is parsed whole.
    """
    if rule.paths and type(payload) is bytes:
        try:
            selection = _selections[rule]
        except KeyError:
            if len(_selections) >= _MAX_SELECTIONS:
                _selections.clear()
            selection = _selections[rule] = _selection(rule)
        if selection is not None:
            doc = selection.pruned(payload)
            if doc is not None and (rule.each is None or walk(doc, rule.each) is not ABSENT):
                return _parse_paths([doc], rule, captures, limits)
    return parse(payload, rule, captures, limits)


def selective() -> bool:
    """Whether the selective scanner is built (else :func:`parse_selective` is :func:`parse`)."""
    return _Selection is not no_selection
