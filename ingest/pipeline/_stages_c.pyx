# cython: language_level=3
"""Compiled twin of ingest/pipeline/stages.py: ``held_bytes`` (twin of ``held_bytes_py``).

The same estimate for every input, the same exceptions: a list of exactly ``Reading``
with dict values is counted here; anything else takes the Python twin's steps.
"""

from cpython.dict cimport PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

from ingest.model import Reading

# The estimates of ingest/pipeline/stages.py (a test holds them equal).
MESSAGE_BYTES = 256
READING_BYTES = 512
VALUE_BYTES = 48
REJECT_DOC_BYTES = 768

cdef object _Reading = Reading
cdef Py_ssize_t _VALUES = Reading._fields.index("values")


cdef object _values_count(object readings):
    """``sum([len(reading.values) for reading in readings])``, in the same steps."""
    cdef Py_ssize_t i = 0, count, total = 0
    cdef object reading, values, big = None
    if type(readings) is not list:
        return sum([len(r.values) for r in readings])
    while i < PyList_GET_SIZE(readings):  # as a list iterator: the length checked each step
        reading = <object>PyList_GET_ITEM(readings, i)
        i += 1
        if type(reading) is _Reading and PyTuple_GET_SIZE(reading) > _VALUES:
            values = <object>PyTuple_GET_ITEM(reading, _VALUES)
        else:
            values = reading.values
        count = PyDict_Size(values) if type(values) is dict else len(values)
        if big is not None:
            big += count
        elif total > PY_SSIZE_T_MAX - count:
            big = total
            big += count
        else:
            total += count
    return total if big is None else big


def held_bytes(message, readings, docs):
    """Estimated memory one taken message holds until it is acknowledged."""
    size = MESSAGE_BYTES + len(message.payload) + len(message.topic)
    if readings:
        size += READING_BYTES * len(readings) + VALUE_BYTES * _values_count(readings)
    for doc in docs:
        size += REJECT_DOC_BYTES + len(doc["payload"]) + len(doc["detail"])
    return size
