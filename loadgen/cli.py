"""Entry point of the ``loadgen`` command (the tool itself is not built yet)."""

from __future__ import annotations

import sys


def main() -> int:
    """Say plainly that loadgen is not available in this version."""
    print("loadgen: not implemented in this version", file=sys.stderr)  # noqa: T201
    return 2
