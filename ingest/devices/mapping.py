"""Mapping rules at work: which rule takes a topic, then what its format makes of the payload.

All topic filters are compiled into one regular expression (alternatives in rule order,
a rule's list of filters in its place, so the first matching rule wins), asked once per
topic: the answer, with the topic's captures, tags and sensor id, is kept in a bounded
cache. A rule with ``[rule.match]``
takes only the payloads it selects; the answer then also holds the rules after it whose
filters match the topic, tried in turn for the others. A format parses the payload
into raw items (:mod:`ingest.devices.formats`); :meth:`Mapping.decode` applies the rule to each:
field names made safe and kept or dropped, values mapped, strings bounded, the time
read, the sensor id and tags filled in. Nothing here does I/O per message or raises for
bad input: problems are counted rejections, field by field where the rest can be stored.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, NamedTuple

import orjson

from ingest import accel, caches
from ingest.devices import _mapping_py
from ingest.devices._mapping_py import MAX_NAME as MAX_NAME  # noqa: PLC0414
from ingest.devices._mapping_py import _sensor, _tag_problem, _Topic
from ingest.devices._mapping_py import safe as safe  # noqa: PLC0414
from ingest.devices._mapping_py import tag_name as tag_name  # noqa: PLC0414
from ingest.devices.decode import (
    Arrivals,
    decode,
    sensor_from_topic,
)
from ingest.devices.formats import influx, json, senml, value
from ingest.devices.formats.homie import subscriptions as homie_subscriptions
from ingest.devices.formats.sparkplug import shared_subscriptions as sparkplug_shared
from ingest.devices.formats.stateful import OTHER
from ingest.devices.homie_state import HomieState
from ingest.devices.rules import (
    check_unique,
    covers,
    load_file,
    load_preset,
    match_key,
)
from ingest.devices.sparkplug_state import SparkplugState
from ingest.errors import ConfigError
from ingest.model import (
    RESERVED_FIELDS,
    Decoded,
    Rejection,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ingest.devices.decode import Limits
    from ingest.devices.formats import Parsed
    from ingest.devices.formats.stateful import Stateful
    from ingest.devices.rules import Rule

NAME_CACHE = 10_000  # field names remembered per rule
_DROP = ""  # a field name resolved to "leave it out, silently"
_new = tuple.__new__  # builds a NamedTuple without its argument handling
_FORMATS: dict[str, Callable[[bytes, Rule, dict[str, str], Limits], Parsed]] = {
    "json": json.parse,
    "json_value": json.parse_value,
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
    # Rules' filters matched the topic, but the payload matched none's [rule.match].
    unselected: bool = False


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
            if covers(other, current):
                break
            if _overlap(other, current):
                done.remove(other)
                pending.insert(0, _join(other, current))
                break
        else:
            done = [d for d in done if not covers(current, d)]
            done.append(current)
    return tuple("/".join(f) for f in done)


def _rule_regex(rule: Rule, index: int) -> str:
    """Rule ``index``'s filters as alternatives in order, group ``r<index>f<n>`` each."""
    return "|".join(
        f"(?P<r{index}f{n}>{_filter_regex(topic, f'r{index}f{n}')})"
        for n, topic in enumerate(rule.topics)
    )


