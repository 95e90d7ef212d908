"""The delivery ledger: entries packed and read back, the latest per packet id and
checksum among a client's last ``keep``, numbered across restarts, trimmed, and the
recorded times given again by both decoder twins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from ingest.devices._decode_py import decode as decode_py
from ingest.devices.decode import Arrivals, Limits, Replayed
from ingest.model import Inbound
from ingest.mqtt.source import SESSION_EXPIRY
from ingest.store import deliveries
from ingest.store.deliveries import (
    COLLECTION,
    Deliveries,
    Recorded,
    checksum,
    first_delivery,
    latest,
    pack,
    pieces,
    unpack,
)
from ingest.store.schema import Schema
from tests.support.twins import compiled_or_none

if TYPE_CHECKING:
    type Entry = tuple[Inbound, list[int]]

NOW = 1_790_000_000.25


def message(
    mid: int,
    payload: bytes = b'{"v":1}',
    topic: str = "sensors/a/readings",
    received_at: float = NOW,
) -> Inbound:
    return Inbound(topic, payload, mid, 1, 1, received_at)


def flat(entries: list[Entry]) -> tuple[list[Inbound], list[int]]:
    """Messages and what they were given, as a batch holds them."""
    return [m for m, _ in entries], [x for _, times in entries for x in (len(times), *times)]


def doc(seq: int, entries: list[Entry]) -> dict[str, Any]:
    return {"seq": seq, "n": len(entries), "entries": pack(*flat(entries))}


def documents(ledger: Deliveries, entries: list[Entry]) -> Any:
    return ledger.documents(*flat(entries))


@given(
    st.lists(
        st.tuples(
            st.integers(1, 65535),
            st.binary(max_size=40),
            st.floats(0, 4e9),
            st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
        ),
        max_size=20,
    )
)
def test_entries_read_back_as_they_were_packed(
    raw: list[tuple[int, bytes, float, list[int]]],
) -> None:
    entries = [(message(mid, payload, received_at=at), times) for mid, payload, at, times in raw]
    assert list(unpack(pack(*flat(entries)), len(entries))) == [
        (m.mid, checksum(m.topic, m.payload), Recorded(m.received_at, tuple(times)))
        for m, times in entries
    ]


def test_a_resent_message_is_the_latest_entry_of_its_packet_id_if_the_content_agrees() -> None:
    """A broker gives a packet id to the next message once the PUBACK is in: the latest
    entry of an id is the resent message's first delivery, if that was recorded. An
    earlier message with the same words and id (a device repeating a state) never is."""
    acked = (message(7, received_at=NOW - 60), [1])  # the same words, earlier: acked
    other = (message(7, b'{"v":2}'), [2])  # the id given to another payload
    resent = (message(7), [3, 4])  # the one the broker resends
    found = latest([doc(2, [acked, other]), doc(3, [resent])], keep=10)
    assert first_delivery(found, message(7)) == Recorded(NOW, (3, 4))
    assert first_delivery(found, message(7, b'{"v":2}')) is None  # acked before (7, v1)
    assert first_delivery(found, message(8)) is None
    assert first_delivery(found, message(7, topic="sensors/b/readings")) is None
    # (7, v1) resent, its first delivery never recorded: not taken for the acked one
    assert first_delivery(latest([doc(2, [acked, other])], keep=10), message(7)) is None


def test_only_the_clients_last_keep_entries_count() -> None:
    entries = [(message(mid), [mid]) for mid in range(1, 7)]
    found = latest([doc(3, entries[:3]), doc(6, entries[3:])], keep=4)
    assert sorted(found) == [3, 4, 5, 6]
    assert latest([], keep=4) == {}


def test_a_batch_too_large_for_one_document_is_recorded_in_several(monkeypatch: Any) -> None:
    monkeypatch.setattr(deliveries, "ENTRIES_PER_DOC", 3)
    monkeypatch.setattr(deliveries, "TIMES_PER_DOC", 8)  # counts and times
    entries = [(message(mid), [mid] * (4 if mid == 5 else 1)) for mid in range(1, 9)]
    split = list(pieces(*flat(entries)))
    assert [[m.mid for m in some] for some, _given in split] == [[1, 2, 3], [4, 5], [6, 7, 8]]
    assert [given for _some, given in split] == [
        [1, 1, 1, 2, 1, 3],
        [1, 4, 4, 5, 5, 5, 5],
        [1, 6, 1, 7, 1, 8],
    ]


def test_the_ledger_outlives_every_session_the_broker_keeps() -> None:
    assert deliveries.EXPIRE_SECONDS > SESSION_EXPIRY


async def test_entries_are_numbered_across_restarts_trimmed_and_written_once(db: Any) -> None:
    await Schema(
        db,
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    ).ensure_deliveries()
    first = Deliveries(db[COLLECTION], "worker-0", keep=2)
    docs = await documents(first, [(message(1), [10]), (message(2), [20])])
    await first.write(docs)
    await first.write(docs)  # again, after an answer lost: still written once
    assert await db[COLLECTION].count_documents({}) == 1
    other = Deliveries(db[COLLECTION], "worker-1", keep=2)
    await other.write(await documents(other, [(message(1), [99])]))
    again = Deliveries(db[COLLECTION], "worker-0", keep=2)  # a restart: numbering goes on
    for mid in (3, 4, 5):
        await again.write(await documents(again, [(message(mid), [mid * 10])]))
    ours = await db[COLLECTION].find({"client": "worker-0"}).sort("seq", 1).to_list()
    assert [d["seq"] for d in ours] == [3, 4, 5]  # the first document, all older: trimmed
    crc = checksum("sensors/a/readings", b'{"v":1}')
    assert await again.tail() == {4: (crc, Recorded(NOW, (40,))), 5: (crc, Recorded(NOW, (50,)))}
    indexes = await db[COLLECTION].index_information()
    assert indexes[deliveries.INDEX]["key"] == [("client", 1), ("seq", 1)]
    assert indexes[deliveries.TTL_INDEX]["expireAfterSeconds"] == deliveries.EXPIRE_SECONDS


def test_both_decoders_give_a_redelivery_the_recorded_times_in_order() -> None:
    """Two readings without a time, one with: the recorded times go to the two, in
    order, and are recorded again; a third asked for (not expected) takes its arrival."""
    payload = orjson.dumps(
        [
            {"sensor_id": "a", "v": 1},
            {"sensor_id": "a", "ts": NOW, "v": 2},
            {"sensor_id": "b", "v": 3},
        ]
    )
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
