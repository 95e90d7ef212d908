"""One series, one instant, one reading: what both layouts do with readings that meet.

A *series* is a sensor id and its identity tags (``Reading.tags``); an *instant* is a
millisecond, as BSON stores a time. Readings of one series at one instant are one
reading: their fields merge (Sparkplug tag groups, Telegraf plugins, several topics of
one device). A field that is already there with the same value adds nothing; the same
field with another value is a conflict, and the later reading is refused
(``ts_conflict``) while the stored one is kept. ``seq`` is kept from the first reading of
the instant and never makes a conflict.

Both writers use these functions, within a batch and against what is stored, so the two
layouts store and refuse the same readings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from ingest.model import Reading

type TagsKey = tuple[tuple[str, str], ...]
NO_TAGS: TagsKey = ()
# Fields of a stored bucket ``readings`` entry or time-series document that are not
# measurements.
NOT_VALUES = frozenset({"_id", "ts", "seq", "meta", "units", "info"})


def tags_key(tags: dict[str, str] | None) -> TagsKey:
    """A reading's identity tags in name order (the canonical form of its series)."""
    if not tags:
        return NO_TAGS
    return tuple(sorted(tags.items()))


def same_value(a: object, b: object) -> bool:
    """Whether two stored values are the same, ``True`` and ``1`` being different."""
    return a == b and (type(a) is bool) is (type(b) is bool)


def series_name(reading: Reading) -> str:
    """The series for a message: ``sensor`` or ``sensor{k=v,...}``."""
    if not reading.tags:
        return reading.sensor_id
    inner = ",".join(f"{k}={v}" for k, v in tags_key(reading.tags))
    return f"{reading.sensor_id}{{{inner}}}"


def conflict_detail(reading: Reading, name: str, stored: object) -> str:
    """Why a reading is refused: its series has ``name`` at that instant with another value."""
    return (
        f"{series_name(reading)} already has {name}={stored!r} at "
        f"{reading.ts.isoformat(timespec='milliseconds')} (this reading: "
        f"{reading.values[name]!r}); the stored value is kept"
    )


def new_fields(reading: Reading, stored: dict[str, Any]) -> dict[str, Any] | str:
    """The fields of ``reading`` that ``stored`` (values at its instant) lacks, or a conflict.

    An empty dict: the reading adds nothing (a duplicate).
    """
    new: dict[str, Any] = {}
    for name, value in reading.values.items():
        if name in stored:
            if not same_value(stored[name], value):
                return conflict_detail(reading, name, stored[name])
        else:
            new[name] = value
    return new


def with_fields(reading: Reading, fields: dict[str, Any]) -> Reading:
    """``reading`` holding only ``fields`` (and their units): the part still to store."""
    units = reading.units
    if units is not None:
        units = {k: u for k, u in units.items() if k in fields} or None
    return reading._replace(values=fields, units=units)


def merged(first: Reading, other: Reading) -> Reading | str | None:
    """``first`` with the fields of ``other`` (same series and instant) added.

    None: ``other`` adds nothing (a duplicate); a string: the conflict that refuses it.
    """
    new = new_fields(other, first.values)
    if isinstance(new, str):
        return new
    if not new:
        return None
    units = first.units
    if other.units:
        units = {**(units or {}), **{k: u for k, u in other.units.items() if k in new}}
    # No tags (the default format: numbers only) and empty tags (a mapping rule: strings
    # and booleans too) are one series; the merged reading may hold the mapping's values,
    # so it is a mapping reading, which the writers take strings and booleans from.
    tags = first.tags if first.tags is not None else other.tags
    return first._replace(values={**first.values, **new}, units=units or None, tags=tags)


def stored_values(entry: dict[str, Any]) -> dict[str, Any]:
    """The measurements of a stored bucket entry or time-series document."""
    return {k: v for k, v in entry.items() if k not in NOT_VALUES}


def merge_series(
    group: list[Reading],
    instant: Callable[[Reading], Hashable],
) -> tuple[list[tuple[Reading, list[Reading]]], list[Reading]]:
    """Readings, one per instant, each with the readings it stands for; and the deferred.

    ``instant(reading)`` names a reading's series and instant (within one series, its
    millisecond is enough). Readings of one instant whose fields are disjoint merge. One
    that repeats a field of an earlier one is deferred, to be judged once the earlier
    ones are written, against what is then stored: so whether it is a duplicate, a
    conflict or adds something is decided as if every reading were written one after
    the other, whatever the batches. Merged readings come in order of first arrival.
    """
    seen: dict[Hashable, tuple[Reading, list[Reading]]] = {}
    deferred: list[Reading] = []
    waiting: set[Hashable] = set()  # instants with a deferred reading: the later ones wait too
    for reading in group:
        key = instant(reading)
        first = seen.get(key)
        if first is None:
            seen[key] = (reading, [reading])
            continue
        if key in waiting or not first[0].values.keys().isdisjoint(reading.values):
            # Deferred, and every later reading of the instant with it: merged ahead of a
            # deferred one, a later reading would be judged before it, out of order.
            waiting.add(key)
            deferred.append(reading)
            continue
        result = merged(first[0], reading)
        assert isinstance(result, tuple), "disjoint fields always merge"
        first[1].append(reading)
        seen[key] = (result, first[1])
    return list(seen.values()), deferred
