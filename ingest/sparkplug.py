"""The ``sparkplug`` format at work: alias tables in memory, backed by MongoDB.

A BIRTH reaches one daemon only when several share a subscription, and a restarted
daemon has lost its memory. So every BIRTH is written to the ``sparkplug_births``
collection (one document per edge node or device, ``_id`` = ``group/node[/device]``)
before the BIRTH message can be acknowledged, a DEATH marks its documents offline, and a
DATA message whose table is not in memory reads it from there once. Everything else is
the pure :mod:`ingest.formats.sparkplug`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.errors import InvalidDocument
from pymongo.errors import PyMongoError

from ingest.errors import RefusedWriteError
from ingest.formats import Parsed
from ingest.formats import sparkplug as spb
from ingest.retry import backoff
from ingest.writers import as_write_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from ingest.decode import Limits
    from ingest.formats.stateful import Stateful
    from ingest.metrics import Metrics

logger = logging.getLogger(__name__)
BIRTHS_COLLECTION = "sparkplug_births"
# A key not found in MongoDB is not looked up again for this long (a flood of DATA from an
# edge node that never sent a BIRTH must not become a flood of reads).
MISS_SECONDS = 5.0
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_-]+")


def attach_store(stateful: dict[str, Stateful], db: AsyncDatabase[dict[str, Any]]) -> None:
    """Give the ``sparkplug`` format of ``Mapping.stateful`` its MongoDB store."""
    fmt = stateful.get("sparkplug")
    if isinstance(fmt, SparkplugFormat):
        fmt.store = BirthStore(db[BIRTHS_COLLECTION])


def birth_doc(topic: spb.Topic, table: spb.Table, decoded: Any,  # noqa: ANN401
              received_at: float) -> dict[str, Any]:
    """The ``sparkplug_births`` document of a BIRTH: identity, sequence, every metric."""
    metrics = []
    for metric in decoded.metrics:
        name = metric.name
        if type(name) is not str or spb.bad_name(name) or name not in table.by_name:
            continue
        entry: dict[str, Any] = {"name": name, "datatype": spb.datatype_name(metric.datatype)}
        if metric.HasField("alias"):
            entry["alias"] = metric.alias
        definition = table.by_name[name]
        if definition.units is not None:
            entry["units"] = definition.units
        props = {_UNSAFE_KEY.sub("_", k)[:64]: v for k, v in spb.properties(metric).items()}
        if props:
            entry["properties"] = props
        metrics.append(entry)
    return {
        "_id": topic.key, "group": topic.group, "node": topic.node, "device": topic.device,
        "sensor_id": spb.sensor_id(topic), "type": topic.type, "bd_seq": table.bd_seq,
        "seq": table.seq,
        "birth_ts": (datetime.fromtimestamp(table.birth_ms / 1000, UTC)
                     if table.birth_ms is not None and table.birth_ms < 2**42 else None),
        "received_at": datetime.fromtimestamp(received_at, UTC), "online": True,
        "metrics": metrics,
    }


def table_of(doc: dict[str, Any]) -> spb.Table:
    """The alias table a stored BIRTH document holds."""
    table = spb.Table(str(doc["_id"]), doc.get("bd_seq"), doc.get("seq"), None,
                      online=bool(doc.get("online", True)))
    for entry in doc.get("metrics", []):
        declared = spb.definition(entry["name"], spb.datatype_id(entry.get("datatype")),
                                  entry.get("units"))
        table.by_name[declared.name] = declared
        alias = entry.get("alias")
        if alias is not None:
            table.by_alias[int(alias)] = declared
    return table


class BirthStore:
    """The ``sparkplug_births`` collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]]) -> None:
        self.collection = collection

    async def save(self, topic: spb.Topic, doc: dict[str, Any]) -> None:
        """Replace the table of ``topic``; an NBIRTH also marks its devices offline."""
        await self.collection.replace_one({"_id": doc["_id"]}, doc, upsert=True)
        if topic.type == "NBIRTH":
            await self._offline({"group": topic.group, "node": topic.node,
                                 "device": {"$ne": None}}, doc["received_at"])

    async def load(self, key: str) -> spb.Table | None:
        """The stored table of ``key``, or None."""
        doc = await self.collection.find_one({"_id": key})
        return None if doc is None else table_of(doc)

    async def close(self, topic: spb.Topic, at: float) -> None:
        """A DEATH: the node and its devices (NDEATH) or the device (DDEATH) go offline."""
        when = datetime.fromtimestamp(at, UTC)
        if topic.type == "NDEATH":
            await self._offline({"group": topic.group, "node": topic.node}, when)
        else:
            await self._offline({"_id": topic.key}, when)

    async def _offline(self, query: dict[str, Any], when: datetime) -> None:
        await self.collection.update_many(query, {"$set": {"online": False, "death_at": when}})


