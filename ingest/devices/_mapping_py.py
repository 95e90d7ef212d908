# cython: annotation_typing=False
"""A mapping rule applied to the items a format parsed: readings and counted rejections.

The one source of these rules (field names and values, the kinds ``[rule.types]``
declares, strings, times and their window, sensor ids, tags, units): plain Python, run as
it is, that setup.py also compiles as ``ingest.devices._mapping_c``, typed by
``_mapping_c.pxd`` (Cython's pure-Python mode); ingest/devices/mapping.py picks one of the
two (:func:`ingest.accel.pick`) and keeps the rest (which rule takes a topic). Nothing
here raises for bad input: problems are counted rejections, field by field where the rest
can be stored.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ingest.devices._decode_py import BEYOND_MAGNITUDE, MAX_MAGNITUDE
from ingest.devices.formats import senml
from ingest.devices.formats.times import LIMIT as TIME_LIMIT
from ingest.devices.formats.times import from_seconds, parse
from ingest.devices.rules import EVERY_UNIT, MAX_UNIT
from ingest.model import (
    MAX_TAG_BYTES,
    MAX_TAGS,
    RESERVED_TAGS,
    SENSOR_ID_PATTERN,
    SENSOR_ID_RULE,
    Decoded,
    Reading,
    Rejection,
)

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

if TYPE_CHECKING:
    from ingest.devices.decode import Arrivals, Limits
    from ingest.devices.formats import Item, Parsed
    from ingest.devices.rules import Rule

    class Mapping(Protocol):
        """What of a mapping.Mapping applying its rules reads: its caches, its arrivals."""

        _names: dict[str, dict[str, str | Rejection]]
        _kinds: dict[str, dict[str, str]]
        _exact: bool
        arrivals: Arrivals

        def _resolve(self, rule: Rule, raw: str) -> str | Rejection: ...
        def _kind(self, rule: Rule, name: str) -> str: ...


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_SENSOR = re.compile(SENSOR_ID_PATTERN)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_NAME = 64  # characters of a measurement or tag name (model.NAME_PATTERN)
if not cython.compiled:  # compiled: ingest/_capi.pxd's tuple_as, the same without a call
    _new = tuple.__new__  # builds a NamedTuple without its argument handling


def safe(text: str) -> str:
    """Each run of characters outside ``[A-Za-z0-9_-]`` becomes ``_``."""
    return _UNSAFE.sub("_", text)


_DROP_VALUE = object()  # a value left out, silently


class _Topic(NamedTuple):
    """What is known about a topic once matched: rule, captures, tags, sensor id."""

    rule: Rule
    captures: dict[str, str]
    tags: dict[str, str]  # shared by the topic's readings, never changed
    sensor: str | Rejection | None  # None: decided per item (payload or line tags)
    # Every tag the rule renders from the payload is descriptive (``info``), and no
    # descriptive one comes from the topic: readings keep ``tags`` as they are.
    info_only: bool = False
    # The next rule whose filter matches the topic, tried when this rule's
    # ``[rule.match]`` does not take the payload (None: no other).
    after: _Topic | None = None


def readings(
    mapping: Mapping, matched: _Topic, parsed: Parsed, received_at: float, limits: Limits
) -> Decoded:
    """The rule applied to each item a format parsed: readings and rejections in order."""
    out: Decoded = _new(Decoded, ([], parsed.rejections))
    window = (received_at - limits.max_past_seconds, received_at + limits.max_future_seconds)
    several = len(parsed.items) > 1
    for position, item in enumerate(parsed.items):
        index = item.position if item.position is not None else (position if several else None)
        reading = _reading(
            mapping,
            matched,
            item,
            received_at,
            window,
            out.rejections,
            index,
        )
        if reading is not None:
            out.readings.append(reading)
    return out


def values(
    mapping: Mapping,
    rule: Rule,
    fields: dict[str, object],
    rejections: list[Rejection],
    index: int | None,
) -> dict[str, int | float | bool | str]:
    """The item's fields as the reading's values; field-level rejections appended."""
    values: dict[str, int | float | bool | str] = {}
    names = mapping._names[rule.name]  # noqa: SLF001
    kinds = mapping._kinds[rule.name] if rule.types else None  # noqa: SLF001
    for raw, raw_value in fields.items():
        if raw_value is None:
            continue
        name = names.get(raw)
        if name is None:
            name = mapping._resolve(rule, raw)  # noqa: SLF001
        if type(name) is not str:
            rejections.append(_at(name, index))  # type: ignore[arg-type]
            continue
        if not name:
            continue
        declared = None
        if kinds is not None:
            declared = kinds.get(name)
            if declared is None:
                declared = mapping._kind(rule, name)  # noqa: SLF001
        kind = type(raw_value)
        if (
            kind is bool
            or (kind is float and -MAX_MAGNITUDE <= raw_value <= MAX_MAGNITUDE)  # type: ignore[operator]
            or (kind is int and _INT64_MIN <= raw_value <= _INT64_MAX)  # type: ignore[operator]
        ):
            stored: object = raw_value  # the common case, without a call
            if declared and (
                declared == "string" or (kind is bool) is not (declared == "boolean")
            ):  # a kind the rule does not declare
                stored = _typed(rule, name, raw_value, declared)
        elif declared:
            stored = _typed(rule, name, raw_value, declared)
        else:
            stored = _value(rule, name, raw_value)
        if type(stored) is Rejection:
            rejections.append(_at(stored, index))
            continue
        if stored is _DROP_VALUE:
            continue
        if name in values:
            rejections.append(_collision(raw, name, index))
            continue
        values[name] = stored  # type: ignore[assignment]
    return values


def _collision(raw: str, name: str, index: int | None) -> Rejection:
    return Rejection(
        "bad_field_name", f"{raw[:60]!r}: same name as another field once made safe ({name})", index
    )


def _at(rejection: Rejection, index: int | None) -> Rejection:
    if index is None or rejection.index == index:
        return rejection
    return Rejection(rejection.reason, rejection.detail, index)


def _bad_time(item: Item, rule: Rule) -> str:
    """The detail of a time that gives no instant."""
    if item.epoch is not None:  # SenML: bt + t, in seconds
        return (
            f"SenML time (bt + t) {item.epoch:.6g} s is beyond ±{TIME_LIMIT:,} s of "
            "the epoch (SenML times are seconds; bt in milliseconds?)"
        )
    return f"time {str(item.ts)[:60]!r} is not {rule.time.format} time"


def _sensor(text: str) -> str | Rejection:
    """The device's own name as its sensor id, kept exactly, or why it cannot be one.

    Never made "safe": two devices whose names differ stay two sensors.
    """
    if _SENSOR.fullmatch(text):
        return text
    return Rejection("bad_sensor_id", f"sensor id {text[:60]!r}: {SENSOR_ID_RULE}")


def _units(
    rule: Rule,
    values: dict[str, int | float | bool | str],
    variables: dict[str, str],
    units: dict[str, str] | None,
) -> dict[str, str] | None:
    """The reading's units with the rule's declared ones (which win) added.

    ``"*"`` declares the unit of every measurement that no other key names.
    """
    declared = rule.units
    for name, template in declared.items():
        if name == EVERY_UNIT:
            unit = template.render(variables)
            if unit:
                units = units if units is not None else {}
                for measurement in values:
                    if measurement not in declared:
                        units[measurement] = unit[:MAX_UNIT]
        elif name in values:
            unit = template.render(variables)
            if unit:
                units = units if units is not None else {}
                units[name] = unit[:MAX_UNIT]
    return units


def _value(rule: Rule, name: str, value: object) -> object:
    """The value to store, ``_DROP_VALUE``, or a field-level Rejection."""
    kind = type(value)
    if kind is float or kind is int:
        if not -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE:  # type: ignore[operator]  # and NaN
            return Rejection("bad_value", f"{name}: {BEYOND_MAGNITUDE}")
        return value if kind is float or _INT64_MIN <= value <= _INT64_MAX else float(value)  # type: ignore[operator,arg-type]
    if kind is bool:
        return value
    if kind is str:
        mapped = rule.values.get(value, _DROP_VALUE) if rule.values else _DROP_VALUE  # type: ignore[call-overload]
        if mapped is not _DROP_VALUE:
            return mapped
        if rule.strings == "drop":
            return _DROP_VALUE
        if rule.strings == "reject":
            return Rejection("bad_value", f'{name}: a string (strings = "reject")')
        limit = rule.max_string_bytes
        if len(value) > limit or (len(value) * 4 > limit and len(value.encode()) > limit):  # type: ignore[arg-type,attr-defined]
            return Rejection("bad_value", f"{name}: string longer than {limit} bytes")
        return value
    if kind is list:
        return Rejection("bad_value", f"{name}: an array (leave it out with drop)")
    return Rejection("bad_value", f"{name}: unsupported value ({kind.__name__})")


_FITS = {"number": (int, float), "boolean": (bool,), "string": (str,)}


def _typed(rule: Rule, name: str, value: object, declared: str) -> object:
    """:func:`_value` for a measurement of a declared kind (``[rule.types]``).

    A string the rule's ``values`` maps is the value it maps to; then a value of another
    kind is refused (``bad_value``) whatever ``strings`` says: a measurement never
    changes kind within a series.
    """
    if type(value) is str and rule.values:
        mapped = rule.values.get(value, _DROP_VALUE)
        if mapped is not _DROP_VALUE:
            return mapped if type(mapped) in _FITS[declared] else _mistyped(name, value, declared)
    if type(value) in _FITS[declared]:
        return _value(rule, name, value)  # bounds, strings and max_string_bytes
    return _mistyped(name, value, declared)


def _mistyped(name: str, value: object, declared: str) -> Rejection:
    kind = type(value)
    shown = (
        repr(value[:40])  # type: ignore[index]
        if kind is str
        else "true"
        if value is True
        else "false"
        if value is False
        else repr(value)[:40]
        if kind in (int, float)
        else "an array"
        if kind is list
        else kind.__name__
    )
    return Rejection("bad_value", f"{name}: {shown} is not a {declared} ([rule.types])")


def _tags(matched: _Topic, item: Item) -> dict[str, str] | Rejection:
    """The reading's tags: the topic's, the payload's (line protocol), the rule's."""
    rule = matched.rule
    if item.tags is None and (item.context is None or not rule.tags):
        tags = matched.tags
    else:
        tags = dict(matched.tags)
        for key, tag_value in (item.tags or {}).items():
            if key in rule.named_tags:  # part of the sensor id or the measurement names
                continue
            name = tag_name(key)
            if type(name) is not str:
                return name  # type: ignore[return-value]
            held = tags.get(name)
            if held is not None and (held != tag_value or name not in matched.tags):
                return _tag_collision(matched, item, key, name)
            tags[name] = tag_value
        # The topic's tags passed _tag_problem when the topic was matched: without line
        # tags only the rendered values are new, checked here, and all of them (in the
        # dict's order, as _tag_problem reports) only if one of them fails.
        check = item.tags is not None
        if item.context is not None:
            for key, template in rule.tags.items():
                rendered = template.render(item.context)
                if rendered is not None:
                    held = tags.get(key)
                    if (
                        held is not None
                        and held != rendered
                        and item.tags is not None
                        and key not in matched.tags
                    ):  # a line tag of that name
                        return Rejection(
                            "bad_tag_name",
                            f"tag {key}: the line says "
                            f"{held[:40]!r}, the rule's [rule.tags] "
                            f"{rendered[:40]!r}",
                        )
                    tags[key] = rendered
                    if not check:
                        check = _too_long(rendered)
        problem = _tag_problem(tags) if check or len(tags) > MAX_TAGS else None
        if problem is not None:
            return problem
    return tags


def tag_name(key: str) -> str | Rejection:
    """The name a payload's tag (line protocol) is stored under, or why it has none.

    Made safe as a field name is; a reserved name (``sensor_id``, ``units``, ``_id``)
    takes a ``_`` in front (``_sensor_id``): such a tag still tells series apart.
    """
    name = safe(key)
    if name in RESERVED_TAGS:
        return "_" + name
    if not 1 <= len(name) <= MAX_NAME:
        return Rejection(
            "bad_tag_name",
            f"tag {key[:60]!r}: not a tag name once made safe ([A-Za-z0-9_-]{{1,{MAX_NAME}}})",
        )
    return name


def _tag_collision(matched: _Topic, item: Item, key: str, name: str) -> Rejection:
    """The rejection of a line tag stored under the name of another tag."""
    other = next(
        (
            k
            for k in item.tags or ()
            if k != key and k not in matched.rule.named_tags and tag_name(k) == name
        ),
        None,
    )
    if other is None:  # a tag of the topic (a capture or [rule.tags]) of another value
        return Rejection(
            "bad_tag_name",
            f"tag {key[:60]!r} ({name}): the line says "
            f"{(item.tags or {})[key][:40]!r}, the topic "
            f"{matched.tags[name][:40]!r}",
        )
    first, second = sorted((other, key))
    return Rejection(
        "bad_tag_name", f"tags {first[:60]!r} and {second[:60]!r}: one name once made safe ({name})"
    )


def _too_long(tag_value: str) -> bool:
    """Whether _tag_problem may refuse a tag value (or raise for it: then it decides)."""
    try:
        return len(tag_value) > MAX_TAG_BYTES or len(tag_value.encode()) > MAX_TAG_BYTES
    except UnicodeEncodeError:
        return True


def _info(matched: _Topic, context: dict[str, str]) -> dict[str, str] | None:
    """The rule's tags rendered from ``context`` when all are descriptive (``info_only``).

    What :func:`_tags` and the split in ``_reading`` make of them; None if one may be
    refused (then those decide).
    """
    info: dict[str, str] = {}
    for key, template in matched.rule.tags.items():
        rendered = template.render(context)
        if rendered is not None:
            if _too_long(rendered):
                return None
            info[key] = rendered
    if len(matched.tags) + len(info) > MAX_TAGS:
        return None
    return info


def _tag_problem(tags: dict[str, str]) -> Rejection | None:
    """Why a reading's tags cannot be stored (too many, too long), or None."""
    if len(tags) > MAX_TAGS:
        return Rejection("bad_value", f"more than {MAX_TAGS} tags")
    for key, tag_value in tags.items():
        if len(tag_value) > MAX_TAG_BYTES or len(tag_value.encode()) > MAX_TAG_BYTES:
            return Rejection("bad_value", f"tag {key}: longer than {MAX_TAG_BYTES} bytes")
    return None


