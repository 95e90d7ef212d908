"""Mapping files: TOML read with ``tomllib``, validated into :class:`Rule` objects.

Every problem raises :class:`ConfigError` with one line naming the source, the rule and
the problem (``--mapping FILE: rule 'NAME': ...``), so the CLI prints it and exits 2.
Presets are ordinary mapping files shipped in ``ingest/devices/presets``.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ingest.devices import page_order
from ingest.devices.formats.times import TIME_FORMATS
from ingest.errors import ConfigError
from ingest.model import RESERVED_FIELDS, RESERVED_TAGS

FORMATS = ("ingest", "json", "value", "senml", "influx", "sparkplug", "homie")
STRINGS = ("keep", "drop", "reject")
KINDS = ("number", "boolean", "string")  # what [rule.types] may declare
MAX_STRING_BYTES = 65_536
MAX_RULES = 1000
_RULE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
# A last level capturing the rest of the topic, one or more levels: {name#}.
_REST = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})#\}")
# A template variable: a capture, {tag.<key>} (influx) or a payload path (json: {a.b}).
_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]{0,63}(?:\.[A-Za-z0-9_-]{1,64}){0,7})\}")
_PATH = re.compile(r"[A-Za-z0-9_-]{1,64}(?:\.[A-Za-z0-9_-]{1,64}){0,7}")
MAX_ALTERNATIVES = 8  # sensor_id templates tried in order
_TAG_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FLATTEN = re.compile(r"[A-Za-z0-9_-]{1,8}")
MAX_UNIT = 64  # characters of a unit
EVERY_UNIT = "*"  # [rule.units] key: the unit of every measurement no other key names
MAX_MATCH_VALUES = 64  # values one [rule.match] field may take
MAX_MATCH_KEY = 256  # characters of a [rule.match] field name
MAX_TOPICS = 64  # topic filters one rule may list
ONE_FILTER_FORMATS = ("sparkplug", "homie")  # formats whose rule takes one topic filter
MATCH_FORMATS = ("json", "ingest")  # payloads [rule.match] reads (and ignore rules)
_OPTIONS = frozenset(
    {
        "name",
        "topic",
        "ignore",
        "format",
        "sensor_id",
        "measurement",
        "flatten",
        "drop",
        "keep",
        "strings",
        "max_string_bytes",
        "values",
        "time",
        "tags",
        "info",
        "root",
        "each",
        "rename",
        "units",
        "types",
        "match",
        "value_field",
    }
)
_LINE_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_TIME_OPTIONS = frozenset({"field", "format", "zone"})
_DEFAULT_TIME = {"influx": "epoch_ns", "sparkplug": "epoch_ms"}


class Template:
    """A string with ``{name}`` variables, parsed once; ``{{`` and ``}}`` are literal braces."""

    __slots__ = ("names", "parts", "single", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[tuple[bool, str]] = []  # (is_variable, literal or name)
        pos = 0
        for match in _VAR.finditer(text):
            parts.append((False, text[pos : match.start()]))
            parts.append((True, match.group(1)))
            pos = match.end()
        parts.append((False, text[pos:]))
        for is_var, literal in parts:
            if not is_var and (
                "{" in literal.replace("{{", "") or "}" in literal.replace("}}", "")
            ):
                raise ValueError(
                    f"template {text!r}: a '{{' or '}}' that is not a {{name}} variable"
                )
        self.parts = tuple(
            (v, p if v else p.replace("{{", "{").replace("}}", "}")) for v, p in parts if v or p
        )
        self.names = frozenset(p for v, p in self.parts if v)
        only = self.parts[0] if len(self.parts) == 1 else None
        self.single = only[1] if only is not None and only[0] else None

    def render(self, variables: dict[str, str]) -> str | None:
        """The text with its variables filled in; None if one is missing."""
        if self.single is not None:
            return variables.get(self.single)
        out = []
        for is_var, part in self.parts:
            if is_var:
                value = variables.get(part)
                if value is None:
                    return None
                out.append(value)
            else:
                out.append(part)
        return "".join(out)


class Alternatives(Template):
    """Templates tried in order: the first whose variables are all present gives the text."""

    __slots__ = ("templates",)

    def __init__(self, templates: list[Template]) -> None:
        self.templates = tuple(templates)
        self.text = " | ".join(t.text for t in templates)
        self.parts = ()
        self.names = frozenset().union(*(t.names for t in templates))
        self.single = None

    def render(self, variables: dict[str, str]) -> str | None:
        """The first alternative's text that renders; None if none does."""
        for template in self.templates:
            text = template.render(variables)
            if text is not None:
                return text
        return None


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """Where a reading's time is and in what form."""

    field: str | None = None
    format: str = "auto"
    zone: ZoneInfo | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One validated mapping rule."""

    name: str
    # The topic filters the rule takes, tried in order (``topic`` a string or a list);
    # every one captures the same names.
    topics: tuple[str, ...]
    source: str
    captures: tuple[str, ...]
    ignore: bool = False
    format: str = "json"
    sensor_id: Template | None = None  # None: the format's default (see docs/mapping.md)
    measurement: Template | None = None
    flatten: str = "_"
    drop: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    strings: str = "keep"
    max_string_bytes: int = 256
    values: dict[str, int | float | bool | str] = field(default_factory=dict)
    time: TimeSpec = field(default_factory=TimeSpec)
    time_configured: bool = False
    tags: dict[str, Template] = field(default_factory=dict)
    # Payload tags (line protocol) the sensor id or measurement templates use
    # ({tag.host}): part of those, not also tags, as captures are not.
    named_tags: frozenset[str] = frozenset()
    # Tags that describe a reading rather than identify its series (``info = [...]``):
    # stored with it (``info``), never part of the series' key.
    info: frozenset[str] = frozenset()
    # json: the object whose fields are the measurements (``root = "a.b"``), or whose
    # elements/members are one reading each (``each``); as paths of keys.
    root: tuple[str, ...] | None = None
    each: tuple[str, ...] | None = None
    rename: dict[str, str] = field(default_factory=dict)  # field name -> stored name
    # ``[rule.types]``: (measurement name or glob, kind) in file order; the first that
    # matches a stored name declares its kind (KINDS); other names take any kind.
    types: tuple[tuple[str, str], ...] = ()
    units: dict[str, Template] = field(default_factory=dict)  # measurement -> unit
    # json: payload fields the templates name, as (variable, path of keys): looked up per
    # reading, then left out of its measurements.
    variables: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # json: the time field as a path of keys, and as a flattened field name.
    time_path: tuple[str, ...] | None = None
    time_flat: str | None = None
    # json: any of root, each, payload variables or a nested time field (the slower parse).
    paths: bool = False
    # Whether the last capture takes the rest of the topic ({name#}, one or more levels).
    rest: bool = False
    # ``[rule.rename]`` entries whose new name is a template over the captures.
    rename_templates: dict[str, Template] = field(default_factory=dict)
    # ``[rule.match]``: top-level payload field -> the values it may hold, each as
    # match_key() makes it; None: the rule takes every message its topic filter matches.
    match: tuple[tuple[str, frozenset[tuple[str, object]]], ...] | None = None
    # json with ``measurement``: the payload field (a path of keys) holding the value.
    value_path: tuple[str, ...] | None = None
    # The parser of the rule's payloads: its format's, or json's one-value reader.
    reader: str = "json"

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The topic filters to subscribe to: captures become ``+``, ``{name#}`` ``#``."""
        return tuple(_CAPTURE.sub("+", _REST.sub("#", topic)) for topic in self.topics)


