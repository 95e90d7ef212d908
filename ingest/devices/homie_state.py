"""The ``homie`` format's state: device attributes in memory, backed by MongoDB.

Homie attributes are retained, so a daemon that subscribes anew receives them all. One
that resumes its session (a restart within the session's expiry) does not: the broker
sends retained messages on a new subscription only, and the values it queued for the
daemon meanwhile come first. So every attribute that changes what the daemon holds is
written to the ``homie_devices`` collection (one document per device, ``_id`` = the
device's base topic) before its message can be acknowledged, and a message of a device
not in memory reads that device's document once. Every daemon of a shared group receives
every attribute (the attribute topics are subscribed unshared): they write the same
values, and each one's last write is the latest value. Everything else is the pure
:mod:`ingest.devices.formats.homie`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo.errors import DuplicateKeyError

from ingest.devices.formats import homie as hm
from ingest.devices.formats.stateful import DATA, OTHER, STATE, MetricCounts
from ingest.store.persist import until_done

if TYPE_CHECKING:
    from collections.abc import Callable

    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

    from ingest.devices.decode import Limits
    from ingest.devices.formats import Parsed
    from ingest.devices.formats.stateful import Stateful


logger = logging.getLogger(__name__)
COLLECTION = "homie_devices"
# A device not found in MongoDB is not looked up again for this long (a flood of values
# from a device that never published its attributes must not become a flood of reads).
MISS_SECONDS = 5.0
_ROLES = {"attribute": STATE, "ignored": OTHER}


def attach_store(stateful: dict[str, Stateful], db: AsyncDatabase[dict[str, Any]]) -> None:
    """Give the ``homie`` format of ``Mapping.stateful`` its MongoDB store."""
    fmt = stateful.get("homie")
    if isinstance(fmt, HomieState):
        fmt.store = DeviceStore(db[COLLECTION])


def device_of(doc: dict[str, Any]) -> hm.Device:
    """The device a ``homie_devices`` document holds."""
    props = {}
    for path, entry in (doc.get("properties") or {}).items():
        if isinstance(entry, dict):
            props[path] = hm.Prop(entry.get("datatype"), entry.get("unit"), entry.get("format"))
    version = doc.get("version")
    return hm.Device(str(doc["_id"]), props, version if type(version) is int else None)


def _entry(prop: hm.Prop) -> dict[str, str]:
    """A property as stored: only the attributes it has."""
    return {k: v for k, v in prop._asdict().items() if v is not None}


class DeviceStore:
    """The ``homie_devices`` collection."""

    def __init__(self, collection: AsyncCollection[dict[str, Any]]) -> None:
        self.collection = collection

    async def save(self, change: hm.Change, at: float) -> None:
        """Store what an attribute message sets (a Homie 5 description: the whole device)."""
        topic = change.topic
        when = datetime.fromtimestamp(at, UTC)
        ident = {
            "domain": topic.key.split("/")[0],
            "homie": topic.version,
            "device": topic.device,
            "updated_at": when,
        }
        if isinstance(change, hm.Description):
            if change.props is None:  # cleared: the device is removed
                await self.collection.delete_one({"_id": topic.key})
                return
            doc = {
                "_id": topic.key,
                **ident,
                "version": change.version,
                "properties": {path: _entry(p) for path, p in change.props.items()},
            }
            await self._upsert(
                lambda: self.collection.replace_one({"_id": topic.key}, doc, upsert=True)
            )
            return
        name = f"properties.{topic.path}.{topic.attribute[1:]}"
        update: dict[str, Any] = {"$set": ident}
        if change.value is None:
            update["$unset"] = {name: ""}
        else:
            ident[name] = change.value
        await self._upsert(
            lambda: self.collection.update_one({"_id": topic.key}, update, upsert=True)
        )

    @staticmethod
    async def _upsert(write: Callable[[], Any]) -> None:
        """An upsert, again if another daemon inserted the same device meanwhile."""
        try:
            await write()
        except DuplicateKeyError:
            await write()  # the document exists now: an update

    async def load(self, key: str) -> hm.Device | None:
        """The stored device of ``key``, or None."""
        doc = await self.collection.find_one({"_id": key})
        return None if doc is None else device_of(doc)


class HomieState:
    """The ``homie`` format's state: devices in memory (:attr:`format`) backed by MongoDB.

    The mapping's :class:`~ingest.devices.formats.stateful.Stateful` for ``homie``.
    """

    def __init__(self, fmt: hm.HomieFormat | None = None, store: DeviceStore | None = None) -> None:
        self.format = fmt or hm.HomieFormat()
        self.store = store  # None (dry run, ``ingest check``): memory only
        self._missed: OrderedDict[str, float] = OrderedDict()
        self._lookups = {"found": 0, "missing": 0}
        self._generation: int | None = None

    def role(self, topic: str) -> str:
        """Attributes it uses are state; /set, $broadcast and other attributes nothing."""
        return _ROLES.get(hm.parse_topic(topic).kind, DATA)

    def parse(self, topic: str, payload: bytes, limits: Limits) -> Parsed:
        """Items of one message (see :meth:`.HomieFormat.parse`)."""
        return self.format.parse(topic, payload, limits)

    async def prepare(
        self,
        topic: str,
        payload: bytes,
        limits: Limits,
        closing: Callable[[], bool],
        generation: int = 0,
    ) -> bool:
        """Load a device missing from memory, store an attribute; False if closing first."""
        store = self.store
        if store is None:
            return True
        if generation != self._generation:
            self._reconnected(generation)
        parsed = hm.parse_topic(topic)
        if parsed.kind not in ("value", "attribute") or len(payload) > limits.max_message_bytes:
            return True  # nothing to read, or refused before parse() (too_large)
        if self.format.device(parsed.key) is None and not await self._load(parsed.key, closing):
            return False
        if parsed.kind == "value":
            return True
        change = hm.change_of(parsed, payload)
        if not self.format.changes(change):
            return True  # known already (another daemon stored it, or a repeat)
        return await until_done(
            lambda: self._save(store, change),
            "store a device's attributes",
            closing,
            logger,
            "homie",
        )

    async def _save(self, store: DeviceStore, change: hm.Change) -> None:
        """Store what an attribute sets.

        In MongoDB then, a device evicted from memory is read again, even just after a
        lookup of it (before its first attribute) found nothing.
        """
        await store.save(change, time.time())
        self._missed.pop(change.topic.key, None)

    def _reconnected(self, generation: int) -> None:
        """A new MQTT connection: attributes published meanwhile may have been missed.

        With QoS 0 the broker does not keep them for this daemon, while another one of a
        shared group stored them: the devices in memory are read again when next needed.
        """
        if self._generation is not None and self.format.devices:
            logger.info(
                "homie: reconnected; %d devices' attributes will be read again "
                "from MongoDB when next used",
                len(self.format.devices),
            )
            self.format.forget_all()
            self._missed.clear()
        self._generation = generation

    async def _load(self, key: str, closing: Callable[[], bool]) -> bool:
        """Read ``key``'s device from MongoDB (unless read in vain just now)."""
        missed = self._missed.get(key)
        if missed is not None and time.monotonic() - missed < MISS_SECONDS:
            return True
        found: list[hm.Device | None] = []
        store = self.store
        assert store is not None

        async def load() -> None:
            found.append(await store.load(key))

        if not await until_done(load, "read a device's attributes", closing, logger, "homie"):
            return False
        device = found[0] if found else None
        self._lookups["missing" if device is None else "found"] += 1
        if device is None:
            self._missed[key] = time.monotonic()
            self._missed.move_to_end(key)
            while len(self._missed) > self.format.max_devices:
                self._missed.popitem(last=False)
        else:
            self.format.install(device)
            self._missed.pop(key, None)
        return True

    def take_counts(self) -> MetricCounts:
        """The counts of the state and the store since the last call."""
        messages = self.format.counts.messages
        taken = MetricCounts(
            {"homie_messages": dict(messages), "homie_lookups": dict(self._lookups)},
            {
                "homie_devices": len(self.format.devices),
                "homie_properties": self.format.properties_held,
            },
        )
        for table in (messages, self._lookups):
            table.update(dict.fromkeys(table, 0))
        return taken
