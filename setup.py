"""Build the optional compiled accelerators (Cython); everything else is in pyproject.toml.

Each ``ingest/**/_*_c.pyx`` is the compiled twin of functions of the pure-Python module
beside it (ingest/accel.py picks one at import). The extensions are optional, as
aiohttp's, yarl's and frozenlist's are: without a C compiler, or with
``INGEST_NO_EXTENSIONS=1`` set at build time, ``pip install`` installs the pure-Python
path and the daemon says so at start. A build with the variable set leaves a note,
``ingest/NO_EXTENSIONS``, in what it installs (in the source tree for an editable install),
so that the daemon, started later without the variable, says why nothing is compiled.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NOTE = Path("ingest", "NO_EXTENSIONS")  # ingest/accel.py reads it


def turned_off() -> bool:
    """Whether ``INGEST_NO_EXTENSIONS`` is set for this build."""
    return os.environ.get("INGEST_NO_EXTENSIONS", "") not in ("", "0")


class BuildPyWithNote(build_py):
    """build_py, plus the note of a build with ``INGEST_NO_EXTENSIONS`` set."""

    def run(self) -> None:
        """Copy the modules, then leave the note, or take an old one away."""
        super().run()
        # An editable install runs from the source tree: the note goes there.
        note = (HERE if self.editable_mode else Path(self.build_lib)) / NOTE
        if turned_off():
            note.write_text(
                "INGEST_NO_EXTENSIONS was set when this was built: no accelerator was compiled\n",
                encoding="utf-8",
            )
        else:
            note.unlink(missing_ok=True)


def extensions() -> list[Extension]:
    """The accelerators, or none when they are turned off or Cython is missing."""
    if turned_off():
        return []
    try:
        from Cython.Build import cythonize  # noqa: PLC0415 - a build-time requirement
    except ImportError:
        return []
    sources = sorted(p.relative_to(HERE).as_posix() for p in HERE.glob("ingest/**/_*_c.pyx"))
    modules = cythonize(
        [Extension(source[:-4].replace("/", "."), [source]) for source in sources],
        language_level=3,
        quiet=True,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
        },
    )
    for module in modules:
        # Set after cythonize, which makes new Extensions without it: a compiler that is
        # missing or fails is then a warning, and the pure-Python twin runs.
        module.optional = True
    return modules


setup(ext_modules=extensions(), cmdclass={"build_py": BuildPyWithNote})