def preset_names() -> list[str]:
    """The presets shipped in the package."""
    folder = resources.files("ingest.devices") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> list[Rule]:
    """The rules of a shipped preset."""
    if not _RULE_NAME.fullmatch(name) or name not in preset_names():
        known = ", ".join(preset_names()) or "none"
        raise ConfigError(f"--preset {name}: unknown preset (known: {known})")
    text = (resources.files("ingest.devices") / "presets" / f"{name}.toml").read_text("utf-8")
    return parse(text, f"--preset {name}")


def load_file(path: str) -> list[Rule]:
    """The rules of a mapping file."""
    source = f"--mapping {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    return parse(text, source)


def parse(text: str, source: str) -> list[Rule]:
    """Validate a mapping file's text into rules; ``source`` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    extra = set(doc) - {"rule", "page"}
    if extra:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {', '.join(sorted(extra))} "
            "(rules are [[rule]] tables; [page] orders the read API page's charts)"
        )
    page_order.check(doc.get("page"), source)  # for ingest api; checked here too
    raw = doc.get("rule", [])
    if type(raw) is not list or not raw:
        raise ConfigError(f"{source}: no [[rule]] tables")
    if len(raw) > MAX_RULES:
        raise ConfigError(f"{source}: {len(raw)} rules, at most {MAX_RULES}")
    return [_rule(entry, source, index) for index, entry in enumerate(raw, 1)]


def check_unique(rules: list[Rule]) -> None:
    """Rule names are metric labels: refuse the same name twice across all sources."""
    seen: dict[str, Rule] = {}
    for rule in rules:
        first = seen.setdefault(rule.name, rule)
        if first is not rule:
            where = "" if first.source == rule.source else f" (also in {first.source})"
            raise ConfigError(
                f"{rule.source}: rule {rule.name!r}: the name is used twice"
                f"{where}; rule names must be unique"
            )


def _rule(entry: object, source: str, index: int) -> Rule:
    if type(entry) is not dict:
        raise ConfigError(f"{source}: rule #{index}: must be a table")
    name = entry.get("name")
    if type(name) is not str or not _RULE_NAME.fullmatch(name):
        raise ConfigError(
            f"{source}: rule #{index}: name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}"
        )
    try:
        return _build(entry, source, name)
    except (ValueError, TypeError) as exc:
        # One line whatever a key says (a table key may hold a newline).
        detail = _LINE_BREAKS.sub(lambda m: repr(m.group())[1:-1], str(exc))
        raise ConfigError(f"{source}: rule {name!r}: {detail}") from None


def _build(entry: dict[str, Any], source: str, name: str) -> Rule:
    unknown = set(entry) - _OPTIONS
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(sorted(unknown))}")
    topics, captures = _topics(entry.get("topic"))
    rest = _REST.search(topics[0]) is not None
    ignore = _boolean(entry, "ignore")
    if ignore:
        extra = set(entry) - {"name", "topic", "ignore", "match"}
        if extra:
            raise ValueError(
                "ignore = true takes no other options than [rule.match] "
                f"(got {', '.join(sorted(extra))})"
            )
        return Rule(
            name, topics, source, captures, ignore=True, rest=rest, match=_match(entry, None)
        )
    fmt = _choice(entry, "format", FORMATS, "json")
    if len(topics) > 1 and fmt in ONE_FILTER_FORMATS:
        raise ValueError(f"format {fmt} takes one topic filter per rule, not a list")
    if rest and fmt in {"sparkplug", "homie"}:
        raise ValueError(f"a {{name#}} capture does not apply to format {fmt}")
    match = _match(entry, fmt)
    time, configured = _time(entry.get("time"), fmt)
    root, each = _path(entry, "root", fmt), _path(entry, "each", fmt)
    if root is not None and each is not None:
        raise ValueError("root and each exclude each other")
    allowed = set(captures) | ({"_key"} if each is not None else set())
    sensor_id = _sensor_template(entry, fmt, captures, allowed)
    measurement = _measurement_template(entry, fmt, captures)
    value_path = _value_path(entry, fmt, measurement)
    named = (sensor_id.names if sensor_id else set()) | (
        measurement.names if measurement else set()
    )
    tags = _tags(entry.get("tags", {}), fmt, allowed)
    units = _units(entry.get("units", {}), fmt, allowed)
    rename, rename_templates = _rename(entry.get("rename", {}), set(captures))
    used = set(named).union(*(t.names for t in (*tags.values(), *units.values())))
    _check_capture_tags(
        captures,
        set(named).union(*(t.names for t in (*units.values(), *rename_templates.values()))),
    )
    flatten = _flatten(entry)
    variables = tuple((n, tuple(n.split("."))) for n in sorted(used - allowed) if fmt == "json")
    time_path = tuple(time.field.split(".")) if time.field else None
    return Rule(
        name,
        topics,
        source,
        captures,
        format=fmt,
        sensor_id=sensor_id,
        measurement=measurement,
        named_tags=frozenset(n[4:] for n in named if n.startswith("tag.")),
        flatten=flatten,
        drop=_globs(entry, "drop"),
        keep=_globs(entry, "keep"),
        strings=_choice(entry, "strings", STRINGS, "keep"),
        max_string_bytes=_max_string_bytes(entry),
        values=_values(entry.get("values", {})),
        time=time,
        time_configured=configured,
        tags=tags,
        info=_info(entry),
        root=root,
        each=each,
        rename=rename,
        units=units,
        types=_types(entry.get("types", {}), fmt),
        variables=variables,
        time_path=time_path,
        time_flat=time.field.replace(".", flatten) if time.field else None,
        paths=bool(root or each or variables or (time_path and len(time_path) > 1)),
        rest=rest,
        rename_templates=rename_templates,
        match=match,
        value_path=value_path,
        reader="json_value" if value_path is not None else fmt,
    )


def _topics(given: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``topic``: one filter, or a list of filters that capture the same names.

    Returns the filters and the first one's captures.
    """
    if given is None:
        raise ValueError("topic is required")
    if type(given) is str:
        return (given,), _check_topic(given)
    if type(given) is list and not given:
        raise ValueError("topic: an empty list (give one topic filter or more)")
    if type(given) is not list or len(given) > MAX_TOPICS:
        raise TypeError(
            f"topic must be a topic filter or a list of 1 to {MAX_TOPICS} topic filters"
        )
    for entry in given:
        if type(entry) is not str:
            raise TypeError(f"topic: {str(entry)[:40]!r} in the list is not a string")
    return tuple(given), _listed(given)


