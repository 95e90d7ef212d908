# cython: language_level=3
"""Compiled twins of ingest/store/writers/bucket.py's ``plan_buckets_py`` and ``bson_date_int_py``.

The whole plan of a batch in one call: the grouping of ``group_readings``, the single
pass of ``_fast_update``/``_one_update``, and the general path of ``unique_readings``,
``chunks``, ``update_for``, ``_single``/``_coalesced``, ``_statistics`` and
``statement``. It builds the same statements: the same dicts in the same key order, the
same value types (``BsonDate``, ``int``, ``float``), the same filters, hint, caps and
chunks.

It handles the shapes the decoders make: exact ``Reading`` tuples, ``str`` sensor ids
and names, ``float`` epochs, ``int`` or None ``ms``, ``dict`` values of ``int`` and
``float`` (and ``bool`` and ``str`` on the mapping path), ``dict`` or None tags, units and
info of ``str``. For anything else, and on any exception, the whole batch goes to
``plan_buckets_py`` (planning has no side effects), which so decides the result or the
exception. Readings that meet at one instant are merged by the Python
``unique_readings``, called from here for the groups that have any.
"""

cimport cython
from cpython.dict cimport PyDict_Clear, PyDict_Next, PyDict_Size, PyDict_Update
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsDouble, PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport Py_EQ, Py_GT, Py_LT, PyObject, PyObject_RichCompareBool, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.math cimport copysign, fabs, floor

cdef extern from "Python.h":
    ctypedef PyObject* (*_allocfunc)(PyTypeObject*, Py_ssize_t)
    ctypedef struct _AllocType "PyTypeObject":
        _allocfunc tp_alloc
    PyTypeObject* Py_TYPE(object)
    void PyObject_GC_UnTrack(void*)
    ctypedef struct _MemberDef "PyMemberDef":
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct _MemberDescr "PyMemberDescrObject":
        _MemberDef* d_member
    enum:
        Py_T_OBJECT_EX
        Py_READONLY
    bint PyFloat_CheckExact(object)
    bint PyLong_CheckExact(object)
    bint PyBool_Check(object)
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    bint PyList_CheckExact(object)
    int PyList_SetSlice(object, Py_ssize_t, Py_ssize_t, PyObject*) except -1
    PyObject* PyDict_GetItemWithError(object, object)
    PyObject* PyErr_Occurred()
    object _PyDict_NewPresized(Py_ssize_t)

from types import MemberDescriptorType

from ingest.model import Reading as _Reading

# Reading's fields, by position
cdef enum: SENSOR = 0
cdef enum: EPOCH = 2
cdef enum: VALUES = 3
cdef enum: SEQ = 4
cdef enum: MS = 5
cdef enum: TAGS = 6
cdef enum: UNITS = 7
cdef enum: INFO = 8
cdef enum: FIELDS = 9
if _Reading._fields != ("sensor_id", "when", "epoch", "values", "seq", "ms", "tags", "units",
                        "info"):  # then this module is not used (accel.pick: not built)
    raise ImportError(f"ingest.model.Reading has other fields: {_Reading._fields}")

# Names of ingest.store.writers.bucket and of what it imports, looked up at the first
# call (bucket.py picks this module while it is being imported).
cdef bint _ready = False
cdef object _bucket = None
cdef object _BsonDate = None
cdef Py_ssize_t _ms_offset = 0
cdef object _Plan = None
cdef object _EMPTY = None
cdef object _NO_TAGS = None
cdef object _SCHEMA_VERSION = None
cdef object _BUCKET_INDEX = None
cdef object _tags_key = None
cdef object _ts_key = None
cdef object _unique_readings = None
cdef object _plan_py = None
cdef Py_ssize_t _fallbacks = 0
# name -> its four statistics paths, bounded as bucket._STAT_KEYS
cdef dict _STAT_KEYS = {}
# key -> "info.<key>", name -> "units.<name>" (the ``$set`` paths of _label), bounded alike
cdef dict _INFO_KEYS = {}
cdef dict _UNIT_KEYS = {}

