"""``homie``: Homie 4.0 and 5.0 devices, whose values are typed by their attributes.

Followed: the Homie convention (github.com/homieiot/convention), 4.0.0 (tag v4.0.0) and
5.0 (the develop branch, commit 063301d of 2024-10-17).

A Homie device publishes one plain value per topic,
``<domain>/<device>/<node>/<property>`` (Homie 4) or ``<domain>/5/<device>/<node>/<property>``
(Homie 5), and describes each property on retained attribute topics: Homie 4 on
``.../<property>/$datatype``, ``$unit``, ``$format``; Homie 5 in one JSON document,
``<domain>/5/<device>/$description``. So this format keeps, per device, what those
attributes say (:class:`Device`, bounded, least recently used evicted) and types each value
by its property's datatype; :class:`~ingest.devices.homie_state.HomieState` backs the state with
MongoDB. Nothing here does I/O or raises for bad input.

- A value becomes one reading of the sensor ``<device>`` (the id as in the topic) with one
  measurement ``<node>_<property>`` (Homie ids hold no ``_``; one that does has it
  doubled, see :func:`measurement_name`, so two properties never share a name), and the
  property's unit.
- ``integer`` -> integer, ``float`` -> double, ``boolean`` -> boolean; ``string``,
  ``enum``, ``color``, ``datetime``, ``duration`` and ``json`` keep their text (``"0012"``
  stays a string). A payload that is not what its datatype allows is ``bad_value``.
- A value whose property has no datatype yet is refused (``no_datatype``): types are not
  guessed.
- Attribute topics (``$``-levels), ``/set`` commands and ``$broadcast`` are never
  readings: the attributes above are taken as the device's state, the rest is ignored.
- An empty payload on a value topic clears a retained value: nothing to store. On an
  attribute topic it clears the attribute (the description of Homie 5).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

import orjson

from ingest import caches
from ingest.devices.formats import Item, Parsed, refused, text_of
from ingest.model import Rejection

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ingest.devices.decode import Limits
    from ingest.devices.rules import Rule

V5 = "5"  # the level after the domain that marks Homie 5 (the spec reserves it)
DATATYPES = (
    "integer",
    "float",
    "boolean",
    "string",
    "enum",
    "color",
    "datetime",
    "duration",
    "json",
)
# The Homie 4 property attributes this format uses; every other attribute is ignored.
ATTRIBUTES = ("$datatype", "$unit", "$format")
DESCRIPTION = "$description"
REASONS: tuple[str, ...] = (
    "bad_topic",  # not a Homie topic (e.g. an id with '.' or spaces, a level too many)
    "no_datatype",  # a value whose property's datatype is not known (yet)
)
KINDS = ("value", "attribute", "cleared")  # messages counted (see KindCounts)
MAX_DEVICES = 10_000  # devices held in memory (least recently used are evicted)
MAX_PROPERTIES = 1000  # properties of one device
MAX_HELD_PROPERTIES = 1_000_000  # properties of all the devices held in memory
MAX_UNIT = 64  # characters of a unit
MAX_FORMAT = 4096  # characters of a $format
# Homie ids are [a-z0-9-] ("A topic level ID MAY contain lowercase letters from a to z,
# numbers from 0 to 9 as well as the hyphen character", 4.0.0); uppercase and '_' are
# taken too (Homie 3 names node array elements <node>_<index>; some libraries allow
# '_'). A node or property id neither starts nor ends with '_', so that
# measurement_name() stays one-to-one.
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_PART = re.compile(r"[A-Za-z0-9-](?:[A-Za-z0-9_-]{0,126}[A-Za-z0-9-])?")
_INTEGER = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NUMBER = r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_COLOR = re.compile(rf"(?:(?:rgb|hsv),)?{_NUMBER},{_NUMBER},{_NUMBER}|xyz,{_NUMBER},{_NUMBER}")
_DURATION = re.compile(
    r"P(?=[0-9.]|T[0-9.])(?:[0-9]+Y)?(?:[0-9]+M)?(?:[0-9]+W)?(?:[0-9]+D)?"
    r"(?:T(?=[0-9.])(?:[0-9]+H)?(?:[0-9]+M)?(?:[0-9]+(?:\.[0-9]+)?S)?)?"
)
_INT64 = 2**63


class Topic(NamedTuple):
    """A parsed Homie topic."""

    kind: str  # "value", "attribute" (used: taken as state), "ignored", "bad"
    key: str = ""  # the device's base topic: <domain>/<device> or <domain>/5/<device>
    device: str = ""
    version: int = 4
    node: str = ""
    prop: str = ""
    attribute: str = ""  # "$datatype", "$unit", "$format" (v4), "$description" (v5)

    @property
    def path(self) -> str:
        """The property's key in a device: ``<node>/<property>``."""
        return f"{self.node}/{self.prop}"


