"""Time-series writers racing on one instant: the claims let one store it.

Each race is made certain: every writer's lookup returns before any of them claims (a
barrier after the lookup), so each finds the instants free, as two workers of a shared
group writing a message and its copy at once do. Without claims the same race stores
every instant twice (checked first), so the tests show what the claims change.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from pymongo.errors import BulkWriteError

from ingest.errors import WriteError
from ingest.model import Reading
from ingest.store.schema import CLAIM_SECONDS, CLAIMS_TTL_INDEX, Schema
from ingest.store.writers import bulk
from ingest.store.writers.claims import claim_id
from ingest.store.writers.timeseries import TimeseriesWriter
from tests.support.mongo import failpoint, instants

if TYPE_CHECKING:
    from ingest.store.writers import Outcome

T0 = 1_790_000_000.0
N = 20


def reading(sensor: str, n: int, tags: dict[str, str] | None = None, **values: Any) -> Reading:
    epoch = T0 + n
    return Reading(sensor, datetime.fromtimestamp(epoch, UTC), epoch, values, tags=tags)


def batch(**values: Any) -> list[Reading]:
    """N instants of two sensors, the second of them a tagged series."""
    return [reading("a", n, **values) for n in range(N // 2)] + [
        reading("b", n, {"site": "x y"}, **values) for n in range(N // 2)
    ]


def writer_for(db: Any, owner: str, claims: bool = True) -> TimeseriesWriter:
    schema = Schema(
        db,
        "readings",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    return TimeseriesWriter(db.readings, schema, owner, claims=claims)


async def claimed_only(writer: TimeseriesWriter, monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """``writer`` writes a batch of ``temp=1.0`` whose claims are made and whose insert
    then fails with ``why`` (a process that dies there, an outage): claimed, not stored."""

    async def fails(self: TimeseriesWriter, plan: Any) -> Outcome:
        raise WriteError(why)

    with monkeypatch.context() as patch:
        patch.setattr(TimeseriesWriter, "_insert", fails)
        with pytest.raises(WriteError):
            await writer.write(writer.plan(batch(temp=1.0)))


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``race(n)``: the next ``n`` lookups each wait until all ``n`` have answered."""
    original = TimeseriesWriter.stored_at
    barrier = [asyncio.Barrier(1)]
    held = [0]  # lookups still to hold

    async def stored_at(self: TimeseriesWriter, runs: Any) -> Any:
        found = await original(self, runs)
        if held[0] > 0:
            held[0] -= 1
            await barrier[0].wait()
        return found

    def start(parties: int) -> None:
        barrier[0], held[0] = asyncio.Barrier(parties), parties

    monkeypatch.setattr(TimeseriesWriter, "stored_at", stored_at)
    return start


async def racing(race: Any, writers: list[tuple[TimeseriesWriter, list[Reading]]]) -> list[Outcome]:
    race(len(writers))
    return list(await asyncio.gather(*(w.write(w.plan(b)) for w, b in writers)))


async def test_without_claims_the_race_stores_every_instant_twice(db: Any, race: Any) -> None:
    one, two = writer_for(db, "w0", claims=False), writer_for(db, "w1", claims=False)
    await one.ensure_schema()
    outcomes = await racing(race, [(one, batch(temp=1.0)), (two, batch(temp=1.0))])
    assert [o.written for o in outcomes] == [N, N]
    assert await db.readings.count_documents({}) == 2 * N


async def test_two_writers_store_a_reading_written_by_both_once(db: Any, race: Any) -> None:
    one, two = writer_for(db, "w0"), writer_for(db, "w1")
    await one.ensure_schema()
    outcomes = await racing(race, [(one, batch(temp=1.0)), (two, batch(temp=1.0))])
    assert sorted((o.written, o.duplicates) for o in outcomes) == [(0, N), (N, 0)]
    assert await db.readings.count_documents({}) == N
    assert await db.readings_claims.count_documents({}) == N


async def test_two_writers_with_other_values_store_one_and_refuse_the_other(
    db: Any, race: Any
) -> None:
    one, two = writer_for(db, "w0"), writer_for(db, "w1")
    await one.ensure_schema()
    outcomes = await racing(race, [(one, batch(temp=1.0)), (two, batch(temp=2.0))])
    winner, loser = sorted(outcomes, key=lambda o: len(o.conflicts))
    assert (winner.written, loser.written, len(loser.conflicts)) == (N, 0, N)
    assert "already has temp=" in loser.conflicts[0][1]
    values = {fields["temp"] for fields in (await instants(db.readings, "timeseries")).values()}
    assert len(values) == 1  # one writer's value at every instant
    assert await db.readings.count_documents({}) == N


