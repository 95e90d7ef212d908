"""``sparkplug``: Sparkplug B (Eclipse Sparkplug 3.0) payloads, with per-edge-node state.

Topics are ``spBv1.0/<group>/<type>/<edge node>[/<device>]``. A BIRTH (NBIRTH, DBIRTH)
declares every metric of its edge node or device with a name, an alias and a datatype;
later DATA messages may carry aliases only. So this format keeps, per edge node and per
device, the alias table of the latest BIRTH (:class:`Table`), in memory (bounded) and,
through :class:`~ingest.devices.sparkplug_state.BirthStore`, in MongoDB. The pure part lives here:
:meth:`SparkplugFormat.parse` turns one message into :class:`~ingest.devices.formats.Item` objects
using the tables it holds; :meth:`SparkplugFormat.birth` builds the table a BIRTH declares.
Nothing here does I/O or raises for bad input: the I/O (store a BIRTH before it is acked,
read a table missing from memory) is :class:`~ingest.devices.sparkplug_state.SparkplugState`'s.

State rules (Sparkplug 3.0, chapters 5 and 6):
- NBIRTH replaces the edge node's table and forgets its devices' tables (a new session
  re-declares them); DBIRTH replaces the device's table.
- NDATA/DDATA resolve each metric by alias (or by name when the edge node uses no
  aliases) in that table only. No table, a table closed by a DEATH, or an alias the BIRTH
  did not declare: the metric is not guessed but rejected (``no_birth``,
  ``unknown_alias``).
- NDEATH whose bdSeq matches the NBIRTH's closes the node and its devices; a stale one
  (an older connection's will) is counted and changes nothing. DDEATH closes the device.
- A BIRTH refused whole (``invalid_protobuf``, ``too_large``, ``too_many_readings``) still
  ends the session it follows (a new NBIRTH begins a new session, usable or not): the
  node and its devices (NBIRTH) or the device (DBIRTH) are closed as by a DEATH, so their
  DATA is ``no_birth`` until a usable BIRTH comes, never read with the old aliases.
- ``seq`` (0-255, one counter per edge node, wrapping to 0) is checked: a gap is counted,
  never a reason to refuse data (a historian stores what arrives).
- ``is_null``: no value to store, skipped. ``is_transient``: not for historians, skipped.
  ``is_historical``: a real value measured at its own timestamp (store and forward),
  stored like any other. Both skips are counted.
- Scalars are stored (signed integers decoded from their two's complement, unsigned 64-bit
  beyond the int64 range as doubles, DateTime as epoch milliseconds, UUID and Text as
  strings). DataSet, Template, Bytes, File, PropertySet and array types are refused
  whole, metric by metric, with reason ``unsupported_type``.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from google.protobuf.message import DecodeError

from ingest import caches
from ingest.devices.formats import Item, Parsed, refused
from ingest.devices.formats.sparkplug_pb import Payload
from ingest.model import Rejection

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ingest.devices.decode import Limits

NAMESPACE = "spBv1.0"
MESSAGE_TYPES = ("NBIRTH", "NDATA", "NDEATH", "DBIRTH", "DDATA", "DDEATH", "NCMD", "DCMD", "STATE")
# Every reason this format rejects a message or metric for (metrics initialise them).
REASONS: tuple[str, ...] = (
    "invalid_protobuf",  # not a Sparkplug B payload (truncated, malformed, too deep)
    "bad_topic",  # not spBv1.0/<group>/<type>/<edge node>[/<device>]
    "no_birth",  # DATA for an edge node or device with no BIRTH (or after its DEATH)
    "unknown_alias",  # a DATA metric whose alias (or name) its BIRTH did not declare
    "unsupported_type",  # DataSet, Template, Bytes, File, PropertySet, arrays: not stored
)
# Metrics skipped without a rejection (see module doc); "other_daemon": a BIRTH's metrics
# that another daemon of a shared group stores (every daemon receives every BIRTH).
SKIPS = ("null", "transient", "other_daemon")
DATATYPES = (
    "Unknown",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float",
    "Double",
    "Boolean",
    "String",
    "DateTime",
    "Text",
    "UUID",
    "DataSet",
    "Bytes",
    "File",
    "Template",
    "PropertySet",
    "PropertySetList",
    "Int8Array",
    "Int16Array",
    "Int32Array",
    "Int64Array",
    "UInt8Array",
    "UInt16Array",
    "UInt32Array",
    "UInt64Array",
    "FloatArray",
    "DoubleArray",
    "BooleanArray",
    "StringArray",
    "DateTimeArray",
)
# datatype -> (oneof member carrying it, signed bit width or 0)
_SCALARS: dict[int, tuple[str, int]] = {
    1: ("int_value", 8),
    2: ("int_value", 16),
    3: ("int_value", 32),
    4: ("long_value", 64),
    5: ("int_value", 0),
    6: ("int_value", 0),
    7: ("int_value", 0),
    8: ("long_value", 0),
    9: ("float_value", 0),
    10: ("double_value", 0),
    11: ("boolean_value", 0),
    12: ("string_value", 0),
    13: ("long_value", 0),
    14: ("string_value", 0),
    15: ("string_value", 0),
}
# Metrics that are the protocol's, not measurements: kept in the BIRTH document only.
PROTOCOL_METRICS = ("bdSeq",)
PROTOCOL_PREFIXES = ("Node Control/",)
UNIT_PROPERTIES = ("engUnit", "engUnits", "EngUnit", "units", "unit")
MAX_TABLES = 10_000  # alias tables held in memory (least recently used are evicted)
# Metrics declared in all the tables held (about 260 bytes each): a BIRTH may declare
# --max-readings-per-message metrics, so the count of tables alone bounds nothing useful.
MAX_METRICS = 1_000_000
MAX_PROPERTIES = 32  # scalar properties kept per metric in the BIRTH document
MAX_NAME_BYTES = 512  # a metric name longer than this is refused
_INT64_MAX = 2**63 - 1


class Topic(NamedTuple):
    """A parsed Sparkplug topic."""

    group: str
    type: str
    node: str
    device: str | None

    @property
    def key(self) -> str:
        """The table key: ``group/node`` or ``group/node/device`` (topic levels as sent)."""
        base = f"{self.group}/{self.node}"
        return base if self.device is None else f"{base}/{self.device}"

    @property
    def node_key(self) -> str:
        """The edge node's table key."""
        return f"{self.group}/{self.node}"


