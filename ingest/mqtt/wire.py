"""MQTT bytes on the hot path, as pure functions: PUBLISH packets in, PUBACKs out.

The functions are written once, in ``_wire_py.py``, which Cython compiles as ``_wire_c``
(see ingest/accel.py); the names the rest of the package uses are the ones
:func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

from ingest import accel
from ingest.mqtt import _wire_py, wire_types

MALFORMED = _wire_py.MALFORMED

# The types of the scan (ingest/mqtt/wire_types.py), as the package names them here.
Subscription = wire_types.Subscription
Deliver = wire_types.Deliver
Cursor = wire_types.Cursor


scan = accel.pick(_wire_py.scan, "ingest.mqtt._wire_c", "scan")
deliver_publish = accel.pick(_wire_py.deliver_publish, "ingest.mqtt._wire_c", "deliver_publish")
cut_publish = accel.pick(_wire_py.cut_publish, "ingest.mqtt._wire_c", "cut_publish")
pubacks = accel.pick(_wire_py.pubacks, "ingest.mqtt._wire_c", "pubacks")