def _listed(given: list[str]) -> tuple[str, ...]:
    """The captures of a list of filters, each valid and capturing the same names.

    None may be listed twice or take another's topics.
    """
    captures = _check_topic(given[0])
    names = (frozenset(captures), _REST.search(given[0]) is not None and captures[-1])
    for position, topic in enumerate(given):
        if topic in given[:position]:
            raise ValueError(f"topic {topic!r} is listed twice")
        mine = _check_topic(topic)
        if (frozenset(mine), _REST.search(topic) is not None and mine[-1]) != names:
            shown = ", ".join(f"{{{c}}}" for c in captures) or "none"
            if names[1]:
                shown = shown[:-1] + "#}"  # the last capture takes the rest of the topic
            raise ValueError(
                f"topic {topic!r}: every filter of a rule must capture the same names "
                f"as the first ({shown})"
            )
        for other in given[:position]:
            for wide, narrow in ((other, topic), (topic, other)):
                if covers(_plain(wide), _plain(narrow)):
                    raise ValueError(
                        f"topic {narrow!r} is taken by {wide!r}, listed too: leave it out"
                    )
    return captures


def _plain(topic: str) -> list[str]:
    """A rule's filter as MQTT levels: captures as ``+``, ``{name#}`` as ``#``."""
    return _CAPTURE.sub("+", _REST.sub("#", topic)).split("/")


