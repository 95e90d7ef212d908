"""Run the mongoeco wire-protocol emulator on a port; print its URI on the first line.

Used by the test fixtures when no real MongoDB is configured (INGEST_TEST_MONGODB_URI).
It runs in its own process so its event loop never competes with the code under test.

With ``--loads``, it also takes commands on stdin, one a line, ``load <db> <collection>
<file>``: it inserts the BSON documents of ``<file>`` (one after the other, as mongodump
writes them) with the emulator's own ``insert_many``, decoded as its wire server decodes
an ``insert`` command's, and answers ``loaded <count>`` (or ``error <message>``) on
stdout. The emulator's wire ``insert`` stores one document at a time and checks each new
``_id`` against every stored document (mongoeco 4.11: ``MemoryEngine._ensure_unique_indexes``
with ``scan_payload_id``), so loading a large collection over the wire takes quadratic
time; its ``insert_many`` checks a batch against the ``_id`` index. bench.stored loads a
benchmark's documents this way.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import sys
from pathlib import Path
from typing import Any

from bson import BSON
from mongoeco.api import AsyncMongoClient
from mongoeco.engines.memory import MemoryEngine
from mongoeco.wire.bson_bridge import decode_wire_value
from mongoeco.wire.proxy import AsyncMongoEcoProxyServer

BATCH = 10_000  # documents per insert_many


def documents(path: Path) -> list[dict[str, Any]]:
    """The BSON documents of a file, decoded as the wire server decodes an insert's."""
    data = path.read_bytes()
    out = []
    at = 0
    while at < len(data):
        (size,) = struct.unpack_from("<i", data, at)
        out.append(decode_wire_value(BSON(data[at : at + size]).decode()))
        at += size
    return out


async def load(client: AsyncMongoClient, line: str) -> str:
    """Answer one ``load <db> <collection> <file>`` command."""
    try:
        verb, db, collection, path = line.split(maxsplit=3)
        if verb != "load":
            return f"error unknown command {verb!r}"
        docs = documents(Path(path))
        for start in range(0, len(docs), BATCH):
            await client[db][collection].insert_many(docs[start : start + BATCH], ordered=False)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer to the command
        return f"error {type(exc).__name__}: {str(exc)[:500]}".replace("\n", " ")
    return f"loaded {len(docs)}"


async def answer_loads(client: AsyncMongoClient) -> None:
    """Answer the commands on stdin until it closes."""
    stdin = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(stdin)
    await asyncio.get_running_loop().connect_read_pipe(lambda: protocol, sys.stdin)
    while line := await stdin.readline():
        print(await load(client, line.decode().strip()), flush=True)  # noqa: T201 - the answer


async def serve(port: int, loads: bool) -> None:
    client = AsyncMongoClient(MemoryEngine())
    server = AsyncMongoEcoProxyServer(client=client, host="127.0.0.1", port=port)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(server.address.uri, flush=True)  # noqa: T201 - the fixture reads this line
    commands = asyncio.create_task(answer_loads(client)) if loads else None
    try:
        await stop.wait()
    finally:
        if commands is not None:
            commands.cancel()
        await server.close()


if __name__ == "__main__":
    options = [arg for arg in sys.argv[1:] if arg.startswith("--")]
    ports = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    asyncio.run(serve(int(ports[0]) if ports else 0, "--loads" in options))
