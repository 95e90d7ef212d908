# The C types of _wire_py.py, compiled as ingest.mqtt._wire_c (see setup.py). Indices and
# lengths are C integers: each is within the buffer, or checked before it is converted.
# The helpers take the buffer as a pointer to its bytes (the caller holds the bytes
# object): data[i] is then a byte, and data[a:b] one copy, as for the bytes in Python.
cimport cython

cdef int PUBLISH, PUBACK, SUBSCRIPTION_IDENTIFIER


@cython.locals(buffer=bytes, pos=Py_ssize_t, size=Py_ssize_t, handled=Py_ssize_t, command=int,
               length=Py_ssize_t, at=Py_ssize_t, stop=Py_ssize_t)
cpdef Py_ssize_t scan(object data, object reader, object deliver) except -1


@cython.locals(buffer=bytes, size=Py_ssize_t, command=int, length=Py_ssize_t, at=Py_ssize_t)
cpdef bint cut_publish(object data, Py_ssize_t pos, Py_ssize_t limit) except -1


cdef bytes _read_buffer(object data)


@cython.locals(topic_end=Py_ssize_t, end=Py_ssize_t, block=Py_ssize_t, length=Py_ssize_t,
               mid=long)
cdef int _deliver_publish(object deliver, int command, const unsigned char *data, Py_ssize_t at,
                          Py_ssize_t stop) except -1


@cython.locals(value=Py_ssize_t, shift=int, byte=int)
cdef (Py_ssize_t, Py_ssize_t) _varint(const unsigned char *data, Py_ssize_t pos,
                                      Py_ssize_t end) noexcept


cdef object _subscription(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end)


@cython.locals(ident=int, value=Py_ssize_t, found=object)
cdef object _read_subscription(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end)


cdef Py_ssize_t _skip_strings(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end, int count)


@cython.locals(out=bytearray, at=Py_ssize_t, value=int)
cpdef bytes pubacks(object mids)
