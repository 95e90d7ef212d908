"""Mapping rules at work: which rule takes a topic, then what its format makes of the payload.

All topic filters are compiled into one regular expression (alternatives in rule order,
so the first matching rule wins), asked once per topic: the answer, with the topic's
captures, tags and sensor id, is kept in a bounded cache. A format parses the payload
into raw items (:mod:`ingest.devices.formats`); :meth:`Mapping.decode` applies the rule to each:
field names made safe and kept or dropped, values mapped, strings bounded, the time
read, the sensor id and tags filled in. Nothing here does I/O per message or raises for
bad input: problems are counted rejections, field by field where the rest can be stored.
"""

from __future__ import annotations

import math
import re
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, NamedTuple

from ingest import accel
from ingest.devices.decode import (
    BEYOND_MAGNITUDE,
    MAX_MAGNITUDE,
    Arrivals,
    decode,
    sensor_from_topic,
)
from ingest.devices.formats import influx, json, senml, value
from ingest.devices.formats.homie import subscriptions as homie_subscriptions
from ingest.devices.formats.sparkplug import shared_subscriptions as sparkplug_shared
from ingest.devices.formats.stateful import OTHER
from ingest.devices.formats.times import LIMIT as TIME_LIMIT
from ingest.devices.formats.times import from_seconds, parse
from ingest.devices.homie_state import HomieState
from ingest.devices.rules import (
    MAX_UNIT,
    check_unique,
    load_file,
    load_preset,
)
from ingest.devices.sparkplug_state import SparkplugState
from ingest.errors import ConfigError
from ingest.model import (
    MAX_TAG_BYTES,
    MAX_TAGS,
    RESERVED_FIELDS,
    RESERVED_TAGS,
    SENSOR_ID_PATTERN,
    SENSOR_ID_RULE,
    Decoded,
    Reading,
    Rejection,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ingest.devices.decode import Limits
    from ingest.devices.formats import Item, Parsed
    from ingest.devices.formats.stateful import Stateful
    from ingest.devices.rules import Rule

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_SENSOR = re.compile(SENSOR_ID_PATTERN)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_NAME = 64  # characters of a measurement or tag name (model.NAME_PATTERN)
TOPIC_CACHE = 100_000  # topics remembered with their rule, captures, tags and sensor id
NAME_CACHE = 10_000  # field names remembered per rule
_DROP = ""  # a field name resolved to "leave it out, silently"
_FORMATS: dict[str, Callable[[bytes, Rule, dict[str, str], Limits], Parsed]] = {
    "json": json.parse,
    "value": value.parse,
    "senml": senml.parse,
    "influx": influx.parse,
}


# Formats with state across messages (see ingest.devices.formats.stateful), made once per Mapping.
_STATEFUL: dict[str, Callable[[], Stateful]] = {"sparkplug": SparkplugState, "homie": HomieState}


class Result(NamedTuple):
    """What the mapping made of one message."""

    rule: Rule | None  # None: no rule matched (``no_rule``)
    decoded: Decoded
    ignored: bool = False


class _Topic(NamedTuple):
    """What is known about a topic once matched: rule, captures, tags, sensor id."""

    rule: Rule
    captures: dict[str, str]
    tags: dict[str, str]  # shared by the topic's readings, never changed
    sensor: str | Rejection | None  # None: decided per item (payload or line tags)
    # Every tag the rule renders from the payload is descriptive (``info``), and no
    # descriptive one comes from the topic: readings keep ``tags`` as they are.
    info_only: bool = False


def _covers(wide: list[str], narrow: list[str]) -> bool:
    """Whether every topic matching filter ``narrow`` matches filter ``wide`` (by levels)."""
    if wide[0] in {"+", "#"} and narrow[0].startswith("$"):
        return False  # wildcards never match a level starting with '$' there
    for i, level in enumerate(wide):
        if level == "#":
            return True  # also the parent level: a/# matches a
        if i >= len(narrow) or narrow[i] == "#":
            return False
        if level != "+" and narrow[i] != level:
            return False
    return len(narrow) == len(wide)


def _overlap(a: list[str], b: list[str]) -> bool:
    """Whether some topic matches both filters."""
    if (a[0] in {"+", "#"} and b[0].startswith("$")) or (
        b[0] in {"+", "#"} and a[0].startswith("$")
    ):
        return False
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and "+" not in {x, y}:
            return False
    return True


def _join(a: list[str], b: list[str]) -> list[str]:
    """The narrowest filter (of this simple form) that covers both."""
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is None or y is None or x == "#" or y == "#":
            out.append("#")
            break
        out.append(x if x == y else "+")
    return out


def disjoint_filters(filters: Sequence[str]) -> tuple[str, ...]:
    """``filters`` made non-overlapping: covered ones dropped, overlapping ones joined."""
    pending = [f.split("/") for f in dict.fromkeys(filters)]
    done: list[list[str]] = []
    while pending:
        current = pending.pop(0)
        for other in done:
            if _covers(other, current):
                break
            if _overlap(other, current):
                done.remove(other)
                pending.insert(0, _join(other, current))
                break
        else:
            done = [d for d in done if not _covers(current, d)]
            done.append(current)
    return tuple("/".join(f) for f in done)


def safe(text: str) -> str:
    """Each run of characters outside ``[A-Za-z0-9_-]`` becomes ``_``."""
    return _UNSAFE.sub("_", text)


def _filter_regex(rule: Rule, index: int) -> str:
    levels = rule.topic.split("/")
    out: list[str] = []
    tail = ""
    for level in levels:
        if level == "#":
            tail = "(?:/.*)?" if out else ".*"
            break
        if level == "+":
            out.append("[^/]*")
        elif level.startswith("{"):
            out.append(f"(?P<r{index}_{level[1:-1]}>[^/]*)")
        else:
            out.append(re.escape(level))
    # MQTT: a filter starting with a wildcard does not match topics starting with '$'.
    guard = r"(?!\$)" if levels[0] in {"+", "#"} or levels[0].startswith("{") else ""
    return guard + "/".join(out) + tail


class Mapping:
    """The compiled rules of a mapping file and presets."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        if not rules:
            raise ConfigError("--mapping/--preset: no rules")
        check_unique(list(rules))
        self.rules = tuple(rules)
        self._regex = re.compile(
            "|".join(f"(?P<r{i}>{_filter_regex(rule, i)})" for i, rule in enumerate(self.rules))
        )
        self._group_rule = {self._regex.groupindex[f"r{i}"]: i for i in range(len(self.rules))}
        self._cache: dict[str, _Topic | None] = {}
        self._names: dict[str, dict[str, str | Rejection]] = {r.name: {} for r in self.rules}
        # Per rule with [rule.types]: stored name -> its declared kind ("" for none).
        self._kinds: dict[str, dict[str, str]] = {r.name: {} for r in self.rules if r.types}
        # Arrival times of readings without their own (see ingest.devices.decode.Arrivals).
        self.arrivals = Arrivals()
        # Set during decode_at: items without a time take the given one exactly.
        self._exact = False
        # One object per stateful format in use, shared by its rules.
        self.stateful: dict[str, Stateful] = {
            name: make()
            for name, make in _STATEFUL.items()
            if any(r.format == name and not r.ignore for r in self.rules)
        }

    @classmethod
    def load(cls, mapping_file: str | None, presets: Sequence[str]) -> Mapping:
        """Rules of a mapping file first, then of each preset in order."""
        rules: list[Rule] = []
        if mapping_file:
            rules.extend(load_file(mapping_file))
        for name in presets:
            rules.extend(load_preset(name))
        return cls(rules)

    def subscriptions(self) -> tuple[str, ...]:
        """Topic filters covering every rule's filter, no two of which overlap.

        A broker delivers a message once per matching subscription (mosquitto 2 does), so
        overlapping subscriptions would store a message twice. A filter that another one
        covers is left out; two that partly overlap (``a/bridge/#`` and ``a/+`` share
        ``a/bridge``) are replaced by one covering both (``a/+/#``), whose messages that
        no rule takes are rejected as ``no_rule``.
        """
        return disjoint_filters([rule.subscription for rule in self.rules])

    def shared_subscriptions(self, topics: Sequence[str], group: str | None) -> tuple[str, ...]:
        """``topics`` as a daemon of the shared group ``group`` (None: alone) subscribes.

        Every filter gets the ``$share/<group>/`` prefix, except where a stateful format
        needs every daemon to see some messages: with a ``sparkplug`` rule, the BIRTH and
        DEATH topics are subscribed unshared (:func:`sparkplug.shared_subscriptions`);
        with a ``homie`` rule, its filters are narrowed to the topics it uses, the
        attribute topics first and unshared (:func:`homie.subscriptions`, also alone); a
        wider filter (``+/#``) is kept whole after those attribute topics, which then
        arrive twice (the second copy changes nothing; values arrive once).
        """
        try:
            pieces = (
                homie_subscriptions(topics, self.rules, group is not None)
                if "homie" in self.stateful
                else [(topic, False) for topic in topics]
            )
            if group is None:
                return tuple(topic for topic, _ in pieces)
            if "sparkplug" not in self.stateful:
                return tuple(
                    topic if every else f"$share/{group}/{topic}" for topic, every in pieces
                )
            return tuple(
                dict.fromkeys(
                    out
                    for topic, every in pieces
                    for out in ((topic,) if every else sparkplug_shared([topic], group))
                )
            )
        except ValueError as exc:
            raise ConfigError(f"--shared-group: {exc}") from None

    def match(self, topic: str) -> _Topic | None:
        """The first rule whose filter matches ``topic``, with what it captured."""
        known = self._cache.get(topic, self)
        if known is not self:
            return known  # type: ignore[return-value]
        found = self._match(topic)
        if len(self._cache) >= TOPIC_CACHE:
            self._cache.clear()
        self._cache[topic] = found
        return found

    def _match(self, topic: str) -> _Topic | None:
        m = self._regex.fullmatch(topic)
        if m is None or m.lastindex is None:
            return None
        index = self._group_rule[m.lastindex]
        rule = self.rules[index]
        captures = {name: m.group(f"r{index}_{name}") for name in rule.captures}
        # Captures that build the sensor id or the measurement name are part of those,
        # not tags: as tags they would change from message to message of one sensor.
        named = {"sensor_id", "measurement"}
        for template in (rule.sensor_id, rule.measurement, *rule.units.values()):
            if template is not None:
                named |= template.names
        tags = {k: v for k, v in captures.items() if k not in named}
        tags.update(
            (k, t.render(captures) or "")
            for k, t in rule.tags.items()
            if not t.names - captures.keys()
        )
        sensor: str | Rejection | None = None
        template = rule.sensor_id
        if template is not None and not template.names - captures.keys():
            sensor = _sensor(template.render(captures) or "")
        elif rule.format == "ingest" and template is None:
            sensor = ""  # the ingest format's own default
        problem = _tag_problem(tags)
        if problem is not None:  # a hostile topic: its readings are refused, not cut
            sensor = problem
        info_only = (
            bool(rule.tags) and rule.info.issuperset(rule.tags) and rule.info.isdisjoint(tags)
        )
        return _Topic(rule, captures, tags, sensor, info_only)

    def topic_sensor(self, topic: str) -> str | None:
        """The sensor id that ``topic`` alone names under its rule (``--sensor-id-from-topic``).

        None where the topic names no device: no rule, an ignore rule, a rule whose
        sensor id is made from the payload with no ``{sensor_id}`` capture, or a format
        that names the device from the topic itself (Sparkplug, Homie), which no payload
        can change.
        """
        matched = self.match(topic)
        if (
            matched is None
            or matched.rule.ignore
            or (self.stateful and matched.rule.format in self.stateful)
        ):
            return None
        sensor = matched.sensor
        if isinstance(sensor, Rejection):
            return None  # refused whole already
        if sensor:
            return sensor
        if sensor == "":  # the ingest format's own default: the topic's second level
            return sensor_from_topic(topic)
        return matched.captures.get("sensor_id")

    def stateful_for(self, topic: str) -> Stateful | None:
        """The stateful format whose rule takes ``topic`` (its prepare() comes first)."""
        if not self.stateful:
            return None
        matched = self.match(topic)
        if matched is None or matched.rule.ignore:
            return None
        return self.stateful.get(matched.rule.format)

    def decode(self, topic: str, payload: bytes, received_at: float, limits: Limits) -> Result:
        """Readings and rejections of one message, or ignored, or ``no_rule``."""
        matched = self.match(topic)
        if matched is None:
            return Result(
                None,
                Decoded(
                    [], [Rejection("no_rule", f"no mapping rule matches topic {repr(topic)[:200]}")]
                ),
            )
        rule = matched.rule
        if rule.ignore:
            return Result(rule, Decoded([], []), ignored=True)
        if len(payload) > limits.max_message_bytes:
            return Result(
                rule,
                Decoded(
                    [],
                    [Rejection("too_large", f"{len(payload)} bytes > {limits.max_message_bytes}")],
                ),
            )
        if rule.format == "ingest":
            return Result(rule, self._ingest(matched, topic, payload, received_at, limits))
        stateful = self.stateful.get(rule.format) if self.stateful else None
        if stateful is not None and stateful.role(topic) == OTHER:  # Homie /set, $broadcast
            return Result(rule, Decoded([], []), ignored=True)
        parsed = (
            stateful.parse(topic, payload, limits)
            if stateful is not None
            else _FORMATS[rule.format](payload, rule, matched.captures, limits)
        )
        return _new(Result, (rule, readings(self, matched, parsed, received_at, limits), False))

    def decode_at(self, topic: str, payload: bytes, ms: int, limits: Limits) -> Result:
        """:meth:`decode` with items that have no time of their own at ``ms`` exactly.

        Not spread as arrivals (see :class:`~ingest.devices.decode.Arrivals`): a retained state's
        first-seen time must give the same instant in every worker and every delivery.
        """
        self._exact = True
        try:
            return self.decode(topic, payload, ms / 1000, limits)
        finally:
            self._exact = False

    def _ingest(
        self, matched: _Topic, topic: str, payload: bytes, received_at: float, limits: Limits
    ) -> Decoded:
        sensor = matched.sensor
        if isinstance(sensor, Rejection):
            return Decoded([], [sensor])
        decoded = decode(
            topic,
            payload,
            received_at,
            limits,
            sensor or None,
            None if self._exact else self.arrivals,
        )
        if matched.tags:
            decoded = Decoded(
                [r._replace(tags=matched.tags) for r in decoded.readings], decoded.rejections
            )
        return decoded

    def _reading(
        self,
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
            sensor = self._sensor_of(matched, item)
        if type(sensor) is not str:
            rejections.append(_at(sensor, index))  # type: ignore[arg-type]
            return None
        if item.ts is None and item.epoch is None:  # timed at arrival
            ms = (
                round(now * 1000)
                if self._exact
                else self.arrivals.next(sensor, math.floor(now * 1000))
            )
            epoch = ms / 1000
        else:
            instant = self._instant(item, rule, now)
            if instant is None:
                rejections.append(Rejection("bad_timestamp", _bad_time(item, rule), index))
                return None
            epoch, ms = instant
        if not window[0] <= epoch <= window[1]:
            rejections.append(
                Rejection("ts_out_of_window", f"ts {epoch:.3f} outside the accepted window", index)
            )
            return None
        values = self._values(rule, item.fields, rejections, index)
        if not values:
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
        units = None
        if item.units:
            renamed = ((self._resolve(rule, k), u[:MAX_UNIT]) for k, u in item.units.items())
            units = {k: u for k, u in renamed if type(k) is str and k in values} or None
        if rule.units:
            units = _units(rule, values, item.context or matched.captures, units)
        if info is not None:
            info = info or None
        elif rule.info and not tags.keys().isdisjoint(rule.info):  # descriptive tags apart
            info = {k: v for k, v in tags.items() if k in rule.info}
            tags = {k: v for k, v in tags.items() if k not in rule.info}
            if tags == matched.tags:  # the same keys in the same order: share the topic's
                tags = matched.tags  # (the bucket plan keys its series by the dict's id)
        return _new(Reading, (sensor, None, epoch, values, None, ms, tags, units, info))

    def _instant(self, item: Item, rule: Rule, now: float) -> tuple[float, int] | None:
        if item.epoch is not None:  # SenML: resolved, relative below 2**28
            return from_seconds(item.epoch + now if item.epoch < senml.RELATIVE else item.epoch)
        return parse(item.ts, rule.time.format, rule.time.zone)

    def _sensor_of(self, matched: _Topic, item: Item) -> str | Rejection:
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

    def _resolve(self, rule: Rule, raw: str) -> str | Rejection:
        """A field name as stored ("" to leave it out), or why it cannot be stored."""
        names = self._names[rule.name]
        known = names.get(raw)
        if known is not None:
            return known
        result = _resolve_name(rule, raw)
        if len(names) < NAME_CACHE:
            names[raw] = result
        return result

    def _kind(self, rule: Rule, name: str) -> str:
        """The kind ``[rule.types]`` declares for a stored name ("" for none)."""
        kinds = self._kinds[rule.name]
        kind = kinds.get(name)
        if kind is None:
            kind = next((k for glob, k in rule.types if fnmatchcase(name, glob)), "")
            if len(kinds) < NAME_CACHE:
                kinds[name] = kind
        return kind

    def _values(
        self, rule: Rule, fields: dict[str, object], rejections: list[Rejection], index: int | None
    ) -> dict[str, int | float | bool | str]:
        return values(self, rule, fields, rejections, index)


_DROP_VALUE = object()
_new = tuple.__new__  # builds a NamedTuple without its argument handling


def readings_py(
    mapping: Mapping, matched: _Topic, parsed: Parsed, received_at: float, limits: Limits
) -> Decoded:
    """The rule applied to each item a format parsed: readings and rejections in order."""
    out: Decoded = _new(Decoded, ([], parsed.rejections))
    window = (received_at - limits.max_past_seconds, received_at + limits.max_future_seconds)
    several = len(parsed.items) > 1
    for position, item in enumerate(parsed.items):
        index = item.position if item.position is not None else (position if several else None)
        reading = mapping._reading(  # noqa: SLF001
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


# The compiled twin (_mapping_c.pyx) applies the rule itself to an item of the common
# shape (a time of its own, the topic's sensor id, no units, tags only as info) and calls
# Mapping._reading for any other.
readings = accel.pick(readings_py, "ingest.devices._mapping_c", "readings")


def values_py(
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


# The compiled twin (_values_c.pyx) takes the common fields itself and calls this
# module's _resolve, _kind, _typed, _value, _at and _collision for the rest.
values = accel.pick(values_py, "ingest.devices._values_c", "values")


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
    """The reading's units with the rule's declared ones (which win) added."""
    for name, template in rule.units.items():
        if name in values:
            unit = template.render(variables)
            if unit:
                units = units if units is not None else {}
                units[name] = unit[:MAX_UNIT]
    return units


def _resolve_name(rule: Rule, raw: str) -> str | Rejection:
    renamed = rule.rename.get(raw) if rule.rename else None
    name = safe(raw) if renamed is None else renamed
    if rule.keep and not any(fnmatchcase(raw, g) or fnmatchcase(name, g) for g in rule.keep):
        return _DROP
    if any(fnmatchcase(raw, g) or fnmatchcase(name, g) for g in rule.drop):
        return _DROP
    if renamed is None and (not 1 <= len(name) <= 64 or name in RESERVED_FIELDS):
        # (a new name was checked when the rule was loaded)
        return Rejection(
            "bad_field_name",
            f"field {raw[:60]!r} does not make a valid name "
            "([A-Za-z0-9_-]{1,64}, not ts, seq, sensor_id, "
            "_id, meta, tags, units or info)",
        )
    return name


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
