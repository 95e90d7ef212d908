"""How MongoDB's errors are read: one classification for every call on the write path.

The codes and labels are the server's (src/mongo/base/error_codes.yml); the writers are
driven through the real driver against the emulator, with its ``failCommand`` fail point
where a server error is needed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from bson.errors import InvalidDocument
from pymongo import ReadPreference
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ExecutionTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
)
from pymongo.errors import WriteError as PyMongoWriteError
from pymongo.read_preferences import SecondaryPreferred

from ingest.config import Settings, validate
from ingest.devices.decode import MAX_MAGNITUDE, Limits, decode
from ingest.errors import ConfigError, RefusedWriteError, SchemaError, SchemaGoneError, WriteError
from ingest.model import Reading
from ingest.store import mongo_errors
from ingest.store.schema import BUCKET_INDEX, Schema
from ingest.store.sharding import shard_collection
from ingest.store.writers import Plan, split_bulk_error
from ingest.store.writers.bucket import MAX_BUCKET_BYTES, BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.mongo import failpoint

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR


def reading(sensor: str, epoch: float, v: float = 1.0) -> Reading:
    return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, {"v": v})


def writer_for(db: Any) -> BucketWriter:
    schema = Schema(
        db,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    return BucketWriter(db.buckets, schema, HOUR, 3600)


def bulk_error(*errors: tuple[int, str]) -> BulkWriteError:
    return BulkWriteError(
        {
            "writeErrors": [
                {"index": i, "code": code, "errmsg": message}
                for i, (code, message) in enumerate(errors)
            ],
            "nInserted": 0,
        }
    )


# --- one failed operation of a bulk write ------------------------------------------------------

# Per-operation errors that are not the data's fault: the examples, the
# server's RetriableError/Interruption/StaleShardVersionError codes, and an unknown code.
NOT_THE_DATA = [11601, 24, 365, 13388, 150, 82, 409, 112, 91, 11602, 10107, 50, 262, 13, 999_999]
# Per-operation refusals for the data (each checked against error_codes.yml).
THE_DATA = [2, 9, 14, 52, 55, 56, 57, 66, 121, 10334, 17419]


@pytest.mark.parametrize("code", NOT_THE_DATA)
def test_an_operation_failing_for_a_reason_other_than_its_data_is_retried(code: int) -> None:
    plan = Plan(["op"], [[reading("a", T0)]])
    outcome = split_bulk_error(bulk_error((code, "transient")), plan)
    assert (len(outcome.retry), outcome.refused) == (1, [])


@pytest.mark.parametrize("code", THE_DATA)
def test_an_operation_refused_for_its_data_is_refused_with_the_code(code: int) -> None:
    plan = Plan(["op"], [[reading("a", T0)]])
    outcome = split_bulk_error(bulk_error((code, "refused")), plan)
    assert outcome.retry == []
    assert [detail for _r, detail in outcome.refused] == [f"code {code}: refused"]


def test_a_hint_naming_a_missing_index_is_schema_gone_not_bad_data() -> None:
    plan = Plan(["op", "op"], [[reading("a", T0)], [reading("b", T0)]])
    outcome = split_bulk_error(
        bulk_error(
            (2, "hint provided does not correspond to an existing index"), (11000, "E11000")
        ),
        plan,
        collide=True,
    )
    assert (len(outcome.retry), outcome.refused, outcome.collided) == (1, [], [1])
    assert isinstance(outcome.error, SchemaGoneError)


def test_a_timeseries_plans_failed_documents_are_each_its_own_reading() -> None:
    # One document per reading: the plan lists them as groups of one without building
    # a list for each (Singles); a partial failure still finds the reading by its index.
    readings = [reading(name, T0 + i) for i, name in enumerate("cab")]
    plan = TimeseriesWriter(None, None).plan(readings)  # type: ignore[arg-type]
    assert plan.readings() == 3
    assert [group[0].sensor_id for group in plan.groups] == ["a", "b", "c"]
    outcome = split_bulk_error(
        BulkWriteError(
            {
                "writeErrors": [
                    {"index": 0, "code": 11601, "errmsg": "interrupted"},
                    {"index": 2, "code": 121, "errmsg": "failed validation"},
                ],
                "nInserted": 1,
            }
        ),
        plan,
    )
    assert [r.sensor_id for r in outcome.retry] == ["a"]
    assert [(r.sensor_id, detail) for r, detail in outcome.refused] == [
        ("c", "code 121: failed validation")
    ]
    assert outcome.written == 1


# --- a whole command failed --------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        AutoReconnect("connection reset"),
        NotPrimaryError("not primary"),
        ServerSelectionTimeoutError("no servers"),
        ExecutionTimeout("time limit", 50),
        OperationFailure("not authorized on iot to execute command", 13),
        OperationFailure("interrupted", 11601),
        OperationFailure("new code", 999_999),
        # a data code with a label saying the server wants it retried
        OperationFailure("x", 2, {"code": 2, "errorLabels": ["RetryableWriteError"]}),
        # BadValue / FailedToParse of a whole command: the command's fault, not a reading's
        # (a refusal would send every reading of the batch to rejects, one by one)
        OperationFailure("unknown option", 2),
        OperationFailure("cannot parse", 9),
    ],
)
def test_a_failed_command_is_retried_unless_its_data_is_at_fault(exc: Exception) -> None:
    error = mongo_errors.translate(exc, "write")  # type: ignore[arg-type]
    assert type(error) is WriteError
    assert error.retriable


def test_a_command_refused_for_its_data_is_refused_but_a_lookup_never_is() -> None:
    for exc in (
        InvalidDocument("cannot encode"),
        OperationFailure("too large", 10334),
        OperationFailure("Document failed validation", 121),
        # the one operation of update_one / insert_one, from ``writeErrors``
        PyMongoWriteError("bad value", 2),
        PyMongoWriteError("type", 14),
    ):
        assert type(mongo_errors.translate(exc, "write")) is RefusedWriteError
        assert type(mongo_errors.translate(exc, "lookup")) is WriteError
    missing = OperationFailure("hint provided does not correspond to an existing index", 2)
    assert type(mongo_errors.translate(missing, "lookup")) is SchemaGoneError


# --- the bucket writer's settle lookup (defect 1) ---------------------------------------------


@pytest.mark.parametrize("code", [91, 13])  # a shutdown, and a missing privilege
async def test_a_failed_settle_lookup_returns_its_readings_for_retry_instead_of_raising(
    db: Any, mongo: Any, code: int
) -> None:
    writer = writer_for(db)
    await writer.ensure_schema()
    batch = [reading("a", T0 + i) for i in range(3)]
    assert (await writer.write(writer.plan(batch))).written == 3
    new = reading("a", T0 + 10)
    async with failpoint(mongo, ["aggregate"], code=code):
        outcome = await writer.write(writer.plan([*batch, new]))
    # One upsert carried the four readings: the index refused it whole, the lookup failed.
    assert (outcome.written, outcome.duplicates) == (0, 0)
    assert sorted(r.epoch for r in outcome.retry) == [r.epoch for r in [*batch, new]]
    assert isinstance(outcome.error, WriteError)
    assert f"code {code}" in str(outcome.error)
    again = await writer.write(writer.plan(outcome.retry))  # the retry settles them
    assert (again.written, again.duplicates, again.retry) == (1, 3, [])


def test_the_settle_lookup_reads_from_the_primary_whatever_the_collection_says(mongo: Any) -> None:
    coll = mongo.iot.get_collection("buckets", read_preference=SecondaryPreferred())
    schema = Schema(
        mongo.iot,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    writer = BucketWriter(coll, schema, HOUR, 3600)
    assert writer._primary().read_preference == ReadPreference.PRIMARY


async def test_the_time_series_duplicate_lookup_reads_from_the_primary(
    mongo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secondary may not have the reading that was just written: the DUP lookup would
    call it new and insert it again."""
    coll = mongo.iot.get_collection("readings", read_preference=SecondaryPreferred())
    schema = Schema(
        mongo.iot,
        "readings",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=HOUR,
    )
    writer = TimeseriesWriter(coll, schema)
    used: list[Any] = []
    primary = writer._primary

    def spy() -> Any:
        used.append(primary().read_preference)
        return primary()

    monkeypatch.setattr(writer, "_primary", spy)
    await writer.stored_at(writer.plan([reading("a", T0)]).lookup)  # the lookup of a write
    assert used == [ReadPreference.PRIMARY]


