# cython: language_level=3
"""Compiled twin of ``decode_py`` in ingest/devices/decode.py (the default format).

The same arguments give the same result: the same readings (types, values dicts and their
key order included), the same rejections (reason, detail, index), the same calls to an
``Arrivals``, the same exceptions; tests/devices/test_decode_twins.py runs both on
generated input. The daemon's kinds of argument (a str topic, bytes payload, a finite
float arrival time, a ``Limits`` of ints and floats) take the compiled path; anything
else is handed to ``decode_py`` itself.
"""

from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Contains, PyDict_Next, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsDouble, PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_FindChar
from libc.math cimport fabs, floor, isfinite, modf, round as c_round

import math
import re
from datetime import UTC, datetime

import orjson

from ingest.model import (
    NAME_PATTERN as _MODEL_NAME_PATTERN,
    RESERVED_FIELDS,
    SENSOR_ID_PATTERN as _MODEL_SENSOR_ID_PATTERN,
    SENSOR_ID_RULE,
    Decoded,
    Reading,
    Rejection,
)

cdef extern from *:
    """
    /* A tuple subclass's instance, as tuple.__new__(cls, ...) makes it (its own tp_alloc);
       the caller sets every item before the object is used. */
    static PyObject *ingest_tuple_of(PyObject *cls, Py_ssize_t n) {
        PyTypeObject *type = (PyTypeObject *)cls;
        return type->tp_alloc(type, n);
    }
    /* dict.pop(key, default) */
    static PyObject *ingest_pop(PyObject *d, PyObject *key, PyObject *dflt) {
        PyObject *found;
        int status = PyDict_Pop(d, key, &found);
        if (status == 0) {
            Py_INCREF(dflt);
            return dflt;
        }
        return status < 0 ? NULL : found;
    }
    /* re.fullmatch("[A-Za-z0-9_-]{1,64}", s) for a str s. */
    static int ingest_name_ok(PyObject *s) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i;
        const unsigned char *p;
        if (n < 1 || n > 64 || !PyUnicode_IS_ASCII(s)) return 0;
        p = PyUnicode_1BYTE_DATA(s);
        for (i = 0; i < n; i++) {
            unsigned char c = p[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                  || c == '_' || c == '-')) return 0;
        }
        return 1;
    }
    /* s in {"ts", "seq", "sensor_id", "_id", "meta", "units", "info", "tags"}, s a str. */
    static int ingest_reserved(PyObject *s) {
        const char *p;
        if (!PyUnicode_IS_ASCII(s)) return 0;
        p = (const char *)PyUnicode_1BYTE_DATA(s);
        switch (PyUnicode_GET_LENGTH(s)) {
        case 2: return p[0] == 't' && p[1] == 's';
        case 3: return (p[0] == 's' && p[1] == 'e' && p[2] == 'q')
                       || (p[0] == '_' && p[1] == 'i' && p[2] == 'd');
        case 4: return (p[0] == 'm' && p[1] == 'e' && p[2] == 't' && p[3] == 'a')
                       || (p[0] == 'i' && p[1] == 'n' && p[2] == 'f' && p[3] == 'o')
                       || (p[0] == 't' && p[1] == 'a' && p[2] == 'g' && p[3] == 's');
        case 5: return memcmp(p, "units", 5) == 0;
        case 9: return memcmp(p, "sensor_id", 9) == 0;
        }
        return 0;
    }
    /* re.fullmatch("[^\\x00-\\x1f\\x7f-\\x9f]{1,128}", s) for a str s. */
    static int ingest_sensor_ok(PyObject *s) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i;
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        if (n < 1 || n > 128) return 0;
        for (i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c <= 0x1f || (c >= 0x7f && c <= 0x9f)) return 0;
        }
        return 1;
    }
    """
    object ingest_tuple_of(object cls, Py_ssize_t n)
    object ingest_pop(object d, object key, object dflt)
    bint ingest_name_ok(str s)
    bint ingest_reserved(str s)
    bint ingest_sensor_ok(str s)