def covers(wide: list[str], narrow: list[str]) -> bool:
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


def _check_topic(topic: str) -> tuple[str, ...]:
    if not topic or len(topic) > 1024 or "\0" in topic:
        raise ValueError("topic must be a non-empty MQTT topic filter")
    if topic.startswith("$share/"):
        raise ValueError("topic: use --shared-group, not a $share/ filter")
    levels = topic.split("/")
    captures: list[str] = []
    for position, level in enumerate(levels):
        match = _CAPTURE.fullmatch(level) or _REST.fullmatch(level)
        if match:
            if match.group(1) in captures:
                raise ValueError(f"topic {topic!r}: capture {{{match.group(1)}}} used twice")
            if level.endswith("#}") and position != len(levels) - 1:
                raise ValueError(
                    f"topic {topic!r}: {level} (the rest of the topic) must be the last level"
                    + (", not with '#'" if levels[-1] == "#" else "")
                )
            captures.append(match.group(1))
        elif level == "#":
            if position != len(levels) - 1:
                raise ValueError(f"topic {topic!r}: '#' must be the last level")
        elif level != "+" and any(c in level for c in "+#{}"):
            raise ValueError(f"topic {topic!r}: '+', '#' and {{capture}} must fill a whole level")
    return tuple(captures)


def _check_capture_tags(captures: tuple[str, ...], named: set[str]) -> None:
    """A capture that becomes a tag (see mapping._match) must not take a reserved name."""
    for capture in captures:
        if capture in RESERVED_TAGS - {"sensor_id"} and capture not in named:
            raise ValueError(
                f"capture {{{capture}}} would be a tag, and tag names "
                f"{', '.join(sorted(RESERVED_TAGS))} are reserved: name the "
                "capture otherwise"
            )


