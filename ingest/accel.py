"""Compiled accelerators and their pure-Python twins: which one runs.

A business rule (validation, mapping, statistics) is written once, in Python. Where
profiling shows Python itself is the limit, the rule lives in ``_<name>_py.py``, which
runs as it is without a compiler, and setup.py compiles that same file as ``_<name>_c``
with the types of the augmenting ``_<name>_c.pxd`` beside it (Cython's pure-Python mode,
as aiohttp builds its websocket reader). A hand-written kernel (``_<name>_c.pyx``) is
only for a step whose compiled algorithm differs from any Python we would write (the
selective JSON scanner, the BSON writer, the ISO-8601 fast path): small, and answering
"not sure" to the Python around it rather than holding a copy of its rules. The public
module hands out one of the two with :func:`pick`, where ``pip install`` built the
compiled one::

    decode = accel.pick(_decode_py.decode, "ingest.devices._decode_c", "decode")

The compiled twin is used when it was built and imports, unless ``INGEST_NO_EXTENSIONS``
is set to anything but ``0`` (as aiohttp's ``AIOHTTP_NO_EXTENSIONS``); then every twin is
the Python one. Both must behave identically, rejections and exceptions included
(tests/test_accel.py runs them side by side on generated input). The daemon says at start
which path runs (:func:`describe`) and exports it as ``ingest_build_info{accelerated}``.

A compiled function that meets input it does not handle may hand it to its Python twin.
Only the documented "not supported" signal of a kernel does so silently; any other cause
(an exception, a bug) goes through :func:`fell_back`: counted per function and cause
(``ingest_accelerator_fallbacks_total``) and logged once per cause, so that a bug in a
compiled path shows as a line in the log, not as an unexplained slowdown.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType

ENV = "INGEST_NO_EXTENSIONS"
# Left by a build with INGEST_NO_EXTENSIONS set (setup.py): why nothing is compiled.
BUILD_NOTE = Path(__file__).with_name("NO_EXTENSIONS")
# Compiled module name -> whether it was loaded (False: not built, or turned off).
_loaded: dict[str, bool] = {}
_modules: dict[str, ModuleType] = {}
_errors: dict[str, str] = {}
# (function, cause) -> how many calls the compiled function handed to its Python twin.
_fallbacks: dict[tuple[str, str], int] = {}
logger = logging.getLogger(__name__)


def disabled() -> bool:
    """Whether ``INGEST_NO_EXTENSIONS`` turns the compiled twins off."""
    return os.environ.get(ENV, "") not in ("", "0")


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """What of ``env`` our child processes keep, however clean their environment.

    The choice of path (``INGEST_NO_EXTENSIONS``), so that it holds for the whole process
    tree (``ingest local``'s parts, loadgen's daemons).
    """
    return {ENV: env[ENV]} if ENV in env else {}


def pick[F](python: F, module: str, name: str) -> F:
    """The compiled twin ``module.name`` of ``python`` if it is built and allowed, else it."""
    if module not in _loaded:
        _loaded[module] = False
        if not disabled():
            try:
                _modules[module] = importlib.import_module(module)
            except ImportError as exc:
                _errors[module] = str(exc)
            else:
                _loaded[module] = True
    if not _loaded[module]:
        return python
    return cast("F", getattr(_modules[module], name))


def accelerated() -> bool:
    """True when every compiled twin asked for is the one running."""
    return bool(_loaded) and all(_loaded.values())


def describe() -> str:
    """One line for the start-up log: which path runs, and why when it is Python."""
    names = sorted(_loaded)
    if accelerated():
        return f"accelerators: compiled ({', '.join(m.rsplit('.', 1)[-1] for m in names)})"
    if disabled():
        return f"accelerators: off ({ENV} is set): pure Python"
    missing = [m for m in names if not _loaded[m]]
    if len(missing) == len(names):
        if BUILD_NOTE.is_file():
            return f"accelerators: off ({ENV} was set at install): pure Python"
        return "accelerators: not built (no C compiler at install?): pure Python"
    return (
        f"accelerators: partly built, pure Python for "
        f"{', '.join(m.rsplit('.', 1)[-1] for m in missing)}"
    )


def fell_back(function: str, exc: BaseException) -> None:
    """Count a call of compiled ``function`` handed to its Python twin because of ``exc``.

    The first of each cause is logged (as a warning, with the exception's text); every one
    is counted. Call it from the ``except`` clause that then runs the Python twin.
    """
    cause = type(exc).__name__
    seen = _fallbacks.get((function, cause), 0)
    _fallbacks[function, cause] = seen + 1
    if not seen:
        logger.warning(
            "compiled %s handed a call to its Python twin (%s: %s); further ones of this "
            "cause are counted in ingest_accelerator_fallbacks_total, not logged",
            function,
            cause,
            exc,
        )


def fallbacks() -> dict[tuple[str, str], int]:
    """(function, cause) -> calls handed to the Python twin so far (see :func:`fell_back`)."""
    return dict(_fallbacks)