def _filter_regex(topic: str, group: str) -> str:
    """One filter; a capture ``{name}`` is the group ``<group>_<name>``."""
    levels = topic.split("/")
    out: list[str] = []
    tail = ""
    for level in levels:
        if level == "#":
            tail = "(?:/.*)?" if out else ".*"
            break
        if level == "+":
            out.append("[^/]*")
        elif level.endswith("#}"):  # the rest of the topic, one or more levels
            out.append(f"(?P<{group}_{level[1:-2]}>.*)")
        elif level.startswith("{"):
            out.append(f"(?P<{group}_{level[1:-1]}>[^/]*)")
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
        self._regex = re.compile("|".join(_rule_regex(r, i) for i, r in enumerate(self.rules)))
        # A filter's group -> its rule's index.
        self._group_rule = {
            self._regex.groupindex[f"r{i}f{n}"]: i
            for i, rule in enumerate(self.rules)
            for n in range(len(rule.topics))
        }
        # Rules that select by payload too ([rule.match]): the rules after one that also
        # match its topic are its fallbacks, tried in order (see _select).
        self._alone = (
            [re.compile(_rule_regex(rule, i)) for i, rule in enumerate(self.rules)]
            if any(rule.match is not None for rule in self.rules)
            else []
        )
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
        return disjoint_filters([f for rule in self.rules for f in rule.subscriptions])

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

    def topics_cached(self) -> int:
        """Topics held with their rule, captures, tags and sensor id."""
        return len(self._cache)

    def match(self, topic: str) -> _Topic | None:
        """The first rule whose filter matches ``topic``, with what it captured."""
        known = self._cache.get(topic, self)
        if known is not self:
            return known  # type: ignore[return-value]
        found = self._match(topic)
        if len(self._cache) >= caches.limit:  # one per topic: --max-cached-series
            self._cache.clear()
        self._cache[topic] = found
        return found

    def _match(self, topic: str) -> _Topic | None:
        m = self._regex.fullmatch(topic)
        if m is None or m.lastindex is None:
            return None
        index = self._group_rule[m.lastindex]
        rule = self.rules[index]
        if rule.match is None:
            return self._topic(rule, m, None)
        # The rules after it that match the topic too, tried in turn (see _select).
        found = [(index, m)]
        for later in range(index + 1, len(self.rules)):
            other = self._alone[later].fullmatch(topic)
            if other is not None:
                found.append((later, other))
                if self.rules[later].match is None:
                    break  # takes every message the ones before leave
        after: _Topic | None = None
        for at, got in reversed(found):
            after = self._topic(self.rules[at], got, after)
        return after

    def _topic(self, rule: Rule, m: re.Match[str], after: _Topic | None) -> _Topic:
        """What ``rule`` makes of a topic one of its filters matched (``m``)."""
        group = m.lastgroup  # the filter that matched: r<index>f<n>
        captures = {name: m.group(f"{group}_{name}") for name in rule.captures}
        if rule.rest:  # {name#}: the levels joined with _, made safe as a measurement name
            last = rule.captures[-1]
            captures[last] = safe(captures[last].replace("/", "_"))
        # Captures that build the sensor id or the measurement name are part of those,
        # not tags: as tags they would change from message to message of one sensor.
        named = {"sensor_id", "measurement"}
        for template in (
            rule.sensor_id,
            rule.measurement,
            *rule.units.values(),
            *rule.rename_templates.values(),
        ):
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
        return _Topic(rule, captures, tags, sensor, info_only, after)

    def filter_of(self, rule: Rule, topic: str) -> str:
        """The first of ``rule``'s topic filters that matches ``topic`` (for ``check``)."""
        return next(
            (t for t in rule.topics if re.fullmatch(_filter_regex(t, "f"), topic)),
            rule.topics[0],
        )

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
            or matched.rule.match is not None  # the payload chooses the rule
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
        while matched is not None and matched.rule.match is not None:
            matched = matched.after  # selected by payload: the unconditional rule after
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
        if rule.match is not None:  # [rule.match]: the payload chooses among the rules
            if len(payload) > limits.max_message_bytes:
                return Result(rule, _too_large(payload, limits))
            selected = _select(matched, payload)
            if type(selected) is str:
                return Result(None, _unselected(matched, topic, selected), unselected=True)
            matched = selected  # type: ignore[assignment]
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
            else _FORMATS[rule.reader](payload, rule, matched.captures, limits)
        )
        if rule.rename_templates:
            _rename_items(parsed, rule, matched.captures)
        return _new(
            Result, (rule, readings(self, matched, parsed, received_at, limits), False, False)
        )

    def passed_over(self, topic: str, payload: bytes) -> list[str]:
        """Why each rule tried before the one that takes the message did not (``check``).

        One line per rule whose filter matches ``topic`` but whose ``[rule.match]`` the
        payload does not meet, in the order they are tried.
        """
        matched = self.match(topic)
        if matched is None or matched.rule.match is None:
            return []
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            doc = None
        out = []
        candidate: _Topic | None = matched
        while candidate is not None and candidate.rule.match is not None:
            miss = _miss(candidate.rule, doc)
            if miss is None:
                break
            out.append(f"passed over by rule {candidate.rule.name}: [rule.match] not met: {miss}")
            candidate = candidate.after
        return out

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


