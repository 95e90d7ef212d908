# cython: language_level=3
"""The selective JSON scanner of ingest/devices/formats/json.py: a kernel.

For a rule with ``root`` or ``each``, most of a payload is never read: a LoRaWAN uplink of
about 1 KB names its device, gateways, settings and correlation ids around the few values
the rule takes. :class:`Selection` validates the whole payload in C without building
objects, and materialises only the values at the paths json.py names (a string or small
integer directly, anything else through ``orjson.loads`` of its bytes alone), into the
payload object pruned to those paths. What the rule then does with it is json.py's.

Whenever anything is unusual the answer is None, "not sure", and json.py parses the whole
payload with ``orjson.loads``, so every rejection and its detail text stay orjson's:
invalid UTF-8, a control character in a string, an escape it does not fully check, a
number outside JSON's grammar or so large it could be infinite, nesting deeper than
``MAX_SCAN_DEPTH``, a needed key given twice or written with an escape, a top level that
is not an object, anything after the document. It is stricter than orjson (that only
costs the full parse), never more lenient.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memcmp

import orjson

from ingest import accel

# A module global, not a C one: tests replace it to make a value's parse fail.
_loads = orjson.loads
cdef object _DOUBT = object()  # a value could not be materialised: not sure

cdef enum:
    MAX_SCAN_DEPTH = 128  # orjson's own limit is 1024: deeper payloads are not ours
    MAX_KEYS = 64  # needed keys of one object (a bit each for duplicates)


cdef struct _Buf:
    const unsigned char *p
    Py_ssize_t n
    Py_ssize_t pos


@cython.final
cdef class _Node:
    """The keys of one object that the rule reads: a value itself, or a path through it."""

    cdef Py_ssize_t count
    cdef list names  # str, as in the document's dict
    cdef list raw  # the names' UTF-8 bytes (kept alive for keys[])
    cdef list subs  # the _Node of a path through the key, or None
    cdef const char *keys[MAX_KEYS]
    cdef Py_ssize_t lens[MAX_KEYS]
    cdef bint terms[MAX_KEYS]  # the value at this key is needed whole

    def __cinit__(self):
        self.count = 0
        self.names = []
        self.raw = []
        self.subs = []

    cdef Py_ssize_t add(self, str name, bint term) except -2:
        """The index of ``name`` (added if new); -1 when there are too many."""
        cdef Py_ssize_t i
        cdef bytes raw
        for i in range(self.count):
            if self.names[i] == name:
                self.terms[i] = self.terms[i] or term
                return i
        if self.count >= MAX_KEYS:
            return -1
        raw = name.encode("utf-8")
        i = self.count
        self.names.append(name)
        self.raw.append(raw)
        self.subs.append(None)
        self.keys[i] = PyBytes_AS_STRING(raw)
        self.lens[i] = PyBytes_GET_SIZE(raw)
        self.terms[i] = term
        self.count += 1
        return i


@cython.final
cdef class Selection:
    """The paths of a payload object to materialise (tuples of keys), compiled once.

    ``Selection(paths).pruned(payload)`` is the payload object with only those paths, or
    None (not sure: the caller parses the whole payload). None of them may be empty;
    ``ValueError`` for a path that is empty or not of strings, or too many keys.
    """

    cdef _Node top

    def __cinit__(self, tuple paths):
        cdef _Node node
        cdef Py_ssize_t i, last, index
        self.top = _Node()
        for path in paths:
            if type(path) is not tuple or not path:
                raise ValueError(f"a path is a non-empty tuple of keys, not {path!r}")
            node = self.top
            last = len(path) - 1
            for i, key in enumerate(<tuple>path):
                if type(key) is not str:
                    raise ValueError(f"a key is a string, not {key!r}")
                index = node.add(key, i == last)
                if index < 0:
                    raise ValueError(f"more than {MAX_KEYS} keys in one object")
                if i < last:
                    if node.subs[index] is None:
                        node.subs[index] = _Node()
                    node = node.subs[index]

    def pruned(self, payload):
        """The payload object pruned to the paths, or None when not sure (see above)."""
        if type(payload) is not bytes:
            return None
        return _scan(<bytes>payload, self.top)


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_ARM64))
    #include <intrin.h>
    #endif
    /* Eight bytes of p as a little-endian word: the first byte is the lowest. */
    static inline uint64_t json_c_word(const unsigned char *p) {
        uint64_t w;
        memcpy(&w, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
    #endif
        return w;
    }
    /* The index (0-7) of the lowest byte flagged (0x80) in m (m != 0). */
    static inline int json_c_first(uint64_t m) {
    #if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_ARM64))
        unsigned long index;
        _BitScanForward64(&index, m);
        return (int)(index >> 3);
    #elif defined(__GNUC__) || defined(__clang__)
        return __builtin_ctzll(m) >> 3;
    #else
        int index = 0;
        while (!(m & 0x80)) {
            m >>= 8;
            index++;
        }
        return index;
    #endif
    }
    """
    uint64_t json_c_word(const unsigned char *p) noexcept nogil
    int json_c_first(uint64_t m) noexcept nogil


