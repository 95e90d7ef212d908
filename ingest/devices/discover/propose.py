"""The proposed patterns, completed with what conventions and payloads say about them.

:func:`propose` gives each Homie domain other than ``homie/`` a ``homie`` rule, groups the
other captured topics (:func:`ingest.devices.discover.grouping.group`) and completes each pattern:
units and devices from Home Assistant discovery configs and Homie attributes
(:mod:`ingest.devices.discover.conventions`), device ids inside gateway payloads and the devices a
message lists (:mod:`ingest.devices.discover.identity`), a node level taken for the device, and a
NOTE on each guess, in particular on every place where values would land under something that is not
the device. Pure functions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ingest.devices.discover import conventions, onevalue
from ingest.devices.discover.chores import merge_chores
from ingest.devices.discover.grouping import group
from ingest.devices.discover.identity import (
    container,
    descriptive,
    identity,
    json_docs,
    suffix_units,
)
from ingest.devices.discover.patterns import (
    GENERIC_LAST,
    VARIABLE,
    Pattern,
    device_score,
    field_values,
    literal,
    order,
    quote,
    safe,
)
from ingest.devices.discover.selection import select
from ingest.devices.discover.units import units_of
from ingest.devices.rules import EVERY_UNIT
from ingest.model import RESERVED_FIELDS

if TYPE_CHECKING:
    from ingest.devices.discover.conventions import Entity, Known
    from ingest.devices.discover.identity import Container, Identity
    from ingest.devices.discover.patterns import Captured

KIND = -3  # device_score of a level that names a kind of message (events, data)


def propose(messages: list[Captured], known: Known | None = None) -> list[Pattern]:
    """The patterns to propose as rules, in rule order (the more literal first).

    ``known``: what the conventions say (:func:`ingest.devices.discover.conventions.read` over the
    whole capture; by default over ``messages``).
    """
    if known is None:
        known = conventions.read([(m.topic, m.payload) for m in messages])
    homie = _homie_domains(messages, known)
    taken = {t for p in homie for t in p.topics}
    rest = [m for m in messages if m.topic not in taken]
    now = time.time()
    trees, rest = onevalue.split(rest)
    for tree in trees:
        _tree_units(tree, known)
        _table_units(tree)
    patterns = (
        homie
        + trees
        + [
            r
            for p in group(rest, known)
            for q in _complete(p, known, _wills(messages))
            for r in select(q, now)
        ]
    )
    patterns = onevalue.merge_values(patterns)
    data = {t for p in patterns if p.kind != "ignore" and not p.match for t in p.topics}
    plain = [p for p in patterns if not p.match]
    patterns = [p for p in patterns if p.match] + merge_chores(plain, data)
    return sorted(patterns, key=order)


def _homie_domains(messages: list[Captured], known: Known) -> list[Pattern]:
    """A ``homie`` rule for each Homie domain other than ``homie`` (the preset's).

    The convention lets a controller choose the root; the homie format reads any domain
    as the preset reads ``homie/``. The rule takes the topics of the domain's devices
    and its ``$broadcast``; other topics under that root are proposed as usual.
    """
    devices: dict[str, list[str]] = {}
    for prefix in sorted(known.homie_devices):
        root = prefix.split("/")[0]
        if root != "homie" and literal(root) == root:
            devices.setdefault(root, []).append(prefix)
    out = []
    for root, prefixes in devices.items():
        topics = {
            m.topic
            for m in messages
            if m.topic.startswith(f"{root}/$")
            or any(m.topic.startswith(f"{prefix}/") for prefix in prefixes)
        }
        if not topics:
            continue
        pattern = Pattern([root, "#"], "homie", topics)
        names = [p.split("/")[-1] for p in prefixes]
        pattern.notes.append(
            f"Homie devices under {root}/ (a domain of their own, {len(names)} device(s): "
            f"{', '.join(names[:3])}): the homie format reads them as --preset homie "
            "reads homie/: sensor id the device id, measurement <node>_<property>, typed by "
            "its $datatype, with its $unit; attributes are state, never readings"
        )
        out.append(pattern)
    return out


def _complete(pattern: Pattern, known: Known, wills: frozenset[str] = frozenset()) -> list[Pattern]:
    """The pattern with what conventions and payloads say: units, devices, notes.

    ``wills``: the topics' prefixes that have a last will of their own (``<prefix>/LWT``).
    """
    out = [pattern]
    if pattern.kind == "value":
        out = _value_units(pattern, known)
    elif pattern.kind == "json":
        _json_units(pattern, known)
        _payload_identity(pattern)
        _field_unit(pattern)
    if pattern.kind in {"value", "json"}:
        _home_assistant_device(pattern, known)
    for part in out:
        if part.kind in {"value", "json"} and not part.sensor_id:
            _node_level(part)
        if part.kind == "value" and not part.sensor_id:
            _will_level(part, wills)
        _describe_conventions(part, known)
        _table_units(part)
    return [p for p in out if p.topics]


def _stored_numbers(pattern: Pattern) -> dict[str, list[float]]:
    """The names the pattern's rule stores numbers under, as far as seen, with the numbers.

    Not those seen as 0 and 1 only: a switch's state (Tasmota's ``"Power": 1``) has no
    physical unit whatever its name.
    """
    seen: dict[str, list[object]] = {}
    if pattern.kind == "value" or (pattern.kind == "json" and pattern.measurement):
        template = pattern.measurement or "value"
        for topic in pattern.topics:
            name = safe(_render(template, pattern.captures(topic)))
            for payload in pattern.payloads.get(topic, []):
                seen.setdefault(name, []).append(_number(payload, pattern.kind))
    elif pattern.kind == "json":
        used = {
            f for t in [*pattern.sensor_id, *pattern.tags.values()] for f in VARIABLE.findall(t)
        }
        seen = {
            k: vs
            for k, vs in field_values(pattern.samples, pattern.each).items()
            if k not in used and k not in pattern.drop
        }
    numbers = {
        k: [float(v) for v in vs if type(v) in {int, float}]  # type: ignore[arg-type]
        for k, vs in sorted(seen.items())
    }
    return {k: vs for k, vs in numbers.items() if vs and not set(vs) <= {0, 1}}


def _number(payload: bytes, kind: str) -> object:
    """A plain value's number, or a one-value JSON payload's value."""
    if kind == "json":
        docs = json_docs([payload])
        return docs[0].get("value") if docs and type(docs[0]) is dict else None
    try:
        return float(payload)
    except ValueError:
        return None


def _tree_units(pattern: Pattern, known: Known) -> None:
    """A one-value tree's units: from a unit attribute topic or the payloads' unit field.

    Where every payload carries its unit, ``"*" = "{unit}"``: each measurement, seen in
    the capture or not, takes the unit its payload gives.
    """
    docs = [d for t in pattern.topics for d in json_docs(pattern.payloads.get(t, []))]
    if docs and all(type(d) is dict and type(d.get("unit")) is str and d["unit"] for d in docs):
        pattern.units[EVERY_UNIT] = "{unit}"
        pattern.notes.append(
            "every payload gives its unit: each measurement's unit is its payload's unit "
            'field ("*" = "{unit}")'
        )
        return
    found: dict[str, set[str]] = {}
    for topic in pattern.topics:
        name = safe(_render(pattern.measurement or "value", pattern.captures(topic)))
        given = {
            d["unit"]
            for d in json_docs(pattern.payloads.get(topic, []))
            if type(d) is dict and type(d.get("unit")) is str and d["unit"]
        }
        if topic in known.homie_units:
            given.add(known.homie_units[topic])
        if given:
            found.setdefault(name, set()).update(given)
    units = _single(found)
    if units:
        pattern.units.update(units)
        pattern.notes.append(
            f"units from the payloads' unit field or a unit topic beside the value "
            f"({', '.join(f'{n} {u}' for n, u in sorted(units.items())[:6])})"
        )


def _field_unit(pattern: Pattern) -> None:
    """``{"value": 3.3, "unit": "V"}``: the one number's unit is the payload's unit field."""
    fields = field_values(pattern.samples, pattern.each)
    unit = next((k for k in ("unit", "units", "uom") if k in fields), None)
    if unit is None or not all(type(v) is str for v in fields[unit]):
        return
    numbers = [
        k for k, vs in fields.items() if k != unit and any(type(v) in {int, float} for v in vs)
    ]
    if len(numbers) == 1 and numbers[0] not in pattern.units:
        pattern.units[numbers[0]] = f"{{{unit}}}"
        pattern.notes.append(f"the unit of {numbers[0]} is the payload's {unit} field")


def _table_units(pattern: Pattern) -> None:
    """Units the names imply (:mod:`ingest.devices.discover.units`), as a suggestion.

    None where the payloads give every unit (``"*"``): theirs is the device's word.
    """
    if EVERY_UNIT in pattern.units:
        return
    numbers = _stored_numbers(pattern)
    found = {
        n: u
        for n, u in {**units_of(numbers), **suffix_units(list(numbers))}.items()
        if n not in pattern.units and n not in RESERVED_FIELDS
    }
    if not found:
        return
    pattern.units.update(found)
    given = ", ".join(f"{n} {u}" for n, u in sorted(found.items())[:8])
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    pattern.notes.append(
        f"units suggested by the names ({given}{more}; the table in docs/onboarding.md): "
        "confirm them against the device's documentation"
    )


def _describe_conventions(pattern: Pattern, known: Known) -> None:
    configs = any(t.endswith("/config") for t in pattern.topics)
    if configs and pattern.kind == "ignore" and known.configs:
        described = len({e.state_topic for es in known.entities.values() for e in es})
        pattern.notes.append(
            f"Home Assistant MQTT discovery: {known.configs} config(s) "
            f"describe {described} state topic(s); their units and names "
            "are in the rules for those topics"
        )
    attributes = sorted({label for t in pattern.topics for label in known.attributes.get(t, [])})
    if attributes and pattern.kind != "ignore":
        pattern.notes.append(
            "Home Assistant reads these as attributes of "
            f"{', '.join(attributes[:3])}: descriptive text (names, "
            "addresses) is stored as text values; drop what is no reading"
        )
    computed = sorted(
        {e.template for t in pattern.topics for e in known.entities.get(t, []) if e.template}
    )
    if computed:
        pattern.notes.append(
            f"Home Assistant computes the value with {computed[0]}: stored "
            "as published, not as computed"
        )


def _home_assistant_device(pattern: Pattern, known: Known) -> None:
    """The device Home Assistant's configs name for every topic of the pattern, if one."""
    if pattern.sensor_id or "{sensor_id}" not in pattern.levels or not pattern.topics:
        return
    named = [{e.device for e in known.entities.get(t, [])} for t in pattern.topics]
    devices = set().union(*named)
    if len(devices) != 1 or None in devices or not all(named):
        return
    device = devices.pop()
    assert device is not None
    index = pattern.levels.index("{sensor_id}")
    levels = sorted({t.split("/")[index] for t in pattern.topics})
    pattern.levels[index] = literal(levels[0]) if len(levels) == 1 else "+"
    pattern.sensor_id = [_braces(device)]
    pattern.notes = [
        n for n in pattern.notes if not n.startswith(("one device seen", "the level taken"))
    ]
    pattern.notes.append(
        f"Home Assistant's discovery configs name the device {device!r} "
        f"for these topics (topic level {levels[0]!r}): the sensor id"
    )


