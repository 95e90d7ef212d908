"""Sparkplug alias tables in MongoDB: two daemons' formats sharing one store (real driver)."""

from __future__ import annotations

from ingest.devices.decode import Limits
from ingest.devices.formats.sparkplug import SparkplugFormat
from ingest.devices.sparkplug_state import BIRTHS_COLLECTION, BirthStore, SparkplugState
from loadgen import sparkplug as enc
from loadgen.sparkplug import Metric
from tests.support.mongo import failpoint

T0 = 1_795_000_000_000
LIMITS = Limits()


def never() -> bool:
    return False


async def feed(fmt: SparkplugState, topic: str, payload: bytes):
    assert await fmt.prepare(topic, payload, LIMITS, never)
    return fmt.parse(topic, payload, LIMITS)


BIRTH = enc.nbirth(
    [
        Metric("Temp/A", 1, T0, enc.FLOAT, 1.5, properties={"engUnit": "degC", "Quality": "good"}),
        Metric("Count", 2, T0, enc.UINT32, 3),
    ],
    bd_seq=7,
    timestamp=T0,
)


def data(seq: int, value: float = 2.5) -> bytes:
    return enc.payload(
        [Metric(alias=1, timestamp=T0 + seq, datatype=enc.FLOAT, value=value)], T0 + seq, seq
    )


async def test_a_birth_seen_by_one_daemon_serves_another(db):
    store = BirthStore(db[BIRTHS_COLLECTION])
    first, second = SparkplugState(store=store), SparkplugState(store=store)
    await feed(first, enc.topic("G", "NBIRTH", "E"), BIRTH)
    doc = await db[BIRTHS_COLLECTION].find_one({"_id": "G/E"})
    assert doc["bd_seq"] == 7
    assert doc["online"] is True
    assert doc["sensor_id"] == "G/E"
    assert doc["metrics"][2] == {
        "name": "Temp/A",
        "datatype": "Float",
        "alias": 1,
        "units": "degC",
        "properties": {"engUnit": "degC", "Quality": "good"},
    }
    # The second daemon never saw the BIRTH: it reads the table once, then from memory.
    parsed = await feed(second, enc.topic("G", "NDATA", "E"), data(1))
    assert [i.fields for i in parsed.items] == [{"Temp/A": 2.5}]
    assert second._lookups == {"found": 1, "missing": 0}
    await feed(second, enc.topic("G", "NDATA", "E"), data(2))
    assert second._lookups == {"found": 1, "missing": 0}


async def test_tables_evicted_for_their_metrics_are_read_again_from_mongodb(db):
    # room for one BIRTH's metrics (Temp/A, Count, bdSeq) and not two
    fmt = SparkplugState(SparkplugFormat(max_metrics=4), BirthStore(db[BIRTHS_COLLECTION]))
    early = await feed(fmt, enc.topic("G", "NDATA", "E1"), data(0))  # before its BIRTH
    assert [r.reason for r in early.rejections] == ["no_birth"]
    for node in ("E1", "E2"):
        await feed(fmt, enc.topic("G", "NBIRTH", node), BIRTH)
    assert list(fmt.format.tables) == ["G/E2"]
    parsed = await feed(fmt, enc.topic("G", "NDATA", "E1"), data(1))
    assert [(i.sensor, i.fields) for i in parsed.items] == [("G/E1", {"Temp/A": 2.5})]
    assert fmt._lookups == {"found": 1, "missing": 1}
    assert list(fmt.format.tables) == ["G/E1"]
    assert fmt.format.metrics_held <= 4