def _reading(
    mapping: Mapping,
    matched: _Topic,
    item: Item,
    now: float,
    window: tuple[float, float],
    rejections: list[Rejection],
    index: int | None,
) -> Reading | None:
    """Apply the rule to one item; a reading, or None with the rejection appended."""
    rule = matched.rule
    if item.problems:
        rejections.extend(_at(p, index) for p in item.problems)
    sensor = matched.sensor
    if sensor is None:
        sensor = _sensor_of(matched, item)
    if type(sensor) is not str:
        rejections.append(_at(sensor, index))  # type: ignore[arg-type]
        return None
    if item.ts is None and item.epoch is None:  # timed at arrival
        ms = (
            round(now * 1000)
            if mapping._exact  # noqa: SLF001
            else mapping.arrivals.next(sensor, math.floor(now * 1000))
        )
        epoch = ms / 1000
    else:
        instant = _instant(item, rule, now)
        if instant is None:
            rejections.append(Rejection("bad_timestamp", _bad_time(item, rule), index))
            return None
        epoch, ms = instant
    if not window[0] <= epoch <= window[1]:
        rejections.append(
            Rejection("ts_out_of_window", f"ts {epoch:.3f} outside the accepted window", index)
        )
        return None
    measured = values(mapping, rule, item.fields, rejections, index)
    if not measured:
        rejections.append(Rejection("no_measurements", "no measurement left to store", index))
        return None
    info = None
    if item.tags is None and (
        item.context is None
        or (  # the topic's tags as they are
            matched.info_only and (info := _info(matched, item.context)) is not None
        )
    ):
        tags = matched.tags
    else:
        found = _tags(matched, item)
        if isinstance(found, Rejection):
            rejections.append(_at(found, index))
            return None
        tags = found
    units = _item_units(mapping, rule, item.units, measured) if item.units else None
    if rule.units:
        units = _units(rule, measured, item.context or matched.captures, units)
    if info is not None:
        info = info or None
    elif rule.info and not tags.keys().isdisjoint(rule.info):  # descriptive tags apart
        info = {k: v for k, v in tags.items() if k in rule.info}
        tags = {k: v for k, v in tags.items() if k not in rule.info}
        if tags == matched.tags:  # the same keys in the same order: share the topic's
            tags = matched.tags  # (the bucket plan keys its series by the dict's id)
    return _new(Reading, (sensor, None, epoch, measured, None, ms, tags, units, info))


