"""The ``sparkplug`` format's state: alias tables in memory, backed by MongoDB.

A BIRTH reaches one daemon only when several share a subscription, and a restarted
daemon has lost its memory. So every BIRTH is written to the ``sparkplug_births``
collection (one document per edge node or device, ``_id`` = ``group/node[/device]``)
before the BIRTH message can be acknowledged, a DEATH marks its documents offline, and a
DATA message whose table is not in memory reads it from there once. Everything else is
the pure :mod:`ingest.devices.formats.sparkplug`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo.errors import DuplicateKeyError

from ingest.devices.formats import Parsed
from ingest.devices.formats import sparkplug as spb
from ingest.devices.formats.stateful import DATA, MetricCounts
from ingest.store.persist import until_done

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from ingest.devices.decode import Limits
    from ingest.devices.formats.stateful import Stateful


logger = logging.getLogger(__name__)
BIRTHS_COLLECTION = "sparkplug_births"
# A key not found in MongoDB is not looked up again for this long (a flood of DATA from an
# edge node that never sent a BIRTH must not become a flood of reads).
MISS_SECONDS = 5.0
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_-]+")


def attach_store(
    stateful: dict[str, Stateful],
    db: AsyncDatabase[dict[str, Any]],
    claim_as: tuple[str, str] | None = None,
) -> None:
    """Give the ``sparkplug`` format of ``Mapping.stateful`` its MongoDB store.

    ``claim_as`` = (readings collection, client id) when the daemon is one of a shared
    group: every daemon of the group receives every BIRTH, and the first to claim it
    stores its readings (see :meth:`BirthStore.save`).
    """
    fmt = stateful.get("sparkplug")
    if isinstance(fmt, SparkplugState):
        fmt.store = BirthStore(db[BIRTHS_COLLECTION], claim_as)


def birth_doc(
    topic: spb.Topic,
    table: spb.Table,
    decoded: Any,  # noqa: ANN401
    received_at: float,
) -> dict[str, Any]:
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
        "_id": topic.key,
        "group": topic.group,
        "node": topic.node,
        "device": topic.device,
        "sensor_id": spb.sensor_id(topic),
        "type": topic.type,
        "bd_seq": table.bd_seq,
        "seq": table.seq,
        "birth_ts": _date(table.birth_ms),
        "received_at": datetime.fromtimestamp(received_at, UTC),
        "online": True,
        "digest": table.digest,
        "node_digest": table.node_digest,
        "metrics": metrics,
    }


def table_of(doc: dict[str, Any], key: str | None = None) -> spb.Table:
    """The alias table a stored BIRTH document holds (with the one it replaced)."""
    table = spb.Table(
        key or str(doc["_id"]),
        doc.get("bd_seq"),
        doc.get("seq"),
        _ms(doc.get("birth_ts")),
        online=bool(doc.get("online", True)),
        digest=doc.get("digest"),
        node_digest=doc.get("node_digest"),
        closed_by=doc.get("closed_by"),
        closed_ms=_ms(doc.get("closed_ts")),
        from_store=True,
    )
    history = doc.get("history")
    if isinstance(history, list):
        table.earlier = tuple(
            table_of(entry, table.key) for entry in history if isinstance(entry, dict)
        )
    for entry in doc.get("metrics", []):
        declared = spb.definition(
            entry["name"], spb.datatype_id(entry.get("datatype")), entry.get("units")
        )
        table.by_name[declared.name] = declared
        alias = entry.get("alias")
        if alias is not None:
            table.by_alias[int(alias)] = declared
    return table


def _ms(value: object) -> int | None:
    """A stored date as epoch milliseconds (None stays None; BSON dates are UTC)."""
    if not isinstance(value, datetime):
        return None
    return round(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)


def _date(ms: int | None) -> datetime | None:
    """Epoch milliseconds as a BSON date (None if absent or beyond its range)."""
    return datetime.fromtimestamp(ms / 1000, UTC) if ms is not None and 0 <= ms < 2**42 else None


# What a document keeps of each session a new BIRTH replaces (``history``, newest first).
_SESSION = (
    "digest",
    "node_digest",
    "bd_seq",
    "birth_ts",
    "online",
    "closed_by",
    "closed_ts",
    "metrics",
)
# At most this many earlier sessions, and metric entries in all of them (the document
# must stay far below MongoDB's 16 MiB). A message can be redelivered only while it is one
# of the broker's Receive Maximum unacknowledged ones, each BIRTH one of them.
MAX_HISTORY = 8
MAX_HISTORY_METRICS = 20_000


def _history(old: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``history`` of the document replacing ``old``: its session first, then old's."""
    entries = [{k: old[k] for k in _SESSION if k in old}]
    earlier = old.get("history")
    entries.extend(e for e in (earlier if isinstance(earlier, list) else []) if isinstance(e, dict))
    kept: list[dict[str, Any]] = []
    total = 0
    for entry in entries[:MAX_HISTORY]:
        total += len(entry.get("metrics") or [])
        if total > MAX_HISTORY_METRICS:
            break
        kept.append(entry)
    return kept


