# C-level steps that plain Python cannot say, for the compiled Python (_<name>_py.py
# compiled as _<name>_c) and the kernels: cimported by a _<name>_c.pxd and used only behind
# ``cython.compiled`` (a _<name>_py.py run as Python takes the plain-Python step instead).
# Keep each function small, and say why it is worth a C-level step.

from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

# ---- building the hot path's NamedTuples -----------------------------------------------

cdef extern from *:
    """
    /* tuple.__new__(cls, items) for a tuple subclass cls of no other storage (a
       NamedTuple): its instance made by its own tp_alloc, filled with the items. */
    static PyObject *ingest_capi_tuple_as(PyObject *cls, PyObject *items) {
        PyTypeObject *type = (PyTypeObject *)cls;
        Py_ssize_t n = PyTuple_GET_SIZE(items), i;
        PyObject *out;
        if (!PyType_FastSubclass(type, Py_TPFLAGS_TUPLE_SUBCLASS)
                || type->tp_basicsize != PyTuple_Type.tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s is not a plain tuple subclass", type->tp_name);
            return NULL;
        }
        out = type->tp_alloc(type, n);
        if (out == NULL) return NULL;
        for (i = 0; i < n; i++) {
            PyObject *item = PyTuple_GET_ITEM(items, i);
            Py_INCREF(item);
            PyTuple_SET_ITEM(out, i, item);
        }
        return out;
    }
    """
    object ingest_capi_tuple_as(object cls, tuple items)


cdef inline object tuple_as(type cls, tuple items):
    """``tuple.__new__(cls, items)`` for a NamedTuple class ``cls``, without the call.

    The Python call costs a lookup of ``__new__``, an argument tuple and a copy of
    ``items``; the readings of a message are built by the hundred. A class that is not
    a tuple subclass of no storage of its own (a NamedTuple) is a TypeError.
    """
    return ingest_capi_tuple_as(cls, items)


# ---- objects of other packages' classes, and tuple fields ------------------------------

# Making an object of a Python class with ``__slots__`` (pymongo's RawBSONDocument) and
# setting its slots, without running its ``__init__``. ``RawBSONDocument(raw, options)``
# runs a Python ``__init__`` that checks the options and parses the document's length:
# 1.1 to 1.4 µs a document on the shared development machine (``timeit`` of
# ``RawBSONDocument(raw, RAW_OPTIONS)``), several times what writing its bytes costs; the
# writer checks the options once and writes well-formed documents. The offsets are
# read from the class's member descriptors at import: a slot that is not a plain
# writable object slot gives -1, and the caller then uses the public constructor.

cdef extern from *:
    """
    #include <structmember.h>

    /* type->tp_new(type, (), NULL): what object.__new__(type) does for a class whose
       __new__ is object's (the caller checks). */
    static PyObject *capi_h3_new(PyObject *cls, PyObject *empty) {
        PyTypeObject *type = (PyTypeObject *)cls;
        return type->tp_new(type, empty, NULL);
    }

    /* The offset of the writable object slot described by ``descr`` in an object of
       ``cls``, or -1 when setting it is anything else than storing into that slot. */
    static Py_ssize_t capi_h3_slot_offset(PyObject *cls, PyObject *descr) {
        PyMemberDef *member;
        if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)) return -1;
        if (member->offset <= 0 || member->offset + (Py_ssize_t)sizeof(PyObject *)
                                   > ((PyTypeObject *)cls)->tp_basicsize)
            return -1;
        return member->offset;
    }

    /* What setting the slot at ``offset`` does (PyMember_SetOne for Py_T_OBJECT_EX). */
    static void capi_h3_set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **addr = (PyObject **)((char *)obj + offset);
        Py_INCREF(value);
        Py_XSETREF(*addr, value);
    }
    """
    object capi_h3_new(object cls, object empty)
    Py_ssize_t capi_h3_slot_offset(object cls, object descr)
    void capi_h3_set_slot(object obj, Py_ssize_t offset, object value)