# Epochs handled here: their span's start times 1000 is well within 64 bits.
cdef double EPOCH_LIMIT = 1e14
cdef long long SPAN_LIMIT = 1_000_000_000_000
cdef double TWO_53 = 9007199254740992.0


class _Unsupported(Exception):
    """Input outside the shapes handled here: the Python twin plans the batch."""


cdef int _init() except -1:
    global _ready, _bucket, _BsonDate, _ms_offset, _Plan, _EMPTY, _NO_TAGS
    global _SCHEMA_VERSION, _BUCKET_INDEX, _tags_key, _ts_key, _unique_readings, _plan_py
    import importlib
    _bucket = importlib.import_module("ingest.store.writers.bucket")
    instants = importlib.import_module("ingest.store.writers.instants")
    _BsonDate = _bucket.BsonDate
    if type(_BsonDate) is not type or _BsonDate.__new__ is not object.__new__:
        raise ImportError("bucket.BsonDate is not a plain class")
    slot = _BsonDate.__dict__["ms"]
    if type(slot) is not MemberDescriptorType:
        raise ImportError("bucket.BsonDate.ms is not a slot")
    member = (<_MemberDescr*><PyObject*>slot).d_member
    if member.type != Py_T_OBJECT_EX or member.flags & Py_READONLY:
        raise ImportError("bucket.BsonDate.ms is not a writable object slot")
    _ms_offset = member.offset
    _Plan = _bucket.Plan
    _EMPTY = _bucket._EMPTY
    _NO_TAGS = instants.NO_TAGS
    _SCHEMA_VERSION = _bucket.SCHEMA_VERSION
    _BUCKET_INDEX = _bucket.BUCKET_INDEX
    _tags_key = instants.tags_key
    _ts_key = _bucket.ts_key
    _unique_readings = _bucket.unique_readings
    _plan_py = _bucket.plan_buckets_py
    _ready = True
    return 0


def fallbacks():
    """How many batches this twin has handed to ``plan_buckets_py`` (for the tests)."""
    return _fallbacks


def bson_date_int(date):
    """``int()`` of a BsonDate: its ms (bucket.bson_date_int_py, BsonDate.__int__)."""
    return date.ms


def plan_buckets(readings, span, max_readings):
    """One upsert per series-span of ``span`` seconds (see bucket.plan_buckets_py)."""
    global _fallbacks
    if not _ready:
        _init()
    try:
        return _plan(readings, span, max_readings)
    except Exception:
        _fallbacks += 1
        return _plan_py(readings, span, max_readings)


# --- small pieces ---------------------------------------------------------------------

cdef inline object _field(object reading, Py_ssize_t index):
    return <object>PyTuple_GET_ITEM(reading, index)


cdef inline long long _as_ll(object value) except? -1:
    """An exact int within 64 bits; else _Unsupported."""
    cdef int overflow = 0
    cdef long long out
    if not PyLong_CheckExact(value):
        raise _Unsupported()
    out = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise _Unsupported()
    return out


cdef inline double _floordiv(double vx, double wx) noexcept:
    """``vx // wx`` as Python computes it (floatobject.c _float_div_mod), for integral
    0 < wx < SPAN_LIMIT and |vx| < EPOCH_LIMIT: there that is the exact floor of the
    quotient (fmod is exact, and so are vx - mod and its division by wx), with the sign
    of vx when it is zero. Found from the rounded quotient, corrected by at most one
    (k * wx is exact below 2**53)."""
    cdef double k = floor(vx / wx)
    if k * wx > vx:
        k -= 1.0
    elif (k + 1.0) * wx <= vx:
        k += 1.0
    if k == 0.0:
        return copysign(0.0, vx)
    return k