def _text(entry: dict[str, Any], key: str, default: str | None) -> str | None:
    value = entry.get(key, default)
    if value is not None and type(value) is not str:
        raise TypeError(f"{key} must be a string")
    return value


def _boolean(entry: dict[str, Any], key: str) -> bool:
    value = entry.get(key, False)
    if type(value) is not bool:
        raise TypeError(f"{key} must be true or false")
    return value


def _choice(entry: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = entry.get(key, default)
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _template(text: str, key: str, allowed: set[str], fmt: str) -> Template:
    """``text`` parsed; its variables must be captures, except payload paths (json)."""
    template = Template(text)
    for var in template.names:
        if var in allowed or (fmt == "influx" and var.startswith("tag.")):
            continue
        if fmt == "json" and _PATH.fullmatch(var) and var != "_key":
            continue  # a payload field
        known = ", ".join(f"{{{n}}}" for n in sorted(allowed)) or "none"
        raise ValueError(
            f"{key} = {text!r}: {{{var}}} is not a capture of the topic "
            f"(known: {known})" + (" ({_key} needs each)" if var == "_key" else "")
        )
    return template


def _sensor_template(
    entry: dict[str, Any], fmt: str, captures: tuple[str, ...], allowed: set[str]
) -> Template | None:
    raw = entry.get("sensor_id")
    allowed = allowed | ({"measurement"} if fmt == "influx" else set())
    if type(raw) is list:
        if not 1 <= len(raw) <= MAX_ALTERNATIVES or any(type(t) is not str for t in raw):
            raise TypeError(
                f"sensor_id must be a string or a list of 1 to "
                f"{MAX_ALTERNATIVES} strings (templates tried in order)"
            )
        templates = [_template(t, "sensor_id", allowed, fmt) for t in raw]
        return templates[0] if len(templates) == 1 else Alternatives(templates)
    text = _text(entry, "sensor_id", None)
    if text is not None:
        return _template(text, "sensor_id", allowed, fmt)
    if fmt == "senml":
        return None  # the base name, else the {sensor_id} capture (see formats/senml.py)
    if fmt == "influx":
        return None  # the host tag, else the {sensor_id} capture (see formats/influx.py)
    if "sensor_id" in captures:
        return Template("{sensor_id}")
    if fmt in {"json", "value"}:
        raise ValueError(
            "no sensor id: capture {sensor_id} in the topic or set sensor_id "
            '(a template such as "{device}" or "{site}-{device}")'
        )
    return None  # ingest: the payload or the topic's second level


def _measurement_template(
    entry: dict[str, Any], fmt: str, captures: tuple[str, ...]
) -> Template | None:
    text = _text(entry, "measurement", None)
    if fmt == "value":
        if text is None:
            if "measurement" not in captures:
                raise ValueError(
                    "format value needs a measurement name: capture "
                    "{measurement} in the topic or set measurement"
                )
            text = "{measurement}"
        return _template(text, "measurement", set(captures), fmt)
    if fmt == "influx":  # None: <measurement>_<field> (see formats/influx.py)
        return (
            None
            if text is None
            else _template(text, "measurement", set(captures) | {"measurement", "field"}, fmt)
        )
    if fmt == "json" and text is not None:  # one value per topic, named by the topic
        return _template(text, "measurement", set(captures), "value")
    if text is not None:
        raise ValueError("measurement applies to the json, value and influx formats only")
    return None


def _value_path(
    entry: dict[str, Any], fmt: str, measurement: Template | None
) -> tuple[str, ...] | None:
    """The payload field holding the value (``value_field``) of a json rule with a measurement."""
    text = entry.get("value_field")
    if fmt != "json" or measurement is None:
        if text is not None:
            raise ValueError("value_field applies to json rules with a measurement only")
        return None
    text = "value" if text is None else text
    if type(text) is not str or not _PATH.fullmatch(text):
        raise ValueError(
            "value_field must be a payload field or a path of keys such as data.value"
            f" ([A-Za-z0-9_-] keys joined by '.'), got {text!r}"
        )
    for key in ("root", "each"):
        if key in entry:
            raise ValueError(f"{key} does not apply to a json rule with a measurement")
    return tuple(text.split("."))


def _flatten(entry: dict[str, Any]) -> str:
    value = _text(entry, "flatten", "_")
    if value is None or not _FLATTEN.fullmatch(value):
        raise ValueError("flatten must be 1 to 8 of [A-Za-z0-9_-] (never '.')")
    return value


def _globs(entry: dict[str, Any], key: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if type(value) is not list or any(type(g) is not str or not g for g in value):
        raise TypeError(f"{key} must be a list of non-empty strings (names or globs)")
    return tuple(value)


def _info(entry: dict[str, Any]) -> frozenset[str]:
    """The tag names the rule marks as descriptive (``info = ["rssi", "model"]``)."""
    names = entry.get("info", [])
    if type(names) is not list or any(
        type(n) is not str or not _TAG_KEY.fullmatch(n) for n in names
    ):
        raise TypeError("info must be a list of tag names ([A-Za-z0-9_-]{1,64})")
    return frozenset(names)


def _max_string_bytes(entry: dict[str, Any]) -> int:
    value = entry.get("max_string_bytes", 256)
    if type(value) is not int or not 1 <= value <= MAX_STRING_BYTES:
        raise ValueError(f"max_string_bytes must be an integer from 1 to {MAX_STRING_BYTES}")
    return value


def _values(table: object) -> dict[str, int | float | bool | str]:
    if type(table) is not dict:
        raise TypeError('values must be a table of "string" = replacement')
    for key, value in table.items():
        kind = type(value)
        if kind is float and not math.isfinite(value):
            raise ValueError(f"values.{key}: not a finite number")
        if kind not in {int, float, bool, str}:
            raise TypeError(f"values.{key}: must be a number, true/false or a string")
        if kind is int and not -(2**63) <= value < 2**63:
            raise ValueError(f"values.{key}: outside the 64-bit integer range")
    return dict(table)


def _time(table: object, fmt: str) -> tuple[TimeSpec, bool]:
    if table is None:  # line protocol's timestamps are nanoseconds unless told otherwise
        # (and Sparkplug's milliseconds)
        return TimeSpec(format=_DEFAULT_TIME.get(fmt, "auto")), False
    if type(table) is not dict:
        raise TypeError("time must be a table ([rule.time])")
    unknown = set(table) - _TIME_OPTIONS
    if unknown:
        raise ValueError(f"time: unknown option(s) {', '.join(sorted(unknown))}")
    time_field = table.get("field")
    if time_field is not None and (type(time_field) is not str or not time_field):
        raise TypeError("time.field must be a non-empty string")
    if time_field is not None and fmt != "json":
        raise ValueError(f"time.field applies to the json format (format {fmt} has its own time)")
    time_format = table.get("format", "auto")
    if time_format not in TIME_FORMATS:
        raise ValueError(
            f"time.format must be one of {', '.join(TIME_FORMATS)}, got {time_format!r}"
        )
    zone_name = table.get("zone")
    zone = None
    if time_format == "local":
        if type(zone_name) is not str or not zone_name:
            raise ValueError('time.format = "local" needs time.zone (e.g. "Europe/Berlin")')
        try:
            zone = ZoneInfo(zone_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"time.zone {zone_name!r}: unknown time zone") from None
    elif zone_name is not None:
        raise ValueError('time.zone applies to time.format = "local" only')
    return TimeSpec(time_field, time_format, zone), True


def _path(entry: dict[str, Any], key: str, fmt: str) -> tuple[str, ...] | None:
    """``root``/``each``: a dotted path of payload keys (json only)."""
    text = entry.get(key)
    if text is None:
        return None
    if fmt != "json":
        raise ValueError(f"{key} applies to the json format only")
    if type(text) is not str or not _PATH.fullmatch(text):
        raise ValueError(
            f"{key} must be a path of keys such as uplink_message.decoded_payload"
            f" ([A-Za-z0-9_-] keys joined by '.'), got {text!r}"
        )
    return tuple(text.split("."))


def _rename(table: object, captures: set[str]) -> tuple[dict[str, str], dict[str, Template]]:
    """``[rule.rename]``: field name as the payload has it -> the name stored.

    A new name with ``{capture}`` variables is a template over the topic's captures
    (``value = "{property}"``), rendered per message; the others are literal names.
    """
    if type(table) is not dict:
        raise TypeError('rename must be a table of "field" = "new_name" or "{capture}"')
    literal: dict[str, str] = {}
    templates: dict[str, Template] = {}
    for key, new in table.items():
        if type(new) is str and "{" in new:
            try:
                template = _template(new, f"rename.{key}", captures, "value")
            except ValueError as exc:
                where = "" if str(exc).startswith("rename.") else f"rename.{key}: "
                raise ValueError(f"{where}{exc}") from None
            if template.names:
                templates[key] = template
                continue
        if type(new) is not str or not _TAG_KEY.fullmatch(new) or new in RESERVED_FIELDS:
            raise ValueError(
                f"rename.{key}: {new!r} is not a valid measurement name "
                "([A-Za-z0-9_-]{1,64}, not ts, seq, sensor_id, _id, meta, "
                "tags, units or info) nor a template over the captures"
            )
        literal[key] = new
    return literal, templates


def match_key(value: object) -> tuple[str, object] | None:
    """A payload or [rule.match] value as compared: strings, numbers, booleans apart.

    ``1`` and ``1.0`` are one number; ``true`` is never ``1``; None for other kinds.
    """
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int or kind is float:
        return ("n", value)
    return None


def _match(
    entry: dict[str, Any], fmt: str | None
) -> tuple[tuple[str, frozenset[tuple[str, object]]], ...] | None:
    """``[rule.match]``: top-level payload field -> a value or a list of values."""
    table = entry.get("match")
    if table is None:
        return None
    if fmt is not None and fmt not in MATCH_FORMATS:
        raise ValueError(
            f"match reads JSON payloads: it applies to the {' and '.join(MATCH_FORMATS)} "
            f"formats and to ignore rules, not to format {fmt}"
        )
    if type(table) is not dict or not table:
        raise TypeError('match must be a table of "field" = value or [values] ([rule.match])')
    out = []
    for key, given in table.items():
        if not key or len(key) > MAX_MATCH_KEY:
            raise ValueError(f"match: a field name of 1 to {MAX_MATCH_KEY} characters")
        values = given if type(given) is list else [given]
        if not 1 <= len(values) <= MAX_MATCH_VALUES:
            raise ValueError(f"match.{key}: a list of 1 to {MAX_MATCH_VALUES} values")
        keys = set()
        for value in values:
            found = match_key(value)
            if found is None or (type(value) is float and not math.isfinite(value)):
                raise TypeError(
                    f"match.{key}: {str(value)[:40]!r} is not a string, a finite number "
                    "or true/false"
                )
            keys.add(found)
        out.append((key, frozenset(keys)))
    return tuple(out)


def _types(table: object, fmt: str) -> tuple[tuple[str, str], ...]:
    """``[rule.types]``: kind ("number", "boolean", "string") -> measurement names or globs.

    As (glob, kind) pairs in the table's order: a name matching entries of two kinds
    takes the first.
    """
    if type(table) is not dict:
        raise TypeError(
            f'types must be a table of kind = ["measurement", "glob*"] (kinds: {", ".join(KINDS)})'
        )
    if table and fmt == "ingest":
        raise ValueError("types does not apply to the ingest format (numbers only)")
    out: list[tuple[str, str]] = []
    for kind, names in table.items():
        if kind not in KINDS:
            raise ValueError(f"types.{kind}: not a kind ({', '.join(KINDS)})")
        if type(names) is not list or any(type(n) is not str or not n for n in names):
            raise TypeError(f"types.{kind} must be a list of non-empty strings (names or globs)")
        constant = KINDS[KINDS.index(kind)]  # compared by identity first
        out.extend((name, constant) for name in names)
    return tuple(out)


def _units(table: object, fmt: str, allowed: set[str]) -> dict[str, Template]:
    """``[rule.units]``: measurement -> unit, a literal or a template.

    The key ``"*"`` (EVERY_UNIT) gives the unit of every measurement no other key names.
    """
    if type(table) is not dict:
        raise TypeError('units must be a table of measurement = "unit or {field}"')
    if table and fmt not in {"json", "value"}:
        raise ValueError("units applies to the json and value formats")
    out = {}
    for key, value in table.items():
        if key != EVERY_UNIT and "*" in key:
            raise ValueError(
                f'units.{key}: a measurement name, or "*" alone for every other '
                "measurement (no globs)"
            )
        if type(value) is not str or not value or len(value) > MAX_UNIT:
            raise TypeError(f"units.{key}: must be a string of 1 to {MAX_UNIT} characters")
        out[key] = _template(value, f"units.{key}", allowed, fmt)
    return out


def _tags(table: object, fmt: str, allowed: set[str]) -> dict[str, Template]:
    if type(table) is not dict:
        raise TypeError('tags must be a table of name = "value or {capture}"')
    allowed = allowed | ({"measurement"} if fmt == "influx" else set())
    out = {}
    for key, value in table.items():
        if not _TAG_KEY.fullmatch(key) or key in RESERVED_TAGS:
            raise ValueError(
                f"tags.{key}: tag names match [A-Za-z0-9_-]{{1,64}} and are not "
                f"{', '.join(sorted(RESERVED_TAGS))}"
            )
        if type(value) is not str:
            raise TypeError(f"tags.{key}: must be a string")
        out[key] = _template(value, f"tags.{key}", allowed, fmt)
    return out
