# cython: language_level=3
"""Compiled twin of ingest/mqtt/wire.py (same names without ``_py``, same behaviour)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

from operator import index

cdef enum:
    PUBLISH = 0x30
    MAX_SHIFT = 40  # a property length of 2**40 or more runs past any buffer
    SUBSCRIPTION_IDENTIFIER = 0x0B
MALFORMED = "malformed PUBLISH: its header runs past its end"


def scan(data, reader, deliver):
    """Deliver the complete QoS 0/1 PUBLISH packets of ``data`` from ``reader._pos`` on
    (see wire.py); returns how many packets were handled."""
    _check_bytes(data)
    pos_object = index(reader._pos)
    if pos_object < 0:
        raise ValueError(f"position {pos_object} before the buffer")
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    if pos_object >= size:
        return 0
    cdef const unsigned char *buf = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = pos_object, at, stop, length, handled = 0
    cdef unsigned char command, byte
    cdef int shift
    while pos + 1 < size and not reader._paused:
        command = buf[pos]
        if command & 0xF0 != PUBLISH or command & 0x06 == 0x04:  # not a PUBLISH; QoS 2
            break
        # The remaining length: a variable byte integer of at most 4 bytes.
        length = buf[pos + 1]
        at = pos + 2
        if length & 0x80:
            length, shift, at = 0, 0, pos + 1
            while at < size and at - pos <= 4:
                byte = buf[at]
                at += 1
                length |= <Py_ssize_t>(byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            else:
                break  # incomplete (or malformed: paho's reader refuses it)
        stop = at + length
        if stop > size:
            break
        reader._pos = stop
        pos = stop
        handled += 1
        _deliver_publish(deliver, command, buf, at, stop)
    return handled


def deliver_publish(deliver, command, data, at, stop):
    """Hand a QoS 0 or 1 PUBLISH (its first header byte, its body ``data[at:stop]``) to
    ``deliver`` (see wire.py)."""
    _check_bytes(data)
    command, at, stop = index(command), index(at), index(stop)
    if not (0 <= command <= 0xFF and at >= 0 and stop <= len(data)):
        raise ValueError(f"not a packet of the buffer: command {command}, body {at}:{stop} "
                         f"of {len(data)} bytes")
    if at + 2 > stop:  # no room for the topic length: the header runs past the end
        raise ValueError(MALFORMED)
    _deliver_publish(deliver, <unsigned char>command,
                     <const unsigned char *>PyBytes_AS_STRING(data), at, stop)


cdef inline int _check_bytes(object data) except -1:
    if type(data) is not bytes:
        raise TypeError(f"a read buffer is bytes, not {type(data).__name__}")
    return 0


cdef int _deliver_publish(object deliver, unsigned char command, const unsigned char *buf,
                          Py_ssize_t at, Py_ssize_t stop) except -1:
    """The body ``buf[at:stop]``, with ``0 <= at`` and ``stop`` within the buffer: every
    byte read is below ``stop``, as a header that reads at or past it is malformed in any
    case (wire.py's twin finds that out by reading on, or by an IndexError)."""
    cdef Py_ssize_t end, topic_end, length, shift, block
    cdef unsigned char byte
    cdef long mid = 0
    if at + 2 > stop:
        raise ValueError(MALFORMED)
    topic_end = at + 2 + (buf[at] << 8 | buf[at + 1])
    end = topic_end
    if command & 0x06:
        if end + 2 > stop:
            raise ValueError(MALFORMED)
        mid = buf[end] << 8 | buf[end + 1]
        end += 2
    if end >= stop:
        raise ValueError(MALFORMED)
    if buf[end] < 0x80:  # the usual property length: one byte
        block = end + 1
        end = block + buf[end]
    else:
        length, shift = 0, 0
        while True:
            if end >= stop:
                raise ValueError(MALFORMED)
            byte = buf[end]
            end += 1
            if byte & 0x7F:
                if shift >= MAX_SHIFT:
                    raise ValueError(MALFORMED)
                length |= <Py_ssize_t>(byte & 0x7F) << shift
            if not byte & 0x80:
                break
            if shift < MAX_SHIFT:  # past it, any bit set is refused above
                shift += 7
        if length > stop - end:
            raise ValueError(MALFORMED)
        block = end
        end += length
    if end > stop:
        raise ValueError(MALFORMED)
    deliver(PyUnicode_DecodeUTF8(<const char *>buf + at + 2, topic_end - at - 2, "replace"),
            PyBytes_FromStringAndSize(<const char *>buf + end, stop - end), mid,
            (command & 0x06) >> 1, bool(command & 0x08), bool(command & 0x01),
            _subscription(buf, block, end) if end > block else 0)
    return 0


cdef object _subscription(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end):
    """The Subscription Identifiers among the properties ``buf[pos:end]`` (see wire.py):
    0, the identifier, or a tuple of several."""
    cdef unsigned char ident, byte
    cdef long value, first = 0
    cdef int shift, i
    cdef object several = None
    while pos < end:
        ident = buf[pos]
        pos += 1
        if ident == SUBSCRIPTION_IDENTIFIER:
            value = 0
            shift = 0
            while True:
                if shift > 21 or pos >= end:  # at most 4 bytes; none past the block
                    return _found(first, several)
                byte = buf[pos]
                pos += 1
                value |= <long>(byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            if value == 0:
                continue  # 0 is not an identifier (a protocol error): nothing found
            if first == 0:
                first = value
            elif several is None:
                several = (first, value)
            else:
                several = several + (value,)
        elif ident == 0x01:  # a byte
            pos += 1
        elif ident == 0x02:  # a four-byte integer
            pos += 4
        elif ident == 0x23:  # a two-byte integer
            pos += 2
        elif ident == 0x03 or ident == 0x08 or ident == 0x09 or ident == 0x26:
            for i in range(2 if ident == 0x26 else 1):  # a string or data; a pair
                if pos + 2 > end:
                    return _found(first, several)
                pos += 2 + (buf[pos] << 8 | buf[pos + 1])
        else:
            return _found(first, several)
    return _found(first, several)


cdef inline object _found(long first, object several):
    return several if several is not None else first


def pubacks(list mids):
    """The PUBACK packets of QoS 1 packet ids, in order, as one blob (see wire.py)."""
    cdef Py_ssize_t n = len(mids), i
    cdef object mid
    cdef long value
    for mid in mids:
        if not 0 < mid <= 0xFFFF:
            raise ValueError(f"packet id {mid} outside 1..65535")
    out = PyBytes_FromStringAndSize(NULL, 4 * n)
    cdef unsigned char *buf = <unsigned char *>PyBytes_AS_STRING(out)
    for i in range(n):
        value = mids[i]
        buf[4 * i] = 0x40
        buf[4 * i + 1] = 2
        buf[4 * i + 2] = (value >> 8) & 0xFF
        buf[4 * i + 3] = value & 0xFF
    return out
