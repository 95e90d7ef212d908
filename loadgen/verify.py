"""Check that each reading a run published arrived exactly once, with the right values.

The expected readings are regenerated from the run's parameters (``payloads`` is a pure
function of seed, sensor index and seq), so nothing but the manifest is needed. MongoDB is
read per batch of sensors (``--sensors-per-query``), one streamed cursor per batch, so
memory holds one byte per expected reading of that batch and nothing else.

Counts per mode: ``missing`` (expected seq never seen), ``duplicated`` (occurrences past
the first), ``wrong`` (an occurrence whose timestamp or values differ; for a sensor that sends no
time, whose values differ or that has no time), ``unexpected``
(a reading of the run's sensors with a seq it never published); for bucket mode also
``bad_documents``: documents whose ``count``, ``stats``, ``first_ts``/``last_ts`` or
``bucket_start`` disagree with their own readings.

Readings still on their way are not a mismatch: with ``--wait`` the check first polls
the number of stored readings until it reaches what was published or stops changing
(``--settle`` seconds), and a check that finds readings missing counts again: when the
number grew meanwhile, the mode is reported as still arriving, not as a mismatch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from loadgen import payloads

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from pymongo.collection import Collection
    from pymongo.database import Database

    from loadgen.config import VerifySettings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
MAX_EXAMPLES = 10
SUM_TOLERANCE = 1e-9  # relative: a running sum of doubles depends on the order of addition
POLL_SECONDS = 1.0  # between two counts: while waiting, and to tell a growing count


class VerifyError(RuntimeError):
    """MongoDB could not be read (connection, authentication, a failed command)."""


@dataclass(frozen=True, slots=True)
class Expected:
    """What a run published: its parameters and readings per sensor (seq 0 .. n-1)."""

    run: payloads.Run
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        """Readings published in all."""
        return sum(self.counts)


@dataclass
class ModeReport:
    """The outcome for one storage mode."""

    mode: str
    collection: str
    expected: int = 0
    found: int = 0
    missing: int = 0
    duplicated: int = 0
    wrong: int = 0
    unexpected: int = 0
    documents: int = 0
    bad_documents: int = 0
    arriving: int = 0  # readings stored while verify looked: the count still grows
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every reading exactly once with the right values, every document consistent."""
        return not (
            self.missing or self.duplicated or self.wrong or self.unexpected or self.bad_documents
        )

    @property
    def still_arriving(self) -> bool:
        """Only readings missing, and their number grew while verify looked: lag, so far."""
        return bool(
            self.missing
            and self.arriving
            and not (self.duplicated or self.wrong or self.unexpected or self.bad_documents)
        )

    @property
    def status(self) -> str:
        """``OK``, ``STILL ARRIVING`` or ``MISMATCH``."""
        if self.ok:
            return "OK"
        return "STILL ARRIVING" if self.still_arriving else "MISMATCH"

    def note(self, text: str) -> None:
        """Keep the first few problems as examples."""
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(text)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "mode": self.mode,
            "collection": self.collection,
            "ok": self.ok,
            "still_arriving": self.still_arriving,
            "arriving": self.arriving,
            "expected": self.expected,
            "found": self.found,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "wrong": self.wrong,
            "unexpected": self.unexpected,
            "documents": self.documents,
            "bad_documents": self.bad_documents,
            "examples": self.examples,
        }


def to_ms(value: object) -> int | None:
    """A BSON date as epoch milliseconds (naive datetimes are UTC); None if not a date."""
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // _MS