def _render(template: str, captures: dict[str, str]) -> str:
    return VARIABLE.sub(lambda m: captures.get(m.group(1), m.group(0)), template)


def _unit(topic: str, known: Known, entities: list[Entity]) -> str | None:
    return known.homie_units.get(topic) or next((e.unit for e in entities if e.unit), None)


def _value_units(pattern: Pattern, known: Known) -> list[Pattern]:
    """Units of plain values; an entity the topic does not name gets a rule of its own."""
    units: dict[str, set[str]] = {}
    alone: list[Pattern] = []
    for topic in sorted(pattern.topics):
        name = safe(_render(pattern.measurement or "value", pattern.captures(topic)))
        entities = [e for e in known.entities.get(topic, []) if e.path is None]
        unit = _unit(topic, known, entities)
        alone_ok = all(literal(lv) == lv for lv in topic.split("/"))
        if (
            entities
            and alone_ok
            and (
                name.lower() in GENERIC_LAST or (name in units and unit and unit not in units[name])
            )
        ):
            alone.append(_entity_pattern(pattern, topic, entities[0]))
            continue
        if unit:
            units.setdefault(name, set()).add(unit)
        for entity in entities:
            pattern.values.update(_onoff(entity))
    pattern.topics -= {t for p in alone for t in p.topics}
    pattern.units = _single(units)
    return [pattern, *alone]