_BAD = Topic("bad")
_IGNORED = Topic("ignored")
_TOPICS: dict[str, Topic] = {}


def topics_cached() -> int:
    """Topics held parsed (at most ``ingest.caches.limit``)."""
    return len(_TOPICS)


def parse_topic(topic: str) -> Topic:
    """:func:`topic_of`, remembered (bounded: cleared when full)."""
    known = _TOPICS.get(topic)
    if known is not None:
        return known
    parsed = topic_of(topic)
    if len(_TOPICS) >= caches.limit:  # one per topic: --max-cached-series
        _TOPICS.clear()
    _TOPICS[topic] = parsed
    return parsed


def topic_of(topic: str) -> Topic:
    """What a topic is in Homie 4 or 5 (its first level is the domain, ``homie``)."""
    levels = topic.split("/")
    version = 5 if len(levels) > 1 and levels[1] == V5 else 4
    base = 2 if version == 5 else 1  # the device's level
    if len(levels) <= base + 1 or not levels[0]:
        return _BAD
    if levels[base].startswith("$"):
        return _IGNORED  # $broadcast, and whatever else the domain level holds
    device = levels[base]
    if not _ID.fullmatch(device):
        return _BAD
    key = "/".join(levels[: base + 1])
    rest = levels[base + 1 :]
    if any(level.startswith("$") for level in rest):
        if version == 5 and rest == [DESCRIPTION]:
            return Topic("attribute", key, device, 5, attribute=DESCRIPTION)
        if (
            version == 4
            and len(rest) == 3
            and rest[2] in ATTRIBUTES
            and _PART.fullmatch(rest[0])
            and _PART.fullmatch(rest[1])
        ):
            return Topic("attribute", key, device, 4, rest[0], rest[1], rest[2])
        return _IGNORED  # $state, $name, $target, $log/..., $alert/..., $stats/...
    if len(rest) == 3 and rest[2] == "set":
        return _IGNORED  # a controller's command
    if len(rest) != 2 or not _PART.fullmatch(rest[0]) or not _PART.fullmatch(rest[1]):
        return _BAD
    return Topic("value", key, device, version, rest[0], rest[1])


class Prop(NamedTuple):
    """What a device's attributes say about one property."""

    datatype: str | None = None
    unit: str | None = None
    format: str | None = None


@dataclass(slots=True)
class Device:
    """One device's properties, from its attributes."""

    key: str  # the device's base topic
    props: dict[str, Prop] = field(default_factory=dict)  # "<node>/<property>" -> Prop
    version: int | None = None  # Homie 5: the description's version


class Attribute(NamedTuple):
    """A Homie 4 property attribute as a message sets it (value None: cleared)."""

    topic: Topic
    value: str | None
    problem: Rejection | None = None


class Description(NamedTuple):
    """A Homie 5 ``$description`` (props None: cleared, the device removed)."""

    topic: Topic
    props: dict[str, Prop] | None
    version: int | None = None
    problems: tuple[Rejection, ...] = ()


Change = Attribute | Description


def change_of(topic: Topic, payload: bytes) -> Change:
    """What an attribute message sets (its problems are rejections of the message)."""
    if topic.attribute == DESCRIPTION:
        return description_of(topic, payload)
    if not payload:
        return Attribute(topic, None)
    text = text_of(payload)
    if text is None:
        return Attribute(topic, None, Rejection("invalid_utf8", "payload is not UTF-8"))
    where = f"{topic.key}/{topic.path}/{topic.attribute}"[:160]
    problem = _attribute_problem(topic.attribute, text)
    if problem is not None:
        return Attribute(topic, None, Rejection("bad_value", f"{where}: {problem}"))
    return Attribute(topic, text)