def _select(matched: _Topic, payload: bytes) -> _Topic | str:
    """The first of the topic's rules whose ``[rule.match]`` the payload meets, or why none."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        doc = None
    candidate: _Topic | None = matched
    while candidate is not None:
        wanted = candidate.rule.match
        if wanted is None:
            return candidate
        if type(doc) is dict and all(match_key(doc.get(key)) in values for key, values in wanted):
            return candidate
        candidate = candidate.after
    return "the payload matched no [rule.match]" + (
        "" if type(doc) is dict else " (not a JSON object)"
    )


def _miss(rule: Rule, doc: object) -> str | None:
    """Which ``[rule.match]`` field the payload ``doc`` does not meet, or None."""
    if type(doc) is not dict:
        return "the payload is not a JSON object"
    for key, values in rule.match or ():
        held = doc.get(key, _ABSENT)
        if held is _ABSENT:
            return f"no field {key[:60]!r}"
        if match_key(held) not in values:
            wanted = sorted(_shown(v) for _, v in values)
            return f"{key[:60]!r} is {_shown(held)} (wanted {' or '.join(wanted)[:200]})"
    return None


_ABSENT = object()


def _shown(value: object) -> str:
    """A payload or [rule.match] value as JSON writes it, cut."""
    if type(value) is str:
        return orjson.dumps(value[:60]).decode()
    if type(value) is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    if type(value) in {dict, list}:
        return "an object" if type(value) is dict else "an array"
    return repr(value)[:60]


def _unselected(matched: _Topic, topic: str, why: str) -> Decoded:
    """The ``no_rule`` rejection of a payload that met no rule's ``[rule.match]``."""
    names = []
    candidate: _Topic | None = matched
    while candidate is not None:
        names.append(candidate.rule.name)
        candidate = candidate.after
    return Decoded(
        [],
        [
            Rejection(
                "no_rule",
                f"topic {repr(topic)[:200]}: {why} (rules {', '.join(names)[:200]})",
            )
        ],
    )


def _too_large(payload: bytes, limits: Limits) -> Decoded:
    return Decoded(
        [], [Rejection("too_large", f"{len(payload)} bytes > {limits.max_message_bytes}")]
    )


def _rename_items(parsed: Parsed, rule: Rule, captures: dict[str, str]) -> None:
    """``[rule.rename]`` templates applied to the items' field names, in place."""
    items = parsed.items
    for position, item in enumerate(items):
        fields = item.fields
        if not any(raw in fields for raw in rule.rename_templates):
            continue
        renamed: dict[str, object] = {}
        problems = list(item.problems or ())
        for raw, field_value in fields.items():
            template = rule.rename_templates.get(raw)
            name = raw if template is None else template.render(captures) or raw
            if name in renamed or (name != raw and name in fields):
                problems.append(
                    Rejection(
                        "bad_field_name",
                        f"{raw[:60]!r} renamed {name[:60]!r}: the name of another field",
                    )
                )
                continue
            renamed[name] = field_value
        fields.clear()
        fields.update(renamed)
        if problems:
            items[position] = item._replace(problems=problems)


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


# Applying a rule to a format's items is written once, in _mapping_py.py, and compiled from
# there as _mapping_c; ``values`` is its own (the compiled readings call the compiled one).
readings_py = _mapping_py.readings
values_py = _mapping_py.values
readings = accel.pick(readings_py, "ingest.devices._mapping_c", "readings")
