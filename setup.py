"""Build the optional compiled accelerators (Cython); everything else is in pyproject.toml.

Each ``ingest/**/_*_c.pyx`` is the compiled twin of functions of the pure-Python module
beside it (ingest/accel.py picks one at import). The extensions are optional, as
aiohttp's, yarl's and frozenlist's are: without a C compiler, or with
``INGEST_NO_EXTENSIONS=1`` set at build time, ``pip install`` installs the pure-Python
path and the daemon says so at start.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent


def extensions() -> list[Extension]:
    """The accelerators, or none when they are turned off or Cython is missing."""
    if os.environ.get("INGEST_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize  # noqa: PLC0415 - a build-time requirement
    except ImportError:
        return []
    sources = sorted(p.relative_to(HERE).as_posix() for p in HERE.glob("ingest/**/_*_c.pyx"))
    modules = cythonize([Extension(source[:-4].replace("/", "."), [source]) for source in sources],
                        language_level=3, quiet=True, compiler_directives={
                            "boundscheck": False, "wraparound": False, "cdivision": True,
                            "embedsignature": True})
    for module in modules:
        # Set after cythonize, which makes new Extensions without it: a compiler that is
        # missing or fails is then a warning, and the pure-Python twin runs.
        module.optional = True
    return modules


setup(ext_modules=extensions())