def _single(units: dict[str, set[str]]) -> dict[str, str]:
    """The measurements given one unit only, with it."""
    return {m: min(us) for m, us in units.items() if len(us) == 1}


def _onoff(entity: Entity) -> dict[str, bool]:
    if entity.component not in {"binary_sensor", "switch", "light", "fan", "siren"}:
        return {}
    return {entity.payload_on or "ON": True, entity.payload_off or "OFF": False}


def _entity_pattern(whole: Pattern, topic: str, entity: Entity) -> Pattern:
    """One Home Assistant entity's state topic as a rule: its device, its name, its unit."""
    device = entity.device or whole.captures(topic).get("sensor_id") or entity.label
    name = safe(entity.device_class or entity.label)
    part = Pattern(
        topic.split("/"),
        "value",
        {topic},
        {topic: whole.payloads.get(topic, [])},
        _braces(name),
        sensor_id=[_braces(device)],
        values=_onoff(entity),
    )
    if entity.unit:
        part.units[name] = entity.unit
    part.notes.append(
        f"Home Assistant entity {entity.label!r} ({entity.component}, "
        f"{entity.config_topic}): device {device!r}, measurement {name!r}"
    )
    return part


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _json_units(pattern: Pattern, known: Known) -> None:
    units: dict[str, set[str]] = {}
    for topic in pattern.topics:
        for entity in known.entities.get(topic, []):
            if entity.path is not None and entity.unit:
                units.setdefault(safe("_".join(entity.path)), set()).add(entity.unit)
    pattern.units = _single(units)
    clashes = sorted(m for m, us in units.items() if len(us) > 1)
    if clashes:
        pattern.notes.append(
            f"Home Assistant gives {', '.join(clashes)} different units on "
            "different topics: left without a unit"
        )