_TOPICS: dict[str, Topic | None] = {}


def topics_cached() -> int:
    """Topics held parsed (at most ``ingest.caches.limit``)."""
    return len(_TOPICS)


def parse_topic(topic: str) -> Topic | None:
    """:func:`topic_of`, remembered (bounded: cleared when full)."""
    known = _TOPICS.get(topic, _TOPICS)
    if known is not _TOPICS:
        return known  # type: ignore[return-value]
    parsed = topic_of(topic)
    if len(_TOPICS) >= caches.limit:  # one per topic: --max-cached-series
        _TOPICS.clear()
    _TOPICS[topic] = parsed
    return parsed


def topic_of(topic: str) -> Topic | None:
    """``spBv1.0/<group>/<type>/<node>[/<device>]`` (or ``spBv1.0/STATE/<host>``), or None."""
    parts = topic.split("/")
    if len(parts) < 3 or parts[0] != NAMESPACE or not all(parts[1:]):
        return None
    if parts[1] == "STATE":
        return Topic("", "STATE", parts[2], None) if len(parts) == 3 else None
    if len(parts) not in (4, 5) or parts[2] not in MESSAGE_TYPES:
        return None
    device = parts[4] if len(parts) == 5 else None
    if (device is None) != (parts[2][0] == "N"):
        return None  # N* types have no device level, D* types must have one
    return Topic(parts[1], parts[2], parts[3], device)