cdef inline Py_ssize_t slot_offset(object cls, str name):
    """Where ``setattr(object.__new__(cls), name, value)`` stores ``value``, or -1.

    An offset when ``cls`` takes ``object.__new__`` and ``object.__setattr__`` and
    ``name`` is one of its ``__slots__``; -1 for anything else.
    """
    if cls.__new__ is not object.__new__ or cls.__setattr__ is not object.__setattr__:
        return -1
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return capi_h3_slot_offset(cls, klass.__dict__[name])
    return -1


cdef inline object new_object(object cls):
    """``object.__new__(cls)``, for a class whose slot offsets :func:`slot_offset` gave."""
    return capi_h3_new(cls, ())


cdef inline void set_slot(object obj, Py_ssize_t offset, object value) noexcept:
    """Set the slot at ``offset`` (from :func:`slot_offset`) of ``obj`` to ``value``."""
    capi_h3_set_slot(obj, offset, value)


cdef inline object field(object obj, object cls, Py_ssize_t index, str name):
    """``getattr(obj, name)``, for a ``typing.NamedTuple`` ``cls`` whose field ``name`` is
    its item ``index``: read by index when ``obj`` is exactly a ``cls`` holding it (a
    Python attribute lookup each, else)."""
    if type(obj) is cls and PyTuple_GET_SIZE(obj) > index:
        return <object>PyTuple_GET_ITEM(obj, index)
    return getattr(obj, name)


cdef inline tuple as_tuple(object reading):
    """A ``typing.NamedTuple`` (exactly its class, checked by the caller) as the tuple it
    is, so that Cython reads its fields by index. Cython unpacks an object that is not
    exactly a ``tuple`` through an iterator (a Python call per field)."""
    return <tuple>reading


# ---- bucket mode's dates and spans ----------------------------------------------------

cdef extern from *:
    """
    /* object.__new__(cls), then its slot at ``offset`` set to ``value``. An object whose
       slots hold nothing but an int is in no reference cycle: the collector is told not
       to look at it (a batch makes one per reading), as CPython's stops looking at dicts
       of atomic values. */
    static PyObject *ingest_capi_new_with_slot(PyObject *cls, Py_ssize_t offset,
                                               PyObject *value) {
        PyTypeObject *type = (PyTypeObject *)cls;
        PyObject *obj = type->tp_alloc(type, 0);
        if (obj == NULL) return NULL;
        Py_INCREF(value);
        *(PyObject **)((char *)obj + offset) = value;
        if (PyLong_CheckExact(value) && PyObject_IS_GC(obj)) PyObject_GC_UnTrack(obj);
        return obj;
    }

    /* Python's float // float (floatobject.c, _float_div_mod) for a divisor that is not
       zero: the floor of the exact quotient, -0.0 where Python gives it. For an integral
       0 < wx < 1e12 and |vx| < 1e14 (a span and an epoch) that floor is found from the
       rounded quotient, corrected by at most one (k * wx is exact below 2**53), without
       fmod, which is slow for a large quotient. */
    static double ingest_capi_float_floordiv(double vx, double wx) {
        if (wx > 0.0 && wx < 1e12 && wx == floor(wx) && fabs(vx) < 1e14) {
            double k = floor(vx / wx);
            if (k * wx > vx) k -= 1.0;
            else if ((k + 1.0) * wx <= vx) k += 1.0;
            return k == 0.0 ? copysign(0.0, vx / wx) : k;
        }
        double mod = fmod(vx, wx);
        double div = (vx - mod) / wx;
        double floordiv;
        if (mod) {
            if ((wx < 0) != (mod < 0)) div -= 1.0;
        }
        if (div) {
            floordiv = floor(div);
            if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
            floordiv = copysign(0.0, vx / wx);
        }
        return floordiv;
    }

    /* ``obj`` itself, when it is a tuple or a tuple subclass (a NamedTuple). */
    static PyObject *ingest_capi_as_tuple(PyObject *obj) {
        if (!PyTuple_Check(obj)) {
            PyErr_Format(PyExc_TypeError, "a reading is a tuple (ingest.model.Reading), not %.200s",
                         Py_TYPE(obj)->tp_name);
            return NULL;
        }
        Py_INCREF(obj);
        return obj;
    }
    """
    tuple ingest_capi_as_tuple(object obj)
    object ingest_capi_new_with_slot(object cls, Py_ssize_t offset, object value)
    double ingest_capi_float_floordiv(double vx, double wx) noexcept


