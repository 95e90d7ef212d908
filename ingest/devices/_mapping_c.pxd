# Types for _mapping_py.py compiled as ingest.devices._mapping_c (Cython's pure-Python mode).
# They change nothing of what the code does: C types only where a value is proven in range.

import cython

from ingest._capi cimport tuple_as as _new

cdef object _UNSAFE, _SENSOR, _INT64_MIN, _INT64_MAX, _DROP_VALUE, _FITS
cdef object Decoded, Reading, Rejection, MAX_MAGNITUDE, BEYOND_MAGNITUDE

@cython.locals(several=bint, position=Py_ssize_t, window=tuple)
cpdef object readings(object mapping, object matched, object parsed, object received_at,
                      object limits)

@cython.locals(names=dict, kinds=dict)
cpdef object values(object mapping, object rule, object fields, object rejections,
                    object index)

cdef object _collision(object raw, object name, object index)
cdef object _at(object rejection, object index)
cdef object _value(object rule, object name, object value)
cdef object _typed(object rule, object name, object value, object declared)
cdef object _too_long(object tag_value)
cdef object _info(object matched, object context)
cdef object _reading(object mapping, object matched, object item, object now, tuple window,
                     object rejections, object index)
cdef object _instant(object item, object rule, object now)
