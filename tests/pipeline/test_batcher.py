"""Size-or-linger batching with a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime

from ingest.model import Inbound, Reading
from ingest.pipeline.batcher import Batcher


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(mid: int) -> Inbound:
    return Inbound("sensors/a/readings", b"{}", mid, 1, 1, 0.0)


def readings(n: int) -> list[Reading]:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return [Reading("a", ts, ts.timestamp(), {"v": i}) for i in range(n)]


def test_batch_closes_at_size_in_readings() -> None:
    batcher = Batcher(max_items=10, linger=1.0, clock=Clock())
    assert batcher.add(message(1), readings(6), []) is None
    full = batcher.add(message(2), readings(6), [])
    assert full is not None
    assert [m.mid for m in full.messages] == [1, 2]
    assert len(full.readings) == 12
    assert batcher.deadline() is None


def test_batch_closes_at_size_in_messages_even_without_readings() -> None:
    """Messages that were all rejected still fill a batch, so their acks are not held back."""
    batcher = Batcher(max_items=3, linger=1.0, clock=Clock())
    batcher.add(message(1), [], [{"reason": "x"}])
    batcher.add(message(2), [], [])
    full = batcher.add(message(3), [], [])
    assert full is not None
    assert len(full.messages) == 3
    assert full.rejects == [{"reason": "x"}]


def test_batch_closes_after_linger() -> None:
    clock = Clock()
    batcher = Batcher(max_items=100, linger=0.5, clock=clock)
    batcher.add(message(1), readings(1), [])
    assert batcher.deadline() == 100.5
    clock.now = 100.4
    assert batcher.due() is None
    batcher.add(message(2), readings(1), [])
    clock.now = 100.5
    due = batcher.due()
    assert due is not None
    assert [m.mid for m in due.messages] == [1, 2]
    assert batcher.due() is None


def test_take_flushes_an_open_batch_and_numbers_increase() -> None:
    batcher = Batcher(max_items=100, linger=10, clock=Clock())
    assert batcher.take() is None
    batcher.add(message(1), readings(2), [])
    first = batcher.take()
    batcher.add(message(2), readings(2), [])
    second = batcher.take()
    assert first is not None
    assert second is not None
    assert second.number == first.number + 1


def test_origin_maps_each_reading_to_its_message() -> None:
    batcher = Batcher(max_items=100, linger=10, clock=Clock())
    first, second = readings(2), readings(3)
    batcher.add(message(1), first, [])
    batcher.add(message(2), [], [])
    batcher.add(message(3), second, [])
    batch = batcher.take()
    assert batch is not None
    owners = batch.origin()
    assert {owners[id(r)].mid for r in first} == {1}
    assert {owners[id(r)].mid for r in second} == {3}
