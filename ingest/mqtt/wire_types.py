"""The types of the PUBLISH scan: what it reads from, what it calls, what it hands over.

Beside the scan (``_wire_py.py``, compiled as ``_wire_c``) and ``wire.py``, which picks it:
both import them from here, so neither imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

# The Subscription Identifiers a PUBLISH carries: 0 for none, the identifier when it
# carries one (the usual case), a tuple of them when it carries several.
type Subscription = int | tuple[int, ...]
# topic, payload, mid, qos, dup, retain (the PUBLISH's RETAIN flag as delivered),
# subscription
type Deliver = Callable[[str, bytes, int, int, bool, bool, Subscription], None]


class Cursor(Protocol):
    """A read buffer's reader as :func:`scan` sees it: where it is, and whether paused."""

    _pos: int  # the next unread byte of the buffer
    _paused: bool  # set by a delivery that pauses the reader: the scan stops after it
