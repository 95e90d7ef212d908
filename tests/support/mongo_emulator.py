"""Run the mongoeco wire-protocol emulator on a port; print its URI on the first line.

Used by the test fixtures when no real MongoDB is configured (INGEST_TEST_MONGODB_URI).
It runs in its own process so its event loop never competes with the code under test.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from mongoeco.engines.memory import MemoryEngine
from mongoeco.wire.proxy import AsyncMongoEcoProxyServer


async def serve(port: int) -> None:
    server = AsyncMongoEcoProxyServer(engine=MemoryEngine(), host="127.0.0.1", port=port)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(server.address.uri, flush=True)  # noqa: T201 - the fixture reads this line
    try:
        await stop.wait()
    finally:
        await server.close()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
