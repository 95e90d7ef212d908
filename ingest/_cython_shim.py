"""What a compiled-Python module (``_<name>_py.py``) reads of ``cython`` when it runs as Python.

Such a module is the one source of its rule: run as Python, and compiled by Cython as
``_<name>_c`` (setup.py). It may branch on ``cython.compiled`` (folded away by Cython) for
a C-level step that plain Python cannot say. Cython is needed to build, not to run, so the
module imports it as::

    try:
        import cython
    except ImportError:  # Cython builds the accelerators; it is not needed to run
        from ingest import _cython_shim as cython
"""

compiled = False