def _attribute_problem(attribute: str, text: str) -> str | None:
    """Why an attribute's text cannot be used, or None."""
    if attribute == "$datatype" and text not in DATATYPES:
        return f"{text[:40]!r} is not a Homie datatype ({', '.join(DATATYPES)})"
    if attribute == "$unit" and len(text) > MAX_UNIT:
        return f"a unit longer than {MAX_UNIT} characters"
    if attribute == "$format" and len(text) > MAX_FORMAT:
        return f"a format longer than {MAX_FORMAT} characters"
    return None


def description_of(topic: Topic, payload: bytes) -> Description:
    """The properties a Homie 5 description declares, and the ones it cannot."""
    if not payload:
        return Description(topic, None)
    where = f"{topic.key}/$description"[:160]
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return Description(topic, {}, None, (Rejection("invalid_json", f"{where}: not JSON"),))
    if type(doc) is not dict:
        return Description(
            topic, {}, None, (Rejection("bad_shape", f"{where}: not a JSON object"),)
        )
    version = doc.get("version")
    props: dict[str, Prop] = {}
    problems: list[Rejection] = []
    nodes = doc.get("nodes", {})
    for node_id, node in nodes.items() if type(nodes) is dict else ():
        declared = node.get("properties", {}) if type(node) is dict else None
        if type(declared) is not dict or not _PART.fullmatch(node_id):
            problems.append(
                Rejection(
                    "bad_value", f"{where}: node {node_id[:60]!r} is not a Homie node (ignored)"
                )
            )
            continue
        for prop_id, prop in declared.items():
            found = _declared(prop_id, prop)
            if isinstance(found, str):
                problems.append(
                    Rejection(
                        "bad_value",
                        f"{where}: property {node_id[:40]}/{prop_id[:40]}: {found} (ignored)",
                    )
                )
                continue
            if len(props) >= MAX_PROPERTIES:
                return Description(
                    topic,
                    {},
                    None,
                    (
                        Rejection(
                            "too_many_readings", f"{where}: more than {MAX_PROPERTIES} properties"
                        ),
                    ),
                )
            props[f"{node_id}/{prop_id}"] = found
    known = type(version) is int and -_INT64 <= version < _INT64  # what BSON can hold
    return Description(topic, props, version if known else None, tuple(problems))


def _declared(prop_id: str, prop: object) -> Prop | str:
    """A property object of a description, or why it cannot be used."""
    if not _PART.fullmatch(prop_id) or type(prop) is not dict:
        return "not a Homie property"
    attrs = {
        "datatype": prop.get("datatype"),
        "unit": prop.get("unit"),
        "format": prop.get("format"),
    }
    for name, value in attrs.items():
        if value is not None and type(value) is not str:
            return f"{name} is not a string"
        problem = None if value is None else _attribute_problem(f"${name}", value)
        if problem is not None:
            return problem
    if attrs["datatype"] is None:
        return "no datatype"
    return Prop(attrs["datatype"], attrs["unit"] or None, attrs["format"])


