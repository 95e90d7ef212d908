# cython: language_level=3
"""The BSON writer kernel: a document's bytes, written as pymongo's encoder writes them.

The compiled Python that decides a document (which fields, in which order, from what)
hands its parts to a :class:`Writer` one at a time: ``start``, then elements (``object_id``,
``date``, ``value``, ``items`` of a dict, ``open``/``close`` of a sub-document,
``open_array``/``close`` of an array, whose elements the caller names "0", "1", ...), then
``finish``, which gives the document as a ``RawBSONDocument`` the driver sends as it is.
Each part answers ``WRITTEN``, or ``NOT_SURE`` for anything it cannot write exactly as
``bson.encode`` of the equivalent dict would: a value other than exactly ``bool``,
``int`` (int32 when it fits, else int64; beyond: not sure), ``float``, ``str`` (valid
UTF-8) or None; a name not exactly ``str``, not UTF-8, with a NUL, or one the caller
says is written already. The caller then drops the document and builds its dict, which
the driver encodes or refuses. The kernel knows BSON, not what a document means.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_Size
from cpython.exc cimport PyErr_Clear, PyErr_ExceptionMatches
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.object cimport PyObject
from cpython.unicode cimport (
    PyUnicode_CheckExact,
    PyUnicode_Compare,
    PyUnicode_DATA,
    PyUnicode_GET_LENGTH,
)
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, qsort, realloc
from libc.string cimport memchr, memcpy, memset

from bson.raw_bson import RawBSONDocument

from ingest._capi cimport new_object, set_slot, slot_offset

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object text)  # public: an ASCII str's data is its UTF-8
    # Declared without Cython's exception check: a failure (a lone surrogate) is cleared
    # and the part is NOT_SURE.
    const char *_utf8_of "PyUnicode_AsUTF8AndSize"(object text, Py_ssize_t *size)

cdef enum:
    # BSON element types
    T_DOUBLE = 0x01
    T_STRING = 0x02
    T_DOCUMENT = 0x03
    T_ARRAY = 0x04
    T_OBJECT_ID = 0x07
    T_BOOL = 0x08
    T_DATE = 0x09
    T_NULL = 0x0A
    T_INT32 = 0x10
    T_INT64 = 0x12
    # Items sorted by insertion up to this many; more by qsort.
    FEW_ITEMS = 16

class SentRaw(RawBSONDocument):
    """A RawBSONDocument whose bytes are also a plain slot, ``raw``.

    The driver reads ``raw`` of every document it sends; RawBSONDocument's is a Python
    property, a call per document, where a slot is read in C: ``bson.encode`` of a list
    of 10,000 time-series documents took about 30 ns a document less (``time.perf_counter``
    around 20 encodes each way). Time-series mode sends two a reading, its document and
    its claim.
    """

    __slots__ = ("raw",)


cdef object _RawBSONDocument = RawBSONDocument
cdef object _SentRaw = SentRaw
cdef Py_ssize_t _RAW = slot_offset(SentRaw, "_RawBSONDocument__raw")
cdef Py_ssize_t _INFLATED = slot_offset(SentRaw, "_RawBSONDocument__inflated_doc")
cdef Py_ssize_t _OPTIONS = slot_offset(SentRaw, "_RawBSONDocument__codec_options")
cdef Py_ssize_t _SENT = slot_offset(SentRaw, "raw")
cdef bint _BY_SLOTS = _RAW > 0 and _INFLATED > 0 and _OPTIONS > 0 and _SENT > 0


cdef inline void _le32(char *at, uint32_t v) noexcept:
    at[0] = <char>(v & 0xFF)
    at[1] = <char>((v >> 8) & 0xFF)
    at[2] = <char>((v >> 16) & 0xFF)
    at[3] = <char>((v >> 24) & 0xFF)


cdef inline void _le64(char *at, uint64_t v) noexcept:
    _le32(at, <uint32_t>v)  # the low 32 bits (C's conversion to unsigned)
    _le32(at + 4, <uint32_t>(v >> 32))


cdef inline int _number(object value, uint64_t *bits) noexcept:
    """The BSON type a number is written as (T_BOOL, T_INT32 when it fits, else T_INT64,
    T_DOUBLE), its bits in ``bits``; 0 for anything else (an int beyond int64 included,
    which the driver refuses). One answer for the writer, templates and shapes."""
    cdef long long number
    cdef int overflow = 0
    cdef double real
    if value is True or value is False:
        bits[0] = 1 if value is True else 0
        return T_BOOL
    if PyLong_CheckExact(value):
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return 0
        bits[0] = <uint64_t>number
        return T_INT32 if -2147483648 <= number <= 2147483647 else T_INT64
    if PyFloat_CheckExact(value):
        real = PyFloat_AS_DOUBLE(value)
        memcpy(bits, &real, 8)  # the double's bits as they are: NaN's and -0.0's too
        return T_DOUBLE
    return 0


cdef inline bint _int64(object ms, long long *stamp) noexcept:
    """Whether ``ms`` is exactly an int within int64 (a date's milliseconds), in ``stamp``."""
    cdef int overflow = 0
    if not PyLong_CheckExact(ms):
        return False
    stamp[0] = PyLong_AsLongLongAndOverflow(ms, &overflow)
    return not overflow


cdef inline Py_ssize_t _width(int kind) noexcept:
    """The bytes of a number of BSON type ``kind`` (of :func:`_number`)."""
    return 1 if kind == T_BOOL else 4 if kind == T_INT32 else 8


cdef inline void _put(char *at, int kind, uint64_t bits) noexcept:
    """A number's bytes (:func:`_number`'s type and bits), little-endian."""
    if kind == T_BOOL:
        at[0] = <char>bits
    elif kind == T_INT32:
        _le32(at, <uint32_t>bits)  # the low 32 bits of the int
    else:
        _le64(at, bits)


cdef int _text(object text, const char **out, Py_ssize_t *size) except -1:
    """``text``'s UTF-8 bytes, or NOT_SURE when it is not exactly ``str`` or not UTF-8."""
    cdef const char *data
    if not PyUnicode_CheckExact(text):
        return NOT_SURE
    if PyUnicode_IS_COMPACT_ASCII(text):  # its characters are its UTF-8 bytes
        out[0] = <const char *>PyUnicode_DATA(text)
        size[0] = PyUnicode_GET_LENGTH(text)
        return WRITTEN
    data = _utf8_of(text, size)
    if data == NULL:
        if not PyErr_ExceptionMatches(UnicodeEncodeError):
            return -1  # MemoryError: raised
        PyErr_Clear()
        return NOT_SURE
    out[0] = data
    return WRITTEN


cdef extern from "Python.h":
    # For qsort, which runs while this thread holds the GIL; the names are exactly str,
    # whose comparison cannot fail.
    int _compare "PyUnicode_Compare"(PyObject *a, PyObject *b) nogil


cdef int _by_name(const void *a, const void *b) noexcept nogil:
    return _compare(<PyObject *>(<Item *>a).key, <PyObject *>(<Item *>b).key)


cdef class Writer:
    """Writes one document at a time (see the module docstring); reused between them.

    ``options``: the ``CodecOptions`` of the ``RawBSONDocument``s it gives (how they
    decode when read); their ``document_class`` must be ``RawBSONDocument``.
    """

    def __init__(self, options):
        _RawBSONDocument(b"\x05\x00\x00\x00\x00", options)  # refuses options it does not take
        self.options = options

    def __dealloc__(self):
        free(self.data)
        free(self.items_of)

    cdef int _grow(self, Py_ssize_t extra) except -1:
        """Room for ``extra`` more bytes."""
        cdef Py_ssize_t capacity
        cdef char *data
        if extra <= self.capacity - self.size:
            return 0
        if extra > 0x7FFFFFFF:  # beyond any BSON document: never finished (see finish)
            raise MemoryError()
        capacity = self.capacity * 2 if self.capacity else 512
        while capacity - self.size < extra:
            capacity *= 2
        data = <char *>realloc(self.data, capacity)
        if data == NULL:
            raise MemoryError()
        self.data, self.capacity = data, capacity
        return 0

    cdef int _element(self, int kind, object name, Py_ssize_t extra) except -1:
        """An element's type byte and name, and room for ``extra`` bytes of its value."""
        cdef const char *text
        cdef Py_ssize_t size
        if _text(name, &text, &size) == NOT_SURE or memchr(text, 0, size) != NULL:
            return NOT_SURE
        self._grow(size + 2 + extra)
        self.data[self.size] = <char>kind
        memcpy(self.data + self.size + 1, text, size)
        self.data[self.size + 1 + size] = 0
        self.size += size + 2
        self.value_at = self.size
        self.value_kind = <char>kind
        return WRITTEN

    cdef int start(self) except -1:
        """A new document (the one before, finished or not, is dropped)."""
        cdef Py_ssize_t i
        if self.recording:
            for i in range(MAX_SLOTS):
                self.slot_at[i] = -1
            self.slots = 0
            self.text_at = -1
        self.size = 0
        self.depth = 0
        self._grow(4)
        self.opened[0] = 0
        self.depth = 1
        self.size = 4
        return WRITTEN

    cdef int object_id(self, str name, bytes prefix, Py_ssize_t counter) except -1:
        """An ObjectId: ``prefix`` (9 bytes), then ``counter``'s low 3 bytes, big-endian."""
        if prefix is None or PyBytes_GET_SIZE(prefix) != 9:
            return NOT_SURE
        if self._element(T_OBJECT_ID, name, 12) == NOT_SURE:
            return NOT_SURE
        memcpy(self.data + self.size, PyBytes_AS_STRING(prefix), 9)
        self.data[self.size + 9] = <char>((counter >> 16) & 0xFF)
        self.data[self.size + 10] = <char>((counter >> 8) & 0xFF)
        self.data[self.size + 11] = <char>(counter & 0xFF)
        self.size += 12
        return WRITTEN

    cdef int date(self, str name, object ms) except -1:
        """A UTC datetime of ``ms`` milliseconds since the epoch (exactly an int64)."""
        cdef long long stamp
        if not _int64(ms, &stamp) or self._element(T_DATE, name, 8) == NOT_SURE:
            return NOT_SURE
        _le64(self.data + self.size, <uint64_t>stamp)
        self.size += 8
        return WRITTEN

    cdef int value(self, str name, object value) except -1:
        """``name: value`` for a value of the types in the module docstring."""
        return self._value(name, value)

    cdef int _value(self, object name, object value) except -1:
        cdef uint64_t bits
        cdef const char *data
        cdef Py_ssize_t length
        cdef int kind = _number(value, &bits)
        if kind:
            if self._element(kind, name, _width(kind)) == NOT_SURE:
                return NOT_SURE
            _put(self.data + self.size, kind, bits)
            self.size += _width(kind)
        elif PyLong_CheckExact(value):  # beyond int64: the driver refuses it (OverflowError)
            return NOT_SURE
        elif value is None:
            return self._element(T_NULL, name, 0)
        else:
            if _text(value, &data, &length) == NOT_SURE or length >= 0x7FFFFFFF:
                return NOT_SURE
            if self._element(T_STRING, name, length + 5) == NOT_SURE:
                return NOT_SURE
            _le32(self.data + self.size, <uint32_t>(length + 1))
            memcpy(self.data + self.size + 4, data, length)
            self.data[self.size + 4 + length] = 0
            self.size += length + 5
        return WRITTEN

    cdef int items(self, object mapping, bint by_name, frozenset skip,
                   Py_ssize_t slot=-1, Py_ssize_t stride=1) except -1:
        """Each item of ``mapping`` (exactly a dict) as ``value`` writes it: in name order
        when ``by_name`` (names exactly ``str``), else in the dict's order. A name in
        ``skip`` (one written already in this document) is NOT_SURE. Recording, item k
        is marked as ``slot + k * stride`` (when ``slot`` is not negative)."""
        cdef Py_ssize_t count, j = 0, k, i
        cdef PyObject *key
        cdef PyObject *item
        cdef Item *entries
        cdef Item entry
        if type(mapping) is not dict:
            return NOT_SURE
        count = PyDict_Size(mapping)
        if count > self.items_room:
            entries = <Item *>realloc(self.items_of, count * sizeof(Item))
            if entries == NULL:
                raise MemoryError()
            self.items_of, self.items_room = entries, count
        entries = self.items_of
        k = 0
        while PyDict_Next(mapping, &j, &key, &item):
            if not PyUnicode_CheckExact(<object>key):
                return NOT_SURE
            entries[k].key = key
            entries[k].value = item
            k += 1
        if by_name:
            if count <= FEW_ITEMS:
                for k in range(1, count):
                    entry = entries[k]
                    i = k
                    while i > 0 and PyUnicode_Compare(
                            <object>entries[i - 1].key, <object>entry.key) > 0:
                        entries[i] = entries[i - 1]
                        i -= 1
                    entries[i] = entry
            else:
                qsort(entries, count, sizeof(Item), _by_name)
        # The dict is not changed meanwhile (nothing here runs Python code): the borrowed
        # names and values stay alive.
        for k in range(count):
            if skip is not None and <object>entries[k].key in skip:
                return NOT_SURE
            if self._value(<object>entries[k].key, <object>entries[k].value) == NOT_SURE:
                return NOT_SURE
            if self.recording and slot >= 0 and self.mark(slot + k * stride) == NOT_SURE:
                return NOT_SURE
        return WRITTEN

    cdef int mark(self, Py_ssize_t slot) except -1:
        """Recording: the element written last is ``slot`` of the :class:`Template` this
        document becomes (a date or a number, filled anew for each document); otherwise
        nothing."""
        if not self.recording:
            return WRITTEN
        if not 0 <= slot < MAX_SLOTS or self.value_kind == T_STRING:
            return NOT_SURE
        self.slot_at[slot] = self.value_at
        self.slot_kind[slot] = self.value_kind
        if slot >= self.slots:
            self.slots = slot + 1
        return WRITTEN

    cdef int mark_text(self) except -1:
        """Recording: the string element written last is the :class:`Template`'s text, of
        any length in each document; otherwise nothing."""
        cdef Py_ssize_t i
        if not self.recording:
            return WRITTEN
        if self.value_kind != T_STRING or self.text_at >= 0:
            return NOT_SURE
        self.text_at = self.value_at
        self.text_depth = self.depth
        for i in range(self.depth):
            self.text_opened[i] = self.opened[i]
        return WRITTEN

    cdef Template template(self, object document):
        """The document just finished (recording) as a :class:`Template`; None if no
        text was marked."""
        cdef Template made
        cdef bytes raw = document.raw
        cdef Py_ssize_t i
        if self.text_at < 0:
            return None
        made = Template.__new__(Template)
        made.raw = raw
        made.options = self.options
        made.slots = self.slots
        made.marked = 0
        for i in range(self.slots):
            made.slot_at[i] = self.slot_at[i]
            made.slot_kind[i] = self.slot_kind[i]
            made.marked += self.slot_at[i] >= 0
        made.text_at = self.text_at
        made.text_size = <Py_ssize_t>_read32(PyBytes_AS_STRING(raw) + self.text_at) - 1
        made.text_depth = self.text_depth
        for i in range(self.text_depth):
            made.text_opened[i] = self.text_opened[i]
        return made

    cdef int open(self, str name) except -1:
        """A sub-document ``name``: the elements up to its ``close`` are its own."""
        return self._open(T_DOCUMENT, name)

    cdef int open_array(self, str name) except -1:
        """An array ``name``: the elements up to its ``close`` (named "0", "1", ... by the
        caller, as BSON wants) are its items."""
        return self._open(T_ARRAY, name)

    cdef int _open(self, int kind, str name) except -1:
        if self.depth >= MAX_DEPTH or self._element(kind, name, 4) == NOT_SURE:
            return NOT_SURE
        self.opened[self.depth] = self.size
        self.depth += 1
        self.size += 4
        return WRITTEN

    cdef int close(self) except -1:
        """The end of the sub-document or array opened last."""
        cdef Py_ssize_t begin
        if self.depth <= 1:
            return NOT_SURE
        self._grow(1)
        self.data[self.size] = 0
        self.size += 1
        self.depth -= 1
        begin = self.opened[self.depth]
        _le32(self.data + begin, <uint32_t>(self.size - begin))
        return WRITTEN

    cdef object finish(self):
        """The document written, as a RawBSONDocument; None if it is not whole or too long."""
        if self.depth != 1:
            return None
        self._grow(1)
        self.data[self.size] = 0
        self.size += 1
        self.depth = 0
        if self.size > 0x7FFFFFFF:
            return None
        _le32(self.data, <uint32_t>self.size)
        return _document(PyBytes_FromStringAndSize(self.data, self.size), self.options)


cdef object _document(bytes raw, object options):
    """``raw`` as a RawBSONDocument (a :class:`SentRaw`, made without its Python-level
    ``__init__``)."""
    cdef object doc
    if not _BY_SLOTS:
        return _RawBSONDocument(raw, options)
    doc = new_object(_SentRaw)
    set_slot(doc, _RAW, raw)
    set_slot(doc, _INFLATED, None)
    set_slot(doc, _OPTIONS, options)
    set_slot(doc, _SENT, raw)
    return doc


cdef int kind_of(object value) except -1:
    """The number type :meth:`Writer.value` writes ``value`` as (:func:`_number`), as a
    code of 3 bits: 1 double, 2 bool, 3 int32, 4 int64; 0 for anything else."""
    cdef uint64_t bits
    cdef int kind = _number(value, &bits)
    if kind == T_DOUBLE:
        return 1
    if kind == T_BOOL:
        return 2
    if kind == T_INT32:
        return 3
    return 4 if kind == T_INT64 else 0


cdef long long shape_of(dict values, object first) except -2:
    """The BSON types of ``first`` (None: none) and of each of ``values`` in its order, as
    one code (3 bits each); -1 if one is not a number, or there are more than 20."""
    cdef long long shape = 0 if first is None else kind_of(first)
    cdef Py_ssize_t j = 0
    cdef PyObject *key
    cdef PyObject *item
    cdef int kind
    if PyDict_Size(values) > 20 or (first is not None and not shape):
        return -1
    while PyDict_Next(values, &j, &key, &item):
        kind = kind_of(<object>item)
        if not kind:
            return -1
        shape = shape * 8 + kind
    return shape


cdef inline uint32_t _read32(const char *at) noexcept:
    cdef const unsigned char *b = <const unsigned char *>at
    return b[0] | (<uint32_t>b[1] << 8) | (<uint32_t>b[2] << 16) | (<uint32_t>b[3] << 24)


cdef class Template:
    """A document recorded once (:meth:`Writer.template`) and filled anew for others of
    its shape: the same names, types and order, another text (one string element, of any
    length) and other dates and numbers in its marked slots.

    ``begin`` copies the document with the new text; ``date`` and ``value`` fill each
    slot, with exactly the type it was recorded with (else NOT_SURE); ``finish`` gives
    the document, or None unless every slot was filled.
    """

    def __cinit__(self):
        self.out = None
        self.key = None
        self.names = ()
        self.shape = 0

    cdef bint fits(self, dict values, long long shape, object key) except -1:
        """Whether it was recorded from values of these names, in this order, these
        types (``shape``, of :func:`shape_of`) and this ``key``."""
        cdef Py_ssize_t j = 0, i = 0
        cdef PyObject *name
        cdef PyObject *item
        cdef tuple names = self.names
        if self.shape != shape or PyDict_Size(values) != len(names):
            return False
        if not (self.key is key or self.key == key):
            return False
        while PyDict_Next(values, &j, &name, &item):
            if <object>name is not names[i] and <object>name != names[i]:
                return False
            i += 1
        return True

    cdef int begin(self, object text) except -1:
        """Start a document with ``text`` in the text slot (exactly an ASCII ``str``)."""
        cdef Py_ssize_t size, total, i, after, at
        cdef const char *chars
        cdef const char *raw = PyBytes_AS_STRING(self.raw)
        cdef char *data
        if not PyUnicode_CheckExact(text) or not PyUnicode_IS_COMPACT_ASCII(text):
            return NOT_SURE
        chars = <const char *>PyUnicode_DATA(text)
        size = PyUnicode_GET_LENGTH(text)
        if memchr(chars, 0, size) != NULL:
            return NOT_SURE
        after = self.text_at + 4 + self.text_size + 1  # the prototype's, past its text
        total = PyBytes_GET_SIZE(self.raw) - self.text_size + size
        if total > 0x7FFFFFFF:
            return NOT_SURE
        self.out = PyBytes_FromStringAndSize(NULL, total)
        data = PyBytes_AS_STRING(self.out)
        memcpy(data, raw, self.text_at)
        _le32(data + self.text_at, <uint32_t>(size + 1))
        memcpy(data + self.text_at + 4, chars, size)
        data[self.text_at + 4 + size] = 0
        memcpy(data + self.text_at + 5 + size, raw + after, PyBytes_GET_SIZE(self.raw) - after)
        self.shift = size - self.text_size
        for i in range(self.text_depth):  # the documents around the text grow or shrink
            at = self.text_opened[i]
            _le32(data + at, <uint32_t>(<Py_ssize_t>_read32(raw + at) + self.shift))
        self.data = data
        memset(self.filled, 0, self.slots)
        self.unfilled = self.marked
        return WRITTEN

    cdef char *_at(self, Py_ssize_t slot, char kind) noexcept:
        """Where ``slot``'s value goes, if it is a slot of type ``kind`` (else NULL)."""
        cdef Py_ssize_t at
        if self.out is None or not 0 <= slot < self.slots or self.slot_kind[slot] != kind:
            return NULL
        at = self.slot_at[slot]
        if at < 0:
            return NULL
        if not self.filled[slot]:
            self.filled[slot] = 1
            self.unfilled -= 1
        return self.data + (at + self.shift if at > self.text_at else at)

    cdef int date(self, Py_ssize_t slot, object ms) except -1:
        """A date slot: ``ms`` milliseconds since the epoch (exactly an int64)."""
        cdef long long stamp
        cdef char *at
        if not _int64(ms, &stamp):
            return NOT_SURE
        at = self._at(slot, T_DATE)
        if at == NULL:
            return NOT_SURE
        _le64(at, <uint64_t>stamp)
        return WRITTEN

    cdef int value(self, Py_ssize_t slot, object value) except -1:
        """A number slot: ``value`` as :meth:`Writer.value` writes it, of the slot's type."""
        cdef uint64_t bits
        cdef int kind = _number(value, &bits)
        cdef char *at = self._at(slot, <char>kind) if kind else NULL
        if at == NULL:
            return NOT_SURE
        _put(at, kind, bits)
        return WRITTEN

    cdef int real(self, Py_ssize_t slot, double value) except -1:
        """A double slot: ``value`` (what :meth:`value` writes of ``float(value)``)."""
        cdef uint64_t bits
        cdef char *at = self._at(slot, T_DOUBLE)
        if at == NULL:
            return NOT_SURE
        memcpy(&bits, &value, 8)
        _le64(at, bits)
        return WRITTEN

    cdef object finish(self):
        """The document filled, as a RawBSONDocument; None unless every slot was filled."""
        cdef object out = self.out
        self.out = None
        if out is None or self.unfilled:
            return None
        return _document(out, self.options)


cdef class Templates:
    """The templates of one kind of document, by shape: at most ``limit`` (past it, they
    are dropped and recorded again as documents come); ``filled`` counts the documents
    their maker filled from one (it adds to it)."""

    def __init__(self, Py_ssize_t limit):
        self.by_shape = {}
        self.last = None
        self.held = 0
        self.limit = limit
        self.filled = 0

    cdef Template find(self, dict values, long long shape, object key):
        """The template of these values' names, types and ``key``, or None."""
        cdef Template template = self.last
        cdef list known
        if template is not None and template.fits(values, shape, key):
            return template
        known = self.by_shape.get(shape)
        if known is None:
            return None
        for template in known:
            if template.fits(values, shape, key):
                self.last = template
                return template
        return None

    cdef Template record(self, Writer writer, object document, dict values, long long shape,
                         object key):
        """Keep ``document``, just written recording by ``writer``, as the template of
        ``values``' shape; None if it cannot be one."""
        cdef Template template = writer.template(document)
        if template is None:
            return None
        template.names = tuple(values)
        template.shape = shape
        template.key = key
        if self.held >= self.limit:
            self.by_shape.clear()
            self.held = 0
        self.by_shape.setdefault(shape, []).append(template)
        self.held += 1
        self.last = template
        return template
