"""MQTT bytes on the hot path, as pure functions: PUBLISH packets in, PUBACKs out.

The functions are written once, in ``_wire_py.py``, which Cython compiles as ``_wire_c``
(see ingest/accel.py); the names the rest of the package uses are the ones
:func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ingest import accel
from ingest.mqtt import _wire_py

if TYPE_CHECKING:
    from collections.abc import Callable

MALFORMED = _wire_py.MALFORMED

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


scan = accel.pick(_wire_py.scan, "ingest.mqtt._wire_c", "scan")
deliver_publish = accel.pick(_wire_py.deliver_publish, "ingest.mqtt._wire_c", "deliver_publish")
pubacks = accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks")
