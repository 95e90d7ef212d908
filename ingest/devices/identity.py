"""``--sensor-id-from-topic``: a reading's sensor is the one its topic names.

With per-device broker accounts (deploy/mosquitto/acl: ``pattern write sensors/%u/#``)
the topic is what the broker vouches for; a payload's ``sensor_id`` (the default format
lets one override the topic's) is only the device's word. Under this option a reading
whose sensor differs from the one the topic names is refused (``sensor_id_mismatch``,
counted and kept in ``rejects``), so a device cannot write as another one whatever it
puts in its payload. Topics that name no device (see
:meth:`ingest.devices.mapping.Mapping.topic_sensor`) are left as they are.
"""

from __future__ import annotations

from ingest.model import Decoded, Rejection


def refuse_others(decoded: Decoded, expected: str | None, single: bool) -> Decoded:
    """``decoded`` without the readings of another sensor than ``expected``, refused.

    ``single``: the message held one reading (a rejection then has no index).
    """
    readings = decoded.readings
    if expected is None or all(r.sensor_id == expected for r in readings):
        return decoded
    kept = []
    rejections = list(decoded.rejections)
    for index, reading in enumerate(readings):
        if reading.sensor_id == expected:
            kept.append(reading)
        else:
            rejections.append(
                Rejection(
                    "sensor_id_mismatch",
                    f"the payload names sensor {reading.sensor_id[:60]!r}, "
                    f"the topic {expected[:60]!r} (--sensor-id-from-topic)",
                    None if single else index,
                )
            )
    return Decoded(kept, rejections)