class BirthStore:
    """The ``sparkplug_births`` collection.

    Several daemons may store the same BIRTH (every daemon of a shared group receives it):
    a document is only replaced by a BIRTH with another payload digest and no earlier
    timestamp, so the first store wins, the others change nothing, and a slower daemon
    never puts an older BIRTH back; DEATHs and a new NBIRTH close only the
    documents of the session they end (matched by digest), so a late one from a slower
    daemon never closes a newer session.
    """

    def __init__(
        self, collection: AsyncCollection[dict[str, Any]], claim_as: tuple[str, str] | None = None
    ) -> None:
        self.collection = collection
        self.claim_as = claim_as

    async def save(self, topic: spb.Topic, doc: dict[str, Any]) -> bool:
        """Store a BIRTH's table; True if this daemon is to store its readings.

        An NBIRTH also closes its devices born under an earlier NBIRTH. With ``claim_as``,
        the readings are claimed per readings collection (``claims.<collection>``): the
        first daemon to claim them, or the claimant itself when its message comes again
        (a redelivery), stores them; every other daemon only updates its tables.
        """
        query: dict[str, Any] = {"_id": doc["_id"], "digest": {"$ne": doc["digest"]}}
        if doc["birth_ts"] is not None:  # never back to an older BIRTH (a slower daemon's)
            query["$or"] = [{"birth_ts": {"$lte": doc["birth_ts"]}}, {"birth_ts": None}]
            # The sessions it replaces are kept: DATA of them redelivered after a restart
            # is still read with their own aliases (see spb._session).
            old = await self.collection.find_one(query, [*_SESSION, "history"])
            if old is not None and old.get("birth_ts") is not None:
                doc["history"] = _history(old)
        wrote = False
        with contextlib.suppress(DuplicateKeyError):  # stored already, or a newer one is
            done = await self.collection.replace_one(query, doc, upsert=True)
            wrote = bool(done.modified_count or done.upserted_id is not None)
        if topic.type == "NBIRTH" and (
            wrote
            or await self.collection.find_one(
                {"_id": doc["_id"], "digest": doc["digest"]}, {"_id": 1}
            )
            is not None
        ):
            # this NBIRTH is the node's current one (also when a retry finds it stored)
            await self._offline(
                {
                    "group": topic.group,
                    "node": topic.node,
                    "device": {"$ne": None},
                    "node_digest": {"$ne": doc["digest"]},
                },
                doc["received_at"],
            )
        if self.claim_as is None:
            return True
        where, me = self.claim_as
        claim = f"claims.{where}"
        done = await self.collection.update_one(
            {"_id": doc["_id"], "digest": doc["digest"], claim: {"$exists": False}},
            {"$set": {claim: me}},
        )
        if done.modified_count:
            return True
        held = await self.collection.find_one({"_id": doc["_id"]}, {"claims": 1})
        return held is not None and (held.get("claims") or {}).get(where) == me

    async def load(self, key: str) -> spb.Table | None:
        """The stored table of ``key``, or None."""
        doc = await self.collection.find_one({"_id": key})
        return None if doc is None else table_of(doc)

    async def close(
        self,
        topic: spb.Topic,
        at: float,
        held: spb.Table | None,
        refused: tuple[str, int | None] | None = None,
    ) -> None:
        """A DEATH: the node and its devices (NDEATH) or the device (DDEATH) go offline.

        ``held`` is the table the DEATH ends: only documents of its session are closed.
        ``refused`` = (reason, payload timestamp or None) for a BIRTH refused whole, which
        ends its session the same way (an NBIRTH as an NDEATH, a DBIRTH as a DDEATH); its
        documents say why (``closed_by``) and when (``closed_ts``, the BIRTH's time); when
        the table held was read from MongoDB, none born after that BIRTH is closed.
        """
        when = datetime.fromtimestamp(at, UTC)
        if topic.type in ("NDEATH", "NBIRTH"):
            query: dict[str, Any] = {"group": topic.group, "node": topic.node}
            if held is not None and held.node_digest is not None:
                query["node_digest"] = held.node_digest
        else:
            query = {"_id": topic.key}
            if held is not None and held.digest is not None:
                query["digest"] = held.digest
        if refused is None:
            await self._offline(query, when)
            return
        reason, birth_ms = refused
        closed_ts = _date(birth_ms)
        if closed_ts is not None and (held is None or held.from_store):
            query["$or"] = [{"birth_ts": {"$lte": closed_ts}}, {"birth_ts": None}]
        await self._offline(
            query,
            when,
            {"closed_by": spb.refused_birth_detail(topic.type, reason), "closed_ts": closed_ts},
        )

    async def _offline(
        self, query: dict[str, Any], when: datetime, why: dict[str, Any] | None = None
    ) -> None:
        change: dict[str, Any] = {"online": False, "death_at": when, **(why or {})}
        await self.collection.update_many(query, {"$set": change})