cdef object _date(object ms):
    """bucket.bson_date: a BsonDate of ``ms``, allocated as object.__new__ does, its
    ``ms`` slot set as the slot's descriptor does (checked in _init).

    One holding an int cannot be part of a reference cycle: the collector is told not to
    look at it (as CPython's own collector stops looking at dicts of atomic values), which
    spares it a look at every reading's date in every collection while a batch is built.
    """
    cdef PyTypeObject* kind = <PyTypeObject*>_BsonDate
    cdef PyObject* raw = (<_AllocType*>kind).tp_alloc(kind, 0)
    if raw == NULL:
        raise MemoryError()
    cdef object date = <object>raw
    Py_DECREF(date)  # the reference tp_alloc gave is now date's
    Py_INCREF(ms)
    (<PyObject**>((<char*>raw) + _ms_offset))[0] = <PyObject*>ms
    if PyLong_CheckExact(ms):
        PyObject_GC_UnTrack(raw)
    return date


cdef inline object _date_ms(object date):
    """``date.ms`` of a BsonDate made by _date (its slot, always set there)."""
    return <object>(<PyObject**>((<char*><PyObject*>date) + _ms_offset))[0]


cdef inline object _ms_of(object reading):
    """bucket.ms_of: the reading's ms, else its time's whole milliseconds."""
    cdef object ms = _field(reading, MS)
    if ms is None:
        return _ts_key(reading.ts)
    return ms


cdef tuple _stat_keys(object name):
    """bucket._stat_keys: the update paths of one measurement's statistics."""
    cdef object found = _STAT_KEYS.get(name)
    if found is not None:
        return <tuple>found
    keys = ("stats." + name + ".count", "stats." + name + ".sum",
            "stats." + name + ".min", "stats." + name + ".max")
    if len(_STAT_KEYS) < 10_000:
        _STAT_KEYS[name] = keys
    return keys


cdef inline dict _values_of(object reading):
    cdef object values = _field(reading, VALUES)
    if not PyDict_CheckExact(values):
        raise _Unsupported()
    return <dict>values


cdef inline object _stat_value(object value, bint mapping):
    """The value counted in the statistics: on the mapping path as bucket.stat_values
    makes it (a bool as 0 or 1, None for a string, which is not counted), else the value
    itself; _Unsupported for anything but an int, a float or a bool (or a string there).
    """
    if PyFloat_CheckExact(value) or PyLong_CheckExact(value):
        return value
    if PyBool_Check(value):
        if mapping:
            return 1 if value is True else 0
        return value  # counted as the int it is, kept as it is
    if mapping and PyUnicode_CheckExact(value):
        return None
    raise _Unsupported()


cdef inline double _as_double(object value) except? -1.0:
    """float(value) of an int, bool or float (raises as float() for a huge int)."""
    if PyFloat_CheckExact(value):
        return PyFloat_AS_DOUBLE(value)
    return PyLong_AsDouble(value)


cdef Py_ssize_t _names_bytes(dict values) except -1:
    """What the names of a reading's values add to its size (bucket.reading_bytes)."""
    cdef Py_ssize_t pos = 0, size = 0
    cdef PyObject *key
    cdef PyObject *value
    while PyDict_Next(values, &pos, &key, &value):
        if not PyUnicode_CheckExact(<object>key):
            raise _Unsupported()
        size += 70 + 2 * PyUnicode_GET_LENGTH(<object>key)
    return size


cdef Py_ssize_t _labels_bytes(object labels) except -1:
    """What units or info add to a reading's size (bucket.reading_bytes)."""
    cdef Py_ssize_t pos = 0, size = 0
    cdef PyObject *key
    cdef PyObject *value
    if labels is None:
        return 0
    if not PyDict_CheckExact(labels):
        raise _Unsupported()
    while PyDict_Next(<dict>labels, &pos, &key, &value):
        if not PyUnicode_CheckExact(<object>key) or not PyUnicode_CheckExact(<object>value):
            raise _Unsupported()
        size += PyUnicode_GET_LENGTH(<object>key) + 7 + 4 * PyUnicode_GET_LENGTH(<object>value)
    return size


cdef Py_ssize_t _reading_bytes(object reading) except -1:
    """bucket.reading_bytes."""
    cdef dict values = _values_of(reading)
    cdef Py_ssize_t pos = 0, size = 41 + _names_bytes(values)
    cdef PyObject *key
    cdef PyObject *value
    if _field(reading, TAGS) is None:
        return size
    while PyDict_Next(values, &pos, &key, &value):
        if PyUnicode_CheckExact(<object>value):
            size += 4 * PyUnicode_GET_LENGTH(<object>value)
    return size + _labels_bytes(_field(reading, UNITS)) + _labels_bytes(_field(reading, INFO))


