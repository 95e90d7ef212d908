# cython: annotation_typing=False
"""MQTT bytes on the hot path, written once: PUBLISH packets in, PUBACKs out.

This module runs as it is (the pure-Python path) and is compiled by Cython as
``ingest.mqtt._wire_c`` with the C types of ``_wire_c.pxd`` (setup.py); ingest/mqtt/wire.py
picks one of the two. The compiled module is built without bounds checks, so every byte
is read only after a check against the end it may not pass (a header that runs past its
packet is malformed either way). The annotations are for mypy: the C types are the .pxd's.
"""

from __future__ import annotations

import struct
from operator import index
from typing import TYPE_CHECKING

try:
    import cython
except ImportError:  # Cython builds the accelerators; it is not needed to run
    from ingest import _cython_shim as cython

if TYPE_CHECKING:
    from ingest.mqtt.wire_types import Cursor, Deliver, Subscription

PUBLISH = 0x30
PUBACK = 0x40
PUBACK_WORD = (PUBACK << 8 | 2) << 16  # a PUBACK's head (remaining length 2) above its id
MALFORMED = "malformed PUBLISH: its header runs past its end"
SUBSCRIPTION_IDENTIFIER = 0x0B


def scan(data: bytes, reader: Cursor, deliver: Deliver) -> int:
    """Deliver the complete QoS 0/1 PUBLISH packets of ``data`` from ``reader._pos`` on.

    Stops at anything else (another packet type, QoS 2, a packet not complete in
    ``data``, a remaining length over 4 bytes), and after a delivery that paused the
    reader (``reader._paused`` is read before each packet). ``reader._pos`` moves past a
    packet before its delivery, so a delivery that raises leaves it after that packet.
    Returns how many packets were handled.
    """
    buffer = _read_buffer(data)
    start = index(reader._pos)  # noqa: SLF001
    if start < 0:
        raise ValueError(f"position {start} before the buffer")
    size = len(buffer)
    if start >= size:
        return 0
    pos = start
    handled = 0
    while pos + 1 < size and not reader._paused:  # noqa: SLF001
        command = buffer[pos]
        if command & 0xF0 != PUBLISH or command & 0x06 == 0x04:  # not a PUBLISH; QoS 2
            break
        length = buffer[pos + 1]  # the remaining length
        if length < 0x80:  # in one byte: the usual case
            at = pos + 2
        else:
            length, at = _varint(buffer, pos + 1, size)
            if length < 0:
                break  # incomplete (or malformed: paho's reader refuses it)
        stop = at + length
        if stop > size:
            break
        reader._pos = pos = stop  # noqa: SLF001
        handled += 1
        _deliver_publish(deliver, command, buffer, at, stop)
    return handled


def cut_publish(data: bytes, pos: int, limit: int) -> bool:
    """Whether ``data[pos:]`` is the start of a QoS 0/1 PUBLISH that goes on past its end.

    Only one whose remaining length is at most ``limit`` (or not all there yet); not a
    malformed one (a remaining length over 4 bytes, which paho's reader refuses).
    """
    buffer = _read_buffer(data)
    size = len(buffer)
    if not 0 <= pos < size:
        return False
    command = buffer[pos]
    if command & 0xF0 != PUBLISH or command & 0x06 == 0x04:  # not a PUBLISH; QoS 2
        return False
    length, at = _varint(buffer, pos + 1, size)
    if length < 0:
        return at - pos - 1 < 4  # cut within its remaining length (4 bytes: malformed)
    return size < at + length <= at + limit


def deliver_publish(deliver: Deliver, command: int, data: bytes, at: int, stop: int) -> None:
    """Hand a QoS 0 or 1 PUBLISH to ``deliver``: its first header byte and its body.

    The body is ``data[at:stop]``, parsed in place (topic, packet id, the Subscription
    Identifiers among the properties, payload; see ingest/mqtt/paho_hooks.py for why
    the other properties are safe to skip, and :func:`_subscription`). A header that runs
    past ``stop`` raises ``ValueError`` (:data:`MALFORMED`): in a read buffer, the next
    packet's bytes would be taken for it. So does a body outside ``data`` or a
    ``command`` that is not a byte.
    """
    _read_buffer(data)
    command, at, stop = index(command), index(at), index(stop)
    if not (0 <= command <= 0xFF and at >= 0 and stop <= len(data)):
        raise ValueError(
            f"not a packet of the buffer: command {command}, body {at}:{stop} of {len(data)} bytes"
        )
    if at + 2 > stop:  # no room for the topic's length
        raise ValueError(MALFORMED)
    _deliver_publish(deliver, command, data, at, stop)


def _read_buffer(data: object) -> bytes:
    """``data``, which must be a read buffer: bytes (not a subclass)."""
    if type(data) is not bytes:
        raise TypeError(f"a read buffer is bytes, not {type(data).__name__}")
    return data


