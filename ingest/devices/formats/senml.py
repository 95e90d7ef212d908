"""``senml``: SenML JSON (RFC 8428), resolved as section 4.6 says.

Base fields (``bn``, ``bt``, ``bu``, ``bv``, ``bs``, ``bver``) apply to their record and
the ones after it. A record's name is ``bn + n``; its time ``bt + t``, where a resolved
time below 2**28 is relative to now (section 4.5.3); its value ``bv + v`` (numbers),
``vs`` (string) or ``vb`` (boolean); a sum ``bs + s`` is stored as ``<name>_sum``. ``vd``
(binary data) is refused field by field, as is a record with a field ending in ``_``
(must-understand extensions this reader does not know, section 4.4). Records of one
base name and time form one reading; the sensor id is the base name (made safe) unless
the rule's ``sensor_id`` says otherwise, the measurement the rest of the name.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import orjson

from ingest.devices.formats import Item, Parsed, refused
from ingest.model import Rejection

if TYPE_CHECKING:
    from ingest.devices.decode import Limits
    from ingest.devices.rules import Rule

RELATIVE = 2**28  # RFC 8428 4.5.3: times below this are relative to now
_NUMBER = (int, float)


def _number(value: object) -> bool:
    return type(value) in _NUMBER and math.isfinite(value)  # type: ignore[arg-type]


def _split(name: str, base: str) -> tuple[str, str]:
    """(sensor part, measurement part) of a resolved name."""
    if base:
        return base, name[len(base) :]
    for sep in (":", "/"):
        cut = name.rfind(sep)
        if cut > 0:
            return name[:cut], name[cut + 1 :]
    return "", name


def parse(payload: bytes, rule: Rule, captures: dict[str, str], limits: Limits) -> Parsed:
    """Readings from a SenML pack (a JSON array of records; one object is accepted too)."""
    del rule, captures
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return refused("invalid_json", str(exc).split("\n", 1)[0][:200])
    records = [doc] if type(doc) is dict else doc
    if type(records) is not list:
        return refused("bad_shape", "SenML is a JSON array of records")
    if not records:
        return refused("no_readings", "an empty SenML pack")
    if len(records) > limits.max_readings:
        return refused("too_many_readings", f"{len(records)} records > {limits.max_readings}")
    return _resolve(records, limits.max_readings)


def _resolve(records: list[object], max_readings: int) -> Parsed:
    out = Parsed([], [])
    base = {"bn": "", "bt": 0.0, "bu": None, "bv": 0.0, "bs": 0.0}
    groups: dict[tuple[str, float], Item] = {}
    for index, record in enumerate(records):
        if type(record) is not dict:
            out.rejections.append(Rejection("bad_shape", "a SenML record must be an object", index))
            continue
        problem = _update_base(record, base)
        if problem is not None:
            out.rejections.append(Rejection("bad_shape", problem, index))
            continue
        name = f"{base['bn']}{record.get('n', '')}" if type(record.get("n", "")) is str else None
        if not name:
            if any(k in record for k in ("v", "vs", "vb", "vd", "s")):
                out.rejections.append(
                    Rejection("bad_field_name", "record without a name (bn + n)", index)
                )
            continue
        t = record.get("t", 0)
        if not _number(t):
            out.rejections.append(
                Rejection("bad_timestamp", f"{name[:60]}: t must be a number", index)
            )
            continue
        epoch = float(base["bt"]) + float(t)  # type: ignore[arg-type]
        sensor, measurement = _split(name, str(base["bn"]))
        key = (sensor, epoch)
        item = groups.get(key)
        if item is None:
            if len(groups) >= max_readings:
                out.rejections.append(Rejection("too_many_readings", "too many readings", index))
                continue
            item = groups[key] = Item({}, None, epoch, sensor or None, None, {}, None, [])
        _values(record, base, measurement, item)
    out.items.extend(groups.values())
    return out


def _update_base(record: dict[str, object], base: dict[str, object]) -> str | None:
    """Apply the record's base fields; a problem's description, or None."""
    for key in record:
        if key.endswith("_"):
            return f"unknown must-understand field {key[:40]!r}"
    if "bn" in record:
        if type(record["bn"]) is not str:
            return "bn must be a string"
        base["bn"] = record["bn"]
    for key in ("bt", "bv", "bs"):
        if key in record:
            if not _number(record[key]):
                return f"{key} must be a number"
            base[key] = record[key]
    if "bu" in record:
        if type(record["bu"]) is not str:
            return "bu must be a string"
        base["bu"] = record["bu"]
    return None


def _values(record: dict[str, object], base: dict[str, object], name: str, item: Item) -> None:
    fields, problems, units = item.fields, item.problems, item.units
    assert problems is not None
    assert units is not None
    unit = record.get("u", base["bu"])
    if "v" in record:
        v = record["v"]
        if _number(v):
            fields[name] = float(base["bv"]) + v if base["bv"] else v  # type: ignore[operator,arg-type]
        else:
            problems.append(Rejection("bad_value", f"{name[:60]}: v must be a number"))
    elif "vs" in record:
        if type(record["vs"]) is str:
            fields[name] = record["vs"]
        else:
            problems.append(Rejection("bad_value", f"{name[:60]}: vs must be a string"))
    elif "vb" in record:
        if type(record["vb"]) is bool:
            fields[name] = record["vb"]
        else:
            problems.append(Rejection("bad_value", f"{name[:60]}: vb must be true or false"))
    elif "vd" in record:
        problems.append(Rejection("bad_value", f"{name[:60]}: vd (binary data) is not stored"))
    elif "s" not in record and base["bv"]:
        fields[name] = base["bv"]
    if "s" in record:
        s = record["s"]
        if _number(s):
            fields[f"{name}_sum"] = float(base["bs"]) + s if base["bs"] else s  # type: ignore[operator,arg-type]
        else:
            problems.append(Rejection("bad_value", f"{name[:60]}: s must be a number"))
    if type(unit) is str and unit:
        for stored in (name, f"{name}_sum"):
            if stored in fields:
                units[stored] = unit