class KindCounts:
    """Messages by kind (:data:`KINDS`), as plain ints handed to the metrics at scrape time."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages = dict.fromkeys(KINDS, 0)


class HomieFormat:
    """The ``homie`` format: each device's attributes (bounded, LRU), and parsing by them."""

    def __init__(
        self, max_devices: int = MAX_DEVICES, max_properties: int = MAX_HELD_PROPERTIES
    ) -> None:
        self.max_devices = max_devices
        self.max_properties = max_properties
        self.devices: OrderedDict[str, Device] = OrderedDict()
        self.properties_held = 0  # properties of the devices held
        self.counts = KindCounts()

    def device(self, key: str) -> Device | None:
        """The device held for ``key`` (marked recently used), or None."""
        held = self.devices.get(key)
        if held is not None:
            self.devices.move_to_end(key)
        return held

    def install(self, device: Device) -> None:
        """Hold ``device`` (replacing any of its key), evicting the least recently used."""
        self._forget(device.key)
        self.devices[device.key] = device
        self.properties_held += len(device.props)
        self._trim()

    def forget_all(self) -> None:
        """Drop every device (read again from MongoDB when next needed)."""
        self.devices.clear()
        self.properties_held = 0

    def _forget(self, key: str) -> None:
        """Drop the device held for ``key``, if any."""
        held = self.devices.pop(key, None)
        if held is not None:
            self.properties_held -= len(held.props)

    def _trim(self) -> None:
        """Evict the least recently used devices beyond the bounds (read again when needed).

        The bounds: ``max_devices`` devices, ``max_properties`` properties in all.
        """
        devices = self.devices
        while len(devices) > self.max_devices or (
            self.properties_held > self.max_properties and len(devices) > 1
        ):
            self.properties_held -= len(devices.popitem(last=False)[1].props)

    def changes(self, change: Change) -> bool:
        """Whether ``change`` would change what is held."""
        held = self.devices.get(change.topic.key)
        if isinstance(change, Description):
            if change.props is None:
                return held is not None
            return held is None or (held.props, held.version) != (change.props, change.version)
        prop = held.props.get(change.topic.path) if held is not None else None
        if _set(prop, change.topic.attribute, change.value) == prop:
            return False
        # a property beyond MAX_PROPERTIES is refused (see apply)
        return prop is not None or held is None or len(held.props) < MAX_PROPERTIES

    def apply(self, change: Change) -> list[Rejection]:
        """Hold what ``change`` sets; the message's rejections."""
        key = change.topic.key
        if isinstance(change, Description):
            if change.props is None:
                self._forget(key)
            else:
                self.install(Device(key, dict(change.props), change.version))
            return list(change.problems)
        held = self.device(key)
        if held is None:
            held = Device(key)
            self.install(held)
        path = change.topic.path
        prop = _set(held.props.get(path), change.topic.attribute, change.value)
        if prop is None:
            if held.props.pop(path, None) is not None:
                self.properties_held -= 1
        elif path in held.props:
            held.props[path] = prop
        elif len(held.props) < MAX_PROPERTIES:
            held.props[path] = prop
            self.properties_held += 1
            self._trim()
        else:
            return [
                Rejection(
                    "too_many_readings", f"{key[:120]}: more than {MAX_PROPERTIES} properties"
                )
            ]
        return [] if change.problem is None else [change.problem]

    def parse(self, topic_name: str, payload: bytes, limits: Limits) -> Parsed:
        """One message: a value as one item, an attribute taken as state, or nothing."""
        del limits  # the payload size is checked before any format runs
        topic = parse_topic(topic_name)
        if topic.kind == "bad":
            return refused("bad_topic", f"not a Homie 4 or 5 topic: {topic_name[:120]!r}")
        if topic.kind == "ignored":
            return Parsed([], [])
        if topic.kind == "attribute":
            self.counts.messages["attribute"] += 1
            return Parsed([], self.apply(change_of(topic, payload)))
        if not payload:
            self.counts.messages["cleared"] += 1
            return Parsed([], [])
        self.counts.messages["value"] += 1
        held = self.device(topic.key)
        prop = held.props.get(topic.path) if held is not None else None
        if prop is None or prop.datatype is None:
            return refused("no_datatype", _unknown(topic))
        text = text_of(payload)
        if text is None:
            return refused("invalid_utf8", "payload is not UTF-8")
        value = convert(prop, "" if text == "\0" else text)  # "\0": Homie 5's empty string
        name = measurement_name(topic.node, topic.prop)
        if isinstance(value, Rejection):
            return refused(value.reason, f"{name}: {value.detail}")
        units = {name: prop.unit} if prop.unit else None
        return Parsed([Item({name: value}, sensor=topic.device, units=units)], [])


def measurement_name(node: str, prop: str) -> str:
    """``<node>_<property>``, each ``_`` of an id doubled: one name per property.

    Homie ids hold no ``_``, so a conforming device's names are ``<node>_<property>``
    (``engine_temperature``); node ``a_b`` with property ``c`` is ``a__b_c`` and node
    ``a`` with property ``b_c`` is ``a_b__c``. Ids neither start nor end with ``_``
    (:func:`topic_of`), so the one single ``_`` is the join and the name reads back.
    """
    if "_" in node or "_" in prop:
        return f"{node.replace('_', '__')}_{prop.replace('_', '__')}"
    return f"{node}_{prop}"