async def test_disjoint_fields_merge_and_a_contested_field_is_stored_once(
    db: Any, race: Any
) -> None:
    """Three writers at once: temperature, humidity 40, humidity 41 of the same instants."""
    writers = [writer_for(db, f"w{i}") for i in range(3)]
    await writers[0].ensure_schema()
    outcomes = await racing(
        race,
        [(writers[0], batch(temp=20.5)), (writers[1], batch(hum=40)), (writers[2], batch(hum=41))],
    )
    assert (outcomes[0].written, outcomes[0].conflicts) == (N, [])
    assert sorted(len(o.conflicts) for o in outcomes[1:]) == [0, N]
    assert sum(o.written for o in outcomes) == 2 * N
    stored = await instants(db.readings, "timeseries")  # fails if a field is stored twice
    assert len(stored) == N
    assert {fields["temp"] for fields in stored.values()} == {20.5}
    assert len({fields["hum"] for fields in stored.values()}) == 1
    assert await db.readings.count_documents({}) == 2 * N  # two documents an instant
    claim = await db.readings_claims.find_one({"_id": claim_id(("a", (), int(T0 * 1000)))})
    assert claim is not None
    assert set(claim["f"]) == {"temp", "hum"}
    # a third field later (the lookup finds the two documents): merged; then repeated
    hum = stored[("a", (), int(T0 * 1000))]["hum"]
    later = batch(hum=hum, pressure=1.0)
    added = await writers[1].write(writers[1].plan(later))
    assert (added.written, added.duplicates, len(added.conflicts)) == (N, 0, 0)
    repeated = await writers[2].write(writers[2].plan(later))
    assert (repeated.written, repeated.duplicates, len(repeated.conflicts)) == (0, N, 0)
    assert set((await instants(db.readings, "timeseries"))[("a", (), int(T0 * 1000))]) == {
        "temp",
        "hum",
        "pressure",
    }


async def test_one_writer_writing_an_instant_in_two_batches_at_once_stores_it_once(db: Any) -> None:
    """``--write-concurrency``: two batches of one session holding the same readings."""
    writer = writer_for(db, "w0")
    await writer.ensure_schema()
    outcomes = await asyncio.gather(
        writer.write(writer.plan(batch(temp=1.0))), writer.write(writer.plan(batch(temp=1.0)))
    )
    assert sorted((o.written, o.duplicates) for o in outcomes) == [(0, N), (N, 0)]
    assert await db.readings.count_documents({}) == N