cdef inline object new_with_slot(object cls, Py_ssize_t offset, object value):
    """``object.__new__(cls)`` with the slot at ``offset`` (from :func:`slot_offset`) set.

    Bucket mode makes one BSON date per reading: ``object.__new__`` and the slot's
    setter are two calls through Python's machinery; this is one allocation.
    """
    return ingest_capi_new_with_slot(cls, offset, value)


cdef inline double float_floordiv(double a, double b) noexcept:
    """``a // b`` of two floats as Python computes it (``b`` not zero).

    Cython's ``//`` of C doubles is ``floor(a / b)``, which differs from Python's where
    the quotient rounds up to an integer; Python's own, on objects, boxes both floats.
    """
    return ingest_capi_float_floordiv(a, b)


cdef inline tuple checked_tuple(object obj):
    """``obj`` typed as a tuple: a tuple or a tuple subclass; else a TypeError.

    A NamedTuple's fields by position are then read by Cython in C. Indexing an object
    that Cython does not know as a tuple goes through the type's ``sq_item``, which for a
    Python subclass of tuple (a NamedTuple) is the generic slot that looks ``__getitem__``
    up and calls it, several times the cost of its attribute.
    """
    return ingest_capi_as_tuple(obj)


# ---- h11-decode-speed: NamedTuples filled in place, int arithmetic in C -------------

cdef extern from *:
    """
    /* A tuple subclass of no other storage (a NamedTuple) of n items, from its own
       tp_alloc: NULL and a TypeError for any other class. */
    static PyObject *ingest_capi_tuple_alloc(PyObject *cls, Py_ssize_t n) {
        PyTypeObject *type = (PyTypeObject *)cls;
        if (!PyType_FastSubclass(type, Py_TPFLAGS_TUPLE_SUBCLASS)
                || type->tp_basicsize != PyTuple_Type.tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "%s is not a plain tuple subclass", type->tp_name);
            return NULL;
        }
        return type->tp_alloc(type, n);
    }
    static PyObject *ingest_capi_tuple_as2(PyObject *cls, PyObject *a, PyObject *b) {
        PyObject *out = ingest_capi_tuple_alloc(cls, 2);
        if (out == NULL) return NULL;
        Py_INCREF(a); PyTuple_SET_ITEM(out, 0, a);
        Py_INCREF(b); PyTuple_SET_ITEM(out, 1, b);
        return out;
    }
    static PyObject *ingest_capi_tuple_as9(PyObject *cls, PyObject *a, PyObject *b,
            PyObject *c, PyObject *d, PyObject *e, PyObject *f, PyObject *g, PyObject *h,
            PyObject *i) {
        PyObject *out = ingest_capi_tuple_alloc(cls, 9);
        if (out == NULL) return NULL;
        Py_INCREF(a); PyTuple_SET_ITEM(out, 0, a);
        Py_INCREF(b); PyTuple_SET_ITEM(out, 1, b);
        Py_INCREF(c); PyTuple_SET_ITEM(out, 2, c);
        Py_INCREF(d); PyTuple_SET_ITEM(out, 3, d);
        Py_INCREF(e); PyTuple_SET_ITEM(out, 4, e);
        Py_INCREF(f); PyTuple_SET_ITEM(out, 5, f);
        Py_INCREF(g); PyTuple_SET_ITEM(out, 6, g);
        Py_INCREF(h); PyTuple_SET_ITEM(out, 7, h);
        Py_INCREF(i); PyTuple_SET_ITEM(out, 8, i);
        return out;
    }
    /* float(value) for an int value: within 64 bits, C's conversion (rounded to
       nearest, ties to even, as PyLong_AsDouble rounds); beyond, float() itself. */
    static PyObject *ingest_capi_int_float(PyObject *value) {
        int overflow = 0;
        long long whole = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (whole == -1 && PyErr_Occurred()) return NULL;
        if (!overflow) return PyFloat_FromDouble((double)whole);
        return PyNumber_Float(value);
    }
    /* value * factor for an int value: in C when the product fits in 64 bits (a
       positive factor), else PyNumber_Multiply. */
    static PyObject *ingest_capi_int_times(PyObject *value, long long factor) {
        int overflow = 0;
        long long whole = PyLong_AsLongLongAndOverflow(value, &overflow);
        PyObject *times, *out;
        if (whole == -1 && PyErr_Occurred()) return NULL;
        if (!overflow && factor > 0 && whole <= LLONG_MAX / factor
                && whole >= LLONG_MIN / factor)
            return PyLong_FromLongLong(whole * factor);
        times = PyLong_FromLongLong(factor);
        if (times == NULL) return NULL;
        out = PyNumber_Multiply(value, times);
        Py_DECREF(times);
        return out;
    }
    """
    object ingest_capi_tuple_as2(object cls, object a, object b)
    object ingest_capi_tuple_as9(object cls, object a, object b, object c, object d,
                                 object e, object f, object g, object h, object i)
    object ingest_capi_int_float(object value)
    object ingest_capi_int_times(object value, long long factor)


