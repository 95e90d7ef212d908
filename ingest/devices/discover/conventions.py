"""Conventions that describe other topics: Home Assistant MQTT discovery and Homie.

Pure functions over captured ``(topic, payload)`` messages, used by ``ingest discover``
(:mod:`ingest.devices.discover.patterns`) to name units, measurements and devices it could only
guess from the topics:

- Home Assistant MQTT discovery (home-assistant.io ``source/_integrations/mqtt.markdown``,
  "MQTT Discovery", and ``sensor.mqtt.markdown``): a JSON config on
  ``<prefix>/<component>/[<node_id>/]<object_id>/config`` names a ``state_topic``, the
  ``unit_of_measurement``, ``device_class``, ``value_template`` (``{{ value_json.x }}``:
  which JSON field is the value), ``json_attributes_topic``, availability and command
  topics and the ``device``; names may be abbreviated (``stat_t``, ``unit_of_meas``,
  ``dev``: ``ids``, ``cns``), ``~`` stands for a base topic at either end of a ``*_topic``
  value, and a device config (component ``device``) lists its entities under ``cmps``
  with shared options at the top (``state_topic``).
- Homie 3/4 (homieiot.github.io, convention v4.0.0): ``<root>/<device>/$homie`` marks a
  device; ``<node>/<property>`` carry plain values, ``<property>/$unit`` their unit, and
  every level starting with ``$`` is an attribute. Homie 5 (``homie/5/<device>``) puts
  the units in the device's ``$description`` JSON (``nodes.<node>.properties.<p>.unit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterable

# The abbreviations of the option names discover reads (mqtt.markdown's tables).
ABBREVIATIONS = {
    "stat_t": "state_topic",
    "unit_of_meas": "unit_of_measurement",
    "dev_cla": "device_class",
    "val_tpl": "value_template",
    "json_attr_t": "json_attributes_topic",
    "dev": "device",
    "uniq_id": "unique_id",
    "obj_id": "object_id",
    "p": "platform",
    "cmps": "components",
    "cmp": "components",
    "avty_t": "availability_topic",
    "avty": "availability",
    "pl_on": "payload_on",
    "pl_off": "payload_off",
    "stat_cla": "state_class",
    "o": "origin",
    "t": "topic",
    "cmd_t": "command_topic",
    "ids": "identifiers",
    "cns": "connections",
    "mdl": "model",
    "mf": "manufacturer",
    "sn": "serial_number",
}
_VALUE_JSON = re.compile(
    r"^\{\{-?\s*value_json((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\s*'[^']+'\s*\]|\[\s*\"[^\"]+\"\s*\])+)"
    r"\s*(?:\|\s*(?:float|int|round(?:\(\s*\d*\s*\))?|float\(\s*0?\s*\)|int\(\s*0?\s*\))"
    r"\s*)*-?\}\}$"
)
_VALUE = re.compile(r"^\{\{-?\s*value\s*(?:\|\s*(?:float|int|round(?:\(\s*\d*\s*\))?)\s*)*-?\}\}$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*['\"]([^'\"]+)['\"]\s*\]")
COMPONENTS = frozenset(
    {
        "alarm_control_panel",
        "binary_sensor",
        "button",
        "camera",
        "climate",
        "cover",
        "device_automation",
        "device_tracker",
        "event",
        "fan",
        "humidifier",
        "image",
        "lawn_mower",
        "light",
        "lock",
        "notify",
        "number",
        "scene",
        "select",
        "sensor",
        "siren",
        "switch",
        "tag",
        "text",
        "update",
        "vacuum",
        "valve",
        "water_heater",
        "device",
    }
)


@dataclass(frozen=True)
class Entity:
    """One Home Assistant entity a discovery config describes."""

    config_topic: str
    component: str  # sensor, binary_sensor, switch, ...
    state_topic: str
    path: tuple[str, ...] | None  # the JSON field the value is; None: the whole payload
    template: str | None  # a value_template discover cannot follow (the value is computed)
    unit: str | None
    device_class: str | None
    label: str  # object_id, else name, else the config topic's object id
    device: str | None  # device identifiers[0], connections[0][1] or name
    payload_on: str | None = None
    payload_off: str | None = None


@dataclass
class Known:
    """What the conventions say about the captured topics."""

    entities: dict[str, list[Entity]] = field(default_factory=dict)  # by state topic
    attributes: dict[str, list[str]] = field(default_factory=dict)  # topic -> entity labels
    chores: set[str] = field(default_factory=set)  # availability and command topics
    configs: int = 0  # discovery configs read
    homie_devices: set[str] = field(default_factory=set)  # "<root>/<device>" prefixes
    homie_units: dict[str, str] = field(default_factory=dict)  # property topic -> unit


UNIT_TOPICS = frozenset({"unit", "units", "uom"})  # a value topic's unit, published beside it


def read(messages: Iterable[tuple[str, bytes]]) -> Known:
    """Home Assistant discovery configs and Homie attributes among ``(topic, payload)``."""
    known = Known()
    for topic, payload in messages:
        levels = topic.split("/")
        if levels[-1] == "config" and len(levels) >= 4:
            _discovery(topic, payload, known)
        elif levels[-1].startswith("$") and len(levels) >= 3:
            _homie(levels, payload, known)
        elif levels[-1].lower() in UNIT_TOPICS and len(levels) >= 2:
            _unit_topic(levels, payload, known)
    return known


def _unit_topic(levels: list[str], payload: bytes, known: Known) -> None:
    """A unit attribute topic beside a value (``<value topic>/unit``: ``°C``)."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        return
    if 0 < len(text) <= 16 and not any(c in text for c in '{}[]"\n'):
        known.homie_units.setdefault("/".join(levels[:-1]), text)


