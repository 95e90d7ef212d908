# Types of ingest/store/writers/_bucket_py.py, compiled as _bucket_c (setup.py).
cimport cython

from ingest.store.writers cimport _bson_c

from ingest._capi cimport checked_tuple as _fields
from ingest._capi cimport float_floordiv as _floordiv, new_with_slot, slot_offset
from ingest._capi cimport equal as _eq, greater as _gt, less as _lt, less_equal as _le

cdef Py_ssize_t SENSOR_ID, EPOCH, VALUES, SEQ, MS, TAGS, UNITS, INFO
cdef Py_ssize_t _MS_SLOT
cdef double _NAN
# Typed globals: a plain module global is a dict lookup at each use (Python 3.12+, where
# Cython's cache of the module dict's version is off), and these are read per group or date.
cdef object _DATE, NO_TAGS, BUCKET_INDEX, SCHEMA_VERSION
cdef dict _EMPTY
cdef dict _STAT_KEYS
cdef _bson_c.Writer _WRITER
cdef tuple _INDEX
cdef frozenset _PUSHED_OWN
cdef Py_ssize_t _S_START, _S_NIN, _S_TS, _S_SEQ, _S_FIRST, _S_LAST, _S_VALUES
cdef _bson_c.Templates _TEMPLATES
cdef tuple _CAPS


cpdef object ts_key(object ts)

cpdef object bson_date(object ms)

@cython.locals(out=list)
cpdef list bson_dates(object readings)

@cython.locals(row=tuple)
cpdef object ms_of(object reading)

@cython.locals(row=tuple, size=Py_ssize_t)
cpdef Py_ssize_t reading_bytes(object reading) except -1

@cython.locals(size=Py_ssize_t)
cdef Py_ssize_t _labels_bytes(object labels) except -1

@cython.locals(out=dict)
cpdef dict stat_values(object values)

@cython.locals(row=tuple, groups=list, keys=dict, latest=dict, earlier=dict, mine=tuple,
               found=tuple, group=list, fast=bint, seconds=double, at=double, last_at=double)
cpdef list group_readings(object readings, object span)

cpdef tuple unique_readings(object group, object plan)

cpdef dict reading_doc(object reading)

@cython.locals(row=tuple, dates=list, pushed=list, date=object)
cdef tuple _entries(list readings)

@cython.locals(out=list, chunk=list, grow=Py_ssize_t, size=Py_ssize_t)
cpdef list chunks(object group, object max_readings, object max_bytes=*)

cpdef tuple _stat_keys(object name)

@cython.locals(dates=list, pushed=list, inc=dict, mins=dict, maxs=dict, labels=dict)
cpdef dict update_for(object sensor_id, object tags, object start, list chunk,
                      object max_readings, object size, object max_bytes=*)

@cython.locals(inc=dict, mins=dict, maxs=dict, labels=dict, update=dict)
cpdef dict statement(object sensor_id, object tags, object start, list dates,
                     list pushed, object size, object max_readings, tuple stats,
                     object max_bytes=*)

@cython.final
cdef class _Stat:
    cdef object name
    cdef Py_ssize_t count
    cdef double total
    cdef object low, high


@cython.locals(stat=_Stat)
cdef _Stat _first_stat(object name, object value)

@cython.locals(row=tuple, acc=dict, order=list, stat=_Stat, i=Py_ssize_t, known=Py_ssize_t)
cdef list _by_reading(list group, dict labels=*)

cdef object _one_update(object sensor_id, object tags, object start, object reading,
                        object max_readings, object max_bytes)

@cython.locals(row=tuple, count=Py_ssize_t, stamps=list, dates=list, pushed=list,
               size=Py_ssize_t, values=dict, stats=list, ordered=bint, stat=_Stat,
               inc=dict, mins=dict, maxs=dict)
cdef object _fast_update(object sensor_id, object tags, object start, list group,
                         object max_readings, object max_bytes)

cdef object _group_statement(object sensor_id, object tags, object start, list group,
                             object size, object max_readings, object max_bytes, list stats,
                             tuple bounds)

@cython.locals(row=tuple, i=Py_ssize_t)
cdef int _raw_start(_bson_c.Writer writer, object sensor_id, object tags, object start,
                    list group, object size, object max_readings, object max_bytes) except -1

cdef object _raw_end(_bson_c.Writer writer, bint measured, dict labels=*)

@cython.locals(i=Py_ssize_t)
cdef int _raw_single_stats(_bson_c.Writer writer, dict values, object size, object ms) except -1

@cython.locals(i=Py_ssize_t)
cdef int _raw_values(_bson_c.Writer writer, str field, str date, object ms, dict values,
                     Py_ssize_t key) except -1

@cython.locals(row=tuple, values=dict, shape=cython.longlong, template=_bson_c.Template,
               caps=tuple)
cdef object _templated(object sensor_id, object tags, object start, object reading,
                       object size, object max_readings, object max_bytes)

@cython.locals(slot=Py_ssize_t)
cdef object _filled_in(_bson_c.Template template, object sensor_id, object start, object ms,
                       object seq, dict values)

@cython.locals(stat=_Stat)
cdef int _raw_group_stats(_bson_c.Writer writer, list stats, object count, object size,
                          tuple bounds) except -1

@cython.locals(stat=_Stat)
cdef int _raw_bounds(_bson_c.Writer writer, str field, str date, object ms, list stats,
                     bint high) except -1

@cython.locals(row=tuple, measured=dict, labels=dict)
cdef object _single_raw(_bson_c.Writer writer, object sensor_id, object tags, object start,
                        object reading, object size, object max_readings, object max_bytes)

cdef object _label(object reading, dict labels)

@cython.locals(row=tuple, inc=dict, mins=dict, maxs=dict, labels=dict, keys=tuple)
cpdef tuple _single(object reading, object size)

@cython.locals(labels=dict, stats=list)
cdef tuple _coalesced(list chunk, object size)

@cython.locals(inc=dict, mins=dict, maxs=dict, keys_of=dict, keys=tuple, stat=_Stat)
cdef tuple _statistics(list stats, object count, object size, object first, object last)

@cython.locals(ops=list, groups=list, last_start=object, start_dt=object)
cpdef object plan_buckets(object readings, object span, object max_readings, object max_bytes=*)