def sensor_id(topic: Topic) -> str:
    """``<group>/<node>[/<device>]``: the ids exactly as the topic has them.

    A Sparkplug id is a topic level, so it holds no ``/``: the parts can be read back from
    the sensor id, and two edge nodes or devices never share one.
    """
    if topic.device is None:
        return f"{topic.group}/{topic.node}"
    return f"{topic.group}/{topic.node}/{topic.device}"


class Definition(NamedTuple):
    """One metric as its BIRTH declared it."""

    name: str
    datatype: int
    units: str | None
    protocol: bool = False  # bdSeq, Node Control/*: kept in the BIRTH document only
    member: str | None = None  # the oneof member carrying its value (None: not stored)
    floating: bool = False  # Float or Double: the value needs only a finiteness check


def definition(name: str, datatype: int, units: str | None) -> Definition:
    """A metric's definition, marked if it is one of the protocol's own."""
    spec = _SCALARS.get(datatype)
    member = spec[0] if spec is not None else None
    return Definition(
        name,
        datatype,
        units,
        name in PROTOCOL_METRICS or name.startswith(PROTOCOL_PREFIXES),
        member,
        member in ("float_value", "double_value"),
    )


@dataclass(slots=True)
class Table:
    """The alias table of one edge node or device, from its latest BIRTH."""

    key: str
    bd_seq: int | None  # the NBIRTH's bdSeq (a DBIRTH: its node's, when known)
    seq: int | None  # the BIRTH's seq
    birth_ms: int | None  # the BIRTH's payload timestamp
    by_alias: dict[int, Definition] = field(default_factory=dict)
    by_name: dict[str, Definition] = field(default_factory=dict)
    online: bool = True
    sensor: str = ""  # the readings' sensor id, worked out once (see _items)
    digest: str | None = None  # the BIRTH payload's digest (see :func:`digest`)
    node_digest: str | None = None  # the digest of the node's NBIRTH it belongs to
    closed_by: str | None = None  # why it is offline, when not by a DEATH (DATA's detail)
    closed_ms: int | None = None  # the timestamp of the refused BIRTH that closed it
    from_store: bool = False  # read from MongoDB, not from a BIRTH seen in order
    earlier: tuple[Table, ...] = ()  # from MongoDB: sessions this one replaced, newest first


def _declared(table: Table) -> int:
    """The metrics a table holds, with those of the sessions it keeps as earlier."""
    return len(table.by_name) + sum(len(earlier.by_name) for earlier in table.earlier)


class SessionCounts:
    """Messages by type, seq gaps, skips and stale deaths: plain ints for the metrics."""

    __slots__ = ("messages", "seq_gaps", "skipped", "stale_deaths")

    def __init__(self) -> None:
        self.messages = dict.fromkeys(MESSAGE_TYPES, 0)
        self.seq_gaps = 0
        self.stale_deaths = 0
        self.skipped = dict.fromkeys(SKIPS, 0)


