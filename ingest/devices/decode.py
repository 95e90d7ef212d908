"""Pure decoding: topic + payload bytes -> accepted readings and counted rejections.

No I/O here. Every problem becomes a :class:`Rejection` with a reason from
:data:`REASONS`; nothing but a rejection ever leaves this module for bad input.
:func:`decode_py` is written once, in ``_decode_py.py``, and compiled from there as
``_decode_c`` (see ingest/accel.py); the rest of the package calls :data:`decode`, the
one :func:`ingest.accel.pick` chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingest import accel, caches

# The default format itself (its limits, reasons and details) is in _decode_py.py.
from ingest.devices._decode_py import BEYOND_MAGNITUDE as BEYOND_MAGNITUDE  # noqa: PLC0414
from ingest.devices._decode_py import MAX_MAGNITUDE as MAX_MAGNITUDE  # noqa: PLC0414
from ingest.devices._decode_py import decode as decode_py
from ingest.devices._decode_py import sensor_from_topic as sensor_from_topic  # noqa: PLC0414
from ingest.devices._decode_py import sensors_cached as _sensors_cached_py
from ingest.devices._decode_py import value_count as _value_count_py

# Reasons given when a reading is written, not decoded.
WRITE_REASONS: tuple[str, ...] = (
    "write_rejected",  # MongoDB refused the document (validator, size...)
    "ts_conflict",  # bucket mode: the sensor has a stored reading at that ts, other values
)
# Reasons only the mapping rules give (ingest/devices/mapping.py).
MAPPING_REASONS: tuple[str, ...] = (
    "no_rule",  # mapping rules are configured and none matches the topic
    "bad_tag_name",  # a payload's tag without a name of its own once made safe
)
# Reasons given after decoding, whatever the format (ingest/devices/identity.py).
IDENTITY_REASONS: tuple[str, ...] = (
    "sensor_id_mismatch",  # --sensor-id-from-topic: the payload names another sensor
)
# Every reason a reading can be rejected for; metrics initialise one series per reason.
REASONS: tuple[str, ...] = (
    "too_large",  # payload above --max-message-bytes, refused before parsing
    "invalid_utf8",  # payload is not UTF-8
    "invalid_json",  # not JSON, nested too deep, or NaN/Infinity literals
    "bad_shape",  # JSON that is not a reading object, an array, or an envelope
    "no_readings",  # an empty array or envelope
    "too_many_readings",  # more readings in one message than --max-readings-per-message
    "no_sensor_id",  # neither the payload nor the topic names a sensor
    "bad_sensor_id",  # sensor id not matching the allowed pattern
    "bad_field_name",  # a key that could address a MongoDB operator or path
    "bad_value",  # a measurement that is not a number (strings, booleans, null...)
    "bad_timestamp",  # ts that is not epoch seconds or ISO-8601 with an offset
    "ts_out_of_window",  # ts too far in the past or the future
    "bad_seq",  # seq that is not a non-negative 64-bit integer
    "no_measurements",  # a reading with no numeric measurement
    *MAPPING_REASONS,
    *IDENTITY_REASONS,
    *WRITE_REASONS,
)


class Arrivals:
    """Arrival times for readings without their own: one instant per reading.

    A reading without a time takes its arrival time, in milliseconds, but never one at
    or before the last arrival time given to its sensor: several such readings of one
    sensor (in one message, or in a burst of messages within a millisecond, as devices
    that publish each value as its own message send) are timed apart, a millisecond
    each, in the order they came, instead of meeting at one instant. Worker ``slot`` of
    ``stride`` workers gives only milliseconds == slot (mod stride), so two workers never
    give one sensor the same one. The daemon's default format uses the process's
    :data:`ARRIVALS`; each set of mapping rules has its own.

    ``given``, when a list, receives every time given, in order: the pipeline records a
    message's times so that a redelivery can take them again (:class:`Replayed`).

    The last time given to each sensor is kept for at most ``ingest.caches.limit``
    sensors: when that many are held, those whose time the clock has passed are
    forgotten (for them the arrival time is later anyway, so forgetting changes no time
    given). Only sensors given times ahead of the clock, by a burst, stay beyond it.
    """

    __slots__ = ("_full", "_last", "_slot", "_stride", "given")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}  # sensor -> last arrival time given, in ms
        self._full = 0  # entries at which the passed ones are forgotten (0: not yet set)
        self._slot, self._stride = 0, 1
        self.given: list[int] | None = None

    def held(self) -> int:
        """Sensors whose last arrival time is held."""
        return len(self._last)

    def spread(self, slot: int, stride: int) -> None:
        """Give only milliseconds == ``slot`` (mod ``stride``): worker ``slot`` of ``stride``."""
        self._slot, self._stride = slot, stride

    def next(self, sensor: str, ms: int) -> int:
        """The arrival time to give a reading of ``sensor`` that arrived at ``ms``."""
        last = self._last.get(sensor)
        if last is None:
            if len(self._last) >= self._full:  # only a new sensor grows the cache
                self._forget(ms)
        elif ms <= last:
            ms = last + 1
        if self._stride > 1:
            ms += (self._slot - ms) % self._stride
        self._last[sensor] = ms
        given = self.given
        if given is not None:
            given.append(ms)
        return ms

    def _forget(self, now: int) -> None:
        """Forget the sensors whose last time is before ``now`` (ms): they change nothing.

        The times given before ``now`` stay distinct from those given from now on, which
        are at ``now`` or later. If too few are forgotten (a burst ran ahead of the
        clock), the next forgetting waits until the cache has doubled, so the work stays
        in proportion to the entries added.
        """
        limit = caches.limit
        self._last = {sensor: ms for sensor, ms in self._last.items() if ms >= now}
        self._full = max(limit, 2 * len(self._last))


class Replayed(Arrivals):
    """The times a message's first delivery gave its readings, given again in order.

    For the redelivery of a message whose times were recorded: decoded from the same
    payload, it asks for as many, in the same order (past them, not expected, it gives
    arrival times as :class:`Arrivals` does).
    """

    __slots__ = ("_at", "_times")

    def __init__(self, times: tuple[int, ...], given: list[int] | None) -> None:
        super().__init__()
        self._times, self._at = times, 0
        self.given = given

    def next(self, sensor: str, ms: int) -> int:
        """The next recorded time; past the recorded ones, an arrival time as usual."""
        if self._at >= len(self._times):
            return super().next(sensor, ms)
        ms = self._times[self._at]
        self._at += 1
        if self.given is not None:
            self.given.append(ms)
        return ms


# This process's arrival times for the default format.
ARRIVALS = Arrivals()


@dataclass(frozen=True, slots=True)
class Limits:
    """What the decoder accepts; built from the settings."""

    max_message_bytes: int = 1024 * 1024
    max_readings: int = 10_000
    max_past_seconds: float = 365 * 86400.0
    max_future_seconds: float = 600.0


decode = accel.pick(decode_py, "ingest.devices._decode_c", "decode")
sensors_cached = accel.pick(_sensors_cached_py, "ingest.devices._decode_c", "sensors_cached")
value_count = accel.pick(_value_count_py, "ingest.devices._decode_c", "value_count")
