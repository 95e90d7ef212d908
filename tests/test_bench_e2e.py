"""The end-to-end benchmark's instruments: fakemongo answers the real driver and counts
exactly, the relay times and counts every consumer from the broker's side, and a tiny
bench run accounts for every message on every side."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import bson
import pytest
from pymongo import InsertOne, MongoClient, UpdateOne
from pymongo.errors import OperationFailure

from bench import e2e
from bench.e2e import (
    CLIENTS,
    CONSUMERS,
    Run,
    Sample,
    Settings,
    Watch,
    markdown,
    run_all,
    timed,
    tools,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def fakemongo() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen([str(tools()["fakemongo"])], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    uri = proc.stdout.readline().strip()
    yield uri, proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=10)


def final_counts(proc: subprocess.Popen[str]) -> dict[str, Any]:
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    counts: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return counts


def test_driver_writes_and_counts(fakemongo: tuple[str, subprocess.Popen[str]]) -> None:
    uri, proc = fakemongo
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        assert client.admin.command("ping")["ok"] == 1
        coll = client.bench.buckets
        assert len(coll.insert_many([{"i": i} for i in range(25)]).inserted_ids) == 25
        result = coll.bulk_write(
            [
                UpdateOne({"s": i}, {"$push": {"readings": {"$each": [1, 2, 3]}}}, upsert=True)
                for i in range(4)
            ]
            + [
                UpdateOne({"s": 9}, {"$push": {"readings": 7}, "$inc": {"count": 1}}, upsert=True),
                UpdateOne({"s": 10}, {"$set": {"x": 1}}),
                InsertOne({"i": 99}),
            ],
            ordered=False,
        )
        client.bench.readings_claims.insert_many([{"_id": i} for i in range(3)])
        # A database that keeps nothing: every upsert inserts, a plain update matches none.
        assert (
            result.upserted_count,
            result.matched_count,
            result.modified_count,
            result.inserted_count,
        ) == (5, 0, 0, 1)
        assert result.upserted_ids is not None
        assert sorted(result.upserted_ids) == [0, 1, 2, 3, 4]
        stats = client.bench.command("fakemongoStats")
        assert coll.find_one({}) is None
    finally:
        client.close()
    assert (stats["insertedDocuments"], stats["insertCommands"]) == (26, 2)
    # timeseries mode's claims are counted apart from the readings' documents
    assert (stats["claimDocuments"], stats["claimCommands"]) == (3, 1)
    assert (stats["updateOps"], stats["upserts"], stats["pushedElements"]) == (6, 5, 13)
    counts = final_counts(proc)
    assert counts["insertedDocuments"] == 26
    assert counts["claimDocuments"] == 3
    assert counts["pushedElements"] == 13
    assert counts["commands"]["endSessions"] == 1


def test_collections_as_the_daemon_checks_them(
    fakemongo: tuple[str, subprocess.Popen[str]],
) -> None:
    uri, _ = fakemongo
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=5000)
    try:
        db = client.bench
        options = {"timeField": "ts", "metaField": "meta", "granularity": "seconds"}
        db.command({"create": "readings", "timeseries": options})
        db.command({"create": "rejects", "capped": True, "size": 4096})
        with pytest.raises(OperationFailure) as exc:
            db.command({"create": "readings"})
        assert exc.value.code == 48
        [info] = db.list_collections(filter={"name": "readings"})
        assert info["type"] == "timeseries"
        assert info["options"]["timeseries"] == options
        assert (
            db.readings.create_index([("meta.sensor_id", 1), ("ts", 1)]) == "meta.sensor_id_1_ts_1"
        )
        assert sorted(c["name"] for c in db.list_collections()) == ["readings", "rejects"]
        assert list(client.other.list_collections()) == []
        with pytest.raises(OperationFailure) as unknown:
            db.command("noSuchCommand")
        assert unknown.value.code == 59
    finally:
        client.close()


def test_legacy_op_query_hello(fakemongo: tuple[str, subprocess.Popen[str]]) -> None:
    uri, _ = fakemongo
    port = int(uri.rsplit(":", 1)[1])
    query = bson.encode({"isMaster": 1})
    body = struct.pack("<i", 0) + b"admin.$cmd\0" + struct.pack("<ii", 0, -1) + query
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(struct.pack("<iiii", 16 + len(body), 7, 0, 2004) + body)
        header = sock.recv(16, socket.MSG_WAITALL)
        length, _, response_to, opcode = struct.unpack("<iiii", header)
        rest = sock.recv(length - 16, socket.MSG_WAITALL)
    assert (response_to, opcode) == (7, 1)  # OP_REPLY to our request
    assert struct.unpack("<i", rest[16:20]) == (1,)  # one document returned
    reply = bson.decode(rest[20:])
    assert reply["ismaster"] is True
    assert reply["maxWireVersion"] >= 17


def test_at_qos_0_the_daemon_is_timed_from_its_connect_to_the_scrapes_around_its_end() -> None:
    run = Run("bucket", 1, 1, 0, 100, connected=0.3)
    # sent, answered, done, received, cpu
    watch = Watch(
        [
            Sample(0.0, 0.1, 0, 0, 1.0),
            Sample(0.2, 0.3, 0, 0, 1.5),
            Sample(0.4, 0.6, 10, 20, 2.0),
            Sample(1.0, 1.1, 90, 95, 3.0),
            Sample(1.2, 1.3, 100, 100, 3.5),
        ],
        cpu_at_connect=1.6,
    )
    timed(run, watch)
    # From the relay's connect (0.3) to the last acknowledgement: after 1.0 (the scrape
    # sent before the one that showed it), by 1.3; CPU from the connect on.
    assert (run.seconds_low, run.seconds_high) == pytest.approx((0.7, 1.0))
    assert run.seconds == pytest.approx(0.85)
    assert run.cpu_seconds == pytest.approx(3.5 - 1.6)
    # fakemongo's last write narrows the end: after 1.15.
    timed(run, watch, (0.5, 1.15))
    assert run.seconds_low == pytest.approx(1.15 - 0.3)
    # A run that lost messages stalls: it ends at the first scrape showing its final
    # count, not at the last one, 20 s later.
    watch.samples += [Sample(21.2, 21.3, 100, 100, 3.5), Sample(22.2, 22.3, 100, 100, 3.5)]
    timed(run, watch)
    assert run.seconds_high == pytest.approx(1.0)
    # At QoS 1 both ends are the relay's (settle): timed leaves the clock alone.
    qos1 = Run(
        "bucket", 1, 1, 1, 100, connected=0.3, seconds=0.9, seconds_low=0.9, seconds_high=0.9
    )
    timed(qos1, watch)
    assert (qos1.seconds_low, qos1.seconds, qos1.seconds_high) == (0.9, 0.9, 0.9)


@pytest.mark.process
def test_tiny_run_accounts_for_every_message() -> None:
    settings = Settings(
        sensors=(20,),
        messages=200,
        batched_messages=10,
        per_message=(1, 100),
        qos=(1,),
        consumers=CONSUMERS,
        rounds=1,
    )
    report = run_all(settings)
    assert len(report["runs"]) == 10
    for run in report["runs"]:
        readings = run["messages"] * run["per_message"]
        assert run["complete"], run
        assert set(run["lost"].values()) == {0}, run
        assert run["published"] == run["received"] == run["messages"], run
        # the broker's side: every message sent, every PUBACK taken (the relay), nothing
        # left in the session afterwards, nothing dropped ($SYS)
        assert run["delivered"] == run["pubacks"] == run["messages_done"] == run["messages"]
        assert run["left_at_broker"] == 0, run
        assert run["broker_dropped"] == 0, run
        # from the consumer's connect to the broker's answer to a PINGREQ sent after the
        # last PUBACK, both dated by the relay
        assert 0 < run["seconds_low"] == run["seconds"] == run["seconds_high"], run
        assert run["broker_read_lag"] > 0, run
        assert run["relay_cpu_seconds"] > 0, run
        if run["consumer"] not in CLIENTS:
            assert run["acked"] == run["messages"], run
            assert run["written"] == readings, run
        if run["consumer"] in ("bucket", "timeseries"):
            assert run["sink_readings"] == readings, run
            assert run["sink_requests"] >= 1, run
    # every consumer's rate as its ratio to the reference's (idealsub) in the round
    for row in report["summary"]:
        assert row["reference"] == "idealsub"
        assert row["ratio"]["median"] > 0, row
        assert row["complete"], row
    ideal = [row for row in report["summary"] if row["consumer"] == "idealsub"]
    assert [row["ratio"]["median"] for row in ideal] == [1.0, 1.0]
    table = markdown(report)
    assert "| ratio to idealsub (min / median / max) |" in table
    # a row of rates and a row of accounting for each consumer and case
    for consumer in CONSUMERS:
        assert table.count(f"\n| 20 | 1 | 1 | {consumer} |") == 2
        assert table.count(f"\n| 20 | 100 | 1 | {consumer} |") == 2
    # the interpreter's build is part of the figures (PGO/LTO change the CPU per reading)
    assert f"{sys.version.split()[0]}, configured " in table
    assert "the relay that takes the clock spent" in table


@pytest.mark.process
def test_at_qos_0_the_c_clients_are_timed_to_their_exit_after_the_backlog() -> None:
    settings = Settings(
        sensors=(20,), messages=300, per_message=(1,), qos=(0,), consumers=CLIENTS, rounds=1
    )
    for run in run_all(settings)["runs"]:
        assert run["complete"], run
        assert run["delivered"] == run["received"] == run["messages_done"] == 300, run
        assert run["pubacks"] == 0, run  # QoS 0: nothing to acknowledge
        # after the broker sent the last message, by the exit the bench saw
        assert 0 < run["seconds_low"] <= run["seconds"] <= run["seconds_high"], run


UNACKING_CONSUMER = """
import signal, sys
from paho.mqtt import client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port, client_id, topic, total, unacked = sys.argv[1:6]
seen = 0


