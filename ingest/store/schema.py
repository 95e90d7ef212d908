"""Collections, validators, indexes and TTL, created idempotently.

Creation goes through the ``create`` command so the same code works for capped and
time-series collections. Several daemons may start at once: "already exists" is fine.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pymongo.errors import OperationFailure

from ingest.errors import SchemaError
from ingest.model import SENSOR_ID_PATTERN
from ingest.store import deliveries
from ingest.store.mongo_errors import DUPLICATE_KEY

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase

logger = logging.getLogger(__name__)

NAMESPACE_EXISTS = 48
# The bucket collection's indexes; the writer names them in its hints. A series is a
# sensor id and its tags (the whole ``tags`` object, keys in name order).
BUCKET_KEY = [("sensor_id", 1), ("tags", 1), ("bucket_start", 1)]
BUCKET_INDEX = "sensor_id_1_tags_1_bucket_start_1"
# Unique across documents: no instant of a series is stored twice.
READINGS_KEY = [("sensor_id", 1), ("tags", 1), ("readings.ts", 1)]
READINGS_INDEX = "sensor_id_1_tags_1_readings.ts_1"
# The document shape the bucket writer writes (see ingest.store.writers.bucket), and the
# indexes of earlier shapes, which ``ingest migrate`` drops.
BUCKET_SCHEMA_VERSION = 2
OLD_BUCKET_INDEXES = ("sensor_id_1_bucket_start_1", "sensor_id_1_readings.ts_1")
# Same key with other options (85), or same name with another spec or options (86).
INDEX_CONFLICTS = frozenset({85, 86})
BUCKET_TTL_INDEX = "bucket_start_ttl"
# createIndexes refused, e.g. a unique index on a collection sharded on another key.
CANNOT_CREATE_INDEX = 67
TIMESERIES_INDEX = "meta.sensor_id_1_ts_1"
# Timeseries mode's claims (ingest.store.writers.claims): a plain collection beside the
# time-series one, whose unique ``_id`` decides which writer stores an instant. A claim
# is needed only while writers may race on its instant (one write attempt: its claim,
# then its insert); the TTL index removes it this long after it was made.
CLAIM_SECONDS = 600
CLAIMS_TTL_INDEX = "at_ttl"

BUCKET_VALIDATOR: dict[str, Any] = {
    "$jsonSchema": {
        "bsonType": "object",
        "required": [
            "sensor_id",
            "tags",
            "bucket_start",
            "count",
            "bytes",
            "first_ts",
            "last_ts",
            "readings",
            "stats",
            "schema_version",
        ],
        "properties": {
            "sensor_id": {"bsonType": "string", "pattern": f"^{SENSOR_ID_PATTERN}$"},
            "tags": {"bsonType": "object"},
            "bucket_start": {"bsonType": "date"},
            "count": {"bsonType": ["int", "long"], "minimum": 1},
            "bytes": {"bsonType": ["int", "long"], "minimum": 1},
            "first_ts": {"bsonType": "date"},
            "last_ts": {"bsonType": "date"},
            # Items are not validated one by one: the whole document is revalidated
            # on every update, and a full bucket holds thousands of readings.
            "readings": {"bsonType": "array"},
            "stats": {"bsonType": "object"},
            "schema_version": {"enum": [BUCKET_SCHEMA_VERSION]},
        },
    }
}


class Schema:
    """Creates and checks what the writers need in one database."""

    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        collection: str,
        *,
        rejects_collection: str,
        rejects_max_bytes: int,
        retention_days: float | None,
        span_seconds: int,
        granularity: str = "seconds",
        custom_span: int | None = None,
    ) -> None:
        self.db = db
        self.collection = collection
        self.rejects_collection = rejects_collection
        self.rejects_max_bytes = rejects_max_bytes
        self.retention_days = retention_days
        self.span_seconds = span_seconds
        self.granularity = granularity
        self.custom_span = custom_span

    async def info(self, name: str) -> dict[str, Any] | None:
        """The listCollections entry for ``name``, or None if it does not exist."""
        cursor = await self.db.list_collections(filter={"name": name})
        entries = await cursor.to_list()
        return dict(entries[0]) if entries else None

    async def create(self, name: str, **options: Any) -> bool:  # noqa: ANN401
        """Create a collection; False if another process created it first."""
        try:
            await self.db.command({"create": name, **options})
        except OperationFailure as exc:
            if exc.code == NAMESPACE_EXISTS:
                return False
            raise
        logger.info("created collection %s.%s", self.db.name, name)
        return True

    async def ensure_buckets(self) -> None:
        """Bucket collection with its validator, compound index and optional TTL."""
        info = await self.info(self.collection)
        if info is None:
            await self.create(
                self.collection,
                validator=BUCKET_VALIDATOR,
                validationLevel="strict",
                validationAction="error",
            )
        elif _is_timeseries(info) or info.get("type", "collection") != "collection":
            raise SchemaError(
                f"{self.db.name}.{self.collection} exists but is not a regular "
                "collection; bucket mode will not write into it"
            )
        else:
            await self.check_bucket_version()
        if info is not None and info["options"].get("validator") != BUCKET_VALIDATOR:
            # An older validator: bring it up to date.
            await self.db.command(
                {
                    "collMod": self.collection,
                    "validator": BUCKET_VALIDATOR,
                    "validationLevel": "strict",
                    "validationAction": "error",
                }
            )
            logger.info("updated the validator of %s.%s", self.db.name, self.collection)
        await self.ensure_index(BUCKET_KEY, BUCKET_INDEX)
        try:
            await self.ensure_index(READINGS_KEY, READINGS_INDEX, unique=True)
        except OperationFailure as exc:
            if exc.code == CANNOT_CREATE_INDEX:
                raise SchemaError(
                    f"{self.db.name}.{self.collection}: cannot create the "
                    f"unique index {READINGS_INDEX}: {str(exc)[:200]}"
                ) from exc
            if exc.code != DUPLICATE_KEY:
                raise
            raise SchemaError(
                f"{self.db.name}.{self.collection} holds a reading twice (same series and "
                f"ts), so the unique index {READINGS_INDEX} cannot be built: "
                f"{str(exc)[:200]}"
            ) from exc
        if self.retention_days is not None:
            # A bucket expires once its last possible reading is past the retention.
            expire = int(self.retention_days * 86400) + self.span_seconds
            await self.ensure_ttl(BUCKET_TTL_INDEX, "bucket_start", expire)
        await self.ensure_rejects()
        await self.ensure_deliveries()

    async def check_bucket_version(self) -> None:
        """Refuse a bucket collection holding documents of an earlier shape.

        Mixing shapes in one collection would split a series between two keys and break
        the uniqueness of its instants. One line names the collection and what to do.
        """
        coll = self.db[self.collection]
        # Two cheap looks, not a scan: the indexes of an earlier shape (``ingest migrate``
        # drops them last), and the oldest document (by _id).
        names = {index["name"] async for index in await coll.list_indexes()}
        stale = sorted(names & set(OLD_BUCKET_INDEXES))
        oldest = await coll.find_one({}, {"schema_version": 1}, sort=[("_id", 1)])
        if oldest is not None and oldest.get("schema_version") != BUCKET_SCHEMA_VERSION:
            what = (
                f"holds bucket documents of schema_version "
                f"{oldest.get('schema_version')!r}, this daemon writes "
                f"{BUCKET_SCHEMA_VERSION}"
            )
        elif stale:
            what = f"has the index {stale[0]} of an earlier document shape"
        else:
            return
        raise SchemaError(
            f"{self.db.name}.{self.collection} {what}: "
            f"run `ingest migrate --db {self.db.name} --collection {self.collection}` once "
            "(docs/readings.md#document-versions), or choose another --collection"
        )

    async def migrate_buckets(self) -> tuple[int, list[str]]:
        """Bring bucket documents of an earlier shape to this one; drop the old indexes.

        Version 1 documents get ``tags`` as their series (the tags they were last written
        with, keys in name order; ``{}`` without any) and ``schema_version`` 2. Returns
        how many documents changed and which indexes were dropped. Idempotent.
        """
        coll = self.db[self.collection]
        changed = 0
        cursor = coll.find(
            {"schema_version": {"$ne": BUCKET_SCHEMA_VERSION}},
            {"tags": 1, "schema_version": 1},
            sort=[("_id", 1)],
        )
        async for doc in cursor:
            tags = dict(sorted((doc.get("tags") or {}).items()))
            result = await coll.update_one(
                {"_id": doc["_id"], "schema_version": doc.get("schema_version")},
                {"$set": {"tags": tags, "schema_version": BUCKET_SCHEMA_VERSION}},
                bypass_document_validation=True,
            )
            changed += result.modified_count
        # Last: while they exist, the daemon refuses the collection (a migration cut
        # short is found and can be run again).
        dropped: list[str] = []
        indexes = await (await coll.list_indexes()).to_list()
        for index in indexes:
            if index["name"] in OLD_BUCKET_INDEXES:
                await coll.drop_index(index["name"])
                dropped.append(index["name"])
        return changed, dropped

    def timeseries_options(self) -> dict[str, Any]:
        """The ``timeseries`` option of the collection as configured."""
        options: dict[str, Any] = {"timeField": "ts", "metaField": "meta"}
        if self.custom_span is None:
            options["granularity"] = self.granularity
        else:  # MongoDB 6.3+: custom bucketing, both values equal
            options["bucketMaxSpanSeconds"] = self.custom_span
            options["bucketRoundingSeconds"] = self.custom_span
        return options

    async def ensure_timeseries(self) -> None:
        """Time-series collection (checked if it exists), its index and optional expiry."""
        wanted = self.timeseries_options()
        expire = int(self.retention_days * 86400) if self.retention_days is not None else None
        info = await self.info(self.collection)
        if info is None:
            extra = {} if expire is None else {"expireAfterSeconds": expire}
            await self.create(self.collection, timeseries=wanted, **extra)
            info = await self.info(self.collection)
            assert info is not None
        self._check_timeseries(info, wanted)
        current = info["options"].get("expireAfterSeconds")
        if expire is not None and current != expire:
            await self.db.command({"collMod": self.collection, "expireAfterSeconds": expire})
            logger.info("changed expireAfterSeconds of %s to %d", self.collection, expire)
        await self.ensure_index([("meta.sensor_id", 1), ("ts", 1)], TIMESERIES_INDEX)
        await self.ensure_claims()
        await self.ensure_rejects()
        await self.ensure_deliveries()

    async def ensure_claims(self) -> None:
        """The claims collection of time-series mode and its TTL index."""
        name = claims_collection(self.collection)
        info = await self.info(name)
        if info is None:
            await self.create(name)
        elif _is_timeseries(info) or info.get("type", "collection") != "collection":
            raise SchemaError(
                f"{self.db.name}.{name} exists but is not a regular "
                "collection; timeseries mode keeps its claims there"
            )
        await self.ensure_ttl(CLAIMS_TTL_INDEX, "at", CLAIM_SECONDS, collection=name)

    def _check_timeseries(self, info: dict[str, Any], wanted: dict[str, Any]) -> None:
        """Refuse to write into a collection of another kind or with other options."""
        name = f"{self.db.name}.{self.collection}"
        if not _is_timeseries(info):
            raise SchemaError(
                f"{name} exists but is not a time-series collection "
                f"(type {info.get('type', '?')!r}); drop it or choose another "
                "--collection"
            )
        actual = info["options"]["timeseries"]
        # MongoDB adds derived fields (bucketMaxSpanSeconds for a granularity): compare
        # only what we set.
        different = {k: (actual.get(k), v) for k, v in wanted.items() if actual.get(k) != v}
        if different:
            detail = ", ".join(f"{k} is {a!r}, configured {w!r}" for k, (a, w) in different.items())
            raise SchemaError(f"{name} exists with other time-series options: {detail}")

    async def ensure_index(
        self, keys: list[tuple[str, int]], name: str, unique: bool = False
    ) -> None:
        """Create an index the writers name in their ``hint``; refuse a clashing one.

        MongoDB refuses an index whose key another index already has under another name
        (85) or whose name another key already uses (86): retrying cannot change that,
        and the writes name the index, so say which one to drop.
        """
        try:
            await self.db[self.collection].create_index(keys, name=name, unique=unique)
        except OperationFailure as exc:
            if exc.code not in INDEX_CONFLICTS:
                raise
            raise SchemaError(
                f"{self.db.name}.{self.collection}: cannot create index {name} "
                f"{dict(keys)}{' (unique)' if unique else ''}: an index with the same key "
                "or the same name but other options exists; drop it (dropIndex) and start "
                f"again ({str(exc)[:160]})"
            ) from exc

    async def ensure_ttl(
        self, name: str, field: str, expire_seconds: int, collection: str | None = None
    ) -> None:
        """Create a TTL index, or change its expiry if it exists with another one.

        On the mode's collection, or on ``collection``.
        """
        collection = collection or self.collection
        coll = self.db[collection]
        try:
            await coll.create_index(field, name=name, expireAfterSeconds=expire_seconds)
        except OperationFailure as exc:
            if exc.code not in INDEX_CONFLICTS:
                raise
            await self.db.command(
                {
                    "collMod": collection,
                    "index": {"name": name, "expireAfterSeconds": expire_seconds},
                }
            )
            logger.info("changed TTL of %s to %d s", name, expire_seconds)

    async def ensure_rejects(self) -> None:
        """Capped collection for rejected payloads, so it can never grow without bound."""
        info = await self.info(self.rejects_collection)
        if info is None:
            await self.create(self.rejects_collection, capped=True, size=self.rejects_max_bytes)
        elif not info.get("options", {}).get("capped"):
            logger.warning(
                "collection %s exists and is not capped; rejects will grow unbounded",
                self.rejects_collection,
            )

    async def ensure_deliveries(self) -> None:
        """The delivery ledger's indexes (ingest/store/deliveries.py): by client, and expiry."""
        coll = self.db[deliveries.COLLECTION]
        try:
            await coll.create_index([("client", 1), ("seq", 1)], name=deliveries.INDEX)
            await coll.create_index(
                "at", name=deliveries.TTL_INDEX, expireAfterSeconds=deliveries.EXPIRE_SECONDS
            )
        except OperationFailure as exc:
            if exc.code not in INDEX_CONFLICTS:
                raise
            raise SchemaError(
                f"{self.db.name}.{deliveries.COLLECTION}: an index with the key or the name "
                f"of {deliveries.INDEX} or {deliveries.TTL_INDEX} but other options exists; "
                f"drop it (dropIndex) and start again ({str(exc)[:160]})"
            ) from exc


def claims_collection(collection: str) -> str:
    """The claims collection of the time-series collection ``collection``."""
    return f"{collection}_claims"


def _is_timeseries(info: dict[str, Any]) -> bool:
    """Whether a listCollections entry is a time-series collection (type or options)."""
    return info.get("type") == "timeseries" or "timeseries" in info.get("options", {})