# decode.py's bound and its detail (the twin tests check that they still agree).
MAX_MAGNITUDE = 1e300
BEYOND_MAGNITUDE = "not a finite number within ±1e300"
# What ingest_name_ok, ingest_sensor_ok and ingest_reserved check; if the model's rules
# are ever others, its own patterns and set are used instead.
NAME_PATTERN = r"[A-Za-z0-9_-]{1,64}"
SENSOR_ID_PATTERN = r"[^\x00-\x1f\x7f-\x9f]{1,128}"
RESERVED = frozenset({"ts", "seq", "sensor_id", "_id", "meta", "units", "info", "tags"})
cdef bint _C_NAME = _MODEL_NAME_PATTERN == NAME_PATTERN
cdef bint _C_SENSOR_ID = _MODEL_SENSOR_ID_PATTERN == SENSOR_ID_PATTERN
cdef bint _C_RESERVED = RESERVED_FIELDS == RESERVED
cdef object _NAME = re.compile(_MODEL_NAME_PATTERN)
cdef object _SENSOR_ID = re.compile(_MODEL_SENSOR_ID_PATTERN)

# Module globals as C variables: a module global is a dict lookup at every use.
cdef object _loads = orjson.loads
cdef object _JSONDecodeError = orjson.JSONDecodeError
cdef object _Reading = Reading
cdef object _Decoded = Decoded
cdef object _Rejection = Rejection
cdef frozenset _RESERVED = RESERVED_FIELDS
cdef str _SENSOR_ID_RULE = SENSOR_ID_RULE
cdef str _NAME_PATTERN = _MODEL_NAME_PATTERN
cdef str _BEYOND = BEYOND_MAGNITUDE
cdef object _fromisoformat = datetime.fromisoformat
cdef double _MAX = MAX_MAGNITUDE
# Whole seconds within this become milliseconds in a C integer.
cdef long long _MS_SAFE = 9_000_000_000_000_000 // 1000
# Epoch seconds whose microseconds are computed here (years 68 to 9892, well inside
# datetime's 1 to 9999); the others (outside the window of any sane --max-past-seconds)
# go through datetime, which raises where decode_py's does.
cdef double _FAST_FROM = -6e10, _FAST_TO = 2.5e11

for _cls, _fields in ((Reading, 9), (Decoded, 2)):
    if not (issubclass(_cls, tuple) and len(_cls._fields) == _fields
            and _cls.__basicsize__ == tuple.__basicsize__):
        raise ImportError(f"{_cls.__name__} is not a plain NamedTuple of {_fields} fields")

# Resolved at the first call (decode.py imports this module while it loads).
cdef object _decode_py = None
cdef object _Limits = None
# The last Limits seen (frozen) and its fields as C numbers.
cdef object _limits = None
cdef long long _max_bytes = 0, _max_readings = 0
cdef double _past = 0.0, _future = 0.0


cdef int _load() except -1:
    global _decode_py, _Limits
    from ingest.devices.decode import Limits, decode_py
    _decode_py, _Limits = decode_py, Limits
    return 0


cdef bint _c_limits(object limits) except -1:
    """Whether ``limits`` is a Limits of ints and floats, now in the C copies."""
    global _limits, _max_bytes, _max_readings, _past, _future
    cdef int overflow_bytes = 0, overflow_readings = 0
    cdef long long max_bytes, max_readings
    if limits is _limits:
        return True
    if _Limits is None:
        _load()
    if type(limits) is not _Limits:
        return False
    max_bytes_obj, max_readings_obj = limits.max_message_bytes, limits.max_readings
    past_obj, future_obj = limits.max_past_seconds, limits.max_future_seconds
    if type(max_bytes_obj) is not int or type(max_readings_obj) is not int:
        return False
    max_bytes = PyLong_AsLongLongAndOverflow(max_bytes_obj, &overflow_bytes)
    max_readings = PyLong_AsLongLongAndOverflow(max_readings_obj, &overflow_readings)
    if overflow_bytes or overflow_readings or not (_exact_double(past_obj)
                                                   and _exact_double(future_obj)):
        return False
    _max_bytes, _max_readings = max_bytes, max_readings
    _past, _future = past_obj, future_obj
    _limits = limits
    return True


