# cython: language_level=3
"""Compiled twin of ingest/store/writers/timeseries.py: ``batch_documents`` (twin of
``batch_documents_py``), ``reading_document`` (``reading_document_py``) and
``sorted_readings`` (``sorted_readings_py``).

``batch_documents`` gives each document as a ``bson.raw_bson.RawBSONDocument`` (with
:data:`RAW_OPTIONS`) whose bytes it writes itself: the bytes pymongo's encoder writes for
the Python twin's dict (``_id``, ``ts`` as a date, ``meta``, ``seq``, ``units``, ``info``,
the values in name order; bool, int32 when it fits else int64, double, string, null), so
the driver copies them instead of walking a dict per reading. A document holding
anything else (another type, an int beyond int64, a string that is not UTF-8, a name
with a NUL byte or one of the document's own fields, a ``Reading`` subclass, a ``when``)
is the Python twin's dict, built by its steps: the driver then encodes or refuses it as
it does the Python twin's. The same ``_id`` bytes for the same prefix and counter, the
same runs and the same exceptions. Readings that are exactly ``Reading`` are read by
index; anything else through its attributes, as the Python twin does. Values dicts whose
names are all exactly ``str`` are ordered here; any other names take the Python twin's
steps. ``reading_document`` gives the Python twin's dict.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_SetItem, PyDict_Size, PyDict_Update
from cpython.exc cimport PyErr_Clear, PyErr_ExceptionMatches
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.list cimport PyList_GET_ITEM, PyList_GetSlice, PyList_New, PyList_SET_ITEM, PyList_Sort
from cpython.ref cimport Py_INCREF
from cpython.object cimport (
    Py_EQ,
    PyObject,
    PyObject_IsTrue,
    PyObject_RichCompare,
    PyObject_RichCompareBool,
)
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_Compare
from libc.math cimport isnan
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memchr, memcpy

from datetime import UTC
from operator import attrgetter

from bson.codec_options import CodecOptions, DatetimeConversion
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument

from ingest.model import Reading
from ingest.store.writers.bucket import BsonDate, ts_key

cdef extern from *:
    """
    #include <structmember.h>

    /* object.__new__(cls) for a class that takes object.__new__ (see _slot). */
    static PyObject *tsc_new(PyObject *cls, PyObject *empty) {
        PyTypeObject *type = (PyTypeObject *)cls;
        return type->tp_new(type, empty, NULL);
    }

    /* The offset of a writable object slot (``__slots__`` entry) ``name`` of ``cls``, or -1
       when setting it is anything else than storing into the slot. */
    static Py_ssize_t tsc_slot_offset(PyObject *cls, PyObject *descr) {
        PyMemberDef *member;
        if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)) return -1;
        if (member->offset <= 0
                || member->offset + (Py_ssize_t)sizeof(PyObject *)
                   > ((PyTypeObject *)cls)->tp_basicsize)
            return -1;
        return member->offset;
    }

    /* A dict with room for ``n`` items (no resize while they are inserted). */
    static PyObject *tsc_dict(Py_ssize_t n) {
    #if PY_VERSION_HEX < 0x030E0000 && !defined(PYPY_VERSION)
        return _PyDict_NewPresized(n);
    #else
        return PyDict_New();
    #endif
    }

    /* What setting the slot at ``offset`` of a fresh object does (PyMember_SetOne). */
    static void tsc_set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **addr = (PyObject **)((char *)obj + offset);
        Py_INCREF(value);
        Py_XSETREF(*addr, value);
    }
    """
    object tsc_new(object cls, object empty)
    Py_ssize_t tsc_slot_offset(object cls, object descr)
    void tsc_set_slot(object obj, Py_ssize_t offset, object value)
    dict tsc_dict(Py_ssize_t n)

# Reading's fields by index.
cdef Py_ssize_t SENSOR_ID = Reading._fields.index("sensor_id")
cdef Py_ssize_t WHEN = Reading._fields.index("when")
cdef Py_ssize_t EPOCH = Reading._fields.index("epoch")
cdef Py_ssize_t VALUES = Reading._fields.index("values")
cdef Py_ssize_t SEQ = Reading._fields.index("seq")
cdef Py_ssize_t MS = Reading._fields.index("ms")
cdef Py_ssize_t TAGS = Reading._fields.index("tags")
cdef Py_ssize_t UNITS = Reading._fields.index("units")
cdef Py_ssize_t INFO = Reading._fields.index("info")
cdef Py_ssize_t FIELDS = len(Reading._fields)

cdef enum:
    # Most names of one reading sorted on the stack (more: the Python twin's steps).
    MAX_NAMES = 32

cdef object _Reading = Reading
cdef object _ObjectId = ObjectId
cdef object _BsonDate = BsonDate
cdef object _ts_key = ts_key
cdef object _dict_update = dict.update
cdef object _object_new = object.__new__
cdef tuple _NO_ARGS = ()


cdef Py_ssize_t _slot(object cls, str name):
    """Where ``setattr(object.__new__(cls), name, value)`` stores ``value``, or -1.

    An offset when ``cls`` takes ``object.__new__`` and ``object.__setattr__`` and
    ``name`` is one of its ``__slots__`` (the object is then made and set here in C);
    -1 for anything else (made and set by those very calls).
    """
    if cls.__new__ is not object.__new__ or cls.__setattr__ is not object.__setattr__:
        return -1
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return tsc_slot_offset(cls, klass.__dict__[name])
    return -1


cdef Py_ssize_t _ID_SLOT = _slot(ObjectId, "_ObjectId__id")
cdef Py_ssize_t _MS_SLOT = _slot(BsonDate, "ms")

# Field names in name order by their order in a reading (Python twin: _SORTED), for the
# names that are not all exactly ``str``.
cdef dict _SORTED = {}
cdef Py_ssize_t _SORTED_LIMIT = 10_000


cdef inline object _field(object reading, Py_ssize_t index, str name):
    """``getattr(reading, name)``, by index for a ``Reading`` (a tuple)."""
    if type(reading) is _Reading and PyTuple_GET_SIZE(reading) > index:
        return <object>PyTuple_GET_ITEM(reading, index)
    return getattr(reading, name)


cdef inline object _new_with(object cls, Py_ssize_t offset, str name, object value):
    """``obj = object.__new__(cls); setattr(obj, name, value)`` (``offset``: see _slot)."""
    if offset > 0:
        obj = tsc_new(cls, _NO_ARGS)
        tsc_set_slot(obj, offset, value)
    else:
        obj = _object_new(cls)
        setattr(obj, name, value)
    return obj


cdef object _sorted_names(tuple names):
    """``names`` in name order, or None if they are in order already (Python: _sorted_names)."""
    try:
        return _SORTED[names]
    except KeyError:
        order = tuple(sorted(names))
        result = None if order == names else order
        if len(_SORTED) < _SORTED_LIMIT:
            _SORTED[names] = result
        return result


# --- BSON bytes of a document (see the module docstring) -------------------------------

cdef extern from "Python.h":
    # Declared here without Cython's exception check: a failure (a lone surrogate) is
    # cleared and the document is the Python twin's dict.
    const char *_utf8_of "PyUnicode_AsUTF8AndSize"(object text, Py_ssize_t *size)

# What the CodecOptions of the documents decode to when read (the lookup before an
# insert reads ``meta`` and ``ts``): aware UTC datetimes, or DatetimeMS beyond their range.
RAW_OPTIONS = CodecOptions(document_class=RawBSONDocument, tz_aware=True, tzinfo=UTC,
                           datetime_conversion=DatetimeConversion.DATETIME_AUTO)
cdef object _RAW_OPTIONS = RAW_OPTIONS
cdef object _RawBSONDocument = RawBSONDocument
cdef Py_ssize_t _RAW_SLOT = _slot(RawBSONDocument, "_RawBSONDocument__raw")
cdef Py_ssize_t _INFLATED_SLOT = _slot(RawBSONDocument, "_RawBSONDocument__inflated_doc")
cdef Py_ssize_t _OPTIONS_SLOT = _slot(RawBSONDocument, "_RawBSONDocument__codec_options")
cdef bint _RAW_BY_SLOTS = _RAW_SLOT > 0 and _INFLATED_SLOT > 0 and _OPTIONS_SLOT > 0

# The instants a Python datetime holds (years 1 to 9999), in milliseconds: a Reading's
# ``ts`` beyond them raises OverflowError in both twins.
cdef int64_t _MIN_DATETIME_MS = -62_135_596_800_000
cdef int64_t _MAX_DATETIME_MS = 253_402_300_799_999

cdef enum:
    # what writing a part of a document gives: done, or the document is the dict's
    WRITTEN = 0
    AS_DICT = 1
    # BSON element types
    T_DOUBLE = 0x01
    T_STRING = 0x02
    T_DOCUMENT = 0x03
    T_OBJECT_ID = 0x07
    T_BOOL = 0x08
    T_DATE = 0x09
    T_NULL = 0x0A
    T_INT32 = 0x10
    T_INT64 = 0x12


cdef struct Buf:
    char *data
    Py_ssize_t len
    Py_ssize_t cap


cdef int _grow(Buf *b, Py_ssize_t extra) except -1:
    """Room for ``extra`` more bytes."""
    cdef Py_ssize_t cap
    cdef char *data
    if extra <= b.cap - b.len:
        return 0
    if extra > 0x7FFFFFFF:  # beyond any BSON document: never written (see _finish)
        raise MemoryError()
    cap = b.cap * 2 if b.cap else 512
    while cap - b.len < extra:
        cap *= 2
    data = <char *>realloc(b.data, cap)
    if data == NULL:
        raise MemoryError()
    b.data, b.cap = data, cap
    return 0


cdef inline void _le32(char *at, uint32_t v) noexcept:
    at[0] = <char>(v & 0xFF)
    at[1] = <char>((v >> 8) & 0xFF)
    at[2] = <char>((v >> 16) & 0xFF)
    at[3] = <char>((v >> 24) & 0xFF)


cdef inline void _le64(char *at, uint64_t v) noexcept:
    _le32(at, <uint32_t>v)  # the low 32 bits (C's conversion to unsigned)
    _le32(at + 4, <uint32_t>(v >> 32))


cdef int _name(Buf *b, int kind, const char *name, Py_ssize_t size) except -1:
    """An element's type byte and name (``size`` bytes, no NUL among them)."""
    _grow(b, size + 2)
    b.data[b.len] = <char>kind
    memcpy(b.data + b.len + 1, name, size)
    b.data[b.len + 1 + size] = 0
    b.len += size + 2
    return 0


