# The C types of _batcher_py.py, compiled as ingest.pipeline._batcher_c (see setup.py): the
# batch, the batcher and the intake are extension types, their counts C fields, so a
# message of the default format goes from the source into the open batch in C calls.
cimport cython

from ingest._capi cimport checked_tuple as _fields

cdef Py_ssize_t _TOPIC, _PAYLOAD, _RECEIVED_AT, _DUP, _RETAINED, _VALUES
# (The module's own: ingest/pipeline/batcher.py gives the package those of _batcher_py.)
cdef Py_ssize_t MESSAGE_BYTES, READING_BYTES, VALUE_BYTES, REJECT_DOC_BYTES
cdef list _NOTHING, NO_DOCS


@cython.final
cdef class Batch:
    cdef public Py_ssize_t number
    cdef public double opened_at
    cdef public list messages, readings, rejects, ends, deliveries, given
    cdef public Py_ssize_t held_bytes


@cython.final
cdef class Batcher:
    cdef Py_ssize_t _max
    cdef double _linger
    cdef object _clock
    cdef public Batch current
    cdef Py_ssize_t _numbers

    @cython.locals(batch=Batch)
    cpdef Batch add(self, object message, list readings, list rejects,
                    Py_ssize_t held_bytes=*, list given=*)


@cython.final
cdef class Intake:
    cdef public Batcher batcher
    cdef public Py_ssize_t max_buffered, max_held_bytes
    cdef public bint usual, stateful, closed
    cdef public Py_ssize_t buffered, held_bytes, received, received_bytes, accepted
    cdef object _limits, _decode, _arrivals, _take, _reject, _reject_docs, _dispatch
    cdef object _opened
    cdef list _given

    cpdef bint full(self) except -1

    @cython.locals(row=tuple, parts=tuple)
    cpdef object take_now(self, object message)

    @cython.locals(row=tuple, first=tuple, values=dict, count=Py_ssize_t, size=Py_ssize_t,
                   docs=list, batcher=Batcher, had_open=bint, full=Batch)
    cpdef Batch put(self, object message, list readings, list rejections)