async def test_death_and_unknown_nodes_are_not_guessed(db):
    store = BirthStore(db[BIRTHS_COLLECTION])
    first, second = SparkplugState(store=store), SparkplugState(store=store)
    parsed = await feed(second, enc.topic("G", "NDATA", "X"), data(1))
    assert [r.reason for r in parsed.rejections] == ["no_birth"]
    await feed(second, enc.topic("G", "NDATA", "X"), data(2))
    assert second._lookups["missing"] == 1  # not read again right away
    await feed(first, enc.topic("G", "NBIRTH", "E"), BIRTH)
    await feed(
        first,
        enc.topic("G", "DBIRTH", "E", "D"),
        enc.payload([Metric("p", 5, T0, enc.INT16, -2)], T0, 1),
    )
    device = await db[BIRTHS_COLLECTION].find_one({"_id": "G/E/D"})
    assert device["bd_seq"] == 7
    assert device["online"] is True
    # A stale will (older bdSeq) changes nothing; the matching one closes node and device.
    await feed(first, enc.topic("G", "NDEATH", "E"), enc.ndeath(6))
    assert (await db[BIRTHS_COLLECTION].find_one({"_id": "G/E"}))["online"] is True
    await feed(first, enc.topic("G", "NDEATH", "E"), enc.ndeath(7))
    states = {d["_id"]: d["online"] async for d in db[BIRTHS_COLLECTION].find()}
    assert states == {"G/E": False, "G/E/D": False}
    # A daemon starting now does not use the closed table.
    third = SparkplugState(store=store)
    parsed = await feed(third, enc.topic("G", "NDATA", "E"), data(3))
    assert [r.reason for r in parsed.rejections] == ["no_birth"]


async def test_a_new_nbirth_closes_its_devices_in_the_store(db):
    store = BirthStore(db[BIRTHS_COLLECTION])
    fmt = SparkplugState(store=store)
    await feed(fmt, enc.topic("G", "NBIRTH", "E"), BIRTH)
    await feed(
        fmt,
        enc.topic("G", "DBIRTH", "E", "D"),
        enc.payload([Metric("p", 5, T0, enc.INT16, -2)], T0, 1),
    )
    # a rebirth: the same metrics, a later timestamp (identical bytes would be one BIRTH)
    await feed(
        fmt,
        enc.topic("G", "NBIRTH", "E"),
        enc.nbirth([Metric("Temp/A", 1, T0 + 1, enc.FLOAT, 1.5)], bd_seq=7, timestamp=T0 + 1),
    )
    states = {d["_id"]: d["online"] async for d in db[BIRTHS_COLLECTION].find()}
    assert states == {"G/E": True, "G/E/D": False}
    other = SparkplugState(store=store)
    parsed = await feed(
        other,
        enc.topic("G", "DDATA", "E", "D"),
        enc.payload([Metric(alias=5, timestamp=T0, datatype=enc.INT16, value=1)], T0, 2),
    )
    assert [r.reason for r in parsed.rejections] == ["no_birth"]