cdef int _text(object text, const char **out, Py_ssize_t *size) except -1:
    """``text``'s UTF-8 bytes, or AS_DICT when it is not exactly ``str`` or not UTF-8."""
    cdef const char *data
    if not PyUnicode_CheckExact(text):
        return AS_DICT
    data = _utf8_of(text, size)
    if data == NULL:
        if not PyErr_ExceptionMatches(UnicodeEncodeError):
            return -1  # MemoryError: raised
        PyErr_Clear()
        return AS_DICT
    out[0] = data
    return WRITTEN


# The document's own fields: a value or tag of that name overwrites it in the dict.
cdef frozenset _OWN = frozenset({"_id", "ts", "meta", "seq", "units", "info"})


cdef int _key(object key, const char **out, Py_ssize_t *size, frozenset own) except -1:
    """A field name's UTF-8 bytes, or AS_DICT (not str or UTF-8, a NUL, in ``own``)."""
    if _text(key, out, size) == AS_DICT:
        return AS_DICT
    if memchr(out[0], 0, size[0]) != NULL or (own is not None and key in own):
        return AS_DICT
    return WRITTEN


cdef int _value(Buf *b, const char *name, Py_ssize_t size, object value) except -1:
    """One element as pymongo's encoder writes it, or AS_DICT for another type."""
    cdef long long number
    cdef int overflow = 0
    cdef double real
    cdef uint64_t bits
    cdef const char *data
    cdef Py_ssize_t length
    if value is True or value is False:
        _name(b, T_BOOL, name, size)
        _grow(b, 1)
        b.data[b.len] = 1 if value is True else 0
        b.len += 1
    elif PyLong_CheckExact(value):
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:  # beyond int64: the driver's OverflowError, from the dict
            return AS_DICT
        if -2147483648 <= number <= 2147483647:
            _name(b, T_INT32, name, size)
            _grow(b, 4)
            _le32(b.data + b.len, <uint32_t>number)
            b.len += 4
        else:
            _name(b, T_INT64, name, size)
            _grow(b, 8)
            _le64(b.data + b.len, <uint64_t>number)
            b.len += 8
    elif PyFloat_CheckExact(value):
        real = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &real, 8)  # the double's bits as they are: NaN's and -0.0's too
        _name(b, T_DOUBLE, name, size)
        _grow(b, 8)
        _le64(b.data + b.len, bits)
        b.len += 8
    elif value is None:
        _name(b, T_NULL, name, size)
    else:
        if _text(value, &data, &length) == AS_DICT or length >= 0x7FFFFFFF:
            return AS_DICT
        _name(b, T_STRING, name, size)
        _grow(b, length + 5)
        _le32(b.data + b.len, <uint32_t>(length + 1))
        memcpy(b.data + b.len + 4, data, length)
        b.data[b.len + 4 + length] = 0
        b.len += length + 5
    return WRITTEN