def _payload_identity(pattern: Pattern) -> None:
    """Device ids inside the payloads (a gateway's topic, or message, carries many)."""
    if "{sensor_id}" not in pattern.levels:
        return
    index = pattern.levels.index("{sensor_id}")
    devices = sorted({t.split("/")[index] for t in pattern.topics})
    where = container(pattern.payloads, len(devices))
    found = identity(pattern.payloads, len(devices), where)
    if found is None:
        return
    pattern.sensor_id = found.templates
    pattern.notes = [
        n for n in pattern.notes if not n.startswith(("one device seen", "the level taken"))
    ]
    fields = ", ".join(found.fields)
    if where is not None:
        _listed(pattern, index, devices, where, found)
    elif found.shared:
        pattern.levels[index] = literal(devices[0]) if len(devices) == 1 else "+"
        pattern.notes.append(
            f"one topic carries several devices ({found.shared[0]}): the topic level "
            f"{devices[0]!r} is a gateway or a kind of message, not the device; the sensor "
            f"id comes from the payload's {fields} (e.g. {found.example!r}), the fields "
            "it uses are not stored as values"
        )
    else:
        pattern.levels[index] = literal(devices[0]) if len(devices) == 1 else "+"
        pattern.notes.append(
            f"the payload names its device ({fields}): the sensor id comes from there (e.g. "
            f"{found.example!r}) rather than the topic level ({devices[0]!r}, ...)"
        )
    for name in found.info:
        pattern.tags[name] = f"{{{name}}}"
        pattern.info.append(name)
    numbers = {
        k: [float(v) for v in vs if type(v) in {int, float}]  # type: ignore[arg-type]
        for k, vs in field_values(pattern.samples, pattern.each).items()
        if k not in {*found.fields, *pattern.drop} and any(type(v) in {int, float} for v in vs)
    }
    if where is not None:
        _named_units(pattern, numbers)
    elif "model" in found.fields or "model" in found.info:  # rtl_433's data format
        units = suffix_units(list(numbers))
        if units:
            pattern.units.update(units)
            pattern.notes.append(
                "units from the field names (rtl_433's <Type>_<Unit>: temperature_C is °C)"
            )
    text = descriptive(pattern.payloads, found, where)
    if text:
        pattern.notes.append(
            f"text that never changes for a device ({', '.join(text[:4])}) is stored as a "
            f"value with every reading; to keep it as descriptive info instead add "
            f'[rule.tags] {text[0]} = "{{{text[0]}}}" and info = [{quote(text[0])}]'
        )


def _listed(
    pattern: Pattern, index: int, devices: list[str], where: Container, found: Identity
) -> None:
    """A message that lists several devices: one reading each.

    The topic level is the gateway that sent them, kept as info rather than the device.
    """
    pattern.each = where.each
    pattern.drop += [f for f in where.echo if f not in found.fields]
    at = f"in the array {where.each!r}" if where.each else "as an array of objects"
    if where.keyed:
        at = f"in the object {where.each!r}, a member each"
    count = "one in each message" if where.most == 1 else f"up to {where.most} in one"
    how = (
        f"the member's name is the sensor id ({{_key}}, e.g. {found.example!r})"
        if where.keyed
        else f"the sensor id comes from their {', '.join(found.fields)} "
        f"(e.g. {found.example!r}; not stored as values)"
    )
    echo = f"; {', '.join(where.echo)} repeats it: dropped" if where.keyed and where.echo else ""
    pattern.notes.append(
        f"messages list the devices they carry ({count}, {at}): "
        f"{'each makes' if where.each else 'the rule makes'} a reading of every one; "
        f"{how}{echo}"
    )
    if len(devices) == 1 and device_score(devices[0], index) <= KIND:
        pattern.levels[index] = literal(devices[0])  # a kind of message (events), no gateway
        return
    name = "gateway" if "{gateway}" not in pattern.levels else f"level{index + 1}"
    pattern.levels[index] = f"{{{name}}}"
    pattern.info.append(name)
    seen = ", ".join(repr(d) for d in devices[:3]) + (", ..." if len(devices) > 3 else "")
    pattern.notes.append(
        f"the topic level ({seen}) names the gateway that sent them, not a device: the "
        f"capture {{{name}}} is stored as info with each reading (info = [{quote(name)}]), "
        "not part of the sensor id or the series"
    )


