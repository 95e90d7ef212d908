"""The writers' statements reach MongoDB as pymongo's public bulk API would send them.

``ingest.store.writers.bulk`` hands prebuilt statements to pymongo's bulk machinery instead of
``bulk_write``/``insert_many``. Through the real driver (a command listener on its own
client), both paths send the same commands, fail the same way and retry the same way;
the fallback for another pymongo sends them through the public API.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from hypothesis import given
from hypothesis import strategies as st
from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import BulkWriteError, PyMongoError

from ingest.config import Settings
from ingest.model import Reading
from ingest.pipeline.app import make_writer
from ingest.store.schema import BUCKET_INDEX
from ingest.store.writers import bulk
from ingest.store.writers.bucket import BucketWriter
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.mongo import failpoint

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

HOUR = 3600
T0 = 1_790_000_000 // HOUR * HOUR
# What differs between two sends of the same statements: sessions, clocks, names.
VOLATILE = {"lsid", "txnNumber", "$clusterTime", "$db", "update", "insert"}


class Commands(monitoring.CommandListener):
    """The write commands a client sends, as the driver publishes them."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.failed_codes: list[int | None] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in {"update", "insert"}:
            self.sent.append({k: v for k, v in event.command.items() if k not in VOLATILE})

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.failed_codes.append(event.failure.get("code"))


def on_the_wire(command: dict[str, Any]) -> bytes:
    """A command's BSON: the same whether a statement was written as bytes by the planner
    (a ``RawBSONDocument``) or left to the driver as a dict."""
    return bson.encode(command)


@pytest.fixture
async def listened(mongo_uri: str, db_name: str) -> AsyncIterator[tuple[Any, Commands]]:
    commands = Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_uri, tz_aware=True, event_listeners=[commands]
    )
    try:
        yield client[db_name], commands
    finally:
        await client.drop_database(db_name)
        await client.close()


async def hinted(db: Any, *names: str) -> None:
    """The index the bucket upserts name in their hint."""
    for name in names:
        await db[name].create_index([("sensor_id", 1), ("bucket_start", 1)], name=BUCKET_INDEX)


def readings(sensors: int, each: int, offset: int = 0) -> list[Reading]:
    return [
        Reading(
            f"s{s}",
            None,
            float(T0 + offset + i),
            {"t": 20.5 + i, "h": 40 + s},
            i,
            (T0 + offset + i) * 1000,
        )
        for s in range(sensors)
        for i in range(each)
    ]


def test_the_installed_pymongo_takes_the_fast_path() -> None:
    # A pymongo whose bulk internals changed would still work (the public API), with more
    # CPU per reading; this fails first, so the pin in pyproject.toml gets looked at.
    assert bulk.fast_path_problem() is None
    assert bulk.lean_replies_problem() is None


@pytest.mark.parametrize("kind", [bulk.UPDATE, bulk.INSERT])
async def test_the_fast_path_sends_the_public_apis_commands(
    listened: tuple[Any, Commands], kind: str
) -> None:
    db, commands = listened
    batch = readings(3, 4)
    if kind == bulk.UPDATE:
        await hinted(db, "fast", "public")
        writer: Any = BucketWriter(db["fast"], None, HOUR, 3600)  # type: ignore[arg-type]
    else:
        writer = TimeseriesWriter(db["fast"], None)  # type: ignore[arg-type]
    plan = writer.plan(batch)
    await bulk.execute(db["fast"], kind, plan.ops)
    await bulk.public(db["public"], kind, plan.ops)
    fast, public = commands.sent
    assert on_the_wire(fast) == on_the_wire(public)
    assert fast["ordered"] is False
    field = "updates" if kind == bulk.UPDATE else "documents"
    assert len(fast[field]) == len(plan.ops)
    assert (await db["fast"].count_documents({})) == (await db["public"].count_documents({}))