# --- the schema ---------------------------------------------------------------------------------


async def test_a_dropped_index_makes_the_writes_schema_gone_and_ensure_brings_it_back(
    db: Any,
) -> None:
    writer = writer_for(db)
    await writer.ensure_schema()
    await db.buckets.drop_index(BUCKET_INDEX)
    outcome = await writer.write(writer.plan([reading("a", T0 + 1)]))
    assert (outcome.written, outcome.refused, len(outcome.retry)) == (0, [], 1)
    assert isinstance(outcome.error, SchemaGoneError)
    await writer.ensure_schema()
    assert (await writer.write(writer.plan(outcome.retry))).written == 1


async def test_an_index_with_the_same_key_under_another_name_is_one_line_not_a_retry(
    db: Any, monkeypatch: Any
) -> None:
    """MongoDB answers 85 IndexOptionsConflict (the emulator does not: scripted here)."""
    writer = writer_for(db)

    async def conflict(*_a: Any, **_k: Any) -> None:
        raise OperationFailure("Index already exists with a different name: by_sensor", 85)

    monkeypatch.setattr(type(db.buckets), "create_index", conflict)
    with pytest.raises(SchemaError, match=f"cannot create index {BUCKET_INDEX}.*drop it"):
        await writer.ensure_schema()


@pytest.mark.parametrize(("mode", "most"), [("bucket", 24_855), ("timeseries", 20_000)])
def test_retention_is_bounded_by_what_expire_after_seconds_accepts(mode: str, most: int) -> None:
    """A TTL index takes a 32-bit expireAfterSeconds (a bucket expires one span after
    its retention); a time-series collection at most the seconds since 1970."""
    assert validate(Settings(mode=mode, retention_days=most))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"^--retention-days: at most {most} in {mode}"):
        validate(Settings(mode=mode, retention_days=most + 1))  # type: ignore[arg-type]
    assert most * 86400 + (HOUR if mode == "bucket" else 0) <= 2**31 - 1