class SparkplugState:
    """The ``sparkplug`` format's state: tables in memory (:attr:`format`) backed by MongoDB.

    The mapping's :class:`~ingest.devices.formats.stateful.Stateful` for ``sparkplug``.
    """

    def __init__(
        self, fmt: spb.SparkplugFormat | None = None, store: BirthStore | None = None
    ) -> None:
        self.format = fmt or spb.SparkplugFormat()
        self.store = store  # None (dry run, ``ingest check``): memory only
        self._missed: OrderedDict[str, float] = OrderedDict()
        self._lookups = {"found": 0, "missing": 0}
        self._generation: int | None = None
        self._quiet: bytes | None = None  # a BIRTH whose readings another daemon stores

    def role(self, topic: str) -> str:
        """Every Sparkplug topic is data (a BIRTH is both state and readings)."""
        del topic
        return DATA

    def parse(self, topic: str, payload: bytes, limits: Limits) -> Parsed:
        """Items of one message (see :meth:`.SparkplugFormat.parse`)."""
        if self._quiet is not None and payload is self._quiet:
            self._quiet = None
            return self.format.parse(topic, payload, limits, readings=False)
        return self.format.parse(topic, payload, limits)

    async def prepare(  # noqa: PLR0911
        self,
        topic: str,
        payload: bytes,
        limits: Limits,
        closing: Callable[[], bool],
        generation: int = 0,
    ) -> bool:
        """Store a BIRTH or DEATH, or load a missing table; False if given up (closing)."""
        self._quiet = None
        if self.store is None:
            self._too_large(topic, payload, limits)
            return True
        if generation != self._generation:
            self._reconnected(generation)
        parsed = spb.parse_topic(topic)
        if parsed is None or parsed.type in ("STATE", "NCMD", "DCMD"):
            return True
        data = parsed.type.endswith("DATA")
        if data:
            held = self.format.table(parsed.key)
            if held is not None and held.online:
                return True  # the hot path: one dict lookup
            # Missing, or closed by a DEATH: another daemon may have stored a new BIRTH.
            return await self._load(parsed.key, closing)
        decoded = spb.decode_payload(payload, limits)
        if isinstance(decoded, Parsed):  # parse() refuses it the same way
            return not parsed.type.endswith("BIRTH") or await self._refused_birth(
                parsed, payload, decoded, closing
            )
        store = self.store
        # DATA and DEATH need their own table (a DEATH to check its bdSeq), a DBIRTH its
        # node's (for the bdSeq it records); an NBIRTH replaces what is there.
        key = parsed.node_key if parsed.type == "DBIRTH" else parsed.key
        if (
            parsed.type != "NBIRTH"
            and self.format.table(key) is None
            and not await self._load(key, closing)
        ):
            return False
        if parsed.type.endswith("BIRTH"):
            return await self._birth(parsed, decoded, payload, closing)
        if self.format.death_applies(parsed, decoded):
            held = self.format.table(parsed.key)
            return await _retry(
                lambda: store.close(parsed, time.time(), held), "store a DEATH", closing
            )
        return True

    async def _birth(
        self,
        topic: spb.Topic,
        decoded: Any,  # noqa: ANN401
        payload: bytes,
        closing: Callable[[], bool],
    ) -> bool:
        """Store a BIRTH; its readings are left to another daemon if that one claimed them."""
        store = self.store
        assert store is not None
        table, _ = self.format.birth(topic, decoded, payload)
        doc = birth_doc(topic, table, decoded, time.time())
        mine = [True]  # a document MongoDB refuses: stored from memory, by every daemon

        async def save() -> None:
            mine[0] = await store.save(topic, doc)

        if not await _retry(save, "store a BIRTH", closing):
            return False
        # In MongoDB now: a table evicted from memory is read again, even just after a
        # lookup of it (a DATA before its BIRTH) found nothing.
        self._missed.pop(topic.key, None)
        if not mine[0]:
            self._quiet = payload
        logger.debug(
            "sparkplug: %s of %s stored; its readings stored %s",
            topic.type,
            topic.key,
            "here" if mine[0] else "by another daemon",
        )
        return True

    async def _refused_birth(
        self, topic: spb.Topic, payload: bytes, refusal: Parsed, closing: Callable[[], bool]
    ) -> bool:
        """A BIRTH refused whole ends the session it follows in MongoDB too.

        Otherwise a restarted daemon, or another one that reads the table later, would
        take the old aliases back for the new session's DATA.
        """
        store = self.store
        assert store is not None
        if self.format.table(topic.key) is None and not await self._load(topic.key, closing):
            return False
        held = self.format.table(topic.key)
        # A table read from MongoDB may be of a later session (another daemon is ahead, or
        # this BIRTH is redelivered after a restart): see BirthStore.close.
        refused = (refusal.rejections[0].reason, spb.leading_timestamp(payload))
        logger.debug(
            "sparkplug: %s of %s refused (%s): its DATA is rejected as no_birth "
            "until a usable BIRTH comes",
            topic.type,
            topic.key[:120],
            refused[0],
        )
        if not await _retry(
            lambda: store.close(topic, time.time(), held, refused),
            "close the session of a refused BIRTH",
            closing,
        ):
            return False
        self.format.refused_birth(topic, *refused)  # parse() is not called if too large
        return True

    def _too_large(self, topic: str, payload: bytes, limits: Limits) -> None:
        """Without a store: a BIRTH too large to reach parse() still ends its session."""
        parsed = spb.parse_topic(topic)
        if (
            parsed is not None
            and parsed.type.endswith("BIRTH")
            and len(payload) > limits.max_message_bytes
        ):
            self.format.refused_birth(parsed, "too_large", spb.leading_timestamp(payload))

    def _reconnected(self, generation: int) -> None:
        """A new MQTT connection: BIRTHs published meanwhile were missed (QoS 0).

        The tables in memory may be stale (a rebirth another daemon received and stored
        while this one was away), so they are dropped and read again from MongoDB when
        next needed.
        """
        if self._generation is not None and self.format.tables:
            logger.info(
                "sparkplug: reconnected; %d alias tables will be read again from "
                "MongoDB when next used",
                len(self.format.tables),
            )
            self.format.forget_all()
            self._missed.clear()
        self._generation = generation

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
            self.format.install(table)
        if table is None or not table.online:
            self._missed[key] = time.monotonic()
            self._missed.move_to_end(key)
            while len(self._missed) > self.format.max_tables:
                self._missed.popitem(last=False)
        else:
            self._missed.pop(key, None)
        return True

    def take_counts(self) -> MetricCounts:
        """The counts of the state and the store since the last call."""
        counts = self.format.counts
        taken = MetricCounts(
            {
                "sparkplug_messages": dict(counts.messages),
                "sparkplug_skipped": dict(counts.skipped),
                "sparkplug_lookups": dict(self._lookups),
                "sparkplug_seq_gaps": counts.seq_gaps,
                "sparkplug_stale_deaths": counts.stale_deaths,
            },
            {
                "sparkplug_tables": len(self.format.tables),
                "sparkplug_table_metrics": self.format.metrics_held,
            },
        )
        for table in (counts.messages, counts.skipped, self._lookups):
            table.update(dict.fromkeys(table, 0))
        counts.seq_gaps = counts.stale_deaths = 0
        return taken


async def _retry(
    step: Callable[[], Awaitable[None]], what: str, closing: Callable[[], bool]
) -> bool:
    """Run ``step`` until it succeeds; False if closing first (see :func:`until_done`)."""
    return await until_done(step, what, closing, logger, "sparkplug")