cdef object _label_key(dict known, str prefix, object key):
    """``prefix + key`` (a str), the same string object for the same key while known."""
    cdef PyObject *found
    if not PyUnicode_CheckExact(key):
        raise _Unsupported()
    found = PyDict_GetItemWithError(known, key)
    if found != NULL:
        return <object>found
    path = prefix + <str>key
    if len(known) < 10_000:
        known[key] = path
    return path


cdef int _label(object reading, dict labels) except -1:
    """bucket._label: the reading's info and units into the ``$set``."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef object info = _field(reading, INFO)
    cdef object units = _field(reading, UNITS)
    if info is not None:
        if not PyDict_CheckExact(info):
            raise _Unsupported()
        while PyDict_Next(<dict>info, &pos, &key, &value):
            labels[_label_key(_INFO_KEYS, "info.", <object>key)] = <object>value
    if units is not None:
        if not PyDict_CheckExact(units):
            raise _Unsupported()
        pos = 0
        while PyDict_Next(<dict>units, &pos, &key, &value):
            labels[_label_key(_UNIT_KEYS, "units.", <object>key)] = <object>value
    return 0


cdef dict _entry(object date, object reading, dict values):
    """reading_doc's document with the BSON date: ``{"ts", "seq"?, **values}``."""
    cdef dict entry = {"ts": date}
    cdef object seq = _field(reading, SEQ)
    if seq is not None:
        entry["seq"] = seq
    PyDict_Update(entry, values)
    return entry


cdef struct _Stat:
    Py_ssize_t count
    double sum
    double low   # the value of lows[i] as a double, when low_exact
    double high
    bint low_exact  # lows[i] is a float, or an int that a double holds exactly
    bint high_exact


@cython.final
cdef class _Acc:
    """Each measurement's count, sum, min and max over readings (bucket._by_reading).

    Sums are added up as Python does (``float(first) + value + ...``, an int converted
    as ``float + int`` converts it); min and max compare as Python compares: as doubles
    when both are floats or ints a double holds exactly, else by ``<`` and ``>``.
    """

    cdef list names
    cdef dict where  # name -> its position
    cdef list lows
    cdef list highs
    cdef _Stat *stats
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.names = []
        self.where = {}
        self.lows = []
        self.highs = []
        self.n = 0
        self.cap = 0
        self.stats = NULL

    def __dealloc__(self):
        PyMem_Free(self.stats)

    cdef int reset(self) except -1:
        if self.n:
            PyList_SetSlice(self.names, 0, self.n, NULL)
            PyList_SetSlice(self.lows, 0, self.n, NULL)
            PyList_SetSlice(self.highs, 0, self.n, NULL)
            PyDict_Clear(self.where)
            self.n = 0
        return 0

    cdef int add(self, object name, object value, Py_ssize_t hint) except -1:
        """Count ``value`` (int or float) of ``name``; ``hint``: its likely position."""
        cdef Py_ssize_t i
        cdef double number = _as_double(value)
        cdef bint exact = PyFloat_CheckExact(value) or fabs(number) < TWO_53
        cdef _Stat *stat
        if hint < self.n and <object>PyList_GET_ITEM(self.names, hint) is name:
            i = hint
        else:
            found = self.where.get(name)
            if found is None:
                return self._new(name, value, number, exact)
            i = <Py_ssize_t>found
        stat = &self.stats[i]
        stat.count += 1
        stat.sum += number
        # _by_reading: a new minimum, else perhaps a new maximum
        if (number < stat.low if exact and stat.low_exact
                else PyObject_RichCompareBool(value, <object>PyList_GET_ITEM(self.lows, i),
                                              Py_LT)):
            self.lows[i] = value
            stat.low = number
            stat.low_exact = exact
        elif (number > stat.high if exact and stat.high_exact
                else PyObject_RichCompareBool(value, <object>PyList_GET_ITEM(self.highs, i),
                                              Py_GT)):
            self.highs[i] = value
            stat.high = number
            stat.high_exact = exact
        return 0

    cdef int _new(self, object name, object value, double number, bint exact) except -1:
        cdef Py_ssize_t n = self.n
        cdef Py_ssize_t cap
        cdef void *grown
        if n == self.cap:
            cap = 2 * self.cap if self.cap else 16
            grown = PyMem_Realloc(self.stats, cap * sizeof(_Stat))
            if grown == NULL:
                raise MemoryError()
            self.stats = <_Stat *>grown
            self.cap = cap
        self.names.append(name)
        self.where[name] = n
        self.lows.append(value)
        self.highs.append(value)
        self.stats[n] = _Stat(1, number, number, number, exact, exact)
        self.n = n + 1
        return 0

    cdef int into(self, dict inc, dict mins, dict maxs) except -1:
        """The statistics into ``$inc``, ``$min`` and ``$max`` (bucket._statistics)."""
        cdef Py_ssize_t i
        cdef tuple keys
        for i in range(self.n):
            keys = _stat_keys(<object>PyList_GET_ITEM(self.names, i))
            inc[<object>PyTuple_GET_ITEM(keys, 0)] = self.stats[i].count
            inc[<object>PyTuple_GET_ITEM(keys, 1)] = self.stats[i].sum
            mins[<object>PyTuple_GET_ITEM(keys, 2)] = <object>PyList_GET_ITEM(self.lows, i)
            maxs[<object>PyTuple_GET_ITEM(keys, 3)] = <object>PyList_GET_ITEM(self.highs, i)
        return 0