class SparkplugFormat:
    """The ``sparkplug`` format: alias tables and seq counters (bounded, LRU), and parsing."""

    def __init__(self, max_tables: int = MAX_TABLES, max_metrics: int = MAX_METRICS) -> None:
        self.max_tables = max_tables
        self.max_metrics = max_metrics
        self.tables: OrderedDict[str, Table] = OrderedDict()
        self.metrics_held = 0  # metrics declared in the tables held, their earlier ones too
        self.seqs: OrderedDict[str, int] = OrderedDict()  # last seq per edge node key
        self.counts = SessionCounts()

    # --- state -----------------------------------------------------------------------

    def table(self, key: str) -> Table | None:
        """The table held for ``key`` (marked recently used), or None."""
        table = self.tables.get(key)
        if table is not None:
            self.tables.move_to_end(key)
        return table

    def install(self, table: Table) -> None:
        """Hold ``table`` (replacing any for its key), evicting the least recently used.

        Tables go while more than ``max_tables`` tables or ``max_metrics`` metrics are
        held; an evicted table is read again from MongoDB when next needed.
        """
        replaced = self.tables.pop(table.key, None)
        if replaced is not None:
            self.metrics_held -= _declared(replaced)
        self.tables[table.key] = table
        self.metrics_held += _declared(table)
        tables = self.tables
        while len(tables) > self.max_tables or (
            self.metrics_held > self.max_metrics and len(tables) > 1
        ):
            self.metrics_held -= _declared(tables.popitem(last=False)[1])

    def forget_devices(self, node_key: str) -> None:
        """Drop the tables of an edge node's devices (a new NBIRTH or an NDEATH)."""
        prefix = node_key + "/"
        for key in [k for k in self.tables if k.startswith(prefix)]:
            self.metrics_held -= _declared(self.tables.pop(key))

    def forget_all(self) -> None:
        """Drop every table (they are read again from MongoDB when next needed)."""
        self.tables.clear()
        self.metrics_held = 0

    def _sequence(self, topic: Topic, seq: int | None) -> None:
        """Count a gap if ``seq`` is not the one after the edge node's last (mod 256)."""
        key = topic.node_key
        last = self.seqs.get(key)
        if topic.type != "NBIRTH" and (
            seq is None or (last is not None and seq != (last + 1) % 256)
        ):
            self.counts.seq_gaps += 1
        if seq is None or not 0 <= seq <= 255:
            self.seqs.pop(key, None)
            return
        self.seqs[key] = seq
        self.seqs.move_to_end(key)
        while len(self.seqs) > self.max_tables:
            self.seqs.popitem(last=False)

    # --- parsing ---------------------------------------------------------------------

    def birth(
        self,
        topic: Topic,
        payload: Any,  # noqa: ANN401
        raw: bytes = b"",
    ) -> tuple[Table, list[Rejection]]:
        """The table a parsed BIRTH declares, and the metrics it could not declare."""
        bd_seq = None
        own = digest(raw)
        node_digest: str | None = own
        if topic.type == "DBIRTH":
            node = self.tables.get(topic.node_key)
            bd_seq = node.bd_seq if node is not None else None
            node_digest = node.digest if node is not None else None
        table = Table(
            topic.key,
            bd_seq,
            payload.seq if payload.HasField("seq") else None,
            payload.timestamp if payload.HasField("timestamp") else None,
            digest=own,
            node_digest=node_digest,
        )
        problems: list[Rejection] = []
        for index, metric in enumerate(payload.metrics):
            name = metric.name
            if bad_name(name):
                problems.append(
                    Rejection("bad_field_name", f"metric {index}: missing or invalid name", index)
                )
                continue
            if name == "bdSeq" and metric.WhichOneof("value") == "long_value":
                table.bd_seq = metric.long_value
            declared = definition(name, metric.datatype, _units(metric))
            table.by_name[name] = declared
            if metric.HasField("alias"):
                if metric.alias in table.by_alias:
                    problems.append(
                        Rejection(
                            "unknown_alias",
                            f"metric {name[:60]!r}: alias {metric.alias} "
                            "declared twice in the BIRTH (the later one is not used)",
                            index,
                        )
                    )
                    continue
                table.by_alias[metric.alias] = declared
        return table, problems

    def parse(
        self, topic_name: str, payload: bytes, limits: Limits, readings: bool = True
    ) -> Parsed:
        """One message as items (readings before the rule), with the tables held now.

        ``readings=False``: a BIRTH updates the tables only (another daemon of a shared
        group stores its readings and rejections).
        """
        topic = parse_topic(topic_name)
        if topic is None:
            return refused("bad_topic", f"not a Sparkplug B topic: {topic_name[:120]!r}")
        self.counts.messages[topic.type] += 1
        if topic.type in ("STATE", "NCMD", "DCMD"):
            return Parsed([], [])  # host state and commands: nothing to store
        decoded = decode_payload(payload, limits)
        if isinstance(decoded, Parsed):
            if topic.type in ("NBIRTH", "DBIRTH"):
                self.refused_birth(topic, decoded.rejections[0].reason, leading_timestamp(payload))
            return decoded
        if topic.type != "NDEATH":
            self._sequence(topic, decoded.seq if decoded.HasField("seq") else None)
        if topic.type in ("NDEATH", "DDEATH"):
            self.death(topic, decoded)
            return Parsed([], [])
        if topic.type in ("NBIRTH", "DBIRTH"):
            table, problems = self.birth(topic, decoded, payload)
            self.adopt(topic, table)
            if not readings:
                self.counts.skipped["other_daemon"] += len(decoded.metrics)
                return Parsed([], [])
            parsed = _items(topic, decoded, table, self.counts)
            parsed.rejections.extend(problems)
            return parsed
        held = self.table(topic.key)
        if held is None or not held.online or held.from_store:
            session = _session(held, decoded.timestamp if decoded.HasField("timestamp") else None)
            if isinstance(session, str):
                return refused(
                    "no_birth",
                    f"{topic.type} for {topic.key[:120]!r}: {session} (aliases are not guessed)",
                )
            held = session
        return _items(topic, decoded, held, self.counts)

    def adopt(self, topic: Topic, table: Table) -> None:
        """Make a BIRTH's table current (an NBIRTH also drops its devices' tables)."""
        if topic.type == "NBIRTH":
            self.forget_devices(topic.node_key)
        self.install(table)

    def refused_birth(self, topic: Topic, reason: str, at_ms: int | None) -> None:
        """A BIRTH refused whole (stamped ``at_ms``) ends the session it follows.

        As a DEATH does. The table is kept, closed, so that DATA says why it is refused.
        A table read from MongoDB that is later than the BIRTH (a redelivery of it after a
        restart, the table stored meanwhile) is not the session it ends: nothing changes.
        """
        table = self.tables.get(topic.key)
        if (
            table is not None
            and table.from_store
            and at_ms is not None
            and table.birth_ms is not None
            and at_ms < table.birth_ms
        ):
            return
        if topic.type == "NBIRTH":
            self.forget_devices(topic.node_key)
            self.seqs.pop(topic.node_key, None)
        if table is None:
            table = Table(topic.key, None, None, None)
            self.install(table)
        table.online = False
        table.closed_by = refused_birth_detail(topic.type, reason)
        table.closed_ms = at_ms

    def death_applies(self, topic: Topic, decoded: Any) -> bool:  # noqa: ANN401
        """False for a stale NDEATH: its bdSeq is not the one of the NBIRTH held."""
        if topic.type != "NDEATH":
            return True
        table = self.tables.get(topic.key)
        bd_seq = next(
            (
                m.long_value
                for m in decoded.metrics
                if m.name == "bdSeq" and m.WhichOneof("value") == "long_value"
            ),
            None,
        )
        return table is None or bd_seq is None or table.bd_seq is None or bd_seq == table.bd_seq

    def death(self, topic: Topic, decoded: Any) -> bool:  # noqa: ANN401
        """Apply a DEATH; False if it was stale (an older session's NDEATH) and ignored."""
        if not self.death_applies(topic, decoded):
            self.counts.stale_deaths += 1
            return False
        if topic.type == "NDEATH":
            self.forget_devices(topic.node_key)
            self.seqs.pop(topic.node_key, None)
        table = self.tables.get(topic.key)
        if table is not None:
            table.online = False
        return True


