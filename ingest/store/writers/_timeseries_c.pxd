# Types of ingest/store/writers/_timeseries_py.py, compiled as _timeseries_c (setup.py).
cimport cython

from ingest cimport _capi
from ingest.store.writers cimport _bson_c

cdef Py_ssize_t _DATE_MS_SLOT, _SENSOR_ID, _EPOCH, _MS, _TAGS, _VALUES
cdef frozenset _OWN, _META_OWN
cdef dict _SORTED
cdef _bson_c.Writer _WRITER
cdef object _new, _NOTHING, _TIME
cdef tuple _INDEX


cpdef dict reading_document(object reading)


@cython.locals(by_sensor=dict, run=list, found=list, out=list)
cpdef list sorted_readings(object readings)


@cython.locals(k=Py_ssize_t)
cdef bint _in_time_order(list run) except -1


@cython.locals(
    count=Py_ssize_t,
    i=Py_ssize_t,
    counter=Py_ssize_t,
    begin=Py_ssize_t,
    collided=bint,
    writer=_bson_c.Writer,
    docs=list,
    metas=dict,
    dates=list,
    runs=list,
    row=tuple,
    mapped=bint,
)
cpdef tuple batch_documents(object readings, object prefix, object start)


cdef dict _plain_document(object oid, object date, object sensor, object seq, object values,
                          dict metas)


cdef object _plain_raw(
    _bson_c.Writer writer, Py_ssize_t counter, object sensor, object ms, object seq,
    object values, bytes prefix,
)


cdef object _mapped_raw(
    _bson_c.Writer writer, Py_ssize_t counter, object reading, object when, object ms,
    bytes prefix,
)


cpdef str claim_id(object instant)


cdef str _usual_claim_id(object ms, object sensor)


cpdef list claim_ids(list readings, object other)


@cython.locals(i=Py_ssize_t, writer=_bson_c.Writer, docs=list)
cpdef list claim_documents(object ids, object readings, object at, object owner)


cdef object _claim_raw(_bson_c.Writer writer, str key, object at, object owner, object values)


@cython.locals(writer=_bson_c.Writer, clauses=list)
cpdef list lookup_clauses(object runs)


@cython.locals(count=Py_ssize_t)
cdef object _clause_raw(_bson_c.Writer writer, object sensor, list times)


@cython.locals(k=Py_ssize_t)
cdef int _times_raw(_bson_c.Writer writer, list times, Py_ssize_t count) except -1