cdef int _field_of(Buf *b, object key, object value, frozenset own) except -1:
    """``key: value`` (see _key and _value)."""
    cdef const char *name
    cdef Py_ssize_t size
    if _key(key, &name, &size, own) == AS_DICT:
        return AS_DICT
    return _value(b, name, size, value)


cdef Py_ssize_t _in_order(object mapping, PyObject **names, PyObject **items
                          ) except -2:
    """An exact dict's items (at most MAX_NAMES, names exactly str) sorted by name into
    ``names``/``items`` (borrowed: ``mapping`` is not changed meanwhile); their count,
    or -1 for anything else."""
    cdef Py_ssize_t j = 0, k, count = 0
    cdef PyObject *key
    cdef PyObject *value
    if type(mapping) is not dict or PyDict_Size(mapping) > MAX_NAMES:
        return -1
    while PyDict_Next(mapping, &j, &key, &value):
        if not PyUnicode_CheckExact(<object>key):
            return -1
        k = count
        while k > 0 and PyUnicode_Compare(<object>names[k - 1], <object>key) > 0:
            names[k] = names[k - 1]
            items[k] = items[k - 1]
            k -= 1
        names[k] = key
        items[k] = value
        count += 1
    return count


cdef int _fields(Buf *b, PyObject **names, PyObject **items, Py_ssize_t count,
                 frozenset own) except -1:
    cdef Py_ssize_t k
    for k in range(count):
        if _field_of(b, <object>names[k], <object>items[k], own) == AS_DICT:
            return AS_DICT
    return WRITTEN


