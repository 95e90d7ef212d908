"""Plain data carried between the pipeline stages, and what a reading may hold.

The rules for names, sensor ids and tags are shared by the decoders (ingest/devices), the
store's validator (ingest/store/schema.py) and the read API's parameters (ingest/api).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

# A measurement or tag name.
NAME_PATTERN = r"[A-Za-z0-9_-]{1,64}"
# A sensor id is the device's own name, kept exactly: any text a topic level can hold
# (every Unicode character but the control characters), 1 to 128 characters. Sensor ids
# are values, never field names, so MongoDB needs no escaping of them.
SENSOR_ID_MAX = 128  # characters
SENSOR_ID_CONTROLS = ((0x00, 0x1F), (0x7F, 0x9F))  # code points refused: C0, then DEL and C1
SENSOR_ID_PATTERN = (
    "[^"
    + "".join(f"\\x{first:02x}-\\x{last:02x}" for first, last in SENSOR_ID_CONTROLS)
    + f"]{{1,{SENSOR_ID_MAX}}}"
)
SENSOR_ID_RULE = f"1 to {SENSOR_ID_MAX} characters, no control characters"
# Keys of a reading that are not measurements: "_id", "meta", "units", "info" and "tags"
# would collide with the documents' own fields in either layout.
RESERVED_FIELDS = frozenset({"ts", "seq", "sensor_id", "_id", "meta", "units", "info", "tags"})
# Tag names that would collide with the documents' own fields.
RESERVED_TAGS = frozenset({"sensor_id", "units", "_id"})
MAX_TAGS = 32  # tags of one reading
MAX_TAG_BYTES = 256  # a tag value

type Number = int | float
# A measurement's value: numbers from every format; booleans and strings from mappings.
type Scalar = int | float | bool | str


class Reading(NamedTuple):
    """One accepted sensor reading: a timestamp, its measurements, tags, units and info.

    Its series is ``sensor_id`` and ``tags`` (the identity tags); its instant is ``ms``.

    A NamedTuple rather than a frozen dataclass: one is built per reading on the hot
    path, and a tuple is several times cheaper to create.
    """

    sensor_id: str
    # The time as a datetime, whole milliseconds as BSON stores it, or None when ``ms``
    # is set: the decoders leave it out (building a datetime costs more than the rest of
    # a reading's tuple, and the writers use ``ms``); :attr:`ts` gives it either way.
    when: datetime | None
    epoch: float
    values: dict[str, Scalar]
    seq: int | None = None
    # ``ts`` as whole milliseconds since the epoch (set by the decoder, which has it
    # cheaply): bucket mode's identity of a reading. None: computed from ``ts``.
    ms: int | None = None
    # Tags (topic captures, line protocol tags, rule constants). None: a reading of the
    # default decoder, whose values are numbers only; the mapping path always sets a dict
    # (often empty and shared), which tells the writers that values may also be booleans
    # or strings. So the default path allocates nothing and does no per-kind work.
    tags: dict[str, str] | None = None
    # Units by measurement (SenML ``u``); None when there are none.
    units: dict[str, str] | None = None
    # Descriptive tags (a rule's ``info``): stored with the reading, not part of its
    # series; None when there are none.
    info: dict[str, str] | None = None

    @property
    def ts(self) -> datetime:
        """The time as an aware UTC datetime (whole milliseconds)."""
        when = self.when
        if when is not None:
            return when
        assert self.ms is not None, "a Reading needs its time: when or ms"
        return _EPOCH + self.ms * _MS


@dataclass(slots=True, frozen=True)
class Rejection:
    """A reading (or whole message) that was refused, with a low-cardinality reason."""

    reason: str
    detail: str
    index: int | None = None


class Decoded(NamedTuple):
    """What one MQTT message turned into (a NamedTuple: one is built per message).

    Both lists are given at every construction: a default list would be shared.
    """

    readings: list[Reading]
    rejections: list[Rejection]


class Inbound(NamedTuple):
    """One MQTT message as received, with what is needed to acknowledge it later.

    A NamedTuple for the same reason as :class:`Reading`: one is built per message, and
    a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) costs more than
    twice as much.
    """

    topic: str
    payload: bytes
    mid: int
    qos: int
    generation: int
    received_at: float
    dup: bool = False
    # The RETAIN flag as delivered: set only on a retained message the broker sent because
    # the daemon subscribed (Retain As Published is off), i.e. old state, not a new reading.
    retained: bool = False
