"""The ISO-8601 fast path of ingest.devices.formats.times.text_py: a kernel.

For a format of ``times.ISO_FORMATS``, reads the form network servers send,
``YYYY-MM-DDTHH:MM:SS[.f]`` with ``Z`` or ``±HH:MM`` (one to nine fraction digits), field
by field with the ranges ``datetime`` checks, and
computes what ``datetime.fromisoformat(raw).timestamp()`` gives: the exact count of
microseconds since the epoch (the fraction truncated to microseconds, as fromisoformat
does) divided by 10**6, one rounding as Python's int division. Any other text, any other
format, an out-of-range field or a count beyond 2**53 microseconds (about 285 years from
1970, where a double no longer holds it exactly) is not sure: it goes to ``text_py``
unchanged.
"""

from libc.math cimport floor
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_READ_CHAR

# ingest.devices.formats.times: text_py and ISO_FORMATS, read at the first call (that
# module picks this one while it is itself being imported).
cdef object _text_py = None
cdef tuple _iso_formats = ()
cdef long long _EXACT = 1LL << 53


cdef inline int _digits(str raw, Py_ssize_t at, Py_ssize_t count) except -2:
    """The decimal number in raw[at:at+count], or -1 if one of them is no ASCII digit."""
    cdef int out = 0
    cdef long c
    cdef Py_ssize_t i
    for i in range(at, at + count):
        c = PyUnicode_READ_CHAR(raw, i)
        if c < 48 or c > 57:
            return -1
        out = out * 10 + <int>c - 48
    return out


cdef inline long long _days(long long y, long long m, long long d) noexcept:
    """Days from 1970-01-01 to the proleptic Gregorian date (H. Hinnant's days_from_civil)."""
    y -= m <= 2
    cdef long long era = (y if y >= 0 else y - 399) // 400
    cdef long long yoe = y - era * 400
    cdef long long doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    cdef long long doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline int _month_days(int y, int m) noexcept:
    if m == 2:
        return 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28
    return 30 if m == 4 or m == 6 or m == 9 or m == 11 else 31


cdef object _iso(str raw):
    """The instant of the common form, or None: not that form (the Python twin decides)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(raw), at, start, digits
    if n < 20 or n > 35:
        return None
    if (PyUnicode_READ_CHAR(raw, 4) != 45 or PyUnicode_READ_CHAR(raw, 7) != 45
            or PyUnicode_READ_CHAR(raw, 10) != 84 or PyUnicode_READ_CHAR(raw, 13) != 58
            or PyUnicode_READ_CHAR(raw, 16) != 58):  # - - T : :
        return None
    cdef int year = _digits(raw, 0, 4), month = _digits(raw, 5, 2), day = _digits(raw, 8, 2)
    cdef int hour = _digits(raw, 11, 2), minute = _digits(raw, 14, 2)
    cdef int second = _digits(raw, 17, 2)
    if (year < 1 or month < 1 or month > 12 or day < 1 or day > _month_days(year, month)
            or hour < 0 or hour > 23 or minute < 0 or minute > 59 or second < 0
            or second > 59):
        return None
    cdef long long micro = 0
    cdef long c
    at = 19
    if PyUnicode_READ_CHAR(raw, at) == 46:  # '.'
        at += 1
        start = at
        while at < n:
            c = PyUnicode_READ_CHAR(raw, at)
            if c < 48 or c > 57:
                break
            if at - start < 6:
                micro = micro * 10 + <long long>c - 48
            at += 1
        digits = at - start
        if digits < 1 or digits > 9:
            return None
        while digits < 6:
            micro *= 10
            digits += 1
    cdef long long offset = 0
    cdef int oh, om
    if at >= n:
        return None
    c = PyUnicode_READ_CHAR(raw, at)
    if c == 90:  # 'Z'
        if at + 1 != n:
            return None
    elif c == 43 or c == 45:  # + -
        if at + 6 != n or PyUnicode_READ_CHAR(raw, at + 3) != 58:
            return None
        oh = _digits(raw, at + 1, 2)
        om = _digits(raw, at + 4, 2)
        if oh < 0 or oh > 23 or om < 0 or om > 59:
            return None
        offset = oh * 3600 + om * 60
        if c == 45:
            offset = -offset
    else:
        return None
    cdef long long us = ((_days(year, month, day) * 86400 + hour * 3600 + minute * 60
                          + second - offset) * 1000000 + micro)
    if us >= _EXACT or us <= -_EXACT:
        return None
    cdef double epoch = <double>us / 1e6
    return (epoch, <long long>floor(epoch) * 1000 + micro // 1000)


def text(raw, fmt, zone):
    """times.text_py: a time given as text (the common ISO form read here)."""
    global _text_py, _iso_formats
    if _text_py is None:
        from ingest.devices.formats import times
        _text_py, _iso_formats = times.text_py, times.ISO_FORMATS
    if type(raw) is str and fmt in _iso_formats:
        found = _iso(<str>raw)
        if found is not None:
            return found
    return _text_py(raw, fmt, zone)
