# cython: language_level=3
"""Compiled twin of ingest.devices.mapping.readings_py (a rule applied to a format's items).

An item of the common shape (an ``Item`` with a time of its own and no problems, units or
line tags, the topic's sensor id, and no tags but the rule's descriptive ones, ``info``)
is made a reading here as ``Mapping._reading`` makes it: its time read by the functions
that method uses (``times.text``, else ``times.parse``), the same window, its values by
``mapping.values`` (the same picked function), the rule's tags rendered as ``_info``
renders them. Every other item, and an item whose time, window or info is not the plain
case, goes to ``Mapping._reading``, which decides it: nothing is appended to the
rejections before that.
"""

from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

cdef extern from "Python.h":
    bint PyUnicode_CheckExact(object)
    bint PyDict_CheckExact(object)
    bint PyUnicode_IS_ASCII(object)

cdef bint _ready = False
cdef object _Decoded = None
cdef object _Reading = None
cdef object _Rejection = None
cdef object _Item = None
cdef object _Topic = None
cdef object _Template = None
cdef object _values = None
cdef object _text = None
cdef object _parse = None
cdef object _too_long = None
cdef Py_ssize_t _MAX_TAGS = 0
cdef Py_ssize_t _MAX_TAG_BYTES = 0
cdef object _new = tuple.__new__
cdef object _SLOW = object()  # _fast's answer for an item Mapping._reading decides

# Item's and _Topic's fields, by position
cdef enum: ITEM_FIELDS = 9
cdef enum: FIELDS = 0
cdef enum: TS = 1
cdef enum: EPOCH = 2
cdef enum: TAGS = 4
cdef enum: UNITS = 5
cdef enum: CONTEXT = 6
cdef enum: PROBLEMS = 7
cdef enum: TOPIC_FIELDS = 5
cdef enum: RULE = 0
cdef enum: TOPIC_TAGS = 2
cdef enum: SENSOR = 3
cdef enum: INFO_ONLY = 4


cdef int _init() except -1:
    global _ready, _Decoded, _Reading, _Rejection, _Item, _Topic, _Template, _values, _text, _parse
    global _too_long, _MAX_TAGS, _MAX_TAG_BYTES
    from ingest.devices import mapping
    from ingest.devices.formats import Item, times
    from ingest.devices.rules import Template
    if Item._fields != ("fields", "ts", "epoch", "sensor", "tags", "units", "context",
                        "problems", "position"):
        raise ImportError(f"Item has other fields: {Item._fields}")
    if mapping._Topic._fields != ("rule", "captures", "tags", "sensor", "info_only"):
        raise ImportError(f"mapping._Topic has other fields: {mapping._Topic._fields}")
    _Decoded = mapping.Decoded
    _Reading = mapping.Reading
    _Rejection = mapping.Rejection
    _Item = Item
    _Topic = mapping._Topic
    _Template = Template
    _values = mapping.values
    _text = times.text
    _parse = times.parse
    _too_long = mapping._too_long
    _MAX_TAGS = mapping.MAX_TAGS
    _MAX_TAG_BYTES = mapping.MAX_TAG_BYTES
    _ready = True
    return 0


cdef inline object _at(object obj, Py_ssize_t index):
    return <object>PyTuple_GET_ITEM(obj, index)


cdef bint _long(object text) except -1:
    """mapping._too_long: an ASCII str here (its UTF-8 is as long), else that function."""
    if PyUnicode_CheckExact(text) and PyUnicode_IS_ASCII(text):
        return len(<str>text) > _MAX_TAG_BYTES
    return bool(_too_long(text))


cdef object _info(object matched, object rule, dict context):
    """mapping._info: the rule's tags rendered from ``context``, or None."""
    cdef dict info = {}
    for key, template in rule.tags.items():
        if type(template) is _Template and template.single is not None:
            rendered = context.get(template.single)  # Template.render
        else:
            rendered = template.render(context)
        if rendered is not None:
            if _long(rendered):
                return None
            info[key] = rendered
    if len(_at(matched, TOPIC_TAGS)) + len(info) > _MAX_TAGS:
        return None
    return info


cdef object _fast(object mapping, object matched, object item, tuple window,
                  list rejections, object index):
    """Mapping._reading of a common item; _SLOW (nothing done) for any other."""
    if type(item) is not _Item or PyTuple_GET_SIZE(item) != ITEM_FIELDS:
        return _SLOW
    cdef object ts = _at(item, TS)
    cdef object context = _at(item, CONTEXT)
    cdef object rule = _at(matched, RULE)
    cdef object sensor = _at(matched, SENSOR)
    cdef object info = None
    if (_at(item, PROBLEMS) is not None or not PyUnicode_CheckExact(sensor) or ts is None
            or _at(item, EPOCH) is not None or _at(item, TAGS) is not None
            or _at(item, UNITS) or rule.units):
        return _SLOW
    if context is None:
        if rule.info:  # the topic's descriptive tags are split off there
            return _SLOW
    elif not _at(matched, INFO_ONLY) or not PyDict_CheckExact(context):
        return _SLOW
    else:
        info = _info(matched, rule, <dict>context)
        if info is None:
            return _SLOW
    spec = rule.time
    if PyUnicode_CheckExact(ts):
        instant = _text(ts, spec.format, spec.zone)  # what times.parse does for a str
    else:
        instant = _parse(ts, spec.format, spec.zone)
    if instant is None:
        return _SLOW
    epoch, ms = instant
    if not window[0] <= epoch <= window[1]:
        return _SLOW
    # From here the reading is decided here: values appends its field-level rejections.
    values = _values(mapping, rule, _at(item, FIELDS), rejections, index)
    if not values:
        rejections.append(_Rejection("no_measurements", "no measurement left to store", index))
        return None
    if info is not None:
        info = info or None
    return _new(_Reading, (sensor, None, epoch, values, None, ms, _at(matched, TOPIC_TAGS),
                           None, info))


def readings(mapping, matched, parsed, received_at, limits):
    """mapping.readings_py."""
    if not _ready:
        _init()
    cdef list found = []
    rejections = parsed.rejections
    out = _new(_Decoded, (found, rejections))
    cdef tuple window = (received_at - limits.max_past_seconds,
                         received_at + limits.max_future_seconds)
    items = parsed.items
    cdef bint several = len(items) > 1
    cdef bint common = (type(matched) is _Topic and PyTuple_GET_SIZE(matched) == TOPIC_FIELDS
                        and type(rejections) is list)
    cdef Py_ssize_t position = 0
    for item in items:
        index = item.position
        if index is None and several:
            index = position
        reading = (_fast(mapping, matched, item, window, rejections, index)
                   if common else _SLOW)
        if reading is _SLOW:
            reading = mapping._reading(matched, item, received_at, window, rejections, index)
        if reading is not None:
            found.append(reading)
        position += 1
    return out
