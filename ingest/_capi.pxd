# C-level steps that plain Python cannot say, for the compiled Python (_<name>_py.py
# compiled as _<name>_c) and the kernels: cimported by a _<name>_c.pxd and used only behind
# ``cython.compiled`` (a _<name>_py.py run as Python takes the plain-Python step instead).
# Keep each function small, and say why it is worth a C-level step.

# ---- h2-decode: building the hot path's NamedTuples ---------------------------------

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

