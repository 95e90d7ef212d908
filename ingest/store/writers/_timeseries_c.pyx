# cython: language_level=3
"""Compiled twin of ingest/store/writers/timeseries.py: ``batch_documents`` (twin of
``batch_documents_py``), ``reading_document`` (``reading_document_py``) and
``sorted_readings`` (``sorted_readings_py``).

The same documents (dicts, key order, value types, ``meta`` shared by a sensor's
documents), the same ``_id`` bytes for the same prefix and counter, the same runs and the
same exceptions. Readings that are exactly ``Reading`` are read by index; anything else
through its attributes, as the Python twin does. Values dicts whose names are all exactly
``str`` are ordered here; any other names take the Python twin's steps.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem, PyDict_Size, PyDict_Update
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
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
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

from operator import attrgetter

from bson.objectid import ObjectId

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
                || member->offset + (Py_ssize_t)sizeof(PyObject *) > ((PyTypeObject *)cls)->tp_basicsize)
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


def batch_documents(readings, prefix, start):
    """The documents of ``readings`` (sorted by sensor and time), each sensor's run of
    times and whether two of one sensor share a millisecond (see batch_documents_py)."""
    cdef Py_ssize_t n = len(readings), i, j, k, begin
    if type(prefix) is not bytes or type(start) is not int:
        raise TypeError(f"an ObjectId prefix and counter are bytes and int, not "
                        f"{type(prefix).__name__} and {type(start).__name__}")
    if PyBytes_GET_SIZE(prefix) != 9:
        raise ValueError(f"an ObjectId prefix is 9 bytes, not {PyBytes_GET_SIZE(prefix)}")
    cdef list rows = readings if type(readings) is list else list(readings)
    cdef unsigned long counter = start & 0xFFFFFF
    cdef list dates = [], stamps = [], docs = [], runs = []
    cdef dict metas = {}, doc
    cdef object reading, ms, oid, sensor, meta, values, seq, order, prev_sensor = None
    cdef object prev_meta = None
    cdef bytes raw
    cdef char *buf
    cdef PyObject *key
    cdef PyObject *value
    cdef PyObject *last
    cdef bint fast
    cdef Py_ssize_t count
    cdef PyObject *names[MAX_NAMES]
    cdef PyObject *items[MAX_NAMES]

    for i in range(n):  # the times first, as bson_dates
        reading = rows[i]
        ms = _field(reading, MS, "ms")
        if ms is None:
            ms = _ts_key(getattr(reading, "ts"))
        stamps.append(ms)
        dates.append(_new_with(_BsonDate, _MS_SLOT, "ms", ms))

    for i in range(n):
        reading = rows[i]
        raw = PyBytes_FromStringAndSize(NULL, 12)
        buf = PyBytes_AS_STRING(raw)
        memcpy(buf, PyBytes_AS_STRING(prefix), 9)
        buf[9] = <char>((counter >> 16) & 0xFF)
        buf[10] = <char>((counter >> 8) & 0xFF)
        buf[11] = <char>(counter & 0xFF)
        counter = (counter + 1) & 0xFFFFFF
        oid = _new_with(_ObjectId, _ID_SLOT, "_ObjectId__id", raw)

        if (_field(reading, TAGS, "tags") or _field(reading, UNITS, "units") is not None
                or _field(reading, INFO, "info") is not None):
            doc = {"_id": oid}
            PyDict_Update(doc, _reading_document(reading))
            docs.append(doc)
            continue

        sensor = _field(reading, SENSOR_ID, "sensor_id")
        if prev_meta is not None and sensor is prev_sensor:
            meta = prev_meta
        else:
            meta = metas.get(sensor)
            if meta is None:
                meta = {"sensor_id": sensor}
                metas[sensor] = meta
            prev_sensor, prev_meta = sensor, meta

        values = _field(reading, VALUES, "values")
        # The names in name order, with their values: sorted here when they are all
        # exactly str (at most MAX_NAMES), else by the Python twin's steps.
        fast = type(values) is dict and PyDict_Size(values) <= MAX_NAMES
        count = 0
        if fast:
            j = 0
            while PyDict_Next(values, &j, &key, &value):
                if not PyUnicode_CheckExact(<object>key):
                    fast = False
                    break
                k = count
                while k > 0 and PyUnicode_Compare(<object>names[k - 1], <object>key) > 0:
                    names[k] = names[k - 1]
                    items[k] = items[k - 1]
                    k -= 1
                names[k] = key
                items[k] = value
                count += 1
        order = None
        if not fast:
            count = 0
            order = _sorted_names(tuple(values))

        seq = _field(reading, SEQ, "seq")
        doc = tsc_dict(4 + count)
        doc["_id"] = oid
        doc["ts"] = <object>PyList_GET_ITEM(dates, i)
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
        docs.append(doc)

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
    cdef Py_ssize_t n = len(rows), i, g, k, begin, end, distinct
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
