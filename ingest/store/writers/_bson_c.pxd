# The BSON writer kernel (_bson_c.pyx), for the compiled Python that cimports it.
cimport cython

cdef enum:
    # What writing a part of a document gives: done, or "not sure" (the caller then
    # abandons the document and leaves its dict to the driver).
    WRITTEN = 0
    NOT_SURE = 1
    # Documents open at once (a document, its sub-documents, theirs ...).
    MAX_DEPTH = 8


cdef struct Item:
    void *key  # borrowed, while the mapping is not changed
    void *value


@cython.final
cdef class Writer:
    cdef char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef Py_ssize_t depth
    cdef Py_ssize_t opened[MAX_DEPTH]
    cdef Item *items_of
    cdef Py_ssize_t items_room
    cdef readonly object options

    cdef int start(self) except -1
    cdef int object_id(self, str name, bytes prefix, Py_ssize_t counter) except -1
    cdef int date(self, str name, object ms) except -1
    cdef int value(self, str name, object value) except -1
    cdef int items(self, object mapping, bint by_name, frozenset skip) except -1
    cdef int open(self, str name) except -1
    cdef int open_array(self, str name) except -1
    cdef int _open(self, int kind, str name) except -1
    cdef int close(self) except -1
    cdef object finish(self)
    cdef int _grow(self, Py_ssize_t extra) except -1
    cdef int _element(self, int kind, object name, Py_ssize_t extra) except -1
    cdef int _value(self, object name, object value) except -1