cdef int _sub_document(Buf *b, const char *name, Py_ssize_t size, object mapping,
                       bint meta, object sensor) except -1:
    """``name: dict(sorted(mapping.items()))`` (a ``meta``: ``sensor`` first), or AS_DICT."""
    cdef PyObject *names[MAX_NAMES]
    cdef PyObject *items[MAX_NAMES]
    cdef Py_ssize_t count = 0, begin
    if mapping is not None:
        count = _in_order(mapping, names, items)
        if count < 0:
            return AS_DICT
    _name(b, T_DOCUMENT, name, size)
    begin = b.len
    _grow(b, 4)
    b.len += 4
    if meta and _value(b, b"sensor_id", 9, sensor) == AS_DICT:
        return AS_DICT
    if _fields(b, names, items, count, _SENSOR_ID if meta else None) == AS_DICT:
        return AS_DICT
    _grow(b, 1)
    b.data[b.len] = 0
    b.len += 1
    _le32(b.data + begin, <uint32_t>(b.len - begin))
    return WRITTEN


cdef frozenset _SENSOR_ID = frozenset({"sensor_id"})


cdef int _head(Buf *b, const char *oid, object ms) except -1:
    """A document's length (set by _finish), ``_id`` and ``ts`` (``ms``, exactly int)."""
    cdef long long stamp
    cdef int overflow = 0
    if not PyLong_CheckExact(ms):
        return AS_DICT
    stamp = PyLong_AsLongLongAndOverflow(ms, &overflow)
    if overflow:
        return AS_DICT
    b.len = 0
    _grow(b, 4)
    b.len = 4
    _name(b, T_OBJECT_ID, b"_id", 3)
    _grow(b, 12)
    memcpy(b.data + b.len, oid, 12)
    b.len += 12
    _name(b, T_DATE, b"ts", 2)
    _grow(b, 8)
    _le64(b.data + b.len, <uint64_t>stamp)
    b.len += 8
    return WRITTEN


