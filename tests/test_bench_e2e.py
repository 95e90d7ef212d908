"""The end-to-end benchmark's instruments: fakemongo answers the real driver and counts
exactly, and a tiny bench run accounts for every message on every side."""

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

from bench.e2e import CONSUMERS, Run, Sample, Settings, Watch, markdown, run_all, timed, tools

if TYPE_CHECKING:
    from collections.abc import Iterator


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
            [UpdateOne({"s": i}, {"$push": {"readings": {"$each": [1, 2, 3]}}}, upsert=True)
             for i in range(4)]
            + [UpdateOne({"s": 9}, {"$push": {"readings": 7}, "$inc": {"count": 1}},
                         upsert=True),
               UpdateOne({"s": 10}, {"$set": {"x": 1}}),
               InsertOne({"i": 99})],
            ordered=False)
        # A database that keeps nothing: every upsert inserts, a plain update matches none.
        assert (result.upserted_count, result.matched_count, result.modified_count,
                result.inserted_count) == (5, 0, 0, 1)
        assert sorted(result.upserted_ids) == [0, 1, 2, 3, 4]
        stats = client.bench.command("fakemongoStats")
        assert coll.find_one({}) is None
    finally:
        client.close()
    assert (stats["insertedDocuments"], stats["insertCommands"]) == (26, 2)
    assert (stats["updateOps"], stats["upserts"], stats["pushedElements"]) == (6, 5, 13)
    counts = final_counts(proc)
    assert counts["insertedDocuments"] == 26
    assert counts["pushedElements"] == 13
    assert counts["commands"]["endSessions"] == 1


def test_collections_as_the_daemon_checks_them(
        fakemongo: tuple[str, subprocess.Popen[str]]) -> None:
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
        assert db.readings.create_index([("meta.sensor_id", 1), ("ts", 1)]) == \
            "meta.sensor_id_1_ts_1"
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


def test_clock_bounds_come_from_the_scrapes_around_the_events() -> None:
    run = Run("bucket", 1, 1, 1, 100)
    # sent, answered, done, received, cpu
    watch = Watch([Sample(0.0, 0.1, 0, 0, 1.0), Sample(0.2, 0.3, 0, 0, 1.5),
                   Sample(0.4, 0.6, 10, 20, 2.0), Sample(1.0, 1.1, 90, 95, 3.0),
                   Sample(1.2, 1.3, 100, 100, 3.5)])
    timed(run, watch)
    # first message after 0.2 (a scrape sent then saw none), by 0.6; last ack after 1.0,
    # by 1.3
    assert run.seconds_low == pytest.approx(1.0 - 0.6)
    assert run.seconds_high == pytest.approx(1.3 - 0.2)
    assert run.seconds == pytest.approx((0.4 + 1.1) / 2)
    assert run.cpu_seconds == pytest.approx(3.5 - 1.5)
    # The sink's first and last write narrow both brackets: first message by 0.5, last
    # ack after 1.15.
    timed(run, watch, (0.5, 1.15))
    assert (run.seconds_low, run.seconds_high) == (pytest.approx(1.15 - 0.5),
                                                   pytest.approx(1.3 - 0.2))
    # A run that lost messages stalls: it ends at the first scrape showing its final
    # count, not at the last one, 20 s later.
    watch.samples += [Sample(21.2, 21.3, 100, 100, 3.5), Sample(22.2, 22.3, 100, 100, 3.5)]
    timed(run, watch)
    assert run.seconds_high == pytest.approx(1.3 - 0.2)


def test_tiny_run_accounts_for_every_message() -> None:
    settings = Settings(sensors=20, messages=200, batched_messages=10, per_message=(1, 100),
                        qos=(1,), consumers=CONSUMERS, rounds=1)
    report = run_all(settings)
    assert len(report["runs"]) == 8
    for run in report["runs"]:
        readings = run["messages"] * run["per_message"]
        assert run["complete"], run
        assert set(run["lost"].values()) == {0}, run
        assert run["published"] == run["received"] == run["messages"], run
        assert run["broker_dropped"] == 0, run  # read from the broker's $SYS
        assert run["seconds_low"] <= run["seconds"] <= run["seconds_high"], run
        if run["consumer"] != "mosquitto_sub":
            assert run["acked"] == run["messages"], run
            assert run["written"] == readings, run
        if run["consumer"] in ("bucket", "timeseries"):
            assert run["sink_readings"] == readings, run
            assert run["sink_requests"] >= 1, run
    table = markdown(report)
    assert table.count("\n| 1 | 1 |") == 4
    assert table.count("\n| 100 | 1 |") == 4
    # the interpreter's build is part of the figures (PGO/LTO change the CPU per reading)
    assert f"{sys.version.split()[0]}, configured " in table


def test_tiny_run_with_two_workers_spreads_the_backlog_and_accounts_for_every_message() -> None:
    settings = Settings(sensors=20, messages=200, batched_messages=10, per_message=(1,),
                        qos=(1,), consumers=("mosquitto_sub", "bucket"), rounds=1, workers=2)
    report = run_all(settings)
    for run in report["runs"]:
        assert run["complete"], run
        assert set(run["lost"].values()) == {0}, run
        assert run["published"] == run["received"] == run["messages"], run
    bucket = next(run for run in report["runs"] if run["consumer"] == "bucket")
    assert bucket["sink_readings"] == 200, bucket
    assert "2 worker(s)" in markdown(report)
