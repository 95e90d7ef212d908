# C-level steps that plain Python cannot say, for the compiled Python (_<name>_py.py
# compiled as _<name>_c) and the kernels: cimported by a _<name>_c.pxd and used only behind
# ``cython.compiled`` (a _<name>_py.py run as Python takes the plain-Python step instead).
# Keep each function small, and say why it is worth a C-level step.

# ---- h1-bucket: bucket mode's dates and spans -----------------------------------------

cdef extern from *:
    """
    #include <structmember.h>

    /* The offset of the writable object slot ``name`` of ``cls`` (a member descriptor of
       Py_T_OBJECT_EX within the instance), or -1 when setting that attribute is anything
       else than storing into the slot (a class with its own __new__ or __setattr__). */
    static Py_ssize_t ingest_capi_slot_offset(PyObject *cls, PyObject *name) {
        PyTypeObject *type = (PyTypeObject *)cls;
        PyObject *descr;
        PyMemberDef *member;
        if (type->tp_new != PyBaseObject_Type.tp_new
                || type->tp_setattro != PyBaseObject_Type.tp_setattro) return -1;
        descr = PyObject_GetAttr(cls, name);  /* a slot's descriptor, as the class gives it */
        if (descr == NULL) {
            PyErr_Clear();
            return -1;
        }
        if (Py_TYPE(descr) != &PyMemberDescr_Type) {
            Py_DECREF(descr);
            return -1;
        }
        member = ((PyMemberDescrObject *)descr)->d_member;
        Py_DECREF(descr);  /* the class holds it */
        if (member->type != Py_T_OBJECT_EX || (member->flags & Py_READONLY)
                || member->offset <= 0
                || member->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize)
            return -1;
        return member->offset;
    }

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
    Py_ssize_t ingest_capi_slot_offset(object cls, object name)
    object ingest_capi_new_with_slot(object cls, Py_ssize_t offset, object value)
    double ingest_capi_float_floordiv(double vx, double wx) noexcept


cdef inline Py_ssize_t slot_offset(object cls, str name):
    """Where ``setattr(object.__new__(cls), name, value)`` stores ``value``, or -1.

    Read once, at import: :func:`new_with_slot` then sets the slot without looking up
    the attribute's descriptor by name, as the compiled .pyx did.
    """
    return ingest_capi_slot_offset(cls, name)


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


cdef inline tuple as_tuple(object obj):
    """``obj`` typed as a tuple: a tuple or a tuple subclass; else a TypeError.

    A NamedTuple's fields by position are then read by Cython in C. Indexing an object
    that Cython does not know as a tuple goes through the type's ``sq_item``, which for a
    Python subclass of tuple (a NamedTuple) is the generic slot that looks ``__getitem__``
    up and calls it, several times the cost of its attribute.
    """
    return ingest_capi_as_tuple(obj)