cdef object _finish(Buf *b):
    """The document written: its length set, as a RawBSONDocument (None: too long)."""
    _grow(b, 1)
    b.data[b.len] = 0
    b.len += 1
    if b.len > 0x7FFFFFFF:
        return None
    _le32(b.data, <uint32_t>b.len)
    raw = PyBytes_FromStringAndSize(b.data, b.len)
    if not _RAW_BY_SLOTS:
        return _RawBSONDocument(raw, _RAW_OPTIONS)
    doc = tsc_new(_RawBSONDocument, _NO_ARGS)
    tsc_set_slot(doc, _RAW_SLOT, raw)
    tsc_set_slot(doc, _INFLATED_SLOT, None)
    tsc_set_slot(doc, _OPTIONS_SLOT, _RAW_OPTIONS)
    return doc


cdef object _plain_raw(Buf *b, const char *oid, object ms, object meta, object seq,
                       object values, PyObject **names, PyObject **items, Py_ssize_t count,
                       object order):
    """The bytes of the Python twin's dict for a reading without tags, units or info
    (``meta``: the dict it shares; the values: sorted in ``names``/``items`` when
    ``count`` > 0, else in ``order`` or already in order), or None for its dict."""
    cdef PyObject *value
    cdef PyObject *key
    cdef Py_ssize_t j = 0
    if _head(b, oid, ms) == AS_DICT:
        return None
    if type(meta) is not dict or PyDict_Size(meta) != 1:
        return None
    value = PyDict_GetItem(meta, "sensor_id")
    if value == NULL or _sub_document(b, b"meta", 4, None, True, <object>value) == AS_DICT:
        return None
    if seq is not None and _value(b, b"seq", 3, seq) == AS_DICT:
        return None
    if count > 0:
        if _fields(b, names, items, count, _OWN) == AS_DICT:
            return None
    elif type(values) is not dict:
        return None
    elif order is None:
        while PyDict_Next(values, &j, &key, &value):
            if _field_of(b, <object>key, <object>value, _OWN) == AS_DICT:
                return None
    else:
        for name in order:
            value = PyDict_GetItem(values, name)
            if value == NULL or _field_of(b, name, <object>value, _OWN) == AS_DICT:
                return None
    return _finish(b)