cdef int _single_into(dict values, bint mapping, dict inc, dict mins, dict maxs) except -1:
    """bucket._single's statistics of one reading."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *raw
    cdef object value
    cdef tuple keys
    while PyDict_Next(values, &pos, &key, &raw):
        value = _stat_value(<object>raw, mapping)
        if value is None:
            continue
        keys = _stat_keys(<object>key)
        inc[<object>PyTuple_GET_ITEM(keys, 0)] = 1
        inc[<object>PyTuple_GET_ITEM(keys, 1)] = _as_double(value)
        mins[<object>PyTuple_GET_ITEM(keys, 2)] = value
        maxs[<object>PyTuple_GET_ITEM(keys, 3)] = value
    return 0


cdef inline dict _presized(Py_ssize_t keys):
    """An empty dict with room for ``keys`` keys (no resize while they go in)."""
    return <dict>_PyDict_NewPresized(keys)


cdef inline dict _inc(Py_ssize_t count, Py_ssize_t size, Py_ssize_t names):
    """``$inc`` with the count and bytes, room for the statistics of ``names``."""
    cdef dict inc = _presized(2 + 2 * names)
    inc["count"] = count
    inc["bytes"] = size
    return inc


cdef dict _statement(object sensor_id, object tags, object start, list dates, list pushed,
                     Py_ssize_t size, long long limit, long long max_bytes, dict inc,
                     dict mins, dict maxs, dict labels):
    """bucket.statement."""
    cdef dict on_insert = {"schema_version": _SCHEMA_VERSION}
    cdef dict update = _presized(6)
    cdef dict query = _presized(6)
    cdef long long room = max_bytes - size
    update["$push"] = {"readings": {"$each": pushed}}
    update["$inc"] = inc
    update["$min"] = mins
    update["$max"] = maxs
    update["$setOnInsert"] = on_insert
    if labels:
        update["$set"] = labels
    if len(inc) == 2:
        on_insert["stats"] = {}
    if room < 0:
        room = 0
    query["sensor_id"] = sensor_id
    query["tags"] = tags
    query["bucket_start"] = start
    query["count"] = {"$lte": limit - PyList_GET_SIZE(dates)}
    query["bytes"] = {"$lte": room}
    query["readings.ts"] = {"$nin": dates}
    return {"q": query, "u": update, "multi": False, "upsert": True, "hint": _BUCKET_INDEX}


# --- the batch --------------------------------------------------------------------------

@cython.final
cdef class _Group:
    """One series-span's readings, in arrival order (a value of group_readings' dict)."""

    cdef object sensor_id
    cdef object tags_of
    cdef double start
    cdef list readings
    cdef _Group next  # the sensor's next group, in order of creation


cdef object _key_of(dict tags):
    """instants.tags_key of a non-empty dict: one tag's here, more by the Python function."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    if PyDict_Size(tags) != 1:
        return _tags_key(tags)
    PyDict_Next(tags, &pos, &key, &value)
    return ((<object>key, <object>value),)


