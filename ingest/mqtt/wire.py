"""MQTT bytes on the hot path, as pure functions: PUBLISH packets in, PUBACKs out.

Each function here may have a compiled twin in ``_wire_c.pyx`` (see ingest/accel.py);
the names the rest of the package uses are the ones :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

import struct
from operator import index
from typing import TYPE_CHECKING, Protocol

from ingest import accel

if TYPE_CHECKING:
    from collections.abc import Callable

PUBACK = 0x40
PUBACK_HEAD = bytes((PUBACK, 2))
PUBACK_WORD = int.from_bytes(PUBACK_HEAD) << 16  # a PUBACK's head above its 16-bit id
PUBLISH = 0x30
MALFORMED = "malformed PUBLISH: its header runs past its end"

# The Subscription Identifiers a PUBLISH carries: 0 for none, the identifier when it
# carries one (the usual case), a tuple of them when it carries several.
type Subscription = int | tuple[int, ...]
# topic, payload, mid, qos, dup, retain (the PUBLISH's RETAIN flag as delivered),
# subscription
type Deliver = Callable[[str, bytes, int, int, bool, bool, Subscription], None]
SUBSCRIPTION_IDENTIFIER = 0x0B
# The other properties a PUBLISH may carry (MQTT 5, 3.3.2.3), by how their value is
# skipped: bytes of a fixed size (payload format indicator, message expiry interval,
# topic alias), or strings of two-byte length (content type, response topic,
# correlation data; a user property is a pair).
_FIXED = {0x01: 1, 0x02: 4, 0x23: 2}
_STRINGS = {0x03: 1, 0x08: 1, 0x09: 1, 0x26: 2}


class Cursor(Protocol):
    """A read buffer's reader as :func:`scan` sees it: where it is, and whether paused."""

    _pos: int  # the next unread byte of the buffer
    _paused: bool  # set by a delivery that pauses the reader: the scan stops after it


def scan_py(data: bytes, reader: Cursor, deliver: Deliver) -> int:
    """Deliver the complete QoS 0/1 PUBLISH packets of ``data`` from ``reader._pos`` on.

    Stops at anything else (another packet type, QoS 2, a packet not complete in
    ``data``, a remaining length over 4 bytes), and after a delivery that paused the
    reader (``reader._paused`` is read before each packet). ``reader._pos`` moves past a
    packet before its delivery, so a delivery that raises leaves it after that packet.
    Returns how many packets were handled.
    """
    _check_bytes(data)
    pos = index(reader._pos)  # noqa: SLF001
    if pos < 0:
        raise ValueError(f"position {pos} before the buffer")
    size = len(data)
    handled = 0
    while pos + 1 < size and not reader._paused:  # noqa: SLF001
        command = data[pos]
        if command & 0xF0 != PUBLISH or command & 0x06 == 0x04:  # not a PUBLISH; QoS 2
            break
        # The remaining length: a variable byte integer of at most 4 bytes.
        length = data[pos + 1]
        at = pos + 2
        if length & 0x80:
            length, shift, at = 0, 0, pos + 1
            while at < size and at - pos <= 4:
                byte = data[at]
                at += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            else:
                break  # incomplete (or malformed: paho's reader refuses it)
        stop = at + length
        if stop > size:
            break
        reader._pos = pos = stop  # noqa: SLF001
        handled += 1
        _deliver_publish(deliver, command, data, at, stop)
    return handled


def deliver_publish_py(deliver: Deliver, command: int, data: bytes, at: int, stop: int) -> None:
    """Hand a QoS 0 or 1 PUBLISH to ``deliver``: its first header byte and its body.

    The body is ``data[at:stop]``, parsed in place (topic, packet id, the Subscription
    Identifiers among the properties, payload; see ingest/mqtt/paho_hooks.py for why
    the other properties are safe to skip, and :func:`_subscription`). A
    header that runs past ``stop`` raises ``ValueError`` (:data:`MALFORMED`): in a read
    buffer, the next packet's bytes would be taken for it. So does a body outside
    ``data`` or a ``command`` that is not a byte.
    """
    _check_bytes(data)
    command, at, stop = index(command), index(at), index(stop)
    if not (0 <= command <= 0xFF and at >= 0 and stop <= len(data)):
        raise ValueError(
            f"not a packet of the buffer: command {command}, body {at}:{stop} of {len(data)} bytes"
        )
    _deliver_publish(deliver, command, data, at, stop)