class Tally:
    """Occurrences of each expected (sensor, seq) in one batch of sensors, and their values."""

    def __init__(
        self, expected: Expected, model: payloads.Model, indexes: list[int], report: ModeReport
    ) -> None:
        self.expected = expected
        self.model = model
        self.report = report
        self.seen = {expected.run.sensor_id(i): bytearray(expected.counts[i]) for i in indexes}
        self.shapes = {expected.run.sensor_id(i): model.shape(i) for i in indexes}
        # Sensors that send no time: the daemon times their readings at arrival, so only
        # their values (and that they have a time) can be checked.
        self.untimed = {expected.run.sensor_id(i) for i in indexes if not expected.run.timed(i)}

    def add(self, sensor_id: str, reading: dict[str, Any]) -> None:
        """Count one stored reading (``ts`` as a date, ``seq``, measurements)."""
        report = self.report
        report.found += 1
        seq = reading.get("seq")
        if seq is None:  # formats with no per-reading seq (Sparkplug B): placed by its ts
            seq = self.expected.run.seq_of(to_ms(reading.get("ts")))
        seen = self.seen[sensor_id]
        if type(seq) is not int or not 0 <= seq < len(seen):
            report.unexpected += 1
            report.note(f"{sensor_id}: unexpected seq {seq!r}")
            return
        if seen[seq]:
            report.duplicated += 1
            report.note(f"{sensor_id} seq {seq}: duplicated")
        seen[seq] = min(seen[seq] + 1, 255)
        run = self.expected.run
        ts_ms = run.ts_ms(seq)
        hum, temp = self.model.values(self.shapes[sensor_id], seq, ts_ms)
        values = {k: v for k, v in reading.items() if k not in ("ts", "seq")}
        stored_ms = to_ms(reading.get("ts"))
        if sensor_id in self.untimed and stored_ms is not None:
            ts_ms = stored_ms  # any arrival time is right
        if stored_ms != ts_ms or values != {"hum": hum, "temp": temp}:
            report.wrong += 1
            report.note(
                f"{sensor_id} seq {seq}: stored ts={stored_ms} {values}, "
                f"expected ts={ts_ms} hum={hum} temp={temp}"
            )

    def finish(self) -> None:
        """Count the expected readings never seen."""
        for sensor_id, seen in self.seen.items():
            missing = seen.count(0)
            if missing:
                self.report.missing += missing
                self.report.note(
                    f"{sensor_id}: {missing} of {len(seen)} readings missing "
                    f"(first seq {seen.index(0)})"
                )


def sensor_batches(expected: Expected, size: int) -> Iterator[list[int]]:
    """Sensor indexes in batches of ``size``."""
    for start in range(0, expected.run.sensors, size):
        yield list(range(start, min(start + size, expected.run.sensors)))


def check_bucket_document(doc: dict[str, Any], span_ms: int) -> list[str]:
    """What is inconsistent in one bucket document (empty when it is right)."""
    readings = doc.get("readings") or []
    problems: list[str] = []
    if doc.get("count") != len(readings):
        problems.append(f"count {doc.get('count')} != {len(readings)} readings")
    stamps = [to_ms(r.get("ts")) for r in readings]
    known = [t for t in stamps if t is not None]
    if known:
        if to_ms(doc.get("first_ts")) != min(known) or to_ms(doc.get("last_ts")) != max(known):
            problems.append("first_ts/last_ts differ from the readings")
        start = to_ms(doc.get("bucket_start"))
        if any(start != t - t % span_ms for t in known):
            problems.append("a reading outside its bucket_start span")
    problems.extend(_stats_problems(doc.get("stats") or {}, readings))
    return problems


def _stats_problems(stats: dict[str, Any], readings: list[dict[str, Any]]) -> list[str]:
    values: dict[str, list[float]] = {}
    for reading in readings:
        for name, value in reading.items():
            if name not in ("ts", "seq"):
                values.setdefault(name, []).append(value)
    problems = [f"stats.{name} without readings" for name in stats if name not in values]
    for name, column in values.items():
        stat = stats.get(name)
        if not isinstance(stat, dict):
            problems.append(f"stats.{name} missing")
            continue
        total = math.fsum(column)
        if stat.get("count") != len(column):
            problems.append(f"stats.{name}.count {stat.get('count')} != {len(column)}")
        if stat.get("min") != min(column) or stat.get("max") != max(column):
            problems.append(
                f"stats.{name}.min/max {stat.get('min')}/{stat.get('max')} "
                f"!= {min(column)}/{max(column)}"
            )
        stored = stat.get("sum")
        if not isinstance(stored, (int, float)) or not math.isclose(
            stored, total, rel_tol=SUM_TOLERANCE, abs_tol=SUM_TOLERANCE
        ):
            problems.append(f"stats.{name}.sum {stored} != {total}")
    return problems


def verify_bucket(
    collection: Collection[dict[str, Any]], expected: Expected, batch: int, span_seconds: int
) -> ModeReport:
    """Check the bucket documents of the run's sensors."""
    report = ModeReport("bucket", collection.name, expected=expected.total)
    model = payloads.Model(expected.run.seed)
    for indexes in sensor_batches(expected, batch):
        tally = Tally(expected, model, indexes, report)
        ids = list(tally.seen)
        for doc in _stream(collection, {"sensor_id": {"$in": ids}}):
            report.documents += 1
            sensor_id = doc["sensor_id"]
            for reading in doc.get("readings") or []:
                tally.add(sensor_id, reading)
            problems = check_bucket_document(doc, span_seconds * 1000)
            if problems:
                report.bad_documents += 1
                report.note(f"bucket {sensor_id} {doc.get('bucket_start')}: " + "; ".join(problems))
        tally.finish()
    return report