def _session(held: Table | None, at_ms: int | None) -> Table | str:
    """The table a DATA message stamped ``at_ms`` is read with, or why there is none.

    In order, a DATA message belongs to the table held (if open). A table read from
    MongoDB may be later than a DATA message redelivered after a restart (stored while the
    message waited for its acknowledgement): an older message is read with the earlier
    session its time falls in, and never with a later table's aliases.
    """
    if held is None:
        return "no BIRTH seen"
    if (
        held.from_store
        and at_ms is not None
        and held.birth_ms is not None
        and at_ms < held.birth_ms
    ):
        earlier = next(
            (t for t in held.earlier if t.birth_ms is not None and t.birth_ms <= at_ms), None
        )
        if earlier is None or not _open_at(earlier, at_ms):
            return "older than the BIRTH stored for it, and of no session known"
        return earlier
    if not _open_at(held, at_ms):
        return held.closed_by or "closed by a DEATH"
    return held


def _open_at(table: Table, at_ms: int | None) -> bool:
    """Whether ``table`` was the open session at ``at_ms``.

    A table read from MongoDB, closed by a refused BIRTH stamped later than ``at_ms``,
    was: that DATA is a redelivery from before the BIRTH. (In order, closed is closed.)
    """
    return table.online or (
        table.from_store
        and at_ms is not None
        and table.closed_ms is not None
        and at_ms < table.closed_ms
    )