def _item_units(
    mapping: Mapping,
    rule: Rule,
    units: dict[str, str],
    measured: dict[str, int | float | bool | str],
) -> dict[str, str] | None:
    """The units an item gives (SenML ``u``), under the names its values are stored by."""
    renamed = ((mapping._resolve(rule, k), u[:MAX_UNIT]) for k, u in units.items())  # noqa: SLF001
    return {k: u for k, u in renamed if type(k) is str and k in measured} or None


def _instant(item: Item, rule: Rule, now: float) -> tuple[float, int] | None:
    if item.epoch is not None:  # SenML: resolved, relative below 2**28
        return from_seconds(item.epoch + now if item.epoch < senml.RELATIVE else item.epoch)
    return parse(item.ts, rule.time.format, rule.time.zone)


def _sensor_of(matched: _Topic, item: Item) -> str | Rejection:
    if matched.sensor is not None:
        return matched.sensor
    template = matched.rule.sensor_id
    if template is not None:
        context = item.context or matched.captures
        rendered = template.render(context)
        if rendered is None:
            missing = ", ".join(f"{{{n}}}" for n in sorted(template.names) if n not in context)
            return Rejection(
                "no_sensor_id",
                f"sensor_id {template.text[:120]!r}: no "
                f"value for {missing} (a string or an integer)",
            )
        return _sensor(rendered)
    if item.sensor:
        return _sensor(item.sensor.rstrip(":/."))
    sensor = matched.captures.get("sensor_id")
    if sensor is None:
        return Rejection("no_sensor_id", "no sensor id in the payload or the topic")
    return _sensor(sensor)
