"""``ingest init-db --shard``: shard the mode's collection on a sharded cluster.

Shard keys, chosen for high cardinality and no monotonic growth, so writes from a large
fleet spread over every shard instead of piling onto the chunk that holds "now":

- bucket mode: ``{sensor_id: "hashed"}``. Every document of a sensor lives on one shard,
  which also keeps the unique ``{sensor_id: 1, readings.ts: 1}`` index enforceable (a
  unique index must have the shard key's fields as a prefix), and an update that names
  its sensor goes to exactly one shard.
- timeseries mode: ``{meta.sensor_id: 1}``, the metaField subfield MongoDB's tutorial
  uses. The time field is left out on purpose: MongoDB 8.0 deprecates sharding a
  time-series collection on its time field (SERVER-88647), and the sensor id alone has
  the cardinality. Its claims collection (``<collection>_claims``, see
  :mod:`ingest.store.writers.claims`) is sharded on ``{_id: "hashed"}``: only a shard key
  on ``_id`` keeps ``_id`` unique across shards, which is what the claims rely on (left
  unsharded, the claims live on the database's primary shard, unique there too).

On a deployment that is not a sharded cluster (no ``mongos``), sharding is a no-op.
Before MongoDB 6.0 a database must have sharding enabled before one of its collections
is sharded; from 6.0 on ``enableSharding`` only creates the database if needed, so it is
always sent first (an "already enabled" answer from an old server is fine).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pymongo.errors import OperationFailure

from ingest.errors import SchemaError
from ingest.store.schema import claims_collection

if TYPE_CHECKING:
    from pymongo.asynchronous.mongo_client import AsyncMongoClient

logger = logging.getLogger(__name__)

SHARD_KEYS: dict[str, dict[str, Any]] = {
    "bucket": {"sensor_id": "hashed"},
    "timeseries": {"meta.sensor_id": 1},
}
CLAIMS_SHARD_KEY: dict[str, Any] = {"_id": "hashed"}
# shardCollection on a collection sharded with another key.
ALREADY_INITIALIZED = 23


async def is_sharded_cluster(client: AsyncMongoClient[dict[str, Any]]) -> bool:
    """Whether the client talks to a ``mongos`` (the router of a sharded cluster)."""
    hello = await client.admin.command("hello")
    return hello.get("msg") == "isdbgrid"


async def shard_collection(
    client: AsyncMongoClient[dict[str, Any]], mode: str, db: str, collection: str
) -> bool:
    """Shard ``db.collection`` with the mode's key; False if the cluster is not sharded.

    Idempotent: a collection already sharded on the same key is left as it is; one
    sharded on another key is refused with :class:`SchemaError`.
    """
    namespace = f"{db}.{collection}"
    key = SHARD_KEYS[mode]
    if not await is_sharded_cluster(client):
        logger.warning(
            "--shard: %s is not a sharded cluster (not a mongos), nothing to "
            "shard; %s stays unsharded",
            await _host(client),
            namespace,
        )
        return False
    if mode == "bucket":  # the hashed index must exist if the collection holds data
        await client[db][collection].create_index(
            [("sensor_id", "hashed")], name="sensor_id_hashed"
        )
    try:
        await client.admin.command({"enableSharding": db})
    except OperationFailure as exc:
        if exc.code != ALREADY_INITIALIZED:  # "already enabled", before MongoDB 4.x
            raise
    await _shard(client, namespace, key, mode)
    if mode == "timeseries":
        claims = claims_collection(collection)
        await client[db][claims].create_index([("_id", "hashed")], name="_id_hashed")
        await _shard(client, f"{db}.{claims}", CLAIMS_SHARD_KEY, mode)
    return True


async def _shard(
    client: AsyncMongoClient[dict[str, Any]], namespace: str, key: dict[str, Any], mode: str
) -> None:
    """``shardCollection``; one sharded on another key is refused with one line."""
    try:
        await client.admin.command({"shardCollection": namespace, "key": key})
    except OperationFailure as exc:
        if exc.code == ALREADY_INITIALIZED:
            raise SchemaError(
                f"{namespace} is already sharded with another key; ingest {mode} mode expects {key}"
            ) from exc
        raise
    logger.info("sharded %s on %s", namespace, key)


async def _host(client: AsyncMongoClient[dict[str, Any]]) -> str:
    """The server address for a message (never the URI: it may hold credentials)."""
    address = await client.address
    return "MongoDB" if address is None else f"MongoDB at {address[0]}:{address[1]}"
