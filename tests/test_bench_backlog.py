"""The format benchmarks' shared instrument (bench.backlog): a confirmed backlog drained by
a real daemon, or by mosquitto_sub as the reference, timed with bench.e2e's clock, and
bench.publish's broker-side count."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

import pytest

from bench import mapping
from bench.backlog import fleet_topics, payloads, preload, run_daemon, run_sub
from bench.publish import received
from tests.support.procs import Broker

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.process
def test_a_fleet_backlog_is_drained_whole_and_timed_from_first_message_to_last_ack(
    tmp_path: Path,
) -> None:
    broker = Broker(tmp_path)
    broker.start()
    try:
        lines = payloads(300, 1, sensors=30)
        topics = fleet_topics(300, 30)
        assert len(set(topics)) == 30
        msg_rate, reading_rate = run_daemon(broker, lines, tmp_path, 100, topics=topics)
    finally:
        broker.stop()
    # Every message acknowledged (drain raises otherwise), one reading each, and a rate
    # from a positive duration.
    assert msg_rate > 0
    assert reading_rate == pytest.approx(msg_rate)


@pytest.mark.process
def test_the_publish_bench_reads_what_the_broker_received(tmp_path: Path) -> None:
    broker = Broker(tmp_path, extra="sys_interval 1\n")
    broker.start()
    try:
        preload(broker, [(f"bench/s{i}/readings", b"{}") for i in range(7)])
        assert received(broker, 7) == 7
    finally:
        broker.stop()


@pytest.mark.process
def test_the_c_client_reference_drains_the_same_backlog_timed_by_the_relay(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.start()
    try:
        lines = payloads(300, 1, sensors=30)
        rate = run_sub(broker, lines, tmp_path, fleet_topics(300, 30))
    finally:
        broker.stop()
    # Every message written to its file and acknowledged (run_sub raises otherwise), in
    # a positive time.
    assert rate > 0
    assert (tmp_path / "sub-0.txt").read_bytes().splitlines() == lines


@pytest.mark.process
def test_bench_mapping_reports_each_stream_against_mosquitto_sub_on_the_same_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        mapping.main(
            [
                "--stream",
                "ttn",
                "--c-client",
                "--messages",
                "100",
                "--sensors",
                "10",
                "--rounds",
                "1",
                "--batch-size",
                "50",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    streams = ("default", "default_fleet", "ttn")
    assert set(result["c_client_msgs_per_s"]) == set(result["ratio_to_c_client"]) == {*streams}
    for name in streams:
        [daemon] = result[f"{name}_readings_per_s"]
        [client] = result["c_client_msgs_per_s"][name]
        assert daemon > 0
        assert client > 0
        # (the rates above are rounded to whole readings/s, the ratio to three decimals:
        # a tiny run on a loaded machine can give a ratio of a few hundredths)
        assert result["ratio_to_c_client"][name] == pytest.approx(
            daemon / client, rel=0.01, abs=0.0005
        )


def test_bench_mapping_table_has_the_c_client_columns_only_when_asked() -> None:
    args = argparse.Namespace(stream="ttn", messages=4, sensors=2, rounds=2)
    rates = {"default": [200.0, 100.0], "default_fleet": [150.0, 50.0], "ttn": [60.0, 40.0]}
    clients = {"default": [400.0, 400.0], "default_fleet": [200.0, 200.0], "ttn": [100.0, 100.0]}
    lines = [b"{}"] * 4
    with_client = mapping.table(
        mapping.report(args, "preset ttn", lines, rates, clients), rates, clients
    )
    # medians 150 / 400, 100 / 200, 50 / 100
    assert "| 200, 100 | 150 | 400, 400 | 400 | 0.38 |" in with_client
    assert "| 60, 40 | 50 | 100, 100 | 100 | 0.50 |" in with_client
    plain = mapping.table(mapping.report(args, "preset ttn", lines, rates, None), rates, None)
    assert "mosquitto_sub" not in plain
    assert "| 60, 40 | 50 |\n" in plain