def _unknown(topic: Topic) -> str:
    """The detail of a value refused for want of its datatype."""
    if topic.version == 5:
        return (
            f"no $description of {topic.key[:120]!r} declares {topic.path[:120]} "
            "(types are not guessed)"
        )
    return f"no $datatype of {topic.key[:120]}/{topic.path[:120]} seen (types are not guessed)"


def _set(prop: Prop | None, attribute: str, value: str | None) -> Prop | None:
    """``prop`` with one Homie 4 attribute set (None: nothing left of it)."""
    current = prop or Prop()
    if attribute == "$datatype":
        current = current._replace(datatype=value)
    elif attribute == "$unit":
        current = current._replace(unit=value or None)
    else:
        current = current._replace(format=value)
    return None if current == Prop() else current


def convert(prop: Prop, text: str) -> object:
    """The value a payload's text stands for under its datatype, or a Rejection."""
    datatype = prop.datatype
    if datatype == "float":
        if _FLOAT.fullmatch(text):
            number = float(text)
            if math.isfinite(number):
                return number
        return Rejection("bad_value", f"{text[:40]!r} is not a Homie float")
    if datatype == "integer":
        if _INTEGER.fullmatch(text) and -_INT64 <= (whole := int(text)) < _INT64:
            return whole
        return Rejection("bad_value", f"{text[:40]!r} is not a Homie integer (64-bit)")
    if datatype == "boolean":
        if text in ("true", "false"):
            return text == "true"
        return Rejection("bad_value", f"{text[:40]!r} is not a Homie boolean (true, false)")
    if datatype == "string":
        return text
    problem = _text_problem(datatype, prop.format, text)
    return text if problem is None else Rejection("bad_value", problem)


def _text_problem(datatype: str | None, form: str | None, text: str) -> str | None:
    """Why a payload is not a value of a text datatype (enum, color...), or None."""
    shown = repr(text[:40])
    if datatype == "enum":
        if form and text not in form.split(","):
            return f"{shown} is not one of the enum's values ({form[:80]})"
        return None
    if datatype == "color":
        return None if _COLOR.fullmatch(text) else f"{shown} is not a Homie color"
    if datatype == "duration":
        return None if _DURATION.fullmatch(text) else f"{shown} is not an ISO 8601 duration"
    if datatype == "datetime":
        try:
            datetime.fromisoformat(text)
        except ValueError:
            return f"{shown} is not an ISO 8601 date and time"
        return None
    try:
        decoded = orjson.loads(text)
    except orjson.JSONDecodeError:
        return f"{shown} is not JSON"
    return None if type(decoded) in (dict, list) else f"{shown} is not a JSON object or array"


# --- subscriptions ----------------------------------------------------------------------

# What a daemon subscribes to for a Homie domain D: the attributes it uses (every daemon of
# a shared group must see them all) and the values (shared). Nothing else is subscribed:
# not /set, $broadcast, $log, $alert, $target, or the attributes it does not use.
_V4_ATTRIBUTES = tuple(("D", "+", "+", "+", name) for name in ATTRIBUTES)
_V5_ATTRIBUTES = (("D", V5, "+", DESCRIPTION),)
_V4_VALUES = (("D", "+", "+", "+"),)
_V5_VALUES = (("D", V5, "+", "+", "+"),)


def meet(a: Sequence[str], b: Sequence[str]) -> list[str] | None:
    """The filter (levels) matching exactly the topics both filters match, or None."""
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#":
            return out + list(b[i:])
        if y == "#":
            return out + list(a[i:])
        if x is None or y is None:
            return None
        if x == "+":
            out.append(y)
        elif y in ("+", x):
            out.append(x)
        else:
            return None
    return out


def _pieces(levels: list[str], domain: str, shared: bool) -> list[tuple[str, bool]]:
    """What of one filter a Homie rule needs: (filter, every daemon needs it)."""
    found: list[tuple[str, bool]] = []
    groups = (
        (_V4_ATTRIBUTES, True, 4),
        (_V5_ATTRIBUTES, True, 5),
        (_V4_VALUES, False, 4),
        (_V5_VALUES, False, 5),
    )
    for shapes, every, version in groups:
        for shape in shapes:
            piece = meet(levels, [domain if level == "D" else level for level in shape])
            if piece is None or (version == 4 and len(piece) > 1 and piece[1] == V5):
                continue  # the level after the domain is 5: Homie 5's, not a v4 device's
            found.append(("/".join(piece), every))
    if not shared:  # alone, a piece another one covers comes through that one
        split = [
            (f, every)
            for f, every in found
            if not any(
                g != f and meet(g.split("/"), f.split("/")) == f.split("/") for g, _ in found
            )
        ]
        found = split
    return found


