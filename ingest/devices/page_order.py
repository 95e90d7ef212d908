"""The order in which the read API's page charts a sensor's measurements: ``[page]``.

A mapping file or preset may hold, beside its rules, a ``[page]`` table naming the
measurements a person looks for first and those (housekeeping) to show last, as
shell-style patterns matched against the whole name, ignoring case::

    [page]
    first = ["temperature", "humidity", "power", "energy"]
    last = ["battery*", "linkquality"]

The daemon checks the table and ignores it; ``ingest api --preset``/``--mapping`` hands it
to the page (docs/presets.md).
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

_PATTERN = re.compile(r"[A-Za-z0-9_*?-]{1,64}")
_KEYS = frozenset({"first", "last"})
MAX_PATTERNS = 100  # per list

type Order = tuple[tuple[str, ...], tuple[str, ...]]  # (first, last)


def check(table: object, source: str) -> Order:
    """The ``first`` and ``last`` patterns of a ``[page]`` table (absent: none)."""
    if table is None:
        return (), ()
    if type(table) is not dict:
        raise ConfigError(f"{source}: [page] must be a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise ConfigError(
            f"{source}: [page]: unknown key(s) {', '.join(sorted(unknown))} (known: first, last)"
        )
    out: list[tuple[str, ...]] = []
    for key in ("first", "last"):
        patterns = table.get(key, [])
        if (
            type(patterns) is not list
            or len(patterns) > MAX_PATTERNS
            or not all(type(p) is str and _PATTERN.fullmatch(p) for p in patterns)
        ):
            raise ConfigError(
                f"{source}: [page] {key}: a list of at most {MAX_PATTERNS} measurement "
                "names or patterns (letters, digits, _, -, * and ?; up to 64 characters)"
            )
        out.append(tuple(patterns))
    return out[0], out[1]


def load(mapping_file: str | None, presets: Sequence[str]) -> Order:
    """The patterns of a mapping file's and presets' ``[page]`` tables, in that order.

    The files are read as the daemon reads them (an unknown preset or a bad file is
    refused there); a pattern named twice keeps its first place.
    """
    texts: list[tuple[str, str]] = []
    if mapping_file is not None:
        try:
            texts.append((f"--mapping {mapping_file}", Path(mapping_file).read_text("utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--mapping {mapping_file}: cannot read: {exc}") from None
    folder = resources.files("ingest.devices") / "presets"
    for name in presets:
        path = folder / f"{name}.toml"
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) or not path.is_file():
            raise ConfigError(f"--preset {name}: unknown preset")
        texts.append((f"--preset {name}", path.read_text("utf-8")))
    first: dict[str, None] = {}
    last: dict[str, None] = {}
    for source, text in texts:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
        more_first, more_last = check(doc.get("page"), source)
        first.update(dict.fromkeys(more_first))
        last.update(dict.fromkeys(more_last))
    return tuple(first), tuple(last)
