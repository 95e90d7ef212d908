"""The compiled twin of a pure-Python module, imported directly (whatever
INGEST_NO_EXTENSIONS says), for the tests that run both on the same input."""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

import pytest

from ingest import accel

if TYPE_CHECKING:
    from pathlib import Path
    from types import ModuleType


def compiled(module: str) -> ModuleType:
    """The built extension ``module``; the test is skipped, with the reason, if it is not.

    ``scripts/env.sh`` and ``pip install`` build it wherever a C compiler is present (CI
    included), so this skips only on a machine that cannot compile, and in the suite's
    pure-Python run (``INGEST_NO_EXTENSIONS`` set), where running a twin against its
    reference again would repeat the compiled run's test exactly.
    """
    if accel.disabled():
        pytest.skip(
            f"{accel.ENV} is set: the twins are compared in the compiled run",
            allow_module_level=True,
        )
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(
            f"{module} is not built ({exc}): pip install needs a C compiler",
            allow_module_level=True,
        )


def compiled_or_none(module: str) -> ModuleType | None:
    """The built extension ``module``, or None if it is not built (for the benchmarks)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def cimported_kernels(root: Path) -> set[str]:
    """The compiled modules that other compiled modules cimport (``from pkg cimport
    _name_c`` in their ``.pxd``): a kernel such as ``_bson_c`` is used only through
    them, picked by no Python module, and they do not import without it."""
    return {
        f"{package}.{name}"
        for pxd in (root / "ingest").rglob("_*_c.pxd")
        for package, name in re.findall(
            r"^from ([\w.]+) cimport (_\w+_c)$", pxd.read_text(encoding="utf-8"), re.MULTILINE
        )
    }