async def test_a_claim_left_by_a_crashed_writer_is_its_sessions_to_store(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer claims, then dies before its insert: the claim stays, nothing is stored.

    Another session finds the claim: its copy is a duplicate and another value a
    conflict (the message is still unacknowledged in the claimer's session, which gets it
    again). The claimer's session, after the restart, finds its own claim, which proves
    nothing, and stores the readings (the lookup found them absent).
    """
    crashed = writer_for(db, "ingest-host-w1")
    await crashed.ensure_schema()

    await claimed_only(crashed, monkeypatch, "the process died here")
    assert await db.readings_claims.count_documents({"by": "ingest-host-w1"}) == N
    assert await db.readings.count_documents({}) == 0

    other = writer_for(db, "ingest-other-host")
    copy = await other.write(other.plan(batch(temp=1.0)))
    changed = await other.write(other.plan(batch(temp=2.0)))
    assert (copy.written, copy.duplicates) == (0, N)
    assert (changed.written, len(changed.conflicts)) == (0, N)

    restarted = writer_for(db, "ingest-host-w1")  # the same session, a new process
    redelivered = await restarted.write(restarted.plan(batch(temp=1.0)))
    assert (redelivered.written, redelivered.duplicates) == (N, 0)
    again = await restarted.write(restarted.plan(batch(temp=1.0)))  # now the lookup finds it
    assert (again.written, again.duplicates) == (0, N)
    stored = await instants(db.readings, "timeseries")
    assert {fields["temp"] for fields in stored.values()} == {1.0}
    assert await db.readings.count_documents({}) == N


async def test_a_failed_insert_is_retried_by_the_same_session_through_its_own_claims(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial failure: the failed documents' claims stay, and the retry stores them."""
    writer = writer_for(db, "w0")
    await writer.ensure_schema()
    original = TimeseriesWriter._insert
    calls: list[int] = []

    async def half_fails(self: TimeseriesWriter, plan: Any) -> Outcome:
        calls.append(len(plan.ops))
        if len(calls) > 1:
            return await original(self, plan)
        kept = type(plan)(plan.ops[: N // 2], plan.groups[: N // 2])
        outcome = await original(self, kept)
        outcome.retry.extend(r for group in plan.groups[N // 2 :] for r in group)
        return outcome

    monkeypatch.setattr(TimeseriesWriter, "_insert", half_fails)
    first = await writer.write(writer.plan(batch(temp=1.0)))
    assert (first.written, len(first.retry)) == (N // 2, N // 2)
    retried = await writer.write(writer.plan(first.retry))
    assert (retried.written, retried.duplicates) == (N // 2, 0)
    assert await db.readings.count_documents({}) == N


async def test_the_claims_collection_expires_its_claims(db: Any) -> None:
    await writer_for(db, "w0").ensure_schema()
    await writer_for(db, "w1").ensure_schema()  # idempotent
    indexes = await db.readings_claims.index_information()
    assert indexes[CLAIMS_TTL_INDEX]["expireAfterSeconds"] == CLAIM_SECONDS
    assert indexes[CLAIMS_TTL_INDEX]["key"] == [("at", 1)]


async def test_a_failed_claim_insert_is_retried_and_nothing_is_stored_twice(
    db: Any, mongo: Any
) -> None:
    writer = writer_for(db, "w0")
    await writer.ensure_schema()
    async with failpoint(mongo, ["insert"]):  # the claims' insert comes first: it fails
        with pytest.raises(WriteError, match="code 91"):
            await writer.write(writer.plan(batch(temp=1.0)))
    assert await db.readings.count_documents({}) == 0
    outcome = await writer.write(writer.plan(batch(temp=1.0)))
    assert outcome.written == N
    assert await db.readings.count_documents({}) == N


async def test_a_claim_that_failed_alone_is_retried_with_its_readings(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One claim of a bulk insert fails (a transient error for that operation only)."""
    writer = writer_for(db, "w0")
    await writer.ensure_schema()
    original = bulk.execute

    async def last_fails(collection: Any, kind: str, docs: list[dict[str, Any]]) -> None:
        if collection.name != "readings_claims" or len(docs) < N:
            await original(collection, kind, docs)
            return
        await original(collection, kind, docs[:-1])
        raise BulkWriteError(
            {
                "writeErrors": [{"index": N - 1, "code": 11602, "errmsg": "interrupted"}],
                "nInserted": N - 1,
            }
        )

    monkeypatch.setattr(bulk, "execute", last_fails)
    first = await writer.write(writer.plan(batch(temp=1.0)))
    assert (first.written, len(first.retry)) == (N - 1, 1)
    retried = await writer.write(writer.plan(first.retry))
    assert (retried.written, retried.duplicates) == (1, 0)
    assert await db.readings.count_documents({}) == N


async def test_a_write_retried_after_its_claims_expired_is_judged_afresh(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage longer than the claims' life: the first attempt claimed, its insert
    failed, the TTL removed the claims, another session stored the instants meanwhile.
    The retry looks up and claims again: the other session's values stand."""
    first = writer_for(db, "w0")
    await first.ensure_schema()

    await claimed_only(first, monkeypatch, "MongoDB unreachable")
    await db.readings_claims.delete_many({})  # what the TTL monitor does after 600 s
    other = writer_for(db, "w1")
    assert (await other.write(other.plan(batch(temp=2.0)))).written == N
    retried = await first.write(first.plan(batch(temp=1.0)))
    assert (retried.written, len(retried.conflicts)) == (0, N)
    stored = await instants(db.readings, "timeseries")
    assert {fields["temp"] for fields in stored.values()} == {2.0}


async def test_a_claim_gone_between_its_collision_and_its_read_is_made_again(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest.store.writers.claims import Claims  # noqa: PLC0415

    other = writer_for(db, "w1")
    await other.ensure_schema()
    # claims of another session, nothing stored
    await claimed_only(other, monkeypatch, "the process died here")
    original = Claims._read

    async def expired(self: Claims, ids: list[str]) -> dict[str, dict[str, Any]]:
        await db.readings_claims.delete_many({"_id": {"$in": ids}})  # the TTL, just now
        return await original(self, ids)

    monkeypatch.setattr(Claims, "_read", expired)
    writer = writer_for(db, "w0")
    outcome = await writer.write(writer.plan(batch(temp=1.0)))
    assert (outcome.written, outcome.duplicates) == (N, 0)
    assert await db.readings_claims.count_documents({"by": "w0"}) == N
