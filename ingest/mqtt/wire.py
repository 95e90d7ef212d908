"""MQTT bytes on the hot path, as pure functions: the PUBACKs of a batch of acks.

Each function here may have a compiled twin in ``_wire_c.pyx`` (see ingest/accel.py);
the names the rest of the package uses are the ones :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

import struct

from ingest import accel

PUBACK = 0x40
PUBACK_HEAD = bytes((PUBACK, 2))
PUBACK_WORD = int.from_bytes(PUBACK_HEAD) << 16  # a PUBACK's head above its 16-bit id


def pubacks_py(mids: list[int]) -> bytes:
    """The PUBACK packets of QoS 1 packet ids, in order, as one blob.

    Each is 4 bytes: ``0x40 0x02`` and the id, big-endian (an MQTT 5 PUBACK without
    reason code means success). An id outside 1..65535 raises ``ValueError``.
    """
    for mid in mids:
        if not 0 < mid <= 0xFFFF:
            raise ValueError(f"packet id {mid} outside 1..65535")
    return struct.pack(f">{len(mids)}I", *[PUBACK_WORD | mid for mid in mids])


pubacks = accel.pick(pubacks_py, "ingest.mqtt._wire_c", "pubacks")