cdef bint _exact_double(object value) except -1:
    """A float, or an int a double holds exactly (Python's float arithmetic then is C's)."""
    cdef int overflow = 0
    cdef long long whole
    if type(value) is float:
        return True
    if type(value) is not int:
        return False
    whole = PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0 and -(1 << 53) <= whole <= (1 << 53)


def decode(topic, payload, received_at, limits, sensor=None, arrivals=None):
    """Turn one MQTT message into readings and rejections (see ``decode_py``)."""
    cdef double now, past, future
    cdef Py_ssize_t size, count, index
    cdef list readings, rejections
    if (type(topic) is not str or type(payload) is not bytes or type(received_at) is not float
            or not _c_limits(limits)):
        return _python(topic, payload, received_at, limits, sensor, arrivals)
    now = PyFloat_AS_DOUBLE(received_at)
    if not fabs(now) <= 1e15:  # NaN, inf, or beyond what a C integer of ms holds
        return _python(topic, payload, received_at, limits, sensor, arrivals)
    size = PyBytes_GET_SIZE(payload)
    if size > _max_bytes:
        return _whole("too_large", f"{size} bytes > {_max_bytes}")
    try:
        doc = _loads(payload)
    except _JSONDecodeError as exc:
        return _whole(_json_reason(payload), str(exc).split("\n", 1)[0][:200])
    default_sensor = _sensor_from_topic(topic) if sensor is None else sensor
    past, future = now - _past, now + _future
    if type(doc) is dict and not PyDict_Contains(doc, "readings") and _max_readings > 0:
        # One reading object, the most common message.
        result = _reading(doc, default_sensor, now, past, future, arrivals)
        if type(result) is tuple:
            return _whole(result[0], result[1])
        return _decoded([result], [])
    if type(doc) is dict and PyDict_Contains(doc, "readings"):
        items = doc["readings"]
        if PyDict_Contains(doc, "sensor_id"):
            default_sensor = doc["sensor_id"]
        if PyDict_Size(doc) > 1 + PyDict_Contains(doc, "sensor_id"):
            extra = doc.keys() - {"readings", "sensor_id"}
            return _whole("bad_shape", f"unexpected envelope keys: {_names(extra)}")
        if type(items) is not list:
            return _whole("bad_shape", "'readings' must be an array")
    elif type(doc) is list:
        items = doc
    elif type(doc) is dict:
        items = [doc]  # decode_py's (doc,): one item, the same rejection if too many
    else:
        return _whole("bad_shape", f"expected an object or array, got {type(doc).__name__}")
    count = len(<list>items)
    if count == 0:
        return _whole("no_readings", "no readings in message")
    if count > _max_readings:
        return _whole("too_many_readings", f"{count} readings > {_max_readings}")
    readings, rejections = [], []
    for index in range(count):
        result = _reading((<list>items)[index], default_sensor, now, past, future, arrivals)
        if type(result) is tuple:
            rejections.append(_Rejection(result[0], result[1], index if count > 1 else None))
        else:
            readings.append(result)
    return _decoded(readings, rejections)


cdef object _python(topic, payload, received_at, limits, sensor, arrivals):
    if _decode_py is None:
        _load()
    return _decode_py(topic, payload, received_at, limits, sensor, arrivals)


cdef inline object _decoded(list readings, list rejections):
    """Decoded(readings, rejections), without the NamedTuple's Python-level __new__."""
    cdef object out = ingest_tuple_of(_Decoded, 2)
    Py_INCREF(readings)
    PyTuple_SET_ITEM(out, 0, readings)
    Py_INCREF(rejections)
    PyTuple_SET_ITEM(out, 1, rejections)
    return out