async def test_a_partial_failure_raises_the_same_bulk_write_error(
    listened: tuple[Any, Commands],
) -> None:
    db, _commands = listened
    for name in ("fast", "public"):
        await db[name].insert_one({"_id": "taken"})
    statements = [{"_id": "new", "v": 1}, {"_id": "taken", "v": 2}, {"_id": "other", "v": 3}]
    errors = []
    for name, send in (("fast", bulk.execute), ("public", bulk.public)):
        with pytest.raises(BulkWriteError) as raised:
            await send(db[name], bulk.INSERT, [dict(s) for s in statements])
        errors.append(raised.value.details)
    fast, public = errors
    assert [e["index"] for e in fast["writeErrors"]] == [1]
    assert [(e["index"], e["code"]) for e in fast["writeErrors"]] == [
        (e["index"], e["code"]) for e in public["writeErrors"]
    ]
    assert fast["nInserted"] == public["nInserted"] == 2


async def test_a_failed_command_fails_both_paths_alike(
    listened: tuple[Any, Commands], mongo: AsyncMongoClient[dict[str, Any]]
) -> None:
    db, commands = listened
    outcomes = []
    for name, send in (("fast", bulk.execute), ("public", bulk.public)):
        async with failpoint(mongo, ["insert"], mode={"times": 1}):
            try:
                await send(db[name], bulk.INSERT, [{"_id": 1, "v": 1}])
                outcomes.append("written")
            except PyMongoError as exc:
                outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]
    assert commands.failed_codes == [91, 91]  # each path met the failure once
    # as many attempts either way (one, or two where the driver retries the write)
    assert len(commands.sent) % 2 == 0
    assert commands.sent[: len(commands.sent) // 2] == commands.sent[len(commands.sent) // 2 :]


async def test_without_the_fast_path_the_public_api_writes_the_same(
    listened: tuple[Any, Commands], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, commands = listened
    await hinted(db, "fast", "public")
    plan = BucketWriter(db["x"], None, HOUR, 3600).plan(readings(2, 3))  # type: ignore[arg-type]
    await bulk.execute(db["fast"], bulk.UPDATE, plan.ops)
    monkeypatch.setattr(bulk, "_RUN", None)
    await bulk.execute(db["public"], bulk.UPDATE, plan.ops)
    assert on_the_wire(commands.sent[0]) == on_the_wire(commands.sent[1])
    stored = [d async for d in db["public"].find({}, {"_id": 0}).sort("sensor_id")]
    assert [(d["sensor_id"], d["count"]) for d in stored] == [("s0", 3), ("s1", 3)]
    assert stored[0]["readings"][0]["ts"] == datetime.fromtimestamp(T0, UTC)


NAIVE_FROM = datetime(1970, 1, 1, tzinfo=UTC).replace(tzinfo=None)
NAIVE_TO = datetime(2200, 1, 1, tzinfo=UTC).replace(tzinfo=None)
# Values of every BSON type a server's reply can hold before ``upserted``.
VALUES = st.one_of(
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(2**31, 2**62).map(Int64),
    st.booleans(),
    st.none(),
    st.binary(max_size=20).map(Binary),
    st.builds(ObjectId),
    # hypothesis takes naive bounds; the values are aware (UTC), as the driver gives them
    st.datetimes(NAIVE_FROM, NAIVE_TO, timezones=st.just(UTC)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
    ),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(lambda t: Timestamp(*t)),
    st.just(Decimal128("1.5")),
    st.just(MinKey()),
    st.just(MaxKey()),
    st.text(max_size=10).map(Code),
)
FIELDS = st.dictionaries(st.text("abcnop$_", min_size=1, max_size=8), VALUES, max_size=6)
UPSERTED = st.lists(st.builds(lambda i: {"index": i, "_id": ObjectId()}, st.integers(0, 99)))


@given(
    before=FIELDS,
    after=FIELDS,
    upserted=UPSERTED,
    nested=st.dictionaries(st.just("upserted"), VALUES, max_size=1),
)
def test_an_update_reply_loses_its_upserted_list_and_nothing_else(
    before: dict[str, Any], after: dict[str, Any], upserted: list[Any], nested: dict[str, Any]
) -> None:
    before.pop("upserted", None)
    after.pop("upserted", None)
    reply = {**before, "upserted": upserted, **{k: v for k, v in after.items() if k not in before}}
    reply["sub"] = {"upserted": 1, **nested}  # not at the top: kept
    got = bulk.without_field(bson.encode(reply), b"upserted")
    assert got == bson.encode({k: v for k, v in reply.items() if k != "upserted"})
    # without the field, the same bytes
    assert bulk.without_field(got, b"upserted") == got


@given(st.binary(max_size=64), st.integers(0, 200))
def test_bytes_that_are_no_document_are_left_to_the_drivers_decoder(noise: bytes, cut: int) -> None:
    # a reply cut short, or garbage: the same bytes back, never an exception of its own
    raw = bson.encode({"n": 2, "upserted": [{"index": 0, "_id": ObjectId()}], "ok": 1.0})
    for doc in (raw[:cut], noise, raw[:4] + noise, noise + raw):
        got = bulk.without_field(doc, b"upserted")
        assert got == doc or got == bson.encode({"n": 2, "ok": 1.0})


def test_a_value_of_an_unexpected_type_before_upserted_leaves_the_reply_whole() -> None:
    raw = bson.encode({"odd": Regex("a+", "i"), "upserted": [{"index": 0, "_id": 1}], "ok": 1.0})
    assert bulk.without_field(raw, b"upserted") == raw
    after = bson.encode({"upserted": [], "odd": Regex("a+"), "ok": 1.0})
    assert bson.decode(bulk.without_field(after, b"upserted")) == {"odd": Regex("a+"), "ok": 1.0}


async def test_an_update_batch_fails_alike_with_its_upserts_left_out_of_the_counts(
    listened: tuple[Any, Commands],
) -> None:
    # Two statements start documents (upserted), one fails ($inc of a string): both paths
    # raise the same write error for the same statement and store the same documents;
    # the fast path leaves the upserts out of the bulk result's counts (no writer reads
    # them).
    db, _commands = listened
    statements = [
        {"q": {"_id": "a"}, "u": {"$inc": {"n": 1}}, "multi": False, "upsert": True},
        {"q": {"_id": "text"}, "u": {"$inc": {"n": 1}}, "multi": False, "upsert": True},
        {"q": {"_id": "b"}, "u": {"$inc": {"n": 2}}, "multi": False, "upsert": True},
    ]
    details = []
    for name, send in (("fast", bulk.execute), ("public", bulk.public)):
        await db[name].insert_one({"_id": "text", "n": "not a number"})
        with pytest.raises(BulkWriteError) as raised:
            await send(db[name], bulk.UPDATE, [dict(s) for s in statements])
        details.append(raised.value.details)
        stored = [d async for d in db[name].find({}).sort("_id")]
        assert stored == [
            {"_id": "a", "n": 1},
            {"_id": "b", "n": 2},
            {"_id": "text", "n": "not a number"},
        ]
    fast, public = details
    assert [(e["index"], e["code"]) for e in fast["writeErrors"]] == [
        (e["index"], e["code"]) for e in public["writeErrors"]
    ]
    assert [e["index"] for e in fast["writeErrors"]] == [1]
    assert [u["index"] for u in public["upserted"]] == [0, 2]
    assert (fast["nUpserted"], fast["upserted"]) == (0, [])


@pytest.mark.parametrize(
    ("main", "lean", "mode", "logged"),
    [
        (None, None, "bucket", None),
        ("_Run(x)", None, "bucket", "writing through its public bulk API"),
        (None, "_run_command(unpack_res)", "bucket", "decoding every upserted bucket's _id"),
        (None, "_run_command(unpack_res)", "timeseries", None),  # it sends no updates
    ],
)
def test_a_pymongo_without_the_internals_is_named_at_start(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    main: str | None,
    lean: str | None,
    mode: Literal["bucket", "timeseries"],
    logged: str | None,
) -> None:
    monkeypatch.setattr(bulk, "PROBLEM", main)
    monkeypatch.setattr(bulk, "LEAN_PROBLEM", lean)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(connect=False)
    with caplog.at_level(logging.WARNING, logger="ingest.pipeline.app"):
        make_writer(Settings(mode=mode), client)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if logged is None:
        assert warnings == []
    else:
        (warning,) = warnings
        assert logged in warning
        assert f"({main or lean})" in warning