cdef inline object tuple_as2(type cls, object a, object b):
    """``tuple.__new__(cls, (a, b))`` for a NamedTuple class ``cls``, with no tuple between.

    ``tuple_as`` copies a tuple built for the call; building the result directly spares
    that tuple's allocation and the references counted twice (a reading's Reading, a
    message's Decoded).
    """
    return ingest_capi_tuple_as2(cls, a, b)


cdef inline object tuple_as9(type cls, object a, object b, object c, object d, object e,
                             object f, object g, object h, object i):
    """``tuple.__new__(cls, (a, ..., i))`` for a NamedTuple class ``cls``, as tuple_as2."""
    return ingest_capi_tuple_as9(cls, a, b, c, d, e, f, g, h, i)


cdef inline object int_float(object value):
    """``float(value)`` for an ``int`` value, the same float and the same OverflowError.

    CPython's float() of an int of more than 30 bits (an epoch second) goes through an
    arbitrary-precision frexp; one C conversion gives the same double.
    """
    return ingest_capi_int_float(value)


cdef inline object int_times(object value, long long factor):
    """``value * factor`` for an ``int`` value, in C when the product fits in 64 bits.

    Cython's own fast path multiplies only ints of one 30-bit digit; an epoch second
    times 1000 otherwise goes through CPython's general multiplication.
    """
    return ingest_capi_int_times(value, factor)


# ---- p35-bucket: numbers compared in C -----------------------------------------------

from cpython.object cimport Py_EQ, Py_GT, Py_LE, Py_LT

cdef extern from *:
    """
    /* a < b (op Py_LT), a <= b (Py_LE), a > b (Py_GT) or a == b (Py_EQ), as Python's
       operators compare them: two floats, or two ints within 64 bits, in C (an int of one
       digit read inline); anything else by the objects' own comparison (== without the
       identity shortcut of PyObject_RichCompareBool). A constant op folds the switch away. */
    static CYTHON_INLINE int ingest_capi_compare(PyObject *a, PyObject *b, int op) {
        if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b)) {
            double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
            return op == Py_LT ? x < y : op == Py_LE ? x <= y : op == Py_GT ? x > y : x == y;
        }
        if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
            int over_a = 0, over_b = 0;
            if (PyUnstable_Long_IsCompact((PyLongObject *)a)
                    && PyUnstable_Long_IsCompact((PyLongObject *)b)) {
                Py_ssize_t x = PyUnstable_Long_CompactValue((PyLongObject *)a);
                Py_ssize_t y = PyUnstable_Long_CompactValue((PyLongObject *)b);
                return op == Py_LT ? x < y : op == Py_LE ? x <= y : op == Py_GT ? x > y : x == y;
            }
            long long x = PyLong_AsLongLongAndOverflow(a, &over_a);
            long long y = PyLong_AsLongLongAndOverflow(b, &over_b);
            if (!over_a && !over_b)
                return op == Py_LT ? x < y : op == Py_LE ? x <= y : op == Py_GT ? x > y : x == y;
        }
        if (op == Py_EQ) {
            PyObject *result = PyObject_RichCompare(a, b, op);
            int truth;
            if (result == NULL) return -1;
            truth = PyObject_IsTrue(result);
            Py_DECREF(result);
            return truth;
        }
        return PyObject_RichCompareBool(a, b, op);
    }
    """
    int ingest_capi_compare(object a, object b, int op) except -1


