# cython: language_level=3
"""Compiled twin of ingest/devices/formats/json.py's ``parse`` (its Python twin: ``parse_py``).

For a rule with ``root`` or ``each`` (``rule.paths``), most of a payload is never read:
a LoRaWAN uplink of about 1 KB names its device, gateways, settings and correlation ids
around the few values the rule takes. This twin validates the whole payload in C without
building objects, and materialises only what the rule reads: the value at ``root`` or
``each``, at the time path and at each payload path its templates name (a string or small
integer directly, anything else through ``orjson.loads`` of its bytes alone), into a
document pruned to those paths. What json._parse_paths, _readings, walk and _flatten then
do with the document is done here line for line in C (json.py stays the reference).

Whenever anything is unusual, this twin hands the payload to ``parse_py`` (a full
``orjson.loads``), so every rejection and its detail text stay orjson's: invalid UTF-8,
a control character in a string, an escape it does not fully check, a number outside
JSON's grammar or so large it could be infinite, nesting deeper than ``MAX_SCAN_DEPTH``,
a needed key given twice or written with an escape, a top level that is not an object,
anything after the document. It is stricter than orjson (that only costs the fallback),
never more lenient.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Copy
from cpython.long cimport PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint64_t
from libc.string cimport memcmp

import importlib

import orjson

from ingest.devices.formats import MAX_DEPTH, MAX_FIELDS, Item, Parsed, refused
from ingest.model import Rejection

cdef object _loads = orjson.loads
cdef object _JSONDecodeError = orjson.JSONDecodeError
# ingest.devices.formats.json: imported at the first call, as that module picks this one
# while it is itself being imported.
cdef object _py = None
cdef dict _plans = {}  # rule -> its _Plan, or False (nothing to gain: parse_py)
cdef object _DOUBT = object()  # a value could not be materialised: parse_py decides
cdef object _ABSENT = object()  # what _walk gives for a path the document does not have

cdef enum:
    MAX_SCAN_DEPTH = 128  # orjson's own limit is 1024: deeper payloads go to parse_py
    MAX_KEYS = 64  # needed keys of one object (a bit each for duplicates)
    MAX_PLANS = 1024  # rules remembered (a process has a fixed set)


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
cdef class _Plan:
    """What a rule reads from a payload object, and the rule's fields this twin uses."""

    cdef _Node top
    cdef tuple root, each, time_path, variables
    cdef object time_flat
    cdef str sep