cdef inline Py_ssize_t _ws(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Past JSON's whitespace at ``i``."""
    cdef unsigned char c
    while i < n:
        c = p[i]
        if c != 32 and c != 10 and c != 13 and c != 9:
            break
        i += 1
    return i


cdef inline int _hex(unsigned char c) noexcept nogil:
    if 48 <= c <= 57:
        return c - 48
    if 65 <= c <= 70:
        return c - 55
    if 97 <= c <= 102:
        return c - 87
    return -1


cdef inline long _hex4(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The four hex digits at ``p[i:i+4]``, or -1."""
    cdef int a, b, c, d
    if i + 4 > n:
        return -1
    a = _hex(p[i])
    b = _hex(p[i + 1])
    c = _hex(p[i + 2])
    d = _hex(p[i + 3])
    if a < 0 or b < 0 or c < 0 or d < 0:
        return -1
    return (a << 12) | (b << 8) | (c << 4) | d


cdef inline uint64_t _special(uint64_t w) noexcept nogil:
    """The high bit of each byte of ``w`` that is a quote, a backslash, a control character
    or not ASCII; exact for the lowest such byte (the bytes above it may be flagged too)."""
    cdef uint64_t quote = w ^ 0x2222222222222222ULL, slash = w ^ 0x5C5C5C5C5C5C5C5CULL
    return (((quote - 0x0101010101010101ULL) & ~quote)
            | ((slash - 0x0101010101010101ULL) & ~slash)
            | ((w - 0x2020202020202020ULL) & ~w)
            | w) & 0x8080808080808080ULL


cdef Py_ssize_t _string(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                        bint *escaped) noexcept nogil:
    """Past the string whose opening quote is at ``i``, checked (JSON, UTF-8); -1: doubt."""
    cdef unsigned char c, c1
    cdef long u
    cdef uint64_t mask
    i += 1
    while True:
        while i + 8 <= n:  # eight bytes at a time, to the first that is not plain ASCII
            mask = _special(json_c_word(p + i))
            if mask:
                i += json_c_first(mask)
                break
            i += 8
        if i >= n:
            return -1
        c = p[i]
        if c == 34:  # "
            return i + 1
        if c == 92:  # backslash
            escaped[0] = True
            if i + 1 >= n:
                return -1
            c = p[i + 1]
            if c == 117:  # \uXXXX: a surrogate only as a high-low pair
                u = _hex4(p, i + 2, n)
                if u < 0 or 0xDC00 <= u <= 0xDFFF:
                    return -1
                if 0xD800 <= u <= 0xDBFF:
                    if i + 12 > n or p[i + 6] != 92 or p[i + 7] != 117:
                        return -1
                    u = _hex4(p, i + 8, n)
                    if u < 0xDC00 or u > 0xDFFF:
                        return -1
                    i += 12
                else:
                    i += 6
                continue
            if (c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110
                    or c == 114 or c == 116):
                i += 2
                continue
            return -1
        if c < 0x20:
            return -1
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2:  # a continuation byte, or an overlong two-byte lead
            return -1
        if c < 0xE0:
            if i + 1 >= n or (p[i + 1] & 0xC0) != 0x80:
                return -1
            i += 2
            continue
        if c < 0xF0:
            if i + 2 >= n:
                return -1
            c1 = p[i + 1]
            if (c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80:
                return -1
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0):
                return -1  # overlong, or a surrogate
            i += 3
            continue
        if c < 0xF5:
            if i + 3 >= n:
                return -1
            c1 = p[i + 1]
            if ((c1 & 0xC0) != 0x80 or (p[i + 2] & 0xC0) != 0x80
                    or (p[i + 3] & 0xC0) != 0x80):
                return -1
            if (c == 0xF0 and c1 < 0x90) or (c == 0xF4 and c1 >= 0x90):
                return -1  # overlong, or beyond U+10FFFF
            i += 4
            continue
        return -1


cdef inline bint _digit(unsigned char c) noexcept nogil:
    return 48 <= c <= 57


cdef Py_ssize_t _number(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                        bint *small) noexcept nogil:
    """Past the number at ``i`` (JSON's grammar); ``small``: an integer of at most 18
    digits. -1: doubt (also for a magnitude that could be infinite as a double)."""
    cdef Py_ssize_t start, digits
    cdef long exponent = 0
    cdef bint negative = False
    if p[i] == 45:  # -
        i += 1
    if i >= n:
        return -1
    start = i
    if p[i] == 48:
        i += 1
    elif _digit(p[i]):
        while i < n and _digit(p[i]):
            i += 1
    else:
        return -1
    digits = i - start
    small[0] = digits <= 18
    if i < n and p[i] == 46:  # .
        i += 1
        start = i
        while i < n and _digit(p[i]):
            i += 1
        if i == start:
            return -1
        small[0] = False
    if i < n and (p[i] == 101 or p[i] == 69):  # e E
        i += 1
        if i < n and (p[i] == 43 or p[i] == 45):
            negative = p[i] == 45
            i += 1
        start = i
        while i < n and _digit(p[i]):
            if i - start >= 4:
                return -1
            exponent = exponent * 10 + (p[i] - 48)
            i += 1
        if i == start:
            return -1
        small[0] = False
        if negative:
            exponent = -exponent
    if digits > 300 or (exponent > 0 and digits + exponent > 300):
        return -1  # below 1e300 whatever the digits: never infinite
    return i


cdef inline Py_ssize_t _literal(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                                const char *word, Py_ssize_t size) noexcept nogil:
    if i + size > n or memcmp(p + i, word, size) != 0:
        return -1
    return i + size


cdef Py_ssize_t _skip(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                      int depth) noexcept nogil:
    """Past the value at ``i``, checked, nothing built; -1: doubt. ``depth``: the
    containers around it."""
    cdef unsigned char closers[MAX_SCAN_DEPTH]  # '}' or ']' of each open container
    cdef int open = 0
    cdef unsigned char c
    cdef bint flag = False
    while True:  # at a value (i is -1 when the key before it was in doubt)
        if i < 0 or i >= n:
            return -1
        c = p[i]
        if c == 34:
            i = _string(p, i, n, &flag)
        elif c == 123 or c == 91:  # { [
            if depth + open >= MAX_SCAN_DEPTH:
                return -1
            i = _ws(p, i + 1, n)
            if i < n and p[i] == c + 2:  # {} []
                i += 1
            else:
                closers[open] = c + 2
                open += 1
                if c == 123:
                    i = _key(p, i, n)
                continue
        elif c == 45 or _digit(c):
            i = _number(p, i, n, &flag)
        elif c == 116:
            i = _literal(p, i, n, "true", 4)
        elif c == 102:
            i = _literal(p, i, n, "false", 5)
        elif c == 110:
            i = _literal(p, i, n, "null", 4)
        else:
            return -1
        while True:  # after a value: the next one, or the end of containers
            if i < 0 or open == 0:
                return i
            i = _ws(p, i, n)
            if i >= n:
                return -1
            c = p[i]
            if c == 44:  # ,
                i = _ws(p, i + 1, n)
                if closers[open - 1] == 125:
                    i = _key(p, i, n)
                break
            if c != closers[open - 1]:
                return -1
            i += 1
            open -= 1


cdef inline Py_ssize_t _key(const unsigned char *p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Past ``"key" :`` and the whitespace after it; -1: doubt."""
    cdef bint flag = False
    if i < 0 or i >= n or p[i] != 34:
        return -1
    i = _string(p, i, n, &flag)
    if i < 0:
        return -1
    i = _ws(p, i, n)
    if i >= n or p[i] != 58:
        return -1
    return _ws(p, i + 1, n)


cdef object _value(_Buf *b, int depth):
    """The value at ``b.pos`` as orjson makes it, or _DOUBT."""
    cdef const unsigned char *p = b.p
    cdef Py_ssize_t start = b.pos, i, end
    cdef unsigned char c
    cdef bint flag = False
    cdef long long number = 0
    if start >= b.n:
        return _DOUBT
    c = p[start]
    if c == 34:
        end = _string(p, start, b.n, &flag)
        if end < 0:
            return _DOUBT
        b.pos = end
        if not flag:  # checked UTF-8, nothing to unescape
            try:
                return PyUnicode_DecodeUTF8(<const char *>p + start + 1, end - start - 2,
                                            NULL)
            except ValueError as exc:  # a bug: _string checked it
                accel.fell_back("json.Selection.pruned", exc)
                return _DOUBT
    elif c == 45 or _digit(c):
        end = _number(p, start, b.n, &flag)
        if end < 0:
            return _DOUBT
        b.pos = end
        if flag:
            for i in range(start + (c == 45), end):
                number = number * 10 + (p[i] - 48)
            return PyLong_FromLongLong(-number if c == 45 else number)
    else:
        end = _skip(p, start, b.n, depth)
        if end < 0:
            return _DOUBT
        b.pos = end
    try:
        return _loads(PyBytes_FromStringAndSize(<const char *>p + start, end - start))
    except ValueError as exc:  # orjson.JSONDecodeError: a bug, as the scan checked it
        accel.fell_back("json.Selection.pruned", exc)
        return _DOUBT


cdef object _pick(_Buf *b, _Node node, int depth):
    """The members of the object at ``b.pos`` that ``node`` names (the rest checked and
    skipped), as a dict; None: doubt. ``depth``: this object's nesting (1: the top)."""
    cdef const unsigned char *p = b.p
    cdef Py_ssize_t n = b.n, i = b.pos, start, size, j, k
    cdef dict out = {}
    cdef unsigned long long seen = 0
    cdef bint escaped = False
    if depth > MAX_SCAN_DEPTH:
        return None
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        b.pos = i + 1
        return out
    while True:
        if i >= n or p[i] != 34:
            return None
        start = i + 1
        i = _string(p, i, n, &escaped)
        if i < 0 or escaped:
            return None  # an escaped key could spell a needed one
        size = i - 1 - start
        k = -1
        for j in range(node.count):
            if node.lens[j] == size and memcmp(node.keys[j], p + start, size) == 0:
                k = j
                break
        i = _ws(p, i, n)
        if i >= n or p[i] != 58:
            return None
        i = _ws(p, i + 1, n)
        if k < 0:
            i = _skip(p, i, n, depth)
            if i < 0:
                return None
        else:
            if seen & (1ULL << k):
                return None  # a needed key twice: which one wins is orjson's to say
            seen |= 1ULL << k
            b.pos = i
            if node.terms[k]:
                value = _value(b, depth)
                if value is _DOUBT:
                    return None
                out[node.names[k]] = value
            elif i < n and p[i] == 123:
                value = _pick(b, <_Node>node.subs[k], depth + 1)
                if value is None:
                    return None
                out[node.names[k]] = value
            else:  # not an object: the path ends here
                b.pos = _skip(p, i, n, depth)
                if b.pos < 0:
                    return None
            i = b.pos
        i = _ws(p, i, n)
        if i >= n:
            return None
        if p[i] == 125:  # }
            b.pos = i + 1
            return out
        if p[i] != 44:
            return None
        i = _ws(p, i + 1, n)


cdef object _scan(bytes payload, _Node plan):
    """The payload object pruned to what ``plan`` names, or None when in doubt."""
    cdef _Buf b
    b.p = <const unsigned char *>PyBytes_AS_STRING(payload)
    b.n = PyBytes_GET_SIZE(payload)
    b.pos = _ws(b.p, 0, b.n)
    if b.pos >= b.n or b.p[b.pos] != 123:
        return None
    doc = _pick(&b, plan, 1)
    if doc is None or _ws(b.p, b.pos, b.n) != b.n:
        return None
    return doc