def refused_birth_detail(kind: str, reason: str) -> str:
    """Why DATA is refused after a BIRTH that was refused whole."""
    return f"its last {kind} was refused ({reason}); waiting for a usable BIRTH"


def leading_timestamp(payload: bytes) -> int | None:
    """The payload's ``timestamp`` if it is the first field (as encoders write it), or None.

    Read without parsing the rest: the payload may be one refused as too large or broken.
    """
    if payload[:1] != b"\x08":  # field 1 (timestamp), varint
        return None
    value = shift = 0
    for byte in payload[1:11]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value if value < 2**64 else None
        shift += 7
    return None


def digest(payload: bytes) -> str:
    """A BIRTH's identity: the daemons of a shared group agree on it (same bytes)."""
    return hashlib.blake2b(payload, digest_size=12).hexdigest()


# Message types every daemon of a shared group must see, in order with the DATA it gets.
UNSHARED_TYPES = ("NBIRTH", "NDEATH", "DBIRTH", "DDEATH")
_SHAPES = tuple(
    (kind, [NAMESPACE, "+", kind, "+"]) for kind in ("NBIRTH", "NDATA", "NDEATH", "NCMD")
) + tuple(
    (kind, [NAMESPACE, "+", kind, "+", "+"]) for kind in ("DBIRTH", "DDATA", "DDEATH", "DCMD")
)
_STATE_SHAPE = [NAMESPACE, "STATE", "+"]


def _intersect(levels: list[str], shape: list[str]) -> list[str] | None:
    """The filter matching the topics both match (``shape`` has no ``#``), or None."""
    out: list[str] = []
    for i, level in enumerate(shape):
        if i >= len(levels):
            return None
        mine = levels[i]
        if mine == "#":
            return out + shape[i:]
        if mine == "+":
            out.append(level)
        elif level in ("+", mine):
            out.append(mine)
        else:
            return None
    return out if len(levels) == len(shape) else None


def shared_subscriptions(topics: Sequence[str], group: str) -> tuple[str, ...]:
    """``topics`` for a shared group: BIRTH and DEATH topics unshared, the rest shared.

    Each filter that takes Sparkplug BIRTH or DEATH topics is split by message type, so
    every daemon of the group receives every BIRTH and DEATH, in order with the DATA it
    gets, while each DATA message goes to one daemon. The pieces of one filter match
    disjoint topic sets, so no message arrives twice. Topics under ``spBv1.0/`` that are
    no Sparkplug message type are not subscribed then. A filter whose first level is a
    wildcard cannot be split (MQTT has no "all but" filter): ValueError.
    """
    out: list[str] = []
    for topic in topics:
        levels = topic.split("/")
        pieces = [(kind, _intersect(levels, shape)) for kind, shape in _SHAPES]
        found = [(kind, piece) for kind, piece in pieces if piece is not None]
        if not any(kind in UNSHARED_TYPES for kind, _ in found):
            out.append(f"$share/{group}/{topic}")
            continue
        if levels[0] != NAMESPACE:
            raise ValueError(
                f"topic filter {topic!r} also takes Sparkplug BIRTH and DEATH topics, which "
                "every daemon of a shared group must receive on its own subscription; "
                f"subscribe {NAMESPACE}/# with a filter of its own and narrow this one"
            )
        state = _intersect(levels, _STATE_SHAPE)
        if state is not None:
            found.append(("STATE", state))
        for kind, piece in found:
            text = "/".join(piece)
            out.append(text if kind in UNSHARED_TYPES else f"$share/{group}/{text}")
    return tuple(dict.fromkeys(out))