cdef object _mapped_raw(Buf *b, const char *oid, object reading):
    """The bytes of ``{"_id": oid, **reading_document(reading)}`` for a ``Reading``
    with tags, units or info, or None for that dict (see the module docstring)."""
    cdef PyObject *names[MAX_NAMES]
    cdef PyObject *items[MAX_NAMES]
    cdef Py_ssize_t count
    if type(reading) is not _Reading or PyTuple_GET_SIZE(reading) != FIELDS:
        return None
    ms = <object>PyTuple_GET_ITEM(reading, MS)
    tags = <object>PyTuple_GET_ITEM(reading, TAGS)
    units = <object>PyTuple_GET_ITEM(reading, UNITS)
    info = <object>PyTuple_GET_ITEM(reading, INFO)
    seq = <object>PyTuple_GET_ITEM(reading, SEQ)
    # ts: the datetime of ``ms`` (a ``when`` is encoded by the driver, from the dict)
    if (<object>PyTuple_GET_ITEM(reading, WHEN) is not None or not PyLong_CheckExact(ms)
            or not _MIN_DATETIME_MS <= ms <= _MAX_DATETIME_MS):
        return None
    if tags is not None and type(tags) is not dict:
        return None
    if _head(b, oid, ms) == AS_DICT:
        return None
    if _sub_document(b, b"meta", 4, tags if tags else None, True,
                     <object>PyTuple_GET_ITEM(reading, SENSOR_ID)) == AS_DICT:
        return None
    if seq is not None and _value(b, b"seq", 3, seq) == AS_DICT:
        return None
    if units is not None and _sub_document(b, b"units", 5, units, False, None) == AS_DICT:
        return None
    if info is not None and _sub_document(b, b"info", 4, info, False, None) == AS_DICT:
        return None
    count = _in_order(<object>PyTuple_GET_ITEM(reading, VALUES), names, items)
    if count < 0 or _fields(b, names, items, count, _OWN) == AS_DICT:
        return None
    return _finish(b)


cdef dict _reading_document(object reading):
    cdef dict meta = {"sensor_id": _field(reading, SENSOR_ID, "sensor_id")}
    if _field(reading, TAGS, "tags"):  # in name order: a meta field order is part of the series
        tags = _field(reading, TAGS, "tags")
        for key in sorted(tags):
            meta[key] = tags[key]
    when = _field(reading, WHEN, "when") if type(reading) is _Reading else None
    cdef dict doc = {"ts": when if when is not None else getattr(reading, "ts"), "meta": meta}
    if _field(reading, SEQ, "seq") is not None:
        doc["seq"] = _field(reading, SEQ, "seq")
    if _field(reading, UNITS, "units") is not None:
        doc["units"] = dict(sorted(_field(reading, UNITS, "units").items()))
    if _field(reading, INFO, "info") is not None:
        doc["info"] = dict(sorted(_field(reading, INFO, "info").items()))
    values = _field(reading, VALUES, "values")
    for name in sorted(values):
        doc[name] = values[name]
    return doc


def reading_document(reading):
    """The time-series document for one reading."""
    return _reading_document(reading)


cdef object _document(Buf *b, const char *oid_bytes, object reading, object date, object ms,
                      dict metas):
    """Reading ``reading``'s document (see batch_documents): its bytes, or its dict."""
    cdef PyObject *names[MAX_NAMES]
    cdef PyObject *items[MAX_NAMES]
    cdef Py_ssize_t k, count
    cdef bint fast
    cdef dict doc

    if (_field(reading, TAGS, "tags") or _field(reading, UNITS, "units") is not None
            or _field(reading, INFO, "info") is not None):
        made = _mapped_raw(b, oid_bytes, reading)
        if made is not None:
            return made
        doc = {"_id": _object_id(oid_bytes)}
        PyDict_Update(doc, _reading_document(reading))
        return doc

    sensor = _field(reading, SENSOR_ID, "sensor_id")
    meta = metas.get(sensor)
    if meta is None:
        meta = {"sensor_id": sensor}
        metas[sensor] = meta

    values = _field(reading, VALUES, "values")
    # The names in name order, with their values: sorted here when they are all
    # exactly str (at most MAX_NAMES), else by the Python twin's steps.
    count = _in_order(values, names, items)
    fast = count >= 0
    order = None
    if not fast:
        count = 0
        order = _sorted_names(tuple(values))

    seq = _field(reading, SEQ, "seq")
    if type(reading) is _Reading:
        made = _plain_raw(b, oid_bytes, ms, meta, seq, values, names, items, count, order)
        if made is not None:
            return made
    doc = tsc_dict(4 + count)
    doc["_id"] = _object_id(oid_bytes)
    doc["ts"] = date
    doc["meta"] = meta
    if seq is not None:
        doc["seq"] = seq
    if fast:  # values is not changed meanwhile: borrowed names and values stay alive
        for k in range(count):
            PyDict_SetItem(doc, <object>names[k], <object>items[k])
    elif order is None:
        _dict_update(doc, values)
    else:
        for name in order:
            doc[name] = values[name]
    return doc