cdef list _group(list readings, double span):
    """bucket.group_readings, as its groups in order.

    Found by sensor id, then by tags and start among that sensor's groups: the same
    equality of (sensor_id, tags_of, start) as the dict's, without a key to build.
    """
    cdef dict by_sensor = {}
    cdef list order = []
    cdef dict keys = {}  # by id() of a tags dict
    cdef object last_sensor = None
    cdef object last_tags = None
    cdef double last_start = 0.0, epoch, start
    cdef _Group group = None, first
    cdef object reading, sensor, tags, stamp, tags_of, found
    cdef PyObject *head
    for reading in readings:
        if Py_TYPE(reading) != <PyTypeObject*>_Reading or PyTuple_GET_SIZE(reading) != FIELDS:
            raise _Unsupported()
        sensor = _field(reading, SENSOR)
        tags = _field(reading, TAGS)
        stamp = _field(reading, EPOCH)
        if not PyUnicode_CheckExact(sensor) or not PyFloat_CheckExact(stamp):
            raise _Unsupported()
        epoch = PyFloat_AS_DOUBLE(stamp)
        if not -EPOCH_LIMIT < epoch < EPOCH_LIMIT:  # also NaN
            raise _Unsupported()
        start = _floordiv(epoch, span) * span
        if sensor is last_sensor and tags is last_tags and start == last_start:
            group.readings.append(reading)
            continue
        if tags is None:
            tags_of = _NO_TAGS
        elif not PyDict_CheckExact(tags):
            raise _Unsupported()
        elif not tags:
            tags_of = _NO_TAGS
        else:
            found = keys.get(id(tags))
            if found is None:
                found = keys[id(tags)] = _key_of(<dict>tags)
            tags_of = found
        head = PyDict_GetItemWithError(by_sensor, sensor)
        if head == NULL:
            if PyErr_Occurred():
                raise _Unsupported()
            first = None
        else:
            first = <_Group>head
        group = first
        while group is not None:
            if group.start == start and (group.tags_of is tags_of
                                         or PyObject_RichCompareBool(group.tags_of, tags_of,
                                                                     Py_EQ)):
                group.readings.append(reading)
                break
            group = group.next
        if group is None:
            group = _Group.__new__(_Group)
            group.sensor_id = sensor
            group.tags_of = tags_of
            group.start = start
            group.readings = [reading]
            if first is None:
                by_sensor[sensor] = group
            else:
                while first.next is not None:
                    first = first.next
                first.next = group
            order.append(group)
        last_sensor = sensor
        last_tags = tags
        last_start = start
    return order


cdef object _one_update(object sensor_id, object tags, object start, object reading,
                        long long limit, long long max_bytes):
    """bucket._one_update."""
    cdef object ms = _field(reading, MS)
    if ms is None or _field(reading, TAGS) is not None:
        return None
    cdef dict values = _values_of(reading)
    cdef Py_ssize_t size = 41 + _names_bytes(values)
    if size > max_bytes:
        return None
    cdef object date = _date(ms)
    cdef dict inc = _inc(1, size, PyDict_Size(values))
    cdef dict mins = {"first_ts": date}
    cdef dict maxs = {"last_ts": date}
    _single_into(values, False, inc, mins, maxs)
    return _statement(sensor_id, tags, start, [date], [_entry(date, reading, values)], size,
                      limit, max_bytes, inc, mins, maxs, None)