def on_message(client, userdata, message):
    global seen
    seen += 1
    print(message.payload.decode(), flush=True)  # its own count: every message
    if seen <= int(total) - int(unacked):
        client.ack(message.mid, message.qos)


client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                     protocol=mqtt.MQTTv5, manual_ack=True)
client.on_message = on_message
client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
props = Properties(PacketTypes.CONNECT)
props.SessionExpiryInterval = 3600
client.connect("127.0.0.1", int(port), clean_start=False, properties=props)
signal.signal(signal.SIGTERM, lambda *_: client.disconnect())
client.loop_forever()
"""


@pytest.mark.process
def test_a_consumer_that_leaves_pubacks_unsent_is_not_counted_as_done(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(UNACKING_CONSUMER)

    def consumer(port: int, worker: str, run: Run, topic: str, single: bool) -> list[str]:
        return [sys.executable, str(script), str(port), worker, topic, str(run.published), "7"]

    monkeypatch.setattr(e2e, "sub_command", consumer)
    monkeypatch.setattr(e2e, "STALL", 2.0)  # it never finishes: do not wait 20 s
    settings = Settings(
        sensors=(20,),
        messages=200,
        per_message=(1,),
        qos=(1,),
        consumers=("mosquitto_sub",),
        rounds=1,
    )
    report = run_all(settings)
    [run] = report["runs"]
    # It wrote every message out, but the broker got 193 PUBACKs and sends the other 7
    # to whoever resumes the session: 193 are done, and the run is not complete.
    assert run["received"] == run["delivered"] == 200, run
    assert run["pubacks"] == run["messages_done"] == 193, run
    assert run["lost"]["not_acked"] == run["left_at_broker"] == 7, run
    assert not run["complete"]
    assert not report["summary"][0]["complete"]


@pytest.mark.process
def test_tiny_run_with_two_workers_spreads_the_backlog_and_accounts_for_every_message() -> None:
    settings = Settings(
        sensors=(20,),
        messages=200,
        batched_messages=10,
        per_message=(1,),
        qos=(1,),
        consumers=("idealsub", "mosquitto_sub", "bucket"),
        rounds=1,
        workers=2,
    )
    report = run_all(settings)
    for run in report["runs"]:
        assert run["complete"], run
        assert set(run["lost"].values()) == {0}, run
        assert run["published"] == run["received"] == run["messages"], run
    bucket = next(run for run in report["runs"] if run["consumer"] == "bucket")
    assert bucket["sink_readings"] == 200, bucket
    assert "2 worker(s)" in markdown(report)


@pytest.mark.process
def test_each_fleet_size_runs_in_every_round_and_is_compared_within_it() -> None:
    settings = Settings(
        sensors=(20, 50), messages=200, per_message=(1,), qos=(1,), consumers=CLIENTS, rounds=2
    )
    report = run_all(settings)
    # interleaved: round 1 in order, round 2 reversed (fleets and consumers)
    assert [(r["round"], r["sensors"], r["consumer"]) for r in report["runs"]] == [
        (1, 20, "idealsub"),
        (1, 20, "mosquitto_sub"),
        (1, 50, "idealsub"),
        (1, 50, "mosquitto_sub"),
        (2, 50, "mosquitto_sub"),
        (2, 50, "idealsub"),
        (2, 20, "mosquitto_sub"),
        (2, 20, "idealsub"),
    ]
    for run in report["runs"]:
        assert run["complete"], run
        assert set(run["lost"].values()) == {0}, run
    rates = {(r["round"], r["sensors"], r["consumer"]): r["msg_per_s"] for r in report["runs"]}
    for row in report["summary"]:
        assert row["rounds"] == 2, row
        ratios = sorted(
            rates[k, row["sensors"], row["consumer"]] / rates[k, row["sensors"], "idealsub"]
            for k in (1, 2)
        )
        assert (row["ratio"]["min"], row["ratio"]["max"]) == pytest.approx(tuple(ratios))
    table = markdown(report)
    for sensors in (20, 50):
        assert table.count(f"\n| {sensors} | 1 | 1 | mosquitto_sub |") == 2


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--sensors", "1000,many"], "--sensors: '1000,many' is not a list of fleet sizes\n"),
        (["--sensors", "0"], "--sensors: '0' is not a list of fleet sizes\n"),
        (
            ["--baseline", "/nonexistent"],
            "--baseline: /nonexistent is not a source tree of ingest\n",
        ),
    ],
)
def test_bad_fleet_sizes_or_baseline_are_one_line_before_any_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.e2e", *args])
    assert e2e.main() == 2
    assert capsys.readouterr().err == error
