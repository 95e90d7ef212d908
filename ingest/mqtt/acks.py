"""The acknowledgement ledger, as the package names it.

Written once, in ``_acks_py.py``, which Cython compiles as ``_acks_c`` (see
ingest/accel.py): :class:`AckLedger` is the one :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ingest import accel
from ingest.mqtt import _acks_py

if TYPE_CHECKING:
    from ingest.model import Inbound

# Sends the PUBACKs of these messages, in this order, on the current connection.
type Send = Callable[[list[Inbound]], None]

AckLedger = accel.pick(_acks_py.AckLedger, "ingest.mqtt._acks_c", "AckLedger")