def _expand(doc: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in doc.items():
        name = ABBREVIATIONS.get(key, key)
        if name.endswith("_t") and name not in out:  # *_cmd_t, *_stat_t: topics
            name = name[:-2] + "_topic"
        out[name] = value
    return out


def _discovery(topic: str, payload: bytes, known: Known) -> None:
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return
    if type(doc) is not dict:
        return
    config = _expand(doc)
    levels = topic.split("/")
    object_id = levels[-2]
    component = next((lv for lv in (levels[-3], levels[-4]) if lv in COMPONENTS), levels[-3])
    parts = config.get("components")
    if type(parts) is dict:  # device discovery: shared options at the top
        known.configs += 1
        shared = {k: v for k, v in config.items() if k != "components"}
        for key, part in parts.items():
            if type(part) is dict:
                entity = {**shared, **_expand(part)}
                _entity(topic, str(entity.get("platform", "")), str(key), entity, known)
        return
    if "state_topic" in config or any(k.endswith("_topic") for k in config):
        known.configs += 1
        _entity(topic, component, object_id, config, known)


def _topics(config: dict[str, object]) -> dict[str, str]:
    base = config.get("~")
    out = {}
    for key, value in config.items():
        if not key.endswith("_topic") or type(value) is not str or not value:
            continue
        topic = value
        if type(base) is str and value.startswith("~"):
            topic = base + value[1:]
        elif type(base) is str and value.endswith("~"):
            topic = value[:-1] + base
        out[key] = topic
    return out


def _entity(
    config_topic: str, component: str, object_id: str, config: dict[str, object], known: Known
) -> None:
    topics = _topics(config)
    for key, topic in topics.items():
        if "command" in key or key == "availability_topic":
            known.chores.add(topic)
    availability = config.get("availability")
    for entry in availability if type(availability) is list else []:
        if type(entry) is dict and type(entry.get("topic", entry.get("t"))) is str:
            known.chores.add(str(entry.get("topic", entry.get("t"))))
    label = _text(config.get("object_id")) or _text(config.get("name")) or object_id
    attributes = topics.get("json_attributes_topic")
    if attributes:
        known.attributes.setdefault(attributes, []).append(label)
    state = topics.get("state_topic")
    if not state:
        return
    template = _text(config.get("value_template"))
    path = _path(template)
    entity = Entity(
        config_topic,
        component,
        state,
        path,
        template if template and path is None and not _VALUE.match(template) else None,
        _text(config.get("unit_of_measurement")),
        _text(config.get("device_class")),
        label,
        _device(config.get("device")),
        _text(config.get("payload_on")),
        _text(config.get("payload_off")),
    )
    known.entities.setdefault(state, []).append(entity)


def _path(template: str | None) -> tuple[str, ...] | None:
    """The JSON field a value template reads (``{{ value_json.a.b | float }}``), or None."""
    if not template:
        return None
    match = _VALUE_JSON.match(template.strip())
    if not match:
        return None
    return tuple(a or b for a, b in _STEP.findall(match.group(1)))


def _device(raw: object) -> str | None:
    if type(raw) is not dict:
        return None
    device = _expand(raw)
    ids = device.get("identifiers")
    if type(ids) is list and ids and type(ids[0]) is str:
        return ids[0]
    if type(ids) is str and ids:
        return ids
    links = device.get("connections")
    if type(links) is list and links and type(links[0]) is list and len(links[0]) == 2:
        return str(links[0][1])
    return _text(device.get("name"))


def _text(value: object) -> str | None:
    return value if type(value) is str and value else None


def _homie(levels: list[str], payload: bytes, known: Known) -> None:
    attribute = levels[-1]
    if attribute == "$homie":
        known.homie_devices.add("/".join(levels[:-1]))
    elif attribute == "$unit":
        unit = payload.decode("utf-8", "replace").strip()
        if unit:
            known.homie_units["/".join(levels[:-1])] = unit
    elif attribute == "$description":  # Homie 5: nodes and properties in one document
        known.homie_devices.add("/".join(levels[:-1]))
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        nodes = doc.get("nodes") if type(doc) is dict else None
        for node, spec in nodes.items() if type(nodes) is dict else ():
            props = spec.get("properties") if type(spec) is dict else None
            for prop, desc in props.items() if type(props) is dict else ():
                given = desc.get("unit") if type(desc) is dict else None
                if type(given) is str and given:
                    known.homie_units["/".join([*levels[:-1], node, prop])] = given
