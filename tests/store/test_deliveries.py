"""The delivery ledger: entries packed and read back, the latest per packet id and
checksum among a client's last ``keep``, numbered across restarts, trimmed, and the
recorded times given again by both decoder twins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from ingest.devices.decode import Arrivals, Limits, Replayed, decode_py
from ingest.model import Inbound
from ingest.mqtt.source import SESSION_EXPIRY
from ingest.store import deliveries
from ingest.store.deliveries import (
    COLLECTION,
    Deliveries,
    Recorded,
    checksum,
    chunks,
    latest,
    pack,
    unpack,
)
from ingest.store.schema import Schema
from tests.support.twins import compiled_or_none

if TYPE_CHECKING:
    from ingest.store.deliveries import Entry

NOW = 1_790_000_000.25


def message(mid: int, payload: bytes = b'{"v":1}', topic: str = "sensors/a/readings",
            received_at: float = NOW) -> Inbound:
    return Inbound(topic, payload, mid, 1, 1, received_at, False, False)


def doc(seq: int, entries: list[Entry]) -> dict[str, Any]:
    return {"seq": seq, "n": len(entries), "entries": pack(entries)}


@given(st.lists(st.tuples(st.integers(1, 65535), st.binary(max_size=40), st.floats(0, 4e9),
                          st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)),
                max_size=20))
def test_entries_read_back_as_they_were_packed(
        raw: list[tuple[int, bytes, float, list[int]]]) -> None:
    entries = [(message(mid, payload, received_at=at), times)
               for mid, payload, at, times in raw]
    assert list(unpack(pack(entries))) == [
        ((m.mid, checksum(m.topic, m.payload)), Recorded(m.received_at, tuple(times)))
        for m, times in entries]


def test_a_resent_message_finds_the_latest_entry_of_its_packet_id_and_content() -> None:
    """A broker reuses a packet id once acknowledged: the latest entry is the resent one's;
    another payload under that id, or another id, is another message."""
    acked = (message(7, received_at=NOW - 60), [1])   # the same message, earlier: acked
    other = (message(7, b'{"v":2}'), [2])              # the id reused for another payload
    resent = (message(7), [3])                         # the one the broker resends
    found = latest([doc(2, [acked, other]), doc(3, [resent])], keep=10)
    assert found[7, checksum("sensors/a/readings", b'{"v":1}')] == Recorded(NOW, (3,))
    assert found[7, checksum("sensors/a/readings", b'{"v":2}')] == Recorded(NOW, (2,))
    assert (8, checksum("sensors/a/readings", b'{"v":1}')) not in found
    assert (7, checksum("sensors/b/readings", b'{"v":1}')) not in found


def test_only_the_clients_last_keep_entries_count() -> None:
    entries = [(message(mid), [mid]) for mid in range(1, 7)]
    found = latest([doc(3, entries[:3]), doc(6, entries[3:])], keep=4)
    assert sorted(key[0] for key in found) == [3, 4, 5, 6]
    assert latest([], keep=4) == {}


def test_a_batch_too_large_for_one_document_is_recorded_in_several(monkeypatch: Any) -> None:
    monkeypatch.setattr(deliveries, "ENTRIES_PER_DOC", 3)
    monkeypatch.setattr(deliveries, "TIMES_PER_DOC", 5)
    entries = [(message(mid), [mid] * (4 if mid == 5 else 1)) for mid in range(1, 9)]
    pieces = [[m.mid for m, _times in piece] for piece in chunks(entries)]
    assert pieces == [[1, 2, 3], [4, 5], [6, 7, 8]]


def test_the_ledger_outlives_every_session_the_broker_keeps() -> None:
    assert deliveries.EXPIRE_SECONDS > SESSION_EXPIRY


async def test_entries_are_numbered_across_restarts_trimmed_and_written_once(db: Any) -> None:
    await Schema(db, "buckets", rejects_collection="rejects", rejects_max_bytes=1 << 20,
                 retention_days=None, span_seconds=3600).ensure_deliveries()
    first = Deliveries(db[COLLECTION], "worker-0", keep=2)
    docs = await first.documents([(message(1), [10]), (message(2), [20])])
    await first.write(docs)
    await first.write(docs)  # again, after an answer lost: still written once
    assert await db[COLLECTION].count_documents({}) == 1
    await Deliveries(db[COLLECTION], "worker-1", keep=2).write(
        await Deliveries(db[COLLECTION], "worker-1", keep=2).documents([(message(1), [99])]))
    again = Deliveries(db[COLLECTION], "worker-0", keep=2)  # a restart: numbering goes on
    for mid in (3, 4, 5):
        await again.write(await again.documents([(message(mid), [mid * 10])]))
    ours = await db[COLLECTION].find({"client": "worker-0"}).sort("seq", 1).to_list()
    assert [d["seq"] for d in ours] == [3, 4, 5]  # the first document, all older: trimmed
    crc = checksum("sensors/a/readings", b'{"v":1}')
    assert await again.tail() == {(4, crc): Recorded(NOW, (40,)), (5, crc): Recorded(NOW, (50,))}
    indexes = await db[COLLECTION].index_information()
    assert indexes[deliveries.INDEX]["key"] == [("client", 1), ("seq", 1)]
    assert indexes[deliveries.TTL_INDEX]["expireAfterSeconds"] == deliveries.EXPIRE_SECONDS


def test_both_decoders_give_a_redelivery_the_recorded_times_in_order() -> None:
    """Two readings without a time, one with: the recorded times go to the two, in
    order, and are recorded again; a third asked for (not expected) takes its arrival."""
    payload = orjson.dumps([{"sensor_id": "a", "v": 1}, {"sensor_id": "a", "ts": NOW, "v": 2},
                            {"sensor_id": "b", "v": 3}])
    compiled = compiled_or_none("ingest.devices._decode_c")
    for decode in [decode_py] + ([compiled.decode] if compiled else []):
        again: list[int] = []
        out = decode("t/x", payload, NOW + 5, Limits(), None, Replayed((7, 9), again))
        assert [r.ms for r in out.readings] == [7, round(NOW * 1000), 9]
        assert again == [7, 9]
        more = Replayed((7,), None)
        assert [more.next("a", 1), more.next("a", 1), more.next("a", 1)] == [7, 1, 2]


def test_arrivals_record_what_they_give_only_when_asked() -> None:
    arrivals = Arrivals()
    arrivals.next("a", 5)
    arrivals.given = []
    assert [arrivals.next("a", 5), arrivals.next("b", 5)] == [6, 5]
    assert arrivals.given == [6, 5]
