"""Build the optional compiled accelerators (Cython); everything else is in pyproject.toml.

Two kinds of compiled module, both named ``_<name>_c`` (ingest/accel.py picks them):

- **compiled Python** (the rule): ``_<name>_py.py`` is the one source of the rule, and is
  what runs without a compiler; Cython compiles that same file as ``_<name>_c``, with the
  types and ``cdef`` declarations of the augmenting ``_<name>_c.pxd`` beside it (Cython's
  pure-Python mode, as aiohttp compiles its websocket reader);
- **kernels** (``_<name>_c.pyx``): hand-written Cython only where the compiled algorithm
  genuinely differs from the Python one (the selective JSON scanner, the BSON writer, the
  ISO-8601 fast path); a kernel answers "not sure" to the Python around it rather than
  holding a copy of its rules.

The extensions are optional, as aiohttp's, yarl's and frozenlist's are: without a C
compiler, or with ``INGEST_NO_EXTENSIONS=1`` set at build time, ``pip install`` installs
the pure-Python path and the daemon says so at start. A build with the variable set leaves
a note, ``ingest/NO_EXTENSIONS``, in what it installs (in the source tree for an editable
install), so that the daemon, started later without the variable, says why nothing is
compiled. Cython's warnings are shown, and fail the build.
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


def drop_stale_c(python: Path) -> None:
    """Remove the C that Cython wrote for compiled ``python`` if a ``.pxd`` is newer.

    Cython tracks a source's own ``.pxd`` by the source's name (``_<name>_py.pxd``), not
    the augmenting ``_<name>_c.pxd`` nor the ``.pxd`` files that one cimports; without
    its C, cythonize writes it again.
    """
    c_file = python.with_suffix(".c")
    pxds = [p.stat().st_mtime for p in HERE.glob("ingest/**/*.pxd")]
    if c_file.exists() and pxds and max(pxds) > c_file.stat().st_mtime:
        c_file.unlink()


def extensions() -> list[Extension]:
    """The accelerators, or none when they are turned off or Cython is missing."""
    if turned_off():
        return []
    try:
        from Cython.Build import cythonize  # noqa: PLC0415 - a build-time requirement
        from Cython.Compiler import Options  # noqa: PLC0415
    except ImportError:
        return []
    # Module name -> source: the .pyx kernels, and the compiled Python (a _<name>_c.pxd
    # with no .pyx of its name augments _<name>_py.py).
    sources = {p.with_suffix(""): p for p in HERE.glob("ingest/**/_*_c.pyx")}
    for pxd in HERE.glob("ingest/**/_*_c.pxd"):
        if pxd.with_suffix("") not in sources:
            sources[pxd.with_suffix("")] = pxd.with_name(pxd.name[: -len("_c.pxd")] + "_py.py")
            drop_stale_c(sources[pxd.with_suffix("")])
    Options.warning_errors = True  # a Cython warning (a deprecated DEF, say) fails the build
    modules = cythonize(
        [
            Extension(
                name.relative_to(HERE).as_posix().replace("/", "."),
                [source.relative_to(HERE).as_posix()],
            )
            for name, source in sorted(sources.items())
        ],
        language_level=3,
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
