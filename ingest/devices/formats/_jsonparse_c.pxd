# The C types of _jsonparse_py.py, compiled as ingest.devices.formats._jsonparse_c (see
# setup.py). The containers typed are the exact types the rules make or check for first.
cimport cython


@cython.locals(key=object)
cpdef object walk(object obj, object path)


cpdef object template_text(object value)


cdef object _readings(dict doc, object rule)


@cython.locals(items=list, rejections=list, found=list, index=Py_ssize_t, several=bint,
               fields=dict, problems=list, context=dict)
cdef object _parse_paths(list objects, object rule, object captures, object limits)


cdef int _flatten(dict obj, str prefix, str sep, dict out, list problems, int depth) except -1