cdef inline object _new_reading(object sensor, object epoch, object values, object seq,
                                object ms):
    """Reading(sensor, None, epoch, values, seq, ms), the rest None, as decode_py's _new."""
    cdef object out = ingest_tuple_of(_Reading, 9)
    Py_INCREF(sensor)
    PyTuple_SET_ITEM(out, 0, sensor)
    Py_INCREF(None)
    PyTuple_SET_ITEM(out, 1, None)
    Py_INCREF(epoch)
    PyTuple_SET_ITEM(out, 2, epoch)
    Py_INCREF(values)
    PyTuple_SET_ITEM(out, 3, values)
    Py_INCREF(seq)
    PyTuple_SET_ITEM(out, 4, seq)
    Py_INCREF(ms)
    PyTuple_SET_ITEM(out, 5, ms)
    Py_INCREF(None)
    PyTuple_SET_ITEM(out, 6, None)
    Py_INCREF(None)
    PyTuple_SET_ITEM(out, 7, None)
    Py_INCREF(None)
    PyTuple_SET_ITEM(out, 8, None)
    return out


cdef object _whole(str reason, str detail):
    return _decoded([], [_Rejection(reason, detail)])


cdef str _json_reason(bytes payload):
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    return "invalid_json"


cdef str _names(object keys):
    return ", ".join(sorted([repr(k[:40]) for k in keys])[:5])


cdef object _sensor_from_topic(str topic):
    """The topic level after the first, as decode.py's sensor_from_topic."""
    cdef Py_ssize_t size = len(topic), start, end
    start = PyUnicode_FindChar(topic, "/", 0, size, 1)
    if start < 0:
        return None
    end = PyUnicode_FindChar(topic, "/", start + 1, size, 1)
    if end < 0:
        end = size
    if end == start + 1:
        return None
    return topic[start + 1:end]


cdef inline bint _sensor_ok(str sensor) except -1:
    """The sensor id pattern's fullmatch."""
    if _C_SENSOR_ID:
        return ingest_sensor_ok(sensor)
    return _SENSOR_ID.fullmatch(sensor) is not None


cdef inline bint _name_ok(object name) except -1:
    """The name pattern's fullmatch."""
    if _C_NAME and type(name) is str:
        return ingest_name_ok(name)
    return _NAME.fullmatch(name) is not None


cdef inline bint _reserved(object name) except -1:
    """``name in RESERVED_FIELDS``."""
    if _C_RESERVED and type(name) is str:
        return ingest_reserved(name)
    return name in _RESERVED


cdef inline bint _seq_ok(object seq) except -1:
    """A non-negative 64-bit integer."""
    cdef int overflow = 0
    cdef long long value
    if type(seq) is not int:
        return False
    value = PyLong_AsLongLongAndOverflow(seq, &overflow)
    return overflow == 0 and value >= 0


cdef object _reading(object item, object default_sensor, double now, double past,
                     double future, object arrivals):
    """One reading object: its Reading, or ``(reason, detail)`` (decode_py's _reading)."""
    cdef double epoch
    cdef object whole = None
    cdef long long whole_c = 0
    cdef int overflow = 0
    if type(item) is not dict:
        return "bad_shape", f"a reading must be an object, got {type(item).__name__}"
    sensor = ingest_pop(item, "sensor_id", default_sensor)
    if sensor is None:
        return "no_sensor_id", "no sensor_id in payload or topic"
    if type(sensor) is not str:
        return "bad_sensor_id", f"sensor_id must be a string of {_SENSOR_ID_RULE}"
    if not _sensor_ok(sensor):
        return "bad_sensor_id", f"sensor_id {sensor[:60]!r}: {_SENSOR_ID_RULE}"
    raw = ingest_pop(item, "ts", None)
    if raw is None and arrivals is not None:  # timed at its sensor's next arrival ms
        ms = arrivals.next(sensor, PyLong_FromLongLong(<long long>floor(now * 1000.0)))
        seq = ingest_pop(item, "seq", None)
        if seq is not None and not _seq_ok(seq):
            return "bad_seq", "seq must be a non-negative integer"
        values = _values(item)
        if type(values) is tuple:
            return values
        return _new_reading(sensor, ms / 1000, values, seq, ms)
    if type(raw) is int:  # whole epoch seconds
        whole = raw
        whole_c = PyLong_AsLongLongAndOverflow(raw, &overflow)
        # float(raw): both round to nearest, ties to even
        epoch = <double>whole_c if overflow == 0 else PyLong_AsDouble(raw)
    elif type(raw) is float:
        epoch = PyFloat_AS_DOUBLE(raw)
        if not isfinite(epoch):
            return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
    elif raw is None:
        epoch = now
    elif type(raw) is str:
        try:
            parsed = _fromisoformat(raw)
        except ValueError:
            return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
        if parsed.tzinfo is None:
            return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
        epoch = parsed.timestamp()
    else:
        return "bad_timestamp", "ts must be epoch seconds or ISO-8601 with an offset"
    if not past <= epoch <= future:
        return "ts_out_of_window", f"ts {epoch:.3f} outside the accepted window"
    seq = ingest_pop(item, "seq", None)
    if seq is not None and not _seq_ok(seq):
        return "bad_seq", "seq must be a non-negative integer"
    values = _values(item)
    if type(values) is tuple:
        return values
    if whole is not None:  # whole milliseconds
        if overflow == 0 and -_MS_SAFE <= whole_c <= _MS_SAFE:
            ms = PyLong_FromLongLong(whole_c * 1000)
        else:
            ms = whole * 1000
        return _new_reading(sensor, epoch, values, seq, ms)
    return _new_reading(sensor, epoch, values, seq, _ms_of(epoch))


