# Types for _decode_py.py compiled as ingest.devices._decode_c (Cython's pure-Python mode).
# They change nothing of what the code does: C types only where a value is proven in range.

import cython

from ingest._capi cimport int_float as _int_float, int_times as _int_times
from ingest._capi cimport tuple_as as _new, tuple_as2 as _tuple_as2, tuple_as9 as _tuple_as9
from ingest._capi cimport checked_tuple as _checked_tuple

cdef set _valid_names, _valid_sensors
cdef tuple _known
cdef frozenset _RESERVED
cdef object _floor, _NAME, _SENSOR_ID, _loads, _JSONDecodeError, Decoded, Reading, Rejection
cdef object _INT64_MIN, _INT64_MAX, _FAST_FROM, _FAST_TO
cdef double _INT64_RANGE, _INF
cdef Py_ssize_t CACHE_LIMIT, _VALUES, _ID_MAX
cdef Py_UCS4 _C0_FIRST, _C0_LAST, _C1_FIRST, _C1_LAST


@cython.locals(text=str, start=Py_ssize_t, end=Py_ssize_t)
cpdef object sensor_from_topic(object topic)

@cython.locals(length=Py_ssize_t, character=cython.Py_UCS4, code=cython.Py_UCS4)
cpdef bint _sensor_ok(str sensor) except -1

@cython.locals(count=Py_ssize_t)
cpdef Py_ssize_t value_count(list readings) except -1

@cython.locals(readings=list, rejections=list, known=tuple)
cpdef object decode(object topic, object payload, object received_at, object limits,
                    object sensor=*, object arrivals=*)

@cython.locals(count=Py_ssize_t, index=Py_ssize_t)
cdef object _items(object doc, object default_sensor, object received_at, object earliest,
                   object latest, object max_readings, object arrivals, list readings,
                   list rejections)

cdef tuple _remember(object limits)

cdef object _whole(str reason, str detail)

@cython.locals(number=cython.double)
cdef object _reading(dict item, object default_sensor, object now, object earliest,
                     object latest, object arrivals)

cdef object _values(dict item)

@cython.locals(number=cython.double, whole=cython.longlong, scaled=cython.double,
               micros=cython.longlong, rest=cython.double)
cdef object _ms_of(object epoch)

@cython.locals(value=cython.double)
cdef object _epoch(object raw, object now)