class SparkplugFormat:
    """The stateful ``sparkplug`` format: :class:`~ingest.formats.stateful.Stateful`."""

    def __init__(self, state: spb.SparkplugState | None = None,
                 store: BirthStore | None = None) -> None:
        self.state = state or spb.SparkplugState()
        self.store = store  # None (dry run, ``ingest check``): memory only
        self._missed: OrderedDict[str, float] = OrderedDict()
        self._lookups = {"found": 0, "missing": 0}

    def parse(self, topic: str, payload: bytes, limits: Limits) -> Parsed:
        """Items of one message (see :meth:`SparkplugState.parse`)."""
        return self.state.parse(topic, payload, limits)

    async def prepare(self, topic: str, payload: bytes, limits: Limits,  # noqa: PLR0911
                      closing: Callable[[], bool]) -> bool:
        """Store a BIRTH or DEATH, or load a missing table; False if given up (closing)."""
        if self.store is None:
            return True
        parsed = spb.parse_topic(topic)
        if parsed is None or parsed.type in ("STATE", "NCMD", "DCMD"):
            return True
        data = parsed.type.endswith("DATA")
        if data:
            held = self.state.table(parsed.key)
            if held is not None and held.online:
                return True  # the hot path: one dict lookup
            # Missing, or closed by a DEATH: another daemon may have stored a new BIRTH.
            return await self._load(parsed.key, closing)
        decoded = None if data else spb.decode_payload(payload, limits)
        if isinstance(decoded, Parsed):
            return True  # parse() refuses it the same way
        store = self.store
        # DATA and DEATH need their own table (a DEATH to check its bdSeq), a DBIRTH its
        # node's (for the bdSeq it records); an NBIRTH replaces what is there.
        key = parsed.node_key if parsed.type == "DBIRTH" else parsed.key
        if (parsed.type != "NBIRTH" and self.state.table(key) is None
                and not await self._load(key, closing)):
            return False
        if parsed.type.endswith("BIRTH"):
            table, _ = self.state.birth(parsed, decoded)
            doc = birth_doc(parsed, table, decoded, time.time())
            return await _retry(lambda: store.save(parsed, doc), "store a BIRTH", closing)
        if self.state.death_applies(parsed, decoded):
            return await _retry(lambda: store.close(parsed, time.time()), "store a DEATH",
                                closing)
        return True

    async def _load(self, key: str, closing: Callable[[], bool]) -> bool:
        """Read ``key``'s table from MongoDB into memory (unless read in vain just now).

        A table missing there, or offline, is not read again for ``MISS_SECONDS``.
        """
        missed = self._missed.get(key)
        if missed is not None and time.monotonic() - missed < MISS_SECONDS:
            return True
        found: list[spb.Table | None] = []
        store = self.store
        assert store is not None

        async def load() -> None:
            found.append(await store.load(key))

        if not await _retry(load, "read an alias table", closing):
            return False
        table = found[0]
        self._lookups["missing" if table is None else "found"] += 1
        if table is not None:
            self.state.install(table)
        if table is None or not table.online:
            self._missed[key] = time.monotonic()
            self._missed.move_to_end(key)
            while len(self._missed) > self.state.max_tables:
                self._missed.popitem(last=False)
        else:
            self._missed.pop(key, None)
        return True

    def sync_metrics(self, metrics: Metrics) -> None:
        """Move the counts of the state and the store into the metrics."""
        counts = self.state.counts
        for kind, count in counts.messages.items():
            if count:
                metrics.sparkplug_messages.labels(kind).inc(count)
                counts.messages[kind] = 0
        for why, count in counts.skipped.items():
            if count:
                metrics.sparkplug_skipped.labels(why).inc(count)
                counts.skipped[why] = 0
        for outcome, count in self._lookups.items():
            if count:
                metrics.sparkplug_lookups.labels(outcome).inc(count)
                self._lookups[outcome] = 0
        metrics.sparkplug_seq_gaps.inc(counts.seq_gaps)
        metrics.sparkplug_stale_deaths.inc(counts.stale_deaths)
        counts.seq_gaps = counts.stale_deaths = 0
        metrics.sparkplug_tables.set(len(self.state.tables))


async def _retry(step: Callable[[], Awaitable[None]], what: str,
                 closing: Callable[[], bool]) -> bool:
    """Run ``step`` until it succeeds; False if closing first.

    Transient MongoDB errors are retried with backoff. A refusal for the data itself
    (document too large, validation) is logged and given up: the table is still used from
    memory, and retrying would block the daemon for good.
    """
    attempt = 0
    while not closing():
        try:
            await step()
        except (PyMongoError, InvalidDocument) as exc:
            error = as_write_error(exc)
            if isinstance(error, RefusedWriteError):
                # An expected server answer, not a bug: no traceback.
                logger.error("sparkplug: MongoDB refused to %s (kept in memory only): %s",  # noqa: TRY400
                             what, error)
                return True
            attempt += 1
            delay = backoff(attempt)
            logger.warning("sparkplug: cannot %s (attempt %d, retrying in %.2fs): %s", what,
                           attempt, delay, str(exc)[:200])
            await asyncio.sleep(delay)
        else:
            return True
    return False