class FakeMongos:
    """Records the admin commands ``shard_collection`` sends (no mongos runs here)."""

    def __init__(self, enable_answer: int | None = None) -> None:
        self.commands: list[str] = []
        self.enable_answer = enable_answer
        self.admin = self

    async def command(self, cmd: Any) -> dict[str, Any]:
        name = cmd if isinstance(cmd, str) else next(iter(cmd))
        self.commands.append(name)
        if name == "hello":
            return {"msg": "isdbgrid"}
        if name == "enableSharding" and self.enable_answer is not None:
            raise OperationFailure("already enabled", self.enable_answer)
        return {"ok": 1}

    def __getitem__(self, _name: str) -> Any:
        return self

    async def create_index(self, *_a: Any, **_k: Any) -> str:
        return "sensor_id_hashed"


@pytest.mark.parametrize("answer", [None, 23])
async def test_sharding_enables_the_database_first_as_mongodb_before_6_0_needs(
    answer: int | None,
) -> None:
    client = FakeMongos(answer)
    assert await shard_collection(client, "bucket", "iot", "buckets")  # type: ignore[arg-type]
    assert client.commands == ["hello", "enableSharding", "shardCollection"]


# --- values whose running sum would overflow -------------------------------------------------


async def test_values_whose_bucket_sum_could_overflow_are_refused_and_the_rest_sum_finitely(
    db: Any,
) -> None:
    """``$inc`` on a double overflows to infinity: 1.7e308 twice would make
    ``stats.v.sum`` infinite. Values beyond ±1e300 are refused as bad_value (with the
    reason); the largest accepted ones, as many as a document holds, sum finitely."""
    limits = Limits(1 << 20, 10_000, 365 * 86400.0, 600.0)
    now = T0 + 10.0
    refused = decode("sensors/a/readings", b'{"ts": %f, "v": 1.7e308}' % now, now, limits)
    assert [(r.reason, r.detail) for r in refused.rejections] == [
        ("bad_value", "v: not a finite number within ±1e300")
    ]
    writer = writer_for(db)
    await writer.ensure_schema()
    batch = [reading("a", T0 + i, 1e300) for i in range(100)]
    assert (await writer.write(writer.plan(batch))).written == 100
    doc = await db.buckets.find_one({})
    assert doc["stats"]["v"]["sum"] == pytest.approx(1e302)
    # The worst case: a document full of the largest value (the byte budget caps it).
    assert MAX_MAGNITUDE * (MAX_BUCKET_BYTES // 52) < 1.7976931348623157e308
