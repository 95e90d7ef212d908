"""``influx``: InfluxDB line protocol, one reading per line.

``disk,host=h1,path=/boot free=300i,used=9i 1795251600000000000``: the line's tags
become the reading's tags; each field becomes a measurement named
``<measurement>_<field>`` (``disk_free``), or ``<measurement>`` for a field named
``value``, as Telegraf's Prometheus output names them, unless the rule's ``measurement``
template says otherwise. Without a ``sensor_id`` template the sensor id is the ``host``
tag (then not also a tag), else the topic's ``{sensor_id}`` capture. The timestamp is
nanoseconds unless ``[rule.time]`` gives another unit, and a line without one takes the
arrival time. Lines are parsed by
``line_protocol_parser`` (a C parser following InfluxDB's own grammar and escaping);
blank lines and ``#`` comments are skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from line_protocol_parser import LineFormatError, parse_line

from ingest.devices.formats import MAX_FIELDS, Item, Parsed, refused, text_of
from ingest.model import MAX_TAGS, Rejection

if TYPE_CHECKING:
    from ingest.devices.decode import Limits
    from ingest.devices.rules import Rule


def parse(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """One reading per line of line protocol."""
    text = text_of(payload)
    if text is None:
        return refused("invalid_utf8", "payload is not UTF-8")
    lines = [
        line for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        return refused("no_readings", "no line protocol lines")
    if len(lines) > limits.max_readings:
        return refused("too_many_readings", f"{len(lines)} lines > {limits.max_readings}")
    out = Parsed([], [])
    several = len(lines) > 1
    for index, line in enumerate(lines):
        item = _line(line.rstrip("\r"), rule, captures)
        if isinstance(item, Rejection):
            out.rejections.append(Rejection(item.reason, item.detail, index if several else None))
        else:
            out.items.append(item._replace(position=index) if several else item)
    return out


def _line(line: str, rule: Rule, captures: dict[str, str]) -> Item | Rejection:
    try:
        point = parse_line(line)
    except (LineFormatError, ValueError, OverflowError) as exc:
        return Rejection("bad_shape", f"not line protocol: {str(exc)[:160]}")
    if point is None:  # a comment
        return Rejection("no_readings", "a comment line")
    tags: dict[str, str] = point["tags"]
    raw_fields: dict[str, object] = point["fields"]
    if len(tags) > MAX_TAGS or len(raw_fields) > MAX_FIELDS:
        return Rejection("bad_shape", f"more than {MAX_TAGS} tags or {MAX_FIELDS} fields")
    measurement = str(point["measurement"])
    context = dict(captures)
    context["measurement"] = measurement
    for key, tag in tags.items():
        context[f"tag.{key}"] = tag
    # The default sensor id: the host tag Telegraf adds to every metric (the topic's
    # {sensor_id} when there is none); it identifies the sensor, so it is not a tag too.
    host = tags.pop("host", None) if rule.sensor_id is None else None
    template = rule.measurement
    fields: dict[str, object] = {}
    problems: list[Rejection] = []
    for key, value in raw_fields.items():
        if template is None:
            fields[measurement if key == "value" else f"{measurement}_{key}"] = value
            continue
        context["field"] = key
        name = template.render(context)
        if name is None:
            problems.append(
                Rejection("bad_field_name", f"{key[:60]}: the measurement template has no value")
            )
            continue
        fields[name] = value
    return Item(fields, point["time"], None, host, tags or None, None, context, problems or None)