def _named_units(pattern: Pattern, numbers: dict[str, list[float]]) -> None:
    """Units the listed devices' field names give (hum: %, temperature_C: °C, temp: °C).

    ``numbers``: each numeric field with the numbers seen. A NOTE names the numbers left
    without one.
    """
    physical = {k: vs for k, vs in numbers.items() if not set(vs) <= {0, 1}}  # not a state
    units = {**units_of(physical), **suffix_units(list(numbers))}
    pattern.units.update(units)
    bare = [n for n in numbers if n not in units and n not in RESERVED_FIELDS]
    given = ", ".join(f"{n} {u}" for n, u in sorted(units.items()))
    notes = [f"units from the field names ({given})"] if units else []
    if bare:
        one = len(bare) == 1
        notes.append(
            f"{', '.join(bare[:6])} {'has' if one else 'have'} no unit: "
            f"{'its name does' if one else 'their names do'} not say which (add "
            f"{'it' if one else 'them'} under [rule.units], by the stored name)"
        )
    if notes:
        pattern.notes.append("; ".join(notes))


def _node_level(pattern: Pattern) -> None:
    """A device level whose values repeat under several parents is a node, not the device."""
    levels = pattern.levels
    if "{sensor_id}" not in levels:
        return
    index = levels.index("{sensor_id}")
    parent = next((i for i in range(index - 1, 0, -1) if levels[i].startswith("{")), None)
    if parent is None:
        return
    parents: dict[str, set[str]] = {}
    for topic in pattern.topics:
        parts = topic.split("/")
        parents.setdefault(parts[index], set()).add(parts[parent])
    shared = sorted(v for v, ps in parents.items() if len(ps) > 1)
    if not shared:
        return
    node = "node" if "{node}" not in levels else f"level{index + 1}"
    levels[parent], levels[index] = "{sensor_id}", f"{{{node}}}"
    if pattern.kind == "value":
        pattern.measurement = f"{{{node}}}_{pattern.measurement or 'value'}"
    where = sorted(parents[shared[0]])
    pattern.notes.append(
        f"{shared[0]!r} appears under several devices ({', '.join(where[:3])}): it names a "
        "part of a device (a node, a channel), so the level before it is the sensor id and "
        + (
            "this level is part of the measurement name"
            if pattern.kind == "value"
            else f"this level is the tag {node!r}"
        )
    )


WILL_WORDS = frozenset({"lwt", "will", "availability", "status", "connection"})


def _wills(messages: list[Captured]) -> frozenset[str]:
    """The prefixes that publish a last will or availability topic of their own."""
    return frozenset(
        m.topic.rsplit("/", 1)[0]
        for m in messages
        if "/" in m.topic and m.topic.rsplit("/", 1)[1].lower() in WILL_WORDS
    )


def _will_level(pattern: Pattern, wills: frozenset[str]) -> None:
    """A level before the device's whose every prefix has a last will is the device.

    ESPEasy's ``%sysname%/%tskname%/%valname%`` beside ``%sysname%/LWT``: the client that
    connects to the broker (and leaves a will) is the device; the task under it names a
    part of it, so it becomes part of the measurement name (``BME280_Temperature``).
    """
    levels = pattern.levels
    if "{sensor_id}" not in levels or not wills:
        return
    index = levels.index("{sensor_id}")
    for i in range(index):
        if not levels[i].startswith("{"):
            continue
        prefixes = {"/".join(t.split("/")[: i + 1]) for t in pattern.topics}
        if len(prefixes) < 2 or not prefixes <= wills:
            continue
        node = "node" if "{node}" not in levels else f"level{index + 1}"
        levels[i], levels[index] = "{sensor_id}", f"{{{node}}}"
        pattern.measurement = f"{{{node}}}_{pattern.measurement or 'value'}"
        shown = ", ".join(sorted(prefixes)[:2])
        pattern.notes.append(
            f"each value of this level has a last will of its own ({shown}): it is the "
            "client that connects, so it is the sensor id, and the level after it is "
            "part of the measurement name"
        )
        return