def _deliver_publish(deliver: Deliver, command: int, data: bytes, at: int, stop: int) -> None:
    """:func:`deliver_publish` of a body within ``data`` (``0 <= at``, ``stop <= len``)."""
    if at + 2 > stop:
        raise ValueError(MALFORMED)
    topic_end = at + 2 + (data[at] << 8 | data[at + 1])
    end = topic_end
    mid = 0
    if command & 0x06:
        if end + 2 > stop:
            raise ValueError(MALFORMED)
        mid = data[end] << 8 | data[end + 1]
        end += 2
    if end >= stop:
        raise ValueError(MALFORMED)
    length = data[end]
    if length < 0x80:  # the usual property length: one byte
        block = end + 1
    else:
        length, block = _varint(data, end, stop)
        if length < 0:
            raise ValueError(MALFORMED)
    end = block + length
    if end > stop:
        raise ValueError(MALFORMED)
    deliver(
        data[at + 2 : topic_end].decode("utf-8", "replace"),
        data[end:stop],
        mid,
        (command & 0x06) >> 1,
        bool(command & 0x08),
        bool(command & 0x01),
        _subscription(data, block, end) if end > block else 0,
    )


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The variable byte integer at ``data[pos:end]`` and where it ends.

    (-1, pos) when it is not complete before ``end`` or within 4 bytes (MQTT's longest).
    """
    value = 0
    for shift in range(0, 28, 7):
        if pos >= end:
            break
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    return -1, pos


# The pure-Python path remembers the short property blocks it has read (a daemon's PUBLISH
# packets carry one of a few: its subscriptions' identifiers); compiled, reading a block
# costs less than looking it up.
_BLOCKS: dict[bytes, Subscription] = {}
_MAX_BLOCKS, _MAX_BLOCK_SIZE = 64, 16


def _subscription(data: bytes, pos: int, end: int) -> Subscription:
    """:func:`_read_subscription`, remembered by the pure-Python path."""
    if not cython.compiled and end - pos <= _MAX_BLOCK_SIZE:
        block = data[pos:end]
        found = _BLOCKS.get(block)
        if found is None:
            found = _read_subscription(data, pos, end)
            if len(_BLOCKS) < _MAX_BLOCKS:
                _BLOCKS[block] = found
        return found
    return _read_subscription(data, pos, end)


def _read_subscription(data: bytes, pos: int, end: int) -> Subscription:
    """The Subscription Identifiers among the properties ``data[pos:end]``.

    0 for none, the identifier if one, a tuple if several (a broker may send one copy of
    a message that several subscriptions match). The other properties (MQTT 5, 3.3.2.3)
    are skipped by their type; reading stops, with what was found so far, at a property
    identifier that MQTT 5 does not define for a PUBLISH or at one that runs past the
    block (a malformed block: its bytes are not read as anything else).
    """
    found: Subscription = 0
    while pos < end:
        ident = data[pos]
        pos += 1
        if ident == SUBSCRIPTION_IDENTIFIER:
            value, pos = _varint(data, pos, end)
            if value < 0:
                break
            if value:  # 0 is not an identifier (a protocol error): nothing found
                found = (
                    value
                    if not found
                    else ((found,) if isinstance(found, int) else found) + (value,)
                )
        elif ident == 0x01:  # payload format indicator: a byte
            pos += 1
        elif ident == 0x02:  # message expiry interval: four bytes
            pos += 4
        elif ident == 0x23:  # topic alias: two bytes
            pos += 2
        elif ident in (0x03, 0x08, 0x09, 0x26):  # content type, response topic,
            # correlation data: a string of two-byte length; a user property: a pair
            pos = _skip_strings(data, pos, end, 2 if ident == 0x26 else 1)
            if pos < 0:
                break
        else:
            break
    return found


def _skip_strings(data: bytes, pos: int, end: int, count: int) -> int:
    """Past ``count`` strings (or binary data) of two-byte length; -1 if one runs past."""
    for _ in range(count):
        if pos + 2 > end:
            return -1
        pos += 2 + (data[pos] << 8 | data[pos + 1])
    return pos


def pubacks(mids: list[int]) -> bytes:
    """The PUBACK packets of QoS 1 packet ids, in order, as one blob.

    Each is 4 bytes: ``0x40 0x02`` and the id, big-endian (an MQTT 5 PUBACK without
    reason code means success). An id outside 1..65535 raises ``ValueError``.
    """
    for mid in mids:
        if not 0 < mid <= 0xFFFF:
            raise ValueError(f"packet id {mid} outside 1..65535")
    if not cython.compiled:  # Python packs the words at once; compiled, C writes the bytes
        return struct.pack(f">{len(mids)}I", *[PUBACK_WORD | mid for mid in mids])
    out = bytearray(4 * len(mids))
    at = 0
    for mid in mids:
        value = mid
        out[at] = PUBACK
        out[at + 1] = 2
        out[at + 2] = value >> 8
        out[at + 3] = value & 0xFF
        at += 4
    return bytes(out)