cdef object _object_id(const char *oid_bytes):
    """An ObjectId of these 12 bytes."""
    return _new_with(_ObjectId, _ID_SLOT, "_ObjectId__id",
                     PyBytes_FromStringAndSize(oid_bytes, 12))


def batch_documents(readings, prefix, start):
    """The documents of ``readings`` (sorted by sensor and time), each sensor's run of
    times and whether two of one sensor share a millisecond (see batch_documents_py)."""
    cdef Py_ssize_t n = len(readings), i, k, begin
    if type(prefix) is not bytes or type(start) is not int:
        raise TypeError(f"an ObjectId prefix and counter are bytes and int, not "
                        f"{type(prefix).__name__} and {type(start).__name__}")
    if PyBytes_GET_SIZE(prefix) != 9:
        raise ValueError(f"an ObjectId prefix is 9 bytes, not {PyBytes_GET_SIZE(prefix)}")
    cdef list rows = readings if type(readings) is list else list(readings)
    cdef unsigned long counter = start & 0xFFFFFF
    cdef list dates = [], stamps = [], docs = [], runs = []
    cdef dict metas = {}
    cdef object reading, ms, sensor
    cdef char oid_bytes[12]
    cdef Buf b
    b.data, b.len, b.cap = NULL, 0, 0

    for i in range(n):  # the times first, as bson_dates
        reading = rows[i]
        ms = _field(reading, MS, "ms")
        if ms is None:
            ms = _ts_key(getattr(reading, "ts"))
        stamps.append(ms)
        dates.append(_new_with(_BsonDate, _MS_SLOT, "ms", ms))

    try:
        memcpy(oid_bytes, PyBytes_AS_STRING(prefix), 9)
        for i in range(n):
            oid_bytes[9] = <char>((counter >> 16) & 0xFF)
            oid_bytes[10] = <char>((counter >> 8) & 0xFF)
            oid_bytes[11] = <char>(counter & 0xFF)
            counter = (counter + 1) & 0xFFFFFF
            docs.append(_document(&b, oid_bytes, rows[i], <object>PyList_GET_ITEM(dates, i),
                                  <object>PyList_GET_ITEM(stamps, i), metas))
    finally:
        free(b.data)

    # Each sensor's run of times (as itertools.groupby), and whether two neighbours of a
    # run share a millisecond (compared as operator.eq does: no identity shortcut).
    cdef bint collided = False
    i = 0
    while i < n:
        begin = i
        sensor = _field(rows[i], SENSOR_ID, "sensor_id")
        i += 1
        while i < n and PyObject_RichCompareBool(
                sensor, _field(rows[i], SENSOR_ID, "sensor_id"), Py_EQ):
            i += 1
        if i - begin > 1 and not collided:
            for k in range(begin + 1, i):
                if PyObject_IsTrue(PyObject_RichCompare(
                        <object>PyList_GET_ITEM(stamps, k - 1),
                        <object>PyList_GET_ITEM(stamps, k), Py_EQ)):
                    collided = True
                    break
        runs.append((sensor, PyList_GetSlice(dates, begin, i)))
    return docs, runs, collided


cdef object _BY_SENSOR_AND_TIME = attrgetter("sensor_id", "epoch")

cdef struct Entry:
    double epoch
    Py_ssize_t index  # in the input: a tie keeps the input's order


cdef int _by_epoch(const void *a, const void *b) noexcept nogil:
    cdef const Entry *x = <const Entry *>a
    cdef const Entry *y = <const Entry *>b
    if x.epoch < y.epoch:
        return -1
    if x.epoch > y.epoch:
        return 1
    return -1 if x.index < y.index else (1 if x.index > y.index else 0)