def subscriptions(
    topics: Sequence[str], rules: Sequence[Rule], shared: bool
) -> list[tuple[str, bool]]:
    """``topics`` as subscribed, each with whether every daemon of a group must receive it.

    A filter that a ``homie`` rule takes (no earlier rule of another format shares its
    topics) is narrowed to the topics the format uses: the attribute topics, marked to be
    subscribed unshared and placed before every other filter (retained attributes then
    arrive before the retained values), then the value topics. Other filters are kept
    whole; one that also takes a Homie rule's attribute topics (``+/#``, the join of
    ``homie/#`` with a filter starting with a wildcard) is kept after those attribute
    topics, subscribed on their own as above: each attribute message then comes twice
    (once on each subscription; to one daemon of a group on the shared whole filter),
    and the second copy changes nothing held, while each value topic comes on the whole
    filter only. With ``shared``, attribute topics that an earlier rule of another format
    shares cannot be subscribed apart (that rule would take their copies twice):
    ValueError.
    """
    first: list[tuple[str, bool]] = []
    rest: list[tuple[str, bool]] = []
    for topic in topics:
        levels = topic.split("/")
        owner = _owner(levels, rules)
        if owner is None:
            first.extend((piece, True) for piece in _attributes_apart(topic, levels, rules, shared))
            rest.append((topic, False))
            continue
        for piece, every in _pieces(levels, _domain(owner), shared):
            (first if every else rest).append((piece, every))
    return list(dict.fromkeys([*first, *rest]))


def _domain(rule: Rule) -> str:
    """The domain level of a Homie rule's filter (``+`` when it is a wildcard)."""
    level = rule.subscriptions[0].split("/")[0]  # one filter (rules.ONE_FILTER_FORMATS)
    return "+" if level == "#" else level


def _owner(levels: list[str], rules: Sequence[Rule]) -> Rule | None:
    """The Homie rule that takes every topic of a filter, or None."""
    for rule in rules:
        for subscription in rule.subscriptions:
            theirs = subscription.split("/")
            if rule.format == "homie" and not rule.ignore and meet(theirs, levels) == levels:
                return rule
            if not rule.ignore and rule.format != "homie" and meet(theirs, levels) is not None:
                return None  # an earlier rule of another format takes some of its topics
    return None


def _attributes_apart(
    topic: str, levels: list[str], rules: Sequence[Rule], shared: bool
) -> list[str]:
    """The Homie rules' attribute topics under a filter kept whole, to subscribe apart.

    Only attribute topics a Homie rule takes entirely: a piece that an earlier rule of
    another format shares stays with the whole filter alone (raising ValueError with
    ``shared``, where one daemon of the group would learn those attributes).
    """
    out: list[str] = []
    for rule in rules:
        if rule.format != "homie" or rule.ignore:
            continue
        theirs = rule.subscriptions[0].split("/")  # one filter (rules.ONE_FILTER_FORMATS)
        for version, shapes in ((4, _V4_ATTRIBUTES), (5, _V5_ATTRIBUTES)):
            for shape in shapes:
                mine = meet(theirs, [_domain(rule) if level == "D" else level for level in shape])
                piece = None if mine is None else meet(levels, mine)
                if piece is None or (version == 4 and piece[1] == V5):
                    continue  # the level after the domain is 5: Homie 5's
                if _owner(piece, rules) is rule:
                    out.append("/".join(piece))
                elif shared:
                    raise ValueError(
                        f"topic filter {topic!r} also takes Homie attribute topics of rule "
                        f"{rule.name!r} that an earlier rule of another format shares, "
                        "while every daemon of a shared group must receive them on their "
                        "own subscription; narrow the filters so that rule's topics "
                        "leave the Homie rule's attribute topics alone"
                    )
    return out