async def test_a_daemon_holding_a_closed_table_finds_a_birth_another_daemon_stored(db):
    store = BirthStore(db[BIRTHS_COLLECTION])
    first, second = SparkplugState(store=store), SparkplugState(store=store)
    await feed(second, enc.topic("G", "NBIRTH", "E"), BIRTH)
    await feed(second, enc.topic("G", "NDEATH", "E"), enc.ndeath(7))
    # The edge node reconnects; its new NBIRTH goes to the other daemon.
    await feed(
        first,
        enc.topic("G", "NBIRTH", "E"),
        enc.nbirth([Metric("Other", 1, T0, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0),
    )
    parsed = await feed(second, enc.topic("G", "NDATA", "E"), data(1))
    assert [i.fields for i in parsed.items] == [{"Other": 2.5}]
    assert second._lookups == {"found": 1, "missing": 0}


async def test_a_birth_mongodb_refuses_for_its_data_is_used_from_memory_not_retried(db, mongo):
    fmt = SparkplugState(store=BirthStore(db[BIRTHS_COLLECTION]))
    async with failpoint(mongo, ["update"], code=121):  # validation: the data's fault
        parsed = await feed(fmt, enc.topic("G", "NBIRTH", "E"), BIRTH)
    assert [i.fields for i in parsed.items] == [{"Temp/A": 1.5, "Count": 3}]
    assert await db[BIRTHS_COLLECTION].count_documents({}) == 0
    parsed = await feed(fmt, enc.topic("G", "NDATA", "E"), data(1))
    assert [i.fields for i in parsed.items] == [{"Temp/A": 2.5}]


async def test_daemons_of_a_shared_group_store_a_birth_and_its_readings_once(db):
    births = db[BIRTHS_COLLECTION]
    first = SparkplugState(store=BirthStore(births, ("buckets", "ingest-a")))
    second = SparkplugState(store=BirthStore(births, ("buckets", "ingest-b")))
    other_mode = SparkplugState(store=BirthStore(births, ("readings", "ingest-ts")))
    topic = enc.topic("G", "NBIRTH", "E")
    assert [i.fields for i in (await feed(first, topic, BIRTH)).items] == [
        {"Temp/A": 1.5, "Count": 3}
    ]
    stored = await births.find_one({"_id": "G/E"})
    # Every daemon gets the BIRTH: the table is everyone's, the readings the claimant's.
    assert (await feed(second, topic, BIRTH)).items == []
    assert second.format.counts.skipped["other_daemon"] == 4
    assert await births.find_one({"_id": "G/E"}) == {**stored, "claims": {"buckets": "ingest-a"}}
    # A daemon writing another collection claims for that one; a redelivery to the
    # claimant stores its readings again (the writers settle duplicates).
    assert len((await feed(other_mode, topic, BIRTH)).items) == 1
    assert len((await feed(first, topic, BIRTH)).items) == 1
    assert (await feed(second, topic, BIRTH)).items == []
    parsed = await feed(second, enc.topic("G", "NDATA", "E"), data(1))
    assert [i.fields for i in parsed.items] == [{"Temp/A": 2.5}]
    assert second._lookups == {"found": 0, "missing": 0}


async def test_a_late_death_from_a_slower_daemon_does_not_close_the_next_session(db):
    births = db[BIRTHS_COLLECTION]
    fast = SparkplugState(store=BirthStore(births, ("buckets", "a")))
    slow = SparkplugState(store=BirthStore(births, ("buckets", "b")))
    rebirth = enc.nbirth([Metric("New", 1, T0 + 5, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 5)
    device = enc.payload([Metric("p", 5, T0 + 5, enc.INT16, -2)], T0 + 5, 1)
    for step in (fast, slow):
        await feed(step, enc.topic("G", "NBIRTH", "E"), BIRTH)
    await feed(fast, enc.topic("G", "NDEATH", "E"), enc.ndeath(7))
    await feed(fast, enc.topic("G", "NBIRTH", "E"), rebirth)
    await feed(fast, enc.topic("G", "DBIRTH", "E", "D"), device)
    # the slower daemon processes the same DEATH and NBIRTH afterwards
    await feed(slow, enc.topic("G", "NDEATH", "E"), enc.ndeath(7))
    await feed(slow, enc.topic("G", "NBIRTH", "E"), rebirth)
    states = {d["_id"]: (d["online"], d["bd_seq"]) async for d in births.find()}
    assert states == {"G/E": (True, 8), "G/E/D": (True, 8)}


async def test_after_a_reconnect_tables_are_read_again_from_mongodb(db):
    births = db[BIRTHS_COLLECTION]
    away, other = (
        SparkplugState(store=BirthStore(births)),
        SparkplugState(store=BirthStore(births)),
    )

    async def on(fmt: SparkplugState, generation: int, topic: str, payload: bytes):
        assert await fmt.prepare(topic, payload, LIMITS, never, generation)
        return fmt.parse(topic, payload, LIMITS)

    await on(away, 1, enc.topic("G", "NBIRTH", "E"), BIRTH)
    # While "away" is disconnected, a rebirth moves alias 1 to another metric; only the
    # other daemon receives (and stores) it.
    await on(
        other,
        1,
        enc.topic("G", "NBIRTH", "E"),
        enc.nbirth([Metric("Moved", 1, T0 + 9, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 9),
    )
    parsed = await on(away, 2, enc.topic("G", "NDATA", "E"), data(10))
    assert [i.fields for i in parsed.items] == [{"Moved": 2.5}]
    assert away._lookups == {"found": 1, "missing": 0}


async def test_a_slower_daemon_neither_stores_an_older_birth_again_nor_puts_it_back(db):
    births = db[BIRTHS_COLLECTION]
    fast = SparkplugState(store=BirthStore(births, ("readings", "a")))
    slow = SparkplugState(store=BirthStore(births, ("readings", "b")))
    topic = enc.topic("G", "NBIRTH", "E")
    rebirth = enc.nbirth([Metric("Moved", 1, T0 + 5, enc.FLOAT, 0.5)], bd_seq=7, timestamp=T0 + 5)
    assert len((await feed(fast, topic, BIRTH)).items) == 1
    assert len((await feed(fast, topic, rebirth)).items) == 1
    assert (await feed(slow, topic, BIRTH)).items == []
    assert (await feed(slow, topic, rebirth)).items == []
    doc = await births.find_one({"_id": "G/E"})
    assert [m["name"] for m in doc["metrics"]][-1] == "Moved"
    assert doc["claims"] == {"readings": "a"}


async def test_a_refused_rebirth_closes_only_the_session_it_ends_for_every_daemon(db):
    """Every daemon of a shared group receives the refused NBIRTH, some after the next
    usable one was stored: the session that one opened stays online for all of them."""
    births = db[BIRTHS_COLLECTION]
    fast = SparkplugState(store=BirthStore(births, ("buckets", "a")))
    slow = SparkplugState(store=BirthStore(births, ("buckets", "b")))
    node, device = enc.topic("G", "NBIRTH", "E"), enc.topic("G", "DBIRTH", "E", "D")
    dbirth = enc.payload([Metric("p", 5, T0, enc.INT16, -2)], T0, 1)
    refused = (
        enc.nbirth([Metric("Pressure", 1, T0 + 5, enc.DOUBLE, 1013.0)], bd_seq=8, timestamp=T0 + 5)
        + b"\xff"
    )  # a broken tag: invalid_protobuf
    rebirth = enc.nbirth(
        [Metric("Pressure", 1, T0 + 9, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 9
    )
    for step in (fast, slow):
        await feed(step, node, BIRTH)
        await feed(step, device, dbirth)
    parsed = await feed(fast, node, refused)
    assert [r.reason for r in parsed.rejections] == ["invalid_protobuf"]
    states = {d["_id"]: (d["online"], d.get("closed_by")) async for d in births.find()}
    why = "its last NBIRTH was refused (invalid_protobuf); waiting for a usable BIRTH"
    assert states == {"G/E": (False, why), "G/E/D": (False, why)}
    # Its DATA is not read with the old aliases, by this daemon or one that starts now.
    for fmt in (fast, SparkplugState(store=BirthStore(births))):
        parsed = await feed(fmt, enc.topic("G", "NDATA", "E"), data(6, 1013.0))
        assert parsed.items == []
        assert [(r.reason, why in r.detail) for r in parsed.rejections] == [("no_birth", True)]
    await feed(fast, node, rebirth)
    # The slower daemon processes the refused NBIRTH only now, and so does one that was
    # restarted meanwhile (it reads the table, which is already the next session's).
    restarted = SparkplugState(store=BirthStore(births, ("buckets", "c")))
    for step in (slow, restarted):
        assert [r.reason for r in (await feed(step, node, refused)).rejections] == [
            "invalid_protobuf"
        ]
        assert (await births.find_one({"_id": "G/E"}))["online"] is True
        assert (await feed(step, node, rebirth)).items == []  # the other daemon's to store
        parsed = await feed(step, enc.topic("G", "NDATA", "E"), data(10, 3.5))
        assert [i.fields for i in parsed.items] == [{"Pressure": 3.5}]
    doc = await births.find_one({"_id": "G/E"})
    assert (doc["online"], doc.get("closed_by"), doc["metrics"][-1]["name"]) == (
        True,
        None,
        "Pressure",
    )


async def test_a_refused_dbirth_closes_its_device_and_nothing_else(db):
    store = BirthStore(db[BIRTHS_COLLECTION])
    fmt = SparkplugState(store=store)
    device = enc.topic("G", "DBIRTH", "E", "D")
    await feed(fmt, enc.topic("G", "NBIRTH", "E"), BIRTH)
    await feed(fmt, device, enc.payload([Metric("p", 5, T0, enc.INT16, -2)], T0, 1))
    await feed(
        fmt,
        enc.topic("G", "DBIRTH", "E", "D2"),
        enc.payload([Metric("q", 5, T0, enc.INT16, -2)], T0, 2),
    )
    small = Limits(max_readings=1)
    huge = enc.payload(
        [Metric("p", 5, T0 + 1, enc.INT16, 1), Metric("r", 6, T0 + 1, enc.INT16, 1)], T0 + 1, 3
    )
    assert await fmt.prepare(device, huge, small, never)
    assert [r.reason for r in fmt.parse(device, huge, small).rejections] == ["too_many_readings"]
    states = {d["_id"]: d["online"] async for d in db[BIRTHS_COLLECTION].find()}
    assert states == {"G/E": True, "G/E/D": False, "G/E/D2": True}
    ddata = enc.payload([Metric(alias=5, timestamp=T0 + 2, datatype=enc.INT16, value=4)], T0 + 2, 4)
    for fmt_now in (fmt, SparkplugState(store=store)):
        parsed = await feed(fmt_now, enc.topic("G", "DDATA", "E", "D"), ddata)
        assert [r.reason for r in parsed.rejections] == ["no_birth"]
        parsed = await feed(fmt_now, enc.topic("G", "DDATA", "E", "D2"), ddata)
        assert [i.fields for i in parsed.items] == [{"q": 4}]
        parsed = await feed(fmt_now, enc.topic("G", "NDATA", "E"), data(5))
        assert [i.fields for i in parsed.items] == [{"Temp/A": 2.5}]


async def test_a_birth_too_large_to_be_parsed_ends_the_session_without_a_store():
    """``--dry-run``: the tables are in memory only, and a too-large NBIRTH still ends its
    session (the mapping refuses it before the format parses it)."""
    fmt = SparkplugState()
    await feed(fmt, enc.topic("G", "NBIRTH", "E"), BIRTH)
    small = Limits(max_message_bytes=len(BIRTH) - 1)
    assert await fmt.prepare(enc.topic("G", "NBIRTH", "E"), BIRTH, small, never)
    parsed = await feed(fmt, enc.topic("G", "NDATA", "E"), data(1))
    assert [r.reason for r in parsed.rejections] == ["no_birth"]
    assert "its last NBIRTH was refused (too_large)" in parsed.rejections[0].detail


async def test_data_redelivered_after_a_restart_is_read_with_the_session_it_was_sent_in(db):
    """A restarted daemon gets DATA again that was not yet acknowledged, though BIRTHs after
    it were stored: it reads each message with the session its timestamp falls in (the
    stored one, or one of those it replaced), never a later one's aliases."""
    births = db[BIRTHS_COLLECTION]
    first = SparkplugState(store=BirthStore(births))
    node = enc.topic("G", "NBIRTH", "E")

    def restarted() -> SparkplugState:
        return SparkplugState(store=BirthStore(births))

    async def values(fmt: SparkplugState, seq: int) -> list[dict[str, object]] | str:
        parsed = await feed(fmt, enc.topic("G", "NDATA", "E"), data(seq, float(seq)))
        return [i.fields for i in parsed.items] or parsed.rejections[0].reason

    await feed(first, node, BIRTH)  # alias 1 = Temp/A, at T0
    await feed(
        first,
        node,
        enc.nbirth([Metric("Moved", 1, T0 + 5, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 5),
    )
    again = restarted()
    assert await values(again, 3) == [{"Temp/A": 3.0}]
    assert await values(again, 6) == [{"Moved": 6.0}]
    assert await values(restarted(), -1) == "no_birth"  # before any session stored
    # A refused rebirth at T0 + 8, then a usable one at T0 + 10.
    await feed(
        first,
        node,
        enc.nbirth([Metric("X", 1, T0 + 8, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 8) + b"\xff",
    )
    again = restarted()
    assert await values(again, 7) == [{"Moved": 7.0}]
    assert await values(again, 9) == "no_birth"
    await feed(
        first,
        node,
        enc.nbirth([Metric("Last", 1, T0 + 10, enc.FLOAT, 0.5)], bd_seq=8, timestamp=T0 + 10),
    )
    again = restarted()
    assert [await values(again, seq) for seq in (7, 9, 11)] == [
        [{"Moved": 7.0}],
        "no_birth",
        [{"Last": 11.0}],
    ]
    assert await values(again, 3) == [{"Temp/A": 3.0}]  # three sessions back
    # The history is bounded: eight sessions.
    for step in range(11, 20):
        await feed(
            first,
            node,
            enc.nbirth(
                [Metric(f"S{step}", 1, T0 + 10 * step, enc.FLOAT, 0.5)],
                bd_seq=8,
                timestamp=T0 + 10 * step,
            ),
        )
    again = restarted()
    assert await values(again, 10 * 12 + 1) == [{"S12": 121.0}]
    assert await values(again, 10 * 11 + 1) == [{"S11": 111.0}]
    assert await values(again, 11) == "no_birth"
    doc = await births.find_one({"_id": "G/E"})
    assert [h["metrics"][-1]["name"] for h in doc["history"]] == [
        f"S{step}" for step in range(18, 10, -1)
    ]