def sorted_readings(readings):
    """``sorted(readings, key=attrgetter("sensor_id", "epoch"))`` (sorted_readings_py).

    For a list of ``Reading`` whose sensor ids are exactly ``str`` and whose times are
    exactly ``float`` and not NaN, the key is a total order, so the stable sort has one
    result; it is found here by sensor (sorted once each) then by time within a sensor
    (in order already, as a rule). Anything else is sorted by ``sorted`` itself.
    """
    if type(readings) is not list:
        return sorted(readings, key=_BY_SENSOR_AND_TIME)
    cdef list rows = <list>readings
    cdef Py_ssize_t n = len(rows), i, k, begin, end, distinct
    cdef dict groups = {}
    cdef list sensors = []
    cdef object reading, sensor, epoch, last = None, found
    cdef Py_ssize_t last_group = -1
    cdef Py_ssize_t *group_of = NULL
    cdef Py_ssize_t *start = NULL
    cdef Entry *entries = NULL
    cdef Entry *sorted_entries = NULL
    cdef bint ordered
    cdef list out
    if n == 0:
        return []
    try:
        group_of = <Py_ssize_t *>malloc(n * sizeof(Py_ssize_t))
        entries = <Entry *>malloc(n * sizeof(Entry))
        if group_of == NULL or entries == NULL:
            raise MemoryError()
        for i in range(n):
            reading = <object>PyList_GET_ITEM(rows, i)
            if (type(reading) is not _Reading or PyTuple_GET_SIZE(reading) <= SENSOR_ID
                    or PyTuple_GET_SIZE(reading) <= EPOCH):
                return sorted(rows, key=_BY_SENSOR_AND_TIME)
            sensor = <object>PyTuple_GET_ITEM(reading, SENSOR_ID)
            epoch = <object>PyTuple_GET_ITEM(reading, EPOCH)
            if (not PyUnicode_CheckExact(sensor) or not PyFloat_CheckExact(epoch)
                    or isnan(PyFloat_AS_DOUBLE(epoch))):
                return sorted(rows, key=_BY_SENSOR_AND_TIME)
            if sensor is not last:
                found = groups.get(sensor)
                if found is None:
                    last_group = len(sensors)
                    groups[sensor] = last_group
                    sensors.append((sensor, last_group))
                else:
                    last_group = found
                last = sensor
            group_of[i] = last_group
            entries[i].epoch = PyFloat_AS_DOUBLE(epoch)
        # Each sensor's place in name order, then the readings placed by it (stable).
        distinct = len(sensors)
        start = <Py_ssize_t *>malloc((distinct + 1) * sizeof(Py_ssize_t))
        if start == NULL:
            raise MemoryError()
        PyList_Sort(sensors)  # (str, int) tuples of unique str: by name
        rank = [0] * distinct
        for k in range(distinct):
            rank[<Py_ssize_t>(<tuple>sensors[k])[1]] = k
        for k in range(distinct + 1):
            start[k] = 0
        for i in range(n):
            group_of[i] = <Py_ssize_t>rank[group_of[i]]
            start[group_of[i] + 1] += 1
        for k in range(distinct):
            start[k + 1] += start[k]
        out = PyList_New(n)
        for i in range(n):  # entries[i].epoch is reading i's; placed into out by rank
            k = start[group_of[i]]
            start[group_of[i]] = k + 1
            group_of[i] = k  # reading i's position
        for i in range(n):
            entries[i].index = i
        # entries in output order: (epoch, input index)
        sorted_entries = <Entry *>malloc(n * sizeof(Entry))
        if sorted_entries == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                sorted_entries[group_of[i]] = entries[i]
            begin = 0
            for k in range(distinct):
                end = start[k]
                ordered = True
                for i in range(begin + 1, end):
                    if sorted_entries[i].epoch < sorted_entries[i - 1].epoch:
                        ordered = False
                        break
                if not ordered:
                    qsort(&sorted_entries[begin], end - begin, sizeof(Entry), _by_epoch)
                begin = end
            for i in range(n):
                reading = <object>PyList_GET_ITEM(rows, sorted_entries[i].index)
                Py_INCREF(reading)
                PyList_SET_ITEM(out, i, reading)
        finally:
            free(sorted_entries)
        return out
    finally:
        free(group_of)
        free(start)
        free(entries)