cdef bint _distinct(list group, Py_ssize_t n) except -1:
    """Whether the group's ms (each an int) are distinct: in order, else by a set."""
    cdef Py_ssize_t i
    cdef long long previous = 0, ms
    cdef bint ordered = True
    for i in range(n):
        ms = _as_ll(_field(<object>PyList_GET_ITEM(group, i), MS))
        if i and ms <= previous:
            ordered = False
        previous = ms
    return ordered or len({_field(reading, MS) for reading in group}) == n


cdef object _fast_update(object sensor_id, object tags, object start, list group,
                         long long limit, long long max_bytes, _Acc acc):
    """bucket._fast_update."""
    cdef Py_ssize_t n = PyList_GET_SIZE(group), i, pos, index, size = 0
    cdef object reading, ms, date, low, high
    cdef dict values
    cdef list dates, pushed
    cdef PyObject *key
    cdef PyObject *value
    if n == 1:
        return _one_update(sensor_id, tags, start, <object>PyList_GET_ITEM(group, 0),
                           limit, max_bytes)
    if n > limit:
        return None
    for i in range(n):
        reading = <object>PyList_GET_ITEM(group, i)
        if _field(reading, MS) is None or _field(reading, TAGS) is not None:
            return None
    if not _distinct(group, n):
        return None
    dates = []
    pushed = []
    acc.reset()
    low = high = _field(<object>PyList_GET_ITEM(group, 0), MS)
    for i in range(n):
        reading = <object>PyList_GET_ITEM(group, i)
        ms = _field(reading, MS)
        if ms < low:
            low = ms
        elif ms > high:
            high = ms
        values = _values_of(reading)
        date = _date(ms)
        dates.append(date)
        pushed.append(_entry(date, reading, values))
        size += 41
        pos = index = 0
        while PyDict_Next(values, &pos, &key, &value):
            if not PyUnicode_CheckExact(<object>key):
                raise _Unsupported()
            size += 70 + 2 * PyUnicode_GET_LENGTH(<object>key)
            acc.add(<object>key, _stat_value(<object>value, False), index)
            index += 1
    if size > max_bytes:
        return None
    cdef dict inc = _inc(n, size, acc.n)
    cdef dict mins = {"first_ts": _date(low)}
    cdef dict maxs = {"last_ts": _date(high)}
    acc.into(inc, mins, maxs)
    return _statement(sensor_id, tags, start, dates, pushed, size, limit, max_bytes, inc,
                      mins, maxs, None)


cdef dict _update_for(object sensor_id, object tags, object start, list chunk,
                      long long limit, Py_ssize_t size, long long max_bytes, _Acc acc):
    """bucket.update_for."""
    cdef Py_ssize_t n = PyList_GET_SIZE(chunk), i, pos, index
    cdef object reading, date, first, last
    cdef dict values, inc, mins, maxs
    cdef dict labels = {}
    cdef list dates = [], pushed = []
    cdef bint mapping
    cdef PyObject *key
    cdef PyObject *raw
    if n == 1:
        reading = <object>PyList_GET_ITEM(chunk, 0)
        date = _date(_ms_of(reading))
        values = _values_of(reading)
        inc = _inc(1, size, PyDict_Size(values))
        mins = {"first_ts": date}
        maxs = {"last_ts": date}
        mapping = _field(reading, TAGS) is not None
        if mapping:
            _label(reading, labels)
        _single_into(values, mapping, inc, mins, maxs)
        dates.append(date)
        pushed.append(_entry(date, reading, values))
        return _statement(sensor_id, tags, start, dates, pushed, size, limit, max_bytes,
                          inc, mins, maxs, labels)
    acc.reset()
    for i in range(n):
        reading = <object>PyList_GET_ITEM(chunk, i)
        date = _date(_ms_of(reading))
        dates.append(date)
        values = _values_of(reading)
        mapping = _field(reading, TAGS) is not None
        if mapping:
            _label(reading, labels)
        pos = index = 0
        while PyDict_Next(values, &pos, &key, &raw):
            value = _stat_value(<object>raw, mapping)
            if value is not None:
                acc.add(<object>key, value, index)
                index += 1
    # min(dates, key=ms) and max(dates, key=ms): the first of equal ones
    first = last = <object>PyList_GET_ITEM(dates, 0)
    for i in range(1, n):
        date = <object>PyList_GET_ITEM(dates, i)
        if PyObject_RichCompareBool(_date_ms(date), _date_ms(first), Py_LT):
            first = date
        if PyObject_RichCompareBool(_date_ms(date), _date_ms(last), Py_GT):
            last = date
    for i in range(n):
        reading = <object>PyList_GET_ITEM(chunk, i)
        pushed.append(_entry(<object>PyList_GET_ITEM(dates, i), reading,
                             <dict>_field(reading, VALUES)))
    inc = _inc(n, size, acc.n)
    mins = {"first_ts": first}
    maxs = {"last_ts": last}
    acc.into(inc, mins, maxs)
    return _statement(sensor_id, tags, start, dates, pushed, size, limit, max_bytes, inc,
                      mins, maxs, labels)


