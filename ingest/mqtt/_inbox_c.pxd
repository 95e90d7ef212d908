# The C types of _inbox_py.py, compiled as ingest.mqtt._inbox_c (see setup.py): the inbox
# and the receiver are extension types, so the delivery of a message calls the inbox's
# put in C, and their state is C fields.
cimport cython

from ingest cimport _capi

cdef object _now, _new_tuple
cdef Py_ssize_t INBOX_SHARE, INBOX_MESSAGE_BYTES, _TOPIC, _PAYLOAD


cdef Py_ssize_t _size(object message) except -1


@cython.final
cdef class Inbox:
    cdef public object generation
    cdef public object messages
    cdef public Py_ssize_t bytes
    cdef public object wake
    cdef public object current
    cdef public object reader
    cdef public bint identified
    cdef object _metrics, _health
    cdef Py_ssize_t _limit, _limit_bytes
    cdef double _paused_since

    @cython.locals(size=Py_ssize_t, count=Py_ssize_t)
    cpdef put(self, object message)
    cdef _pause(self, object reader)
    cpdef object take(self)

    @cython.locals(taken=Py_ssize_t)
    cpdef object drain(self, object take_now, Py_ssize_t limit)
    cdef _unpaused(self)


@cython.final
cdef class Receiver:
    cdef public Inbox inbox
    cdef object _arrived, _wanted, _unwanted, _generation