cdef object _ms_of(double epoch):
    """The instant BSON will store, in whole ms (decode_py's _timed, without a datetime).

    datetime.fromtimestamp's microseconds: the fraction of a second times 1e6, rounded
    half to even (CPython's pytime), then truncated to milliseconds.
    """
    cdef double whole_part, micros_d, rounded
    cdef long long micros, seconds
    if not _FAST_FROM < epoch < _FAST_TO:
        return _ms_of_python(epoch)
    micros_d = modf(epoch, &whole_part) * 1e6
    rounded = c_round(micros_d)
    if fabs(micros_d - rounded) == 0.5:
        rounded = 2.0 * c_round(micros_d / 2.0)
    if rounded >= 1e6:
        rounded -= 1e6
    elif rounded < 0:
        rounded += 1e6
    micros = <long long>rounded
    seconds = <long long>floor(epoch)
    if micros < 500_000 and epoch - floor(epoch) > 0.5:  # rounded up to a new second
        seconds += 1
    return PyLong_FromLongLong(seconds * 1000 + micros // 1000)


cdef object _ms_of_python(object epoch):
    """decode_py's _timed, word for word (its exceptions too)."""
    micros = datetime.fromtimestamp(epoch, UTC).microsecond
    seconds = math.floor(epoch)
    if micros < 500_000 and epoch - seconds > 0.5:
        seconds += 1
    return seconds * 1000 + micros // 1000


cdef object _values(dict item):
    """The measurements of a reading object, or why not (decode_py's _values).

    The object itself when it holds only measurements, as decode_py's usual case;
    else a new dict without the reserved keys, integers beyond 64 bits as floats.
    """
    cdef Py_ssize_t position = 0, count = 0
    cdef PyObject *key_ptr
    cdef PyObject *value_ptr
    cdef bint copy = False
    cdef int overflow
    cdef double number
    while PyDict_Next(item, &position, &key_ptr, &value_ptr):
        key = <object>key_ptr
        value = <object>value_ptr
        if _reserved(key):
            copy = True
            continue
        if not _name_ok(key):
            return "bad_field_name", f"field {key[:40]!r} must match {_NAME_PATTERN}"
        if type(value) is float:
            number = PyFloat_AS_DOUBLE(value)
            if not -_MAX <= number <= _MAX:  # also false for NaN
                return "bad_value", f"{key}: {_BEYOND}"
        elif type(value) is int:
            overflow = 0
            PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                copy = True
        else:
            return "bad_value", f"{key}: expected a number, got {type(value).__name__}"
        count += 1
    if count == 0:
        return "no_measurements", "no numeric measurement in reading"
    if not copy:
        return item
    values = {}
    for key, value in item.items():
        if _reserved(key):
            continue
        if type(value) is int:
            overflow = 0
            PyLong_AsLongLongAndOverflow(value, &overflow)
            if overflow:
                # BSON has no wider integer (see decode.py).
                value = float(value)
        values[key] = value
    return values