def verify_timeseries(
    collection: Collection[dict[str, Any]], expected: Expected, batch: int
) -> ModeReport:
    """Check the time-series documents of the run's sensors."""
    report = ModeReport("timeseries", collection.name, expected=expected.total)
    model = payloads.Model(expected.run.seed)
    for indexes in sensor_batches(expected, batch):
        tally = Tally(expected, model, indexes, report)
        for doc in _stream(collection, {"meta.sensor_id": {"$in": list(tally.seen)}}):
            report.documents += 1
            meta = doc.pop("meta")
            tally.add(meta["sensor_id"], doc)
        tally.finish()
    return report


def _stream(
    collection: Collection[dict[str, Any]], match: dict[str, Any]
) -> Iterable[dict[str, Any]]:
    """The documents matching ``match``, streamed in batches (no ``_id``)."""
    try:
        yield from collection.aggregate(
            [{"$match": match}, {"$project": {"_id": 0}}], batchSize=1000
        )
    except PyMongoError as exc:
        raise VerifyError(f"reading {collection.full_name} failed: {exc}") from exc


def count_stored(
    collection: Collection[dict[str, Any]], mode: str, expected: Expected, batch: int
) -> int:
    """Readings of the run's sensors stored now, counted by the server (nothing decoded)."""
    total = 0
    try:
        for indexes in sensor_batches(expected, batch):
            ids = [expected.run.sensor_id(i) for i in indexes]
            if mode == "timeseries":
                total += collection.count_documents({"meta.sensor_id": {"$in": ids}})
                continue
            for row in collection.aggregate(
                [
                    {"$match": {"sensor_id": {"$in": ids}}},
                    {"$group": {"_id": None, "n": {"$sum": "$count"}}},
                ]
            ):
                total += int(row["n"])
    except PyMongoError as exc:
        raise VerifyError(f"counting in {collection.full_name} failed: {exc}") from exc
    return total


def wait_for_readings(count: Callable[[], int], expected: int, wait: float, settle: float) -> int:
    """The last count, polled until it reaches ``expected`` or stops changing.

    It stops changing when, after it has moved at least once, it stays the same ``settle``
    seconds, or twice the longest pause between two of its changes if that is longer: a
    daemon writes in batches, and a slow store takes a while over each. A count that has
    not moved since the start may be waiting for the first batch: only ``wait`` seconds,
    after which the poll gives up in any case, end that.
    """
    start = changed = time.monotonic()
    last, pause, moved = count(), 0.0, False
    while last < expected and (elapsed := time.monotonic() - start) < wait:
        if moved and time.monotonic() - changed >= max(settle, 2 * pause):
            break
        time.sleep(min(POLL_SECONDS, wait - elapsed))
        now = count()
        if now != last:
            pause = max(pause, time.monotonic() - changed)
            last, changed, moved = now, time.monotonic(), True
    return last


def run_verify(
    settings: VerifySettings, expected: Expected, span_seconds: int = 3600
) -> list[ModeReport]:
    """Connect, check each requested mode, return one report per mode."""
    options: dict[str, Any] = {"tz_aware": True}
    if "serverselectiontimeoutms" not in settings.mongodb_uri.lower():
        options["serverSelectionTimeoutMS"] = 5000  # fail fast, not after pymongo's 30 s
    client: MongoClient[dict[str, Any]] = MongoClient(settings.mongodb_uri, **options)
    try:
        try:
            client.admin.command("ping")
        except PyMongoError as exc:
            raise VerifyError(f"cannot reach MongoDB: {str(exc).split(',', 1)[0]}") from exc
        db = client[settings.db]
        return [
            _verify_mode(db, mode, settings, expected, span_seconds)
            for mode in ("bucket", "timeseries")
            if settings.mode in (mode, "both")
        ]
    finally:
        client.close()


def _verify_mode(
    db: Database[dict[str, Any]],
    mode: str,
    settings: VerifySettings,
    expected: Expected,
    span_seconds: int,
) -> ModeReport:
    """Wait as asked, check one mode, and tell readings still arriving from missing ones."""
    name = settings.bucket_collection if mode == "bucket" else settings.timeseries_collection
    collection = db[name]
    batch = settings.sensors_per_query

    def count() -> int:
        return count_stored(collection, mode, expected, batch)

    before = wait_for_readings(count, expected.total, settings.wait, settings.settle)
    report = (
        verify_bucket(collection, expected, batch, span_seconds)
        if mode == "bucket"
        else verify_timeseries(collection, expected, batch)
    )
    if report.missing:
        after = count()
        if after == before:  # the check was quick: give the daemon a moment to show lag
            time.sleep(POLL_SECONDS)
            after = count()
        report.arriving = max(0, after - before)
    return report
