# The C types of _acks_py.py, compiled as ingest.mqtt._acks_c (see setup.py): the ledger
# is an extension type, its state C fields and its helpers C calls. Packet ids stay
# Python ints (dict keys: a C integer would be boxed again at every lookup).
cimport cython

from ingest cimport _capi

cdef Py_ssize_t MIDS, RING, _TOPIC, _PAYLOAD, _MID, _QOS, _GENERATION, _DUP


@cython.final
cdef class _Remembered:
    cdef long long[::1] _ticket, _on, _seq, _size, _hash
    cdef unsigned short[::1] _ring
    cdef list _topic
    cdef Py_ssize_t _head, _tail, _mask
    cdef public Py_ssize_t count

    @cython.locals(ticket="long long[::1]", ring="unsigned short[::1]", topics=list,
                   ons="long long[::1]", seqs="long long[::1]", sizes="long long[::1]",
                   hashes="long long[::1]", count=Py_ssize_t, tail=Py_ssize_t,
                   mask=Py_ssize_t, at=Py_ssize_t, fields=tuple)
    cdef put(self, list messages, long long on, long long seq)

    @cython.locals(at=Py_ssize_t)
    cdef drop(self, object mid)

    @cython.locals(at=Py_ssize_t)
    cdef bint matches(self, object mid, object topic, object payload) except -1

    @cython.locals(at=Py_ssize_t, on=cython.longlong)
    cdef forget_certain(self, long long fresh_on, long long received_on, long long proven)

    @cython.locals(at=Py_ssize_t)
    cdef bound(self, Py_ssize_t limit)
    cdef inline _forget(self, Py_ssize_t at)

    @cython.locals(at=Py_ssize_t, position=Py_ssize_t)
    cpdef list mids(self)

    @cython.locals(at=Py_ssize_t, position=Py_ssize_t)
    cdef _compact(self)


@cython.locals(at=Py_ssize_t)
cdef Py_ssize_t _slot(object mid) except -1


@cython.final
cdef class AckLedger:
    cdef Py_ssize_t _window
    cdef object _send
    cdef object _generation
    cdef bint _open
    cdef dict _unacked
    cdef object _line
    cdef object _line_of
    cdef _Remembered _acked
    cdef readonly Py_ssize_t _received
    cdef object _received_on
    cdef object _fresh_on
    cdef public Py_ssize_t reused, adopted, reacked, acked_late
    cdef set _forgotten

    @cython.locals(fields=tuple)
    cpdef bint arrived(self, object message) except -1
    cdef object _line_for(self, object generation)
    cdef object _resent(self, object generation)
    cdef object _drop_before(self, object generation)
    cdef object _queue(self, object message)
    cdef bint _redelivered(self, object message) except -1
    cdef bint _reacked(self, object message) except -1

    @cython.locals(unacked=dict, usual=bint, done=Py_ssize_t, now=list, waiting=bint,
                   fast=Py_ssize_t, fields=tuple)
    cpdef Py_ssize_t written(self, list messages) except -1
    cdef bint _mark_written(self, object message) except -1
    cdef Py_ssize_t _flush(self) except -1

    @cython.locals(first=Py_ssize_t)
    cdef Py_ssize_t _due(self, list due) except -1

    @cython.locals(seq=Py_ssize_t)
    cdef object _remember(self, list messages)
    cdef object _forget_acked(self)
    cdef object _record(self, object mid, Py_ssize_t at, object entry)
    cdef object _settle(self, object mid, object held)