def _check_bytes(data: object) -> None:
    if type(data) is not bytes:
        raise TypeError(f"a read buffer is bytes, not {type(data).__name__}")


def _deliver_publish(deliver: Deliver, command: int, data: bytes, at: int, stop: int) -> None:
    """:func:`deliver_publish` of a body :func:`scan` found within ``data``."""
    try:
        end = at + 2 + (data[at] << 8 | data[at + 1])
        topic = data[at + 2 : end].decode("utf-8", "replace")
        mid = 0
        if command & 0x06:
            mid = data[end] << 8 | data[end + 1]
            end += 2
        if data[end] < 0x80:  # the usual property length: one byte
            block = end + 1
            end = block + data[end]
        else:
            block, end = _property_block(data, end)
    except IndexError:
        end = stop + 1
    if end > stop:
        raise ValueError(MALFORMED)
    deliver(
        topic,
        data[end:stop],
        mid,
        (command & 0x06) >> 1,
        bool(command & 0x08),
        bool(command & 0x01),
        _subscription(data, block, end) if end > block else 0,
    )


def _property_block(data: bytes, pos: int) -> tuple[int, int]:
    """Where an MQTT 5 property block's properties start and end (after its length)."""
    length, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return pos, pos + length
        shift += 7


def _subscription(data: bytes, pos: int, end: int) -> Subscription:
    """The Subscription Identifiers among the properties ``data[pos:end]``.

    0 for none, the identifier if one, a tuple if several (a broker may send one copy of
    a message that several subscriptions match). The other properties are skipped by
    their type; reading stops, with what was found so far, at a property identifier
    that MQTT 5 does not define for a PUBLISH or at one that runs past the block (a
    malformed block: its bytes are not read as anything else).
    """
    if end - pos == 5 and data[pos] == SUBSCRIPTION_IDENTIFIER:
        # The usual block: one identifier of 4 bytes (the daemon's; see subscriptions.py)
        b1, b2, b3, b4 = data[pos + 1 : end]
        if b1 & b2 & b3 & 0x80 and not b4 & 0x80:
            return (b1 & 0x7F | (b2 & 0x7F) << 7 | (b3 & 0x7F) << 14 | b4 << 21) or 0
    found: Subscription = 0
    while pos < end:
        ident = data[pos]
        pos += 1
        if ident == SUBSCRIPTION_IDENTIFIER:
            value, pos = _identifier(data, pos, end)
            if value < 0:
                break
            if value:  # 0 is not an identifier (a protocol error): nothing found
                found = (
                    value
                    if not found
                    else ((found,) if isinstance(found, int) else found) + (value,)
                )
        elif ident in _FIXED:
            pos += _FIXED[ident]
        elif ident in _STRINGS:
            pos = _skip_strings(data, pos, end, _STRINGS[ident])
            if pos < 0:
                break
        else:
            break
    return found


def _identifier(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """A Subscription Identifier and where it ends; -1 if malformed.

    A variable byte integer of at most 4 bytes, none at or past ``end``.
    """
    value = 0
    for shift in (0, 7, 14, 21):
        if pos >= end:
            return -1, pos
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    return -1, pos


def _skip_strings(data: bytes, pos: int, end: int, count: int) -> int:
    """Past ``count`` strings (or binary data) of two-byte length; -1 if one runs past."""
    for _ in range(count):
        if pos + 2 > end:
            return -1
        pos += 2 + (data[pos] << 8 | data[pos + 1])
    return pos


def pubacks_py(mids: list[int]) -> bytes:
    """The PUBACK packets of QoS 1 packet ids, in order, as one blob.

    Each is 4 bytes: ``0x40 0x02`` and the id, big-endian (an MQTT 5 PUBACK without
    reason code means success). An id outside 1..65535 raises ``ValueError``.
    """
    for mid in mids:
        if not 0 < mid <= 0xFFFF:
            raise ValueError(f"packet id {mid} outside 1..65535")
    return struct.pack(f">{len(mids)}I", *[PUBACK_WORD | mid for mid in mids])


scan = accel.pick(scan_py, "ingest.mqtt._wire_c", "scan")
deliver_publish = accel.pick(deliver_publish_py, "ingest.mqtt._wire_c", "deliver_publish")
pubacks = accel.pick(pubacks_py, "ingest.mqtt._wire_c", "pubacks")