cdef inline bint less(object a, object b) except -1:
    """``a < b``: two floats, or two ints of 64 bits, compared in C; else as Python does.

    Python's ``<`` of two objects makes a bool object out of a C comparison; bucket
    statistics compare each value with its measurement's minimum and maximum.
    """
    return ingest_capi_compare(a, b, Py_LT)


cdef inline bint less_equal(object a, object b) except -1:
    """``a <= b``, as :func:`less`."""
    return ingest_capi_compare(a, b, Py_LE)


cdef inline bint greater(object a, object b) except -1:
    """``a > b``, as :func:`less`."""
    return ingest_capi_compare(a, b, Py_GT)


cdef inline bint equal(object a, object b) except -1:
    """``a == b``, as :func:`less` (a span's start found again for each reading)."""
    return ingest_capi_compare(a, b, Py_EQ)


# ---- the wall clock ---------------------------------------------------------------------

cdef extern from *:
    """
    /* time.time(), without the call: PyTime_Time and PyTime_AsSecondsDouble are the
       functions it runs (public C API since Python 3.13). */
    static PyObject *ingest_capi_now(void) {
        PyTime_t t;
        if (PyTime_Time(&t) < 0) return NULL;
        return PyFloat_FromDouble(PyTime_AsSecondsDouble(t));
    }
    """
    object ingest_capi_now()


cdef inline object now():
    """``time.time()``: the same clock and the same float, without a Python call.

    The receiver stamps every message with it; the call through the ``time`` module was
    about 2% of the daemon's CPU on a stream of single readings.
    """
    return ingest_capi_now()


# ---- text of a number and a name ----------------------------------------------------------

cdef extern from *:
    """
    /* f"{number} {text}" for an exact int that fits a long long and an exact, compact
       ASCII str: one allocation, the digits written in place (the f-string makes the
       number's str, then joins three). Py_None (a new reference) for anything else. */
    static PyObject *ingest_capi_number_space_text(PyObject *number, PyObject *text) {
        long long value;
        unsigned long long rest;
        int overflow, n = 0, i;
        char digits[24];
        Py_ssize_t size;
        PyObject *out;
        char *data;
        if (!PyLong_CheckExact(number) || !PyUnicode_CheckExact(text)
                || !PyUnicode_IS_COMPACT_ASCII(text))
            Py_RETURN_NONE;
        value = PyLong_AsLongLongAndOverflow(number, &overflow);
        if (overflow) Py_RETURN_NONE;
        if (value == -1 && PyErr_Occurred()) return NULL;
        rest = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
        do {
            digits[n++] = (char)('0' + rest % 10);
            rest /= 10;
        } while (rest);
        if (value < 0) digits[n++] = '-';
        size = PyUnicode_GET_LENGTH(text);
        out = PyUnicode_New(n + 1 + size, 127);
        if (out == NULL) return NULL;
        data = (char *)PyUnicode_DATA(out);
        for (i = 0; i < n; i++) data[i] = digits[n - 1 - i];
        data[n] = ' ';
        memcpy(data + n + 1, PyUnicode_DATA(text), (size_t)size);
        return out;
    }
    """
    object ingest_capi_number_space_text(object number, object text)


cdef inline object number_space_text(object number, object text):
    """``f"{number} {text}"`` for an int that fits 64 bits and an ASCII ``str``; else None.

    Time-series mode makes one such text per reading (the ``_id`` of its claim): written
    in place, without the number's own ``str`` and the join of three.
    """
    return ingest_capi_number_space_text(number, text)