cdef object _plan(object rule):
    """The :class:`_Plan` of ``rule``, or False when it reads the whole payload object
    (or is not made as ingest.devices.rules makes rules: then parse_py decides)."""
    target = rule.root if rule.root is not None else rule.each
    if target is None:
        return False  # the payload object itself is the reading
    paths = [target]
    if rule.time_path is not None:
        paths.append(rule.time_path)
    if type(rule.variables) is not tuple or type(rule.flatten) is not str:
        return False
    for variable in rule.variables:
        if type(variable) is not tuple or len(variable) != 2:
            return False
        paths.append(variable[1])
    for path in paths:
        if type(path) is not tuple or not path:
            return False
    if rule.each is not None and type(rule.each) is not tuple:
        return False
    cdef _Plan plan = _Plan()
    cdef _Node node
    cdef Py_ssize_t i, last, index
    plan.top = _Node()
    for path in paths:
        node = plan.top
        last = len(path) - 1
        for i, key in enumerate(path):
            if type(key) is not str:
                return False
            try:
                index = node.add(key, i == last)
            except UnicodeEncodeError:
                return False
            if index < 0:
                return False
            if i < last:
                if node.subs[index] is None:
                    node.subs[index] = _Node()
                node = node.subs[index]
    plan.root, plan.each, plan.time_path = rule.root, rule.each, rule.time_path
    plan.variables, plan.time_flat, plan.sep = rule.variables, rule.time_flat, rule.flatten
    return plan


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
    /* tuple.__new__(cls, items), without the call through tuple.__new__'s wrapper */
    static PyObject *json_c_tuple_new(PyObject *cls, PyObject *items) {
        PyObject *args = PyTuple_Pack(1, items), *out;
        if (args == NULL) {
            return NULL;
        }
        out = PyTuple_Type.tp_new((PyTypeObject *)cls, args, NULL);
        Py_DECREF(args);
        return out;
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
    object _tuple_new "json_c_tuple_new"(object cls, tuple items)
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
            except UnicodeDecodeError:
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
    except _JSONDecodeError:
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


cdef object _walk(object obj, tuple path):
    """json.walk: the value at ``path`` (keys of nested objects), or _ABSENT."""
    for key in path:
        if type(obj) is not dict:
            return _ABSENT
        obj = (<dict>obj).get(key, _ABSENT)
        if obj is _ABSENT:
            return _ABSENT
    return obj


cdef object _text(object value):
    """json.template_text."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


cdef int _flatten(dict obj, str prefix, str sep, dict out, list problems,
                  int depth) except -2:
    """json._flatten; -1 for more than MAX_FIELDS fields (json's _TooMany)."""
    for key, value in obj.items():
        name = prefix + key if prefix else key
        if type(value) is dict:
            if depth >= MAX_DEPTH:
                problems.append(Rejection("bad_value", f"{name[:80]}: nested deeper than "
                                                       f"{MAX_DEPTH} levels"))
                continue
            if _flatten(value, name + sep, sep, out, problems, depth + 1) < 0:
                return -1
            continue
        if len(out) >= MAX_FIELDS:
            return -1
        out[name] = value
    return 0


cdef object _paths(dict top, _Plan plan, object captures, object limits):
    """json._parse_paths for one payload object (``[top]``), with json._readings."""
    cdef list items = [], rejections = []
    cdef Py_ssize_t count, index = 0
    if plan.root is not None:
        obj = _walk(top, plan.root)
        if type(obj) is not dict:
            return _tuple_new(Parsed, ([], [Rejection(
                "no_measurements", f"no object at {'.'.join(plan.root)}")]))
        if 1 > limits.max_readings:
            return refused("too_many_readings", f"1 readings > {limits.max_readings}")
        _reading(obj, None, None, top, plan, captures, items, rejections)
        return _tuple_new(Parsed, (items, rejections))
    inner = _walk(top, plan.each)
    if type(inner) is list:
        count = len(<list>inner)
    elif type(inner) is dict:
        count = len(<dict>inner)
    else:
        return _tuple_new(Parsed, ([], [Rejection(
            "bad_shape", f"{'.'.join(plan.each)}: expected an array or an object, "
                         f"got {type(inner).__name__}")]))
    if count > limits.max_readings:
        return refused("too_many_readings", f"{count} readings > {limits.max_readings}")
    if type(inner) is list:
        for obj in <list>inner:
            _reading(obj, None, index if count > 1 else None, top, plan, captures, items,
                     rejections)
            index += 1
    else:
        for key, obj in (<dict>inner).items():
            _reading(obj, key, index if count > 1 else None, top, plan, captures, items,
                     rejections)
            index += 1
    return _tuple_new(Parsed, (items, rejections))


cdef int _reading(object obj, object key, object position, dict top, _Plan plan,
                  object captures, list items, list rejections) except -1:
    """One reading of json._parse_paths's loop: an Item, or a rejection."""
    cdef dict fields, context
    cdef list problems
    cdef str sep = plan.sep
    cdef tuple path
    if type(obj) is not dict:
        rejections.append(Rejection(
            "bad_shape", f"a reading must be an object, got {type(obj).__name__}", position))
        return 0
    fields = {}
    problems = []
    if _flatten(obj, "", sep, fields, problems, 1) < 0:
        rejections.append(Rejection(
            "bad_shape", f"more than {MAX_FIELDS} fields in one reading", position))
        return 0
    ts = None
    if plan.time_path is not None:
        ts = fields.pop(plan.time_flat, _ABSENT)
        if ts is _ABSENT:
            ts = None if obj is top else _walk(top, plan.time_path)
            ts = None if ts is _ABSENT else ts
    context = None
    if plan.variables or key is not None:
        context = PyDict_Copy(captures) if type(captures) is dict else dict(captures)
        if key is not None:
            context["_key"] = key
        for name, path in plan.variables:
            if name in context:
                continue
            value = _walk(obj, path)
            if value is not _ABSENT:
                fields.pop(sep.join(path), None)  # identity, not a measurement
            elif obj is not top:
                value = _walk(top, path)
            text = _text(value)
            if text is not None:
                context[name] = text
    items.append(_tuple_new(Item, (fields, ts, None, None, None, None, context,
                                   problems or None, position)))
    return 0


def parse(payload, rule, captures, limits):
    """Readings from a JSON object or an array of objects (see json.parse_py)."""
    global _py
    if _py is None:
        _py = importlib.import_module("ingest.devices.formats.json")
    plan = _plans.get(rule)  # the rule's fields are not read again: rules are frozen
    if plan is None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        plan = _plans[rule] = _plan(rule) if rule.paths else False
    if plan is False or type(payload) is not bytes:
        return _py.parse_py(payload, rule, captures, limits)
    doc = _scan(payload, (<_Plan>plan).top)
    if doc is None or ((<_Plan>plan).each is not None and
                       _walk(doc, (<_Plan>plan).each) is _ABSENT):
        return _py.parse_py(payload, rule, captures, limits)  # doubt, or the whole object
    return _paths(doc, plan, captures, limits)
