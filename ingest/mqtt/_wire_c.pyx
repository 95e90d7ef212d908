# cython: language_level=3
"""Compiled twin of ingest/mqtt/wire.py (same names without ``_py``, same behaviour)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize


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