def bad_name(name: object) -> bool:
    """True if a BIRTH metric name cannot be used (missing, not UTF-8, too long)."""
    return type(name) is not str or not name or len(name) > MAX_NAME_BYTES


def datatype_name(datatype: int) -> str:
    """The specification's name of a datatype number (unknown numbers as digits)."""
    return DATATYPES[datatype] if 0 <= datatype < len(DATATYPES) else str(datatype)


_DATATYPE_IDS = {name: number for number, name in enumerate(DATATYPES)}


def datatype_id(name: object) -> int:
    """The number of a datatype name written by :func:`datatype_name`."""
    if type(name) is str:
        return _DATATYPE_IDS.get(name, int(name) if name.isdigit() else 0)
    return 0


def decode_payload(payload: bytes, limits: Limits) -> Any | Parsed:  # noqa: ANN401
    """The parsed ``Payload`` message, or the whole message refused."""
    if len(payload) > limits.max_message_bytes:
        return refused("too_large", f"{len(payload)} bytes > {limits.max_message_bytes}")
    try:
        decoded = Payload.FromString(payload)
    except DecodeError as exc:
        return refused("invalid_protobuf", f"not a Sparkplug B payload: {str(exc)[:160]}")
    if len(decoded.metrics) > limits.max_readings:
        return refused(
            "too_many_readings", f"{len(decoded.metrics)} metrics > {limits.max_readings}"
        )
    return decoded


def _units(metric: Any) -> str | None:  # noqa: ANN401
    """The engineering unit a BIRTH metric's properties name, if any."""
    if not metric.HasField("properties"):
        return None
    props = metric.properties
    for key, value in zip(props.keys, props.values, strict=False):
        if key in UNIT_PROPERTIES and value.WhichOneof("value") == "string_value":
            unit = value.string_value
            if type(unit) is str and 0 < len(unit) <= 64:
                return unit
    return None


def properties(metric: Any) -> dict[str, object]:  # noqa: ANN401
    """A metric's scalar properties (nested property sets are left out)."""
    out: dict[str, object] = {}
    if not metric.HasField("properties"):
        return out
    props = metric.properties
    for key, value in zip(props.keys, props.values, strict=False):
        if len(out) >= MAX_PROPERTIES or type(key) is not str or not key:
            break
        if value.is_null:
            out[key] = None
            continue
        member = value.WhichOneof("value")
        if member in _VALUE_MEMBERS:
            raw = _convert(getattr(value, member), value.type, member)
            if not isinstance(raw, Rejection):
                out[key] = raw
    return out


_VALUE_MEMBERS = frozenset(
    {"int_value", "long_value", "float_value", "double_value", "boolean_value", "string_value"}
)


def _convert(raw: object, datatype: int, member: str) -> object:
    """A oneof value as the datatype means it; a :class:`Rejection` if it cannot be stored."""
    spec = _SCALARS.get(datatype)
    bits = spec[1] if spec is not None else 0
    if member in ("int_value", "long_value"):
        value = int(raw)  # type: ignore[call-overload]
        if bits:
            width = 32 if member == "int_value" else 64
            if value >= 2 ** (width - 1):
                value -= 2**width
            if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                return Rejection("bad_value", f"{value} out of range for {DATATYPES[datatype]}")
        elif value > _INT64_MAX:
            return float(value)  # BSON has no unsigned 64-bit integer
        return value
    if member in ("float_value", "double_value"):
        value_f = float(raw)  # type: ignore[arg-type]
        if not math.isfinite(value_f):
            return Rejection("bad_value", "not a finite number")
        return value_f
    if member == "string_value" and type(raw) is not str:
        return Rejection("bad_value", "string is not UTF-8")
    return raw


