"""A fleet's documents as each layout stores them, built by the writers' code and inserted in bulk.

Writing a day of 1,000 sensors through the writers sends hundreds of thousands of
upserts, or inserts with their lookups and claims, in the daemon's batch sizes: minutes
on a MongoDB server, hours on the emulator. For a benchmark of the read side only the
stored documents matter, so this builds them directly, from all readings at once:

- bucket mode: the writer's plan of the readings (one upsert per series-span, more only
  past the cap), each upsert turned into the document it inserts when nothing matches
  (:func:`upserted_document`). Into an empty collection that is every upsert of one plan:
  the plan holds each instant once, and a series-span has a second upsert only when the
  first one's document is full (``count`` or ``bytes``), which its filter then refuses;
- time-series mode: the writer's plan, which is the documents it inserts.

Both are then inserted with ``insert_many`` in unordered batches, or, into the emulator
this benchmark started, handed to the emulator's own ``insert_many`` in its process
(tests/support/mongo_emulator.py says why). The collections, validators and indexes are
the writers' own (``ensure_schema``), made first; into the emulator, the bucket
collection goes without its unique index (:func:`load` says why).
tests/test_bench_stored.py checks that the documents equal those the daemon stores for
the same readings.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bson
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument

from bench.fleet import COLLECTIONS, writers
from ingest.store.schema import READINGS_INDEX
from ingest.store.writers.bucket import BucketWriter
from tests.support.procs import emulator_load

if TYPE_CHECKING:
    import subprocess

    from pymongo.asynchronous.collection import AsyncCollection

    from bench.fleet import Store
    from ingest.model import Reading
    from ingest.store.writers.timeseries import TimeseriesWriter

BATCH = 10_000  # documents per insert_many
# An upsert's update operators, and what each stores in a field it finds missing.
SETTERS = frozenset({"$setOnInsert", "$set", "$inc", "$min", "$max"})


def upserted_document(statement: Mapping[str, Any], doc_id: ObjectId) -> dict[str, Any]:
    """The document an update statement with ``upsert`` inserts when its filter matches none.

    MongoDB's rule: the filter's equality conditions make the new document, then the
    update applies to it. On a missing field ``$set``, ``$setOnInsert``, ``$inc``,
    ``$min`` and ``$max`` store their value, and ``$push`` with ``$each`` stores the array
    of its values. Raises ValueError for any other operator or shape, so a writer whose
    statements change shape fails here rather than loading other documents.
    """
    doc: dict[str, Any] = {"_id": doc_id}
    for path, condition in statement["q"].items():
        if path.startswith("$"):
            raise ValueError(f"upserted_document: a filter with {path}")
        if isinstance(condition, Mapping) and any(key.startswith("$") for key in condition):
            continue  # an operator expression: not part of the new document
        _put(doc, path, condition)
    for operator, fields in statement["u"].items():
        for path, value in fields.items():
            if operator == "$push":
                if not isinstance(value, Mapping) or list(value) != ["$each"]:
                    raise ValueError(f"upserted_document: $push of {path} without $each")
                _put(doc, path, list(value["$each"]))
            elif operator in SETTERS:
                _put(doc, path, value)
            else:
                raise ValueError(f"upserted_document: no rule for {operator}")
    return doc


def _put(doc: dict[str, Any], path: str, value: Any) -> None:  # noqa: ANN401 - any BSON value
    """Store ``value`` at a dotted ``path`` of ``doc``, which must not hold it yet."""
    *parents, name = path.split(".")
    for parent in parents:
        doc = doc.setdefault(parent, {})
    if name in doc:
        raise ValueError(f"upserted_document: {path} set twice")
    doc[name] = value


def documents(writer: BucketWriter | TimeseriesWriter, readings: list[Reading]) -> list[Any]:
    """The documents ``writer`` stores for ``readings`` in an empty collection.

    Raises ValueError for readings the writer would not store as one plan's documents
    (two readings of one series at one instant).
    """
    plan = writer.plan(readings)
    if plan.deferred or plan.duplicates or plan.conflicts or plan.readings() != len(readings):
        raise ValueError("documents: readings that meet at an instant of their series")
    if not isinstance(writer, BucketWriter):
        return plan.ops
    return [upserted_document(op, ObjectId()) for op in plan.ops]


def encoded(doc: Any) -> bytes:  # noqa: ANN401 - a dict or a RawBSONDocument
    """A document's BSON bytes (the time-series writer's compiled twin has them already)."""
    if isinstance(doc, RawBSONDocument):
        return bytes(doc.raw)
    return bson.encode(doc)


async def insert(
    collection: AsyncCollection[dict[str, Any]],
    docs: list[Any],
    emulator: subprocess.Popen[str] | None = None,
) -> None:
    """Insert ``docs``: unordered ``insert_many`` batches, or through the emulator's own."""
    if emulator is None:
        for start in range(0, len(docs), BATCH):
            await collection.insert_many(docs[start : start + BATCH], ordered=False)
        return
    with tempfile.NamedTemporaryFile(suffix=".bson") as file:
        for doc in docs:
            file.write(encoded(doc))
        file.flush()
        db, name = collection.database.name, collection.name
        count = await asyncio.to_thread(emulator_load, emulator, db, name, Path(file.name))
    if count != len(docs):
        raise RuntimeError(f"the emulator loaded {count} of {len(docs)} documents")


async def load(
    store: Store, readings: list[Reading], modes: tuple[str, ...] = tuple(COLLECTIONS)
) -> dict[str, dict[str, Any]]:
    """Store ``readings`` in the layouts ``modes`` (bench.fleet's collections); how long each took.

    ``build_s``: the writer's plan and the documents; ``insert_s``: the writer's schema
    and the inserts. Into the emulator, the bucket collection goes without its unique
    index (``without_index``): the emulator checks a compound unique index by comparing
    each new document with every stored one, and builds one over stored documents pair
    by pair (quadratic either way), and its queries never use a compound index (it looks
    up only single-field indexes, on an equality), so their times are the same without.
    """
    took: dict[str, dict[str, Any]] = {}
    for mode in modes:
        writer = writers(store.db)[mode]
        began = time.perf_counter()
        docs = documents(writer, readings)
        built = time.perf_counter()
        await writer.ensure_schema()
        collection = store.db[COLLECTIONS[mode]]
        took[mode] = {"documents": len(docs)}
        if store.emulator is not None and isinstance(writer, BucketWriter):
            await collection.drop_index(READINGS_INDEX)
            took[mode]["without_index"] = READINGS_INDEX
        await insert(collection, docs, store.emulator)
        took[mode] |= {
            "build_s": round(built - began, 1),
            "insert_s": round(time.perf_counter() - built, 1),
        }
    return took
