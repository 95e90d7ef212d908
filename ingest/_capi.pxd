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


cdef inline object new_with(object cls, Py_ssize_t offset, str name, object value):
    """``obj = object.__new__(cls); setattr(obj, name, value)``: by its slot when ``offset``
    (:func:`slot_offset` of ``cls`` and ``name``) is one, else by those very calls.

    For the BSON dates the writers make per reading: ``object.__new__`` and ``setattr``
    take a Python call each (about 0.13 µs together, timed from Python), the slot a few ns."""
    if offset > 0:
        obj = capi_h3_new(cls, ())
        capi_h3_set_slot(obj, offset, value)
    else:
        obj = object.__new__(cls)
        setattr(obj, name, value)
    return obj


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
