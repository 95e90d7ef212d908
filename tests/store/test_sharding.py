"""``ingest init-db --shard``: a no-op that says so on a non-sharded deployment, and the
sharding commands on a real sharded cluster (compose profile ``sharded``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

from ingest.model import Reading
from ingest.store.schema import READINGS_INDEX, Schema
from ingest.store.sharding import CLAIMS_SHARD_KEY, SHARD_KEYS
from ingest.store.writers.bucket import BucketWriter
from tests.conftest import SHARDED_ENV
from tests.support.procs import ROOT, clean_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

COLLECTION = {"bucket": "buckets", "timeseries": "readings"}


def init_db(uri: str, db: str, mode: str, *, flag: bool = True) -> subprocess.CompletedProcess[str]:
    """``ingest init-db`` with ``--shard``, or with INGEST_SHARD=true in its environment."""
    env = clean_env()
    if not flag:
        env["INGEST_SHARD"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ingest",
            "init-db",
            *(["--shard"] if flag else []),
            "--mode",
            mode,
            "--mongodb-uri",
            uri,
            "--db",
            db,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "env"])
def test_shard_on_a_deployment_without_mongos_changes_nothing_and_says_so(
    mongo_uri: str, db_name: str, mode: str, flag: bool
) -> None:
    result = init_db(mongo_uri, db_name, mode, flag=flag)
    with MongoClient[dict[str, Any]](mongo_uri) as client:
        try:
            names = client[db_name].list_collection_names()
        finally:
            client.drop_database(db_name)
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "--shard" in line]
    assert len(warning) == 1, result.stderr
    assert "is not a sharded cluster" in warning[0]
    assert f"{db_name}.{COLLECTION[mode]} stays unsharded" in warning[0]
    assert COLLECTION[mode] in names  # the rest of init-db still ran


@pytest.mark.process
def test_help_explains_each_shard_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ingest", "init-db", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=True,
    )
    text = " ".join(result.stdout.split())
    assert '{sensor_id: "hashed"}' in text
    assert "{meta.sensor_id: 1}" in text
    assert '{_id: "hashed"}' in text
    assert "--shard" in text
    assert "changes nothing and says so" in text


# --- on a real sharded cluster -------------------------------------------------------------


@pytest.fixture
async def sharded() -> AsyncIterator[tuple[str, str, AsyncMongoClient[dict[str, Any]]]]:
    uri = os.environ.get(SHARDED_ENV, "")
    name = f"s_{uuid.uuid4().hex[:12]}"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, tz_aware=True)
    try:
        yield uri, name, client
    finally:
        await client.drop_database(name)
        await client.close()


async def shard_key(
    client: AsyncMongoClient[dict[str, Any]], db: str, name: str
) -> dict[str, Any] | None:
    """The shard key recorded in config.collections (time-series: its buckets namespace)."""
    for namespace in (f"{db}.{name}", f"{db}.system.buckets.{name}"):
        entry = await client.config.collections.find_one({"_id": namespace})
        if entry is not None and not entry.get("dropped"):
            return dict(entry["key"])
    return None


@pytest.mark.sharded_cluster
@pytest.mark.parametrize("mode", ["bucket", "timeseries"])
async def test_shard_shards_each_mode_on_its_key_and_is_idempotent(
    sharded: tuple[str, str, AsyncMongoClient[dict[str, Any]]], mode: str
) -> None:
    uri, db, client = sharded
    for _ in range(2):
        result = init_db(uri, db, mode)
        assert result.returncode == 0, result.stderr
    assert await shard_key(client, db, COLLECTION[mode]) == SHARD_KEYS[mode]
    if mode == "timeseries":  # the claims' _id stays unique across shards
        assert await shard_key(client, db, "readings_claims") == CLAIMS_SHARD_KEY
    if mode == "bucket":  # the unique index survives sharding (shard key is its prefix)
        indexes = await client[db].buckets.index_information()
        assert indexes[READINGS_INDEX]["unique"] is True


@pytest.mark.sharded_cluster
async def test_a_collection_sharded_on_another_key_is_refused_with_one_line(
    sharded: tuple[str, str, AsyncMongoClient[dict[str, Any]]],
) -> None:
    uri, db, client = sharded
    await client.admin.command({"shardCollection": f"{db}.buckets", "key": {"bucket_start": 1}})
    result = init_db(uri, db, "bucket")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    # The unique index cannot be built on a collection sharded on another key.
    assert f"cannot create the unique index {READINGS_INDEX}" in result.stderr, result.stderr


@pytest.mark.sharded_cluster
async def test_idempotent_bucket_writes_hold_through_mongos(
    sharded: tuple[str, str, AsyncMongoClient[dict[str, Any]]],
) -> None:
    """The duplicate-key settle path (an aggregate and a retried bulk) through a mongos."""
    uri, db, client = sharded
    assert init_db(uri, db, "bucket").returncode == 0
    schema = Schema(
        client[db],
        "buckets",
        rejects_collection="rejects",
        rejects_max_bytes=1 << 20,
        retention_days=None,
        span_seconds=3600,
    )
    writer = BucketWriter(client[db].buckets, schema, 3600, 5)
    start = 1_790_000_000 // 3600 * 3600
    batch = [
        Reading(f"s{i % 3}", datetime.fromtimestamp(start + i, UTC), start + i, {"v": float(i)})
        for i in range(15)
    ]
    assert (await writer.write(writer.plan(batch))).written == 15
    again = await writer.write(writer.plan(batch))
    assert (again.written, again.duplicates, again.conflicts) == (0, 15, [])
    docs = await client[db].buckets.find({}).to_list()
    assert sum(d["count"] for d in docs) == 15
