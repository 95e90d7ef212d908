# The BSON writer kernel (_bson_c.pyx), for the compiled Python that cimports it.
cimport cython

cdef enum:
    # What writing a part of a document gives: done, or "not sure" (the caller then
    # abandons the document and leaves its dict to the driver).
    WRITTEN = 0
    NOT_SURE = 1
    # Documents open at once (a document, its sub-documents, theirs ...).
    MAX_DEPTH = 8
    # Slots a Template fills (see Writer.mark).
    MAX_SLOTS = 256


cdef struct Item:
    void *key  # borrowed, while the mapping is not changed
    void *value


cdef class Template

# What Writer.value writes a value as: 1 double, 2 bool, 3 int32, 4 int64; 0 otherwise.
cdef int kind_of(object value) except -1
# The types of ``first`` (None: none) and of a dict's values, as one code; -1 if not numbers.
cdef long long shape_of(dict values, object first) except -2


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
    # Where the value of the element written last begins, and its type (see mark).
    cdef Py_ssize_t value_at
    cdef char value_kind
    # Recording (see mark): each slot's value offset (-1: not marked) and type; the
    # string slot's offset and the length prefixes of the documents around it.
    cdef public bint recording
    cdef Py_ssize_t slot_at[MAX_SLOTS]
    cdef char slot_kind[MAX_SLOTS]
    cdef Py_ssize_t slots
    cdef Py_ssize_t text_at
    cdef Py_ssize_t text_depth
    cdef Py_ssize_t text_opened[MAX_DEPTH]

    cdef int start(self) except -1
    cdef int object_id(self, str name, bytes prefix, Py_ssize_t counter) except -1
    cdef int date(self, str name, object ms) except -1
    cdef int value(self, str name, object value) except -1
    cdef int items(self, object mapping, bint by_name, frozenset skip,
                   Py_ssize_t slot=*, Py_ssize_t stride=*) except -1
    cdef int mark(self, Py_ssize_t slot) except -1
    cdef int mark_text(self) except -1
    cdef Template template(self, object document)
    cdef int open(self, str name) except -1
    cdef int open_array(self, str name) except -1
    cdef int _open(self, int kind, str name) except -1
    cdef int close(self) except -1
    cdef object finish(self)
    cdef int _grow(self, Py_ssize_t extra) except -1
    cdef int _element(self, int kind, object name, Py_ssize_t extra) except -1
    cdef int _value(self, object name, object value) except -1


@cython.final
cdef class Template:
    cdef bytes raw
    cdef Py_ssize_t slot_at[MAX_SLOTS]
    cdef char slot_kind[MAX_SLOTS]
    cdef Py_ssize_t slots
    cdef Py_ssize_t text_at, text_size
    cdef Py_ssize_t text_depth
    cdef Py_ssize_t text_opened[MAX_DEPTH]
    cdef object options
    cdef object out
    cdef char *data
    cdef Py_ssize_t shift
    cdef char filled[MAX_SLOTS]
    cdef Py_ssize_t marked, unfilled
    cdef public tuple names
    cdef public long long shape
    cdef public object key

    cdef bint fits(self, dict values, long long shape, object key) except -1
    cdef int begin(self, object text) except -1
    cdef int date(self, Py_ssize_t slot, object ms) except -1
    cdef int value(self, Py_ssize_t slot, object value) except -1
    cdef int real(self, Py_ssize_t slot, double value) except -1
    cdef char *_at(self, Py_ssize_t slot, char kind) noexcept
    cdef object finish(self)


@cython.final
cdef class Templates:
    cdef dict by_shape
    cdef Template last
    cdef Py_ssize_t held, limit
    cdef public Py_ssize_t filled

    cdef Template find(self, dict values, long long shape, object key)
    cdef Template record(self, Writer writer, object document, dict values, long long shape,
                         object key)
