"""Compiled twin of ingest.devices.mapping.values_py (an item's fields as a reading's values).

The common field, a name already resolved and a bool, a float within ±MAX_MAGNITUDE or an
int within int64, is stored here; every other case calls the same functions of
ingest.devices.mapping that the Python twin calls (``Mapping._resolve``, ``Mapping._kind``,
``_typed``, ``_value``, ``_at``, ``_collision``), so names, rejections and their details
are theirs. A measurement whose kind the rule declares (``[rule.types]``) always goes
through ``_typed``.
"""

from cpython.dict cimport PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject

cdef bint _ready = False
cdef object _value = None
cdef object _typed = None
cdef object _at = None
cdef object _collision = None
cdef object _DROP_VALUE = None
cdef object _Rejection = None
cdef object _values_py = None
cdef double _MAX = 0.0


cdef int _init() except -1:
    global _ready, _value, _typed, _at, _collision, _DROP_VALUE, _Rejection, _values_py, _MAX
    from ingest.devices import mapping
    from ingest.devices.decode import MAX_MAGNITUDE
    _value = mapping._value
    _typed = mapping._typed
    _at = mapping._at
    _collision = mapping._collision
    _DROP_VALUE = mapping._DROP_VALUE
    _Rejection = mapping.Rejection
    _values_py = mapping.values_py
    _MAX = MAX_MAGNITUDE
    _ready = True
    return 0


cdef inline bint _plain(object value) except -1:
    """Whether values_py stores ``value`` as it is without calling _value."""
    cdef double number
    cdef int overflow = 0
    if type(value) is bool:
        return True
    if type(value) is float:
        number = <double>value
        return -_MAX <= number <= _MAX  # NaN: False
    if type(value) is int:
        PyLong_AsLongLongAndOverflow(value, &overflow)
        return overflow == 0
    return False


def values(mapping, rule, fields, list rejections, index):
    """mapping.values_py."""
    if not _ready:
        _init()
    if type(fields) is not dict:
        return _values_py(mapping, rule, fields, rejections, index)
    cdef dict out = {}
    cdef dict names = mapping._names[rule.name]
    cdef dict kinds = mapping._kinds[rule.name] if rule.types else None
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *item
    cdef object raw, raw_value, name, stored, declared
    while PyDict_Next(<dict>fields, &pos, &key, &item):
        raw = <object>key
        raw_value = <object>item
        if raw_value is None:
            continue
        name = names.get(raw)
        if name is None:
            name = mapping._resolve(rule, raw)
        if type(name) is not str:
            rejections.append(_at(name, index))
            continue
        if not name:
            continue
        declared = None
        if kinds is not None:
            declared = kinds.get(name)
            if declared is None:
                declared = mapping._kind(rule, name)
        if _plain(raw_value):
            stored = raw_value
            if declared and (declared == "string" or (type(raw_value) is bool) != (
                    declared == "boolean")):  # a kind the rule does not declare
                stored = _typed(rule, name, raw_value, declared)
        elif declared:
            stored = _typed(rule, name, raw_value, declared)
        else:
            stored = _value(rule, name, raw_value)
        if type(stored) is _Rejection:
            rejections.append(_at(stored, index))
            continue
        if stored is _DROP_VALUE:
            continue
        if name in out:
            rejections.append(_collision(raw, name, index))
            continue
        out[name] = stored
    return out