def _value(metric: Any, datatype: int) -> object:  # noqa: ANN401
    """The metric's value, or a Rejection saying why it is not stored."""
    spec = _SCALARS.get(datatype)
    member = metric.WhichOneof("value")
    if spec is None:
        return Rejection(
            "unsupported_type", f"datatype {datatype_name(datatype)} is not stored (refused whole)"
        )
    if member != spec[0]:
        return Rejection(
            "bad_value", f"datatype {DATATYPES[datatype]} but the value is {member or 'missing'}"
        )
    return _convert(getattr(metric, member), datatype, member)


def _items(topic: Topic, decoded: Any, table: Table, counts: SessionCounts) -> Parsed:  # noqa: ANN401
    """Readings of a BIRTH or DATA: metrics grouped by timestamp, one item per timestamp."""
    if not table.sensor:
        table.sensor = sensor_id(topic)
    sensor = table.sensor
    data = topic.type.endswith("DATA")
    by_alias = table.by_alias
    default_ms = decoded.timestamp if decoded.HasField("timestamp") else None
    items: dict[int | None, Item] = {}
    problems: list[Rejection] = []
    for index, metric in enumerate(decoded.metrics):
        if data and metric.HasField("alias"):
            declared = by_alias.get(metric.alias)
            if declared is None:
                problems.append(
                    Rejection(
                        "unknown_alias",
                        f"alias {metric.alias} not declared in the BIRTH of {table.key[:120]!r}",
                        index,
                    )
                )
                continue
        else:
            found = _by_name(metric, table, data)
            if found is None:
                continue  # a BIRTH metric birth() refused already
            if isinstance(found, Rejection):
                problems.append(Rejection(found.reason, found.detail, index))
                continue
            declared = found
        if declared.protocol:
            continue
        if metric.is_null or metric.is_transient:
            counts.skipped["null" if metric.is_null else "transient"] += 1
            continue
        value = _value_of(metric, declared)
        if isinstance(value, Rejection):
            problems.append(
                Rejection(value.reason, f"metric {declared.name[:60]!r}: {value.detail}", index)
            )
            continue
        ms = metric.timestamp if metric.HasField("timestamp") else default_ms
        item = items.get(ms)
        if item is None:
            # ts in whole milliseconds (the format's time.format is epoch_ms); no
            # timestamp at all: the arrival time. Tags come from the rule's captures.
            item = items[ms] = Item({}, ms, None, sensor, None, None, None, None)
        name = declared.name
        if name in item.fields:
            problems.append(
                Rejection(
                    "bad_value",
                    f"metric {name[:60]!r}: twice at the same timestamp (the first is kept)",
                    index,
                )
            )
            continue
        item.fields[name] = value
        if declared.units is not None:
            units = item.units
            if units is None:
                units = {}
                items[ms] = item = item._replace(units=units)
            units[name] = declared.units
    return Parsed(list(items.values()), problems)


def _value_of(metric: Any, declared: Definition) -> object:  # noqa: ANN401
    """The value of a metric as its BIRTH declared it (the fast path), else :func:`_value`."""
    if metric.HasField("datatype") and metric.datatype != declared.datatype:
        return _value(metric, metric.datatype)
    member = declared.member
    if member is None or metric.WhichOneof("value") != member:
        return _value(metric, declared.datatype)
    raw = getattr(metric, member)
    if declared.floating:
        return raw if raw - raw == 0 else Rejection("bad_value", "not a finite number")
    return _convert(raw, declared.datatype, member)


def _by_name(
    metric: Any,  # noqa: ANN401
    table: Table,
    data: bool,
) -> Definition | Rejection | None:
    """The BIRTH definition a metric names (None: a BIRTH metric already refused)."""
    name = metric.name
    if type(name) is not str or not name:
        if not data:
            return None
        return Rejection("bad_field_name", "metric with neither a known alias nor a name")
    found = table.by_name.get(name)
    if found is None and not data:
        return None
    if found is None:
        return Rejection(
            "unknown_alias",
            f"metric {name[:60]!r} not declared in the BIRTH of {table.key[:120]!r}",
        )
    return found