cdef int _general(object sensor_id, object tags, object start, list group, long long limit,
                  long long max_bytes, _Acc acc, object plan, list ops,
                  list carried) except -1:
    """The rest of bucket.plan_buckets_py: unique_readings, chunks, update_for."""
    cdef Py_ssize_t n = PyList_GET_SIZE(group), i, size = 0, grow
    cdef object unique = group, sources = None, reading
    cdef list chunk = []
    cdef bint plain = True
    for i in range(n):
        if _field(<object>PyList_GET_ITEM(group, i), MS) is None:
            plain = False
            break
    if not plain or not _distinct(group, n):
        unique, sources = _unique_readings(group, plan)
    if not PyList_CheckExact(unique):
        raise _Unsupported()
    for reading in <list>unique:
        if Py_TYPE(reading) != <PyTypeObject*>_Reading or PyTuple_GET_SIZE(reading) != FIELDS:
            raise _Unsupported()
        grow = _reading_bytes(reading)
        if chunk and (PyList_GET_SIZE(chunk) >= limit or size + grow > max_bytes):
            _emit(sensor_id, tags, start, chunk, limit, size, max_bytes, acc, sources, ops,
                  carried)
            chunk = []
            size = 0
        chunk.append(reading)
        size += grow
    if chunk:
        _emit(sensor_id, tags, start, chunk, limit, size, max_bytes, acc, sources, ops,
              carried)
    return 0


cdef int _emit(object sensor_id, object tags, object start, list chunk, long long limit,
               Py_ssize_t size, long long max_bytes, _Acc acc, object sources, list ops,
               list carried) except -1:
    ops.append(_update_for(sensor_id, tags, start, chunk, limit, size, max_bytes, acc))
    if sources is None:
        carried.append(chunk)
    else:
        carried.append([o for reading in chunk for o in sources[id(reading)]])
    return 0


cdef object _plan(object readings, object span_arg, object limit_arg):
    """bucket.plan_buckets_py."""
    if not PyList_CheckExact(readings):
        raise _Unsupported()
    cdef long long span = _as_ll(span_arg)
    cdef long long limit = _as_ll(limit_arg)
    cdef long long max_bytes = _as_ll(_bucket.MAX_BUCKET_BYTES)
    if not 0 < span < SPAN_LIMIT:
        raise _Unsupported()
    cdef list ops = []
    cdef list carried = []
    cdef object plan = _Plan(ops, carried)
    cdef _Acc acc = _Acc()
    cdef list order = _group(<list>readings, <double>span)
    cdef _Group group
    cdef object tags_of, tags, start, op
    for group in order:
        tags_of = group.tags_of
        start = _date(<long long>group.start * 1000)
        tags = dict(tags_of) if tags_of else _EMPTY
        op = _fast_update(group.sensor_id, tags, start, group.readings, limit, max_bytes, acc)
        if op is not None:
            ops.append(op)
            carried.append(group.readings)
            continue
        _general(group.sensor_id, tags, start, group.readings, limit, max_bytes, acc, plan,
                 ops, carried)
    return plan
