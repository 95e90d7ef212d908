"""A small Sparkplug B encoder written straight from the protobuf wire format.

It shares no code with the daemon's decoder (which parses with the ``protobuf`` package):
field numbers come from the Sparkplug 3.0 specification's ``sparkplug_b.proto``, the
encoding from the protobuf wire format (varints, little-endian fixed32/fixed64,
length-delimited messages). ``loadgen publish --format sparkplug`` publishes with it, and
the tests build their payloads with it, so a mistake in the decoder's schema shows up as
a failing test rather than as two copies of the same mistake.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

NAMESPACE = "spBv1.0"
# Sparkplug datatypes (specification 6.4.16) used by the encoder's callers.
INT8, INT16, INT32, INT64 = 1, 2, 3, 4
UINT8, UINT16, UINT32, UINT64 = 5, 6, 7, 8
FLOAT, DOUBLE, BOOLEAN, STRING, DATETIME, TEXT, UUID = 9, 10, 11, 12, 13, 14, 15
DATASET, BYTES, FILE, TEMPLATE = 16, 17, 18, 19
INT32_ARRAY, DOUBLE_ARRAY = 24, 31

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_U32 = (INT8, INT16, INT32, UINT8, UINT16, UINT32)
_U64 = (INT64, UINT64, DATETIME)
_TEXT = (STRING, TEXT, UUID)
_BLOB = (BYTES, FILE, INT32_ARRAY, DOUBLE_ARRAY, *range(22, 35))


def varint(value: int) -> bytes:
    """An unsigned varint (negative numbers: their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    """A field's key: its number and wire type."""
    return varint(number << 3 | wire)


def uint(number: int, value: int) -> bytes:
    """A varint field."""
    return tag(number, _VARINT) + varint(value)


def blob(number: int, data: bytes) -> bytes:
    """A length-delimited field (string, bytes or an embedded message)."""
    return tag(number, _LENGTH) + varint(len(data)) + data


def text(number: int, value: str) -> bytes:
    """A string field."""
    return blob(number, value.encode())


@dataclass
class Metric:
    """One metric to encode; ``value`` is written in the member its ``datatype`` uses."""

    name: str | None = None
    alias: int | None = None
    timestamp: int | None = None
    datatype: int | None = None
    value: object = None
    is_null: bool = False
    is_historical: bool = False
    is_transient: bool = False
    properties: dict[str, str] = field(default_factory=dict)  # string properties only
    raw_value: bytes = b""  # already-encoded value field(s), e.g. a DataSet


def _value(datatype: int, value: object) -> bytes:  # noqa: PLR0911 - one return per member
    """The value in the oneof member the specification assigns to ``datatype``."""
    if datatype in _U32:
        return uint(10, int(value) & 0xFFFFFFFF)  # type: ignore[call-overload]
    if datatype in _U64:
        return uint(11, int(value))  # type: ignore[call-overload]
    if datatype == FLOAT:
        return tag(12, _FIXED32) + struct.pack("<f", value)
    if datatype == DOUBLE:
        return tag(13, _FIXED64) + struct.pack("<d", value)
    if datatype == BOOLEAN:
        return uint(14, 1 if value else 0)
    if datatype in _TEXT:
        return text(15, str(value))
    if datatype in _BLOB:
        return blob(16, bytes(value))  # type: ignore[call-overload]
    raise ValueError(f"no encoding for datatype {datatype}")


def _properties(props: dict[str, str]) -> bytes:
    keys = b"".join(text(1, key) for key in props)
    values = b"".join(blob(2, uint(1, STRING) + text(8, value)) for value in props.values())
    return keys + values


def metric(m: Metric) -> bytes:  # noqa: C901 - one test per optional field
    """One encoded ``Payload.Metric``."""
    out = bytearray()
    if m.name is not None:
        out += text(1, m.name)
    if m.alias is not None:
        out += uint(2, m.alias)
    if m.timestamp is not None:
        out += uint(3, m.timestamp)
    if m.datatype is not None:
        out += uint(4, m.datatype)
    if m.is_historical:
        out += uint(5, 1)
    if m.is_transient:
        out += uint(6, 1)
    if m.is_null:
        out += uint(7, 1)
    if m.properties:
        out += blob(9, _properties(m.properties))
    if m.raw_value:
        out += m.raw_value
    elif m.value is not None and not m.is_null:
        if m.datatype is None:
            raise ValueError("a value needs a datatype to be encoded")
        out += _value(m.datatype, m.value)
    return bytes(out)


def payload(metrics: list[Metric], timestamp: int | None = None, seq: int | None = None) -> bytes:
    """One encoded ``Payload``: timestamp (1), metrics (2), seq (3)."""
    out = bytearray()
    if timestamp is not None:
        out += uint(1, timestamp)
    for m in metrics:
        out += blob(2, metric(m))
    if seq is not None:
        out += uint(3, seq)
    return bytes(out)


def topic(group: str, kind: str, node: str, device: str | None = None) -> str:
    """``spBv1.0/<group>/<kind>/<node>[/<device>]``."""
    base = f"{NAMESPACE}/{group}/{kind}/{node}"
    return base if device is None else f"{base}/{device}"


def nbirth(metrics: list[Metric], bd_seq: int, timestamp: int, seq: int = 0) -> bytes:
    """An NBIRTH: ``bdSeq`` and ``Node Control/Rebirth`` (no aliases) then ``metrics``."""
    protocol = [
        Metric("bdSeq", None, timestamp, INT64, bd_seq),
        Metric("Node Control/Rebirth", None, timestamp, BOOLEAN, value=False),
    ]
    return payload(protocol + metrics, timestamp, seq)


def ndeath(bd_seq: int, timestamp: int | None = None) -> bytes:
    """An NDEATH (the edge node's will): its ``bdSeq`` and no seq."""
    return payload([Metric("bdSeq", None, None, INT64, bd_seq)], timestamp)


# --- a simulated fleet for ``loadgen publish --format sparkplug`` ---------------------------
# Group <sensor prefix>, one edge node per sensor, named by its index, so the daemon's
# sensor ids (<group>-<edge node>) are loadgen's own (<prefix>-<n>) and verify works as is.
FLEET_ALIASES = (("hum", 1), ("temp", 2))
_DOUBLE_VALUE = tag(13, _FIXED64)
_PACK_DOUBLE = struct.Struct("<d").pack


def fleet_topic(group: str, index: int, kind: str = "NDATA") -> str:
    """The topic of edge node ``index`` of the fleet."""
    return topic(group, kind, str(index))


def fleet_birth(timestamp: int) -> bytes:
    """An edge node's NBIRTH: hum and temp (Double, aliases 1 and 2), null until measured."""
    return nbirth(
        [Metric(name, alias, timestamp, DOUBLE, is_null=True) for name, alias in FLEET_ALIASES],
        bd_seq=0,
        timestamp=timestamp,
        seq=0,
    )


def fleet_data(readings: list[tuple[int, float, float]], seq: int) -> bytes:
    """An NDATA of ``(ts_ms, hum, temp)`` readings: aliases only, as the specification asks."""
    out = bytearray()
    for ts_ms, hum, temp in readings:
        head = uint(3, ts_ms)
        for alias, value in ((1, hum), (2, temp)):
            body = b"\x10" + varint(alias) + head + _DOUBLE_VALUE + _PACK_DOUBLE(value)
            out += b"\x12" + varint(len(body)) + body
    if readings:
        out += uint(1, readings[-1][0])
    out += uint(3, seq)
    return bytes(out)
