"""The format benchmarks' shared instrument (bench.backlog): a confirmed backlog drained by
a real daemon and timed with bench.e2e's clock, and bench.publish's broker-side count."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bench.backlog import fleet_topics, payloads, preload, run_daemon
from bench.publish import received
from tests.support.procs import Broker

if TYPE_CHECKING:
    from pathlib import Path


def test_a_fleet_backlog_is_drained_whole_and_timed_from_first_message_to_last_ack(
        tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.start()
    try:
        lines = payloads(300, 1, sensors=30)
        topics = fleet_topics(300, 30)
        assert len(set(topics)) == 30
        msg_rate, reading_rate = run_daemon(broker, lines, tmp_path, 100,
                                            topics=topics)
    finally:
        broker.stop()
    # Every message acknowledged (drain raises otherwise), one reading each, and a rate
    # from a positive duration.
    assert msg_rate > 0
    assert reading_rate == pytest.approx(msg_rate)


def test_the_publish_bench_reads_what_the_broker_received(tmp_path: Path) -> None:
    broker = Broker(tmp_path, extra="sys_interval 1\n")
    broker.start()
    try:
        preload(broker, [(f"bench/s{i}/readings", b"{}") for i in range(7)])
        assert received(broker, 7) == 7
    finally:
        broker.stop()
