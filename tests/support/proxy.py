"""A TCP proxy for fault tests: forwards to a target until told to black-hole traffic, or
answers MQTT CONNECTs with a refusal itself."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time


class Proxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` stops forwarding without closing
    anything (like a network partition: bytes and closes from either side are held),
    ``heal()`` resumes."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._open = threading.Event()
        self._open.set()
        self._loop = asyncio.new_event_loop()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="proxy")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._clients: set[asyncio.StreamWriter] = set()
        self._upstreams: set[asyncio.StreamWriter] = set()
        self._hung_up: set[asyncio.StreamWriter] = set()
        self._refusals = 0
        self._refuse_code = 0x88
        self.refused = 0
        self._hold_after_first = False
        self._hold_replies = False
        self._slow_ids: dict[bytes, float] = {}  # client id -> answers held until (monotonic)
        self.client_chunks = 0  # reads forwarded from clients to the target
        self.connects: list[bytes] = []  # the CONNECT packets forwarded, in order

    def refuse(self, count: int, code: int = 0x88) -> None:
        """Answer the next ``count`` connections' CONNECT with an MQTT 5 CONNACK carrying
        reason ``code`` (0x88 server unavailable, 0x87 not authorised, 0x89 server busy)
        and close them, without reaching the target."""
        self._refusals, self._refuse_code = count, code

    def start(self) -> Proxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def drop(self) -> None:
        """Close every open connection; bytes held by a cut are thrown away, not sent."""
        asyncio.run_coroutine_threadsafe(self._close_connections(), self._loop).result(5)

    def hang_up(self) -> None:
        """End every connection from the client's side towards the broker, losing
        nothing the broker sent: the broker reads an EOF (a client gone without
        DISCONNECT), stops sending and closes; whatever it sent before is forwarded to
        the client, then the client's connection is closed. What the client sends
        meanwhile (PUBACKs) is thrown away, as a connection that died would."""
        asyncio.run_coroutine_threadsafe(self._hang_up(), self._loop).result(5)

    async def _hang_up(self) -> None:
        for writer in list(self._upstreams):
            self._hung_up.add(writer)
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()

    def hold_after_connect(self, *, hold: bool = True) -> None:
        """While set, new connections forward the client's first packet (CONNECT) and the
        broker's answers, then hold everything else the client sends (its SUBSCRIBE):
        a partition that begins right after CONNACK."""
        self._hold_after_first = hold

    def hold_replies(self, *, hold: bool = True) -> None:
        """While set, new connections forward the broker's first answer (CONNACK) and
        then hold everything else the broker sends (a SUBACK, messages), while what the
        client sends flows: as a SUBACK sitting behind a backlog the client reads slowly."""
        self._hold_replies = hold

    def slow_client(self, client_id: str, seconds: float) -> None:
        """For a connection of ``client_id`` made in the next ``seconds``: forward what it
        sends, but hold all the broker sends it (its CONNACK first) until then, as a
        client that takes long to come up while the broker has resumed its session."""
        self._slow_ids[client_id.encode()] = time.monotonic() + seconds

    def disconnect(self, code: int) -> None:
        """Send every client an MQTT 5 DISCONNECT with reason ``code`` (as a broker does,
        e.g. 0x8E session taken over) and close its connection (call it while no other
        traffic flows, so the packet is not cut into another)."""
        packet = bytes((0xE0, 2, code, 0))  # reason, no properties
        asyncio.run_coroutine_threadsafe(self._close_connections(packet), self._loop).result(5)

    def stop(self) -> None:
        self._open.set()
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_connections()

    async def _close_connections(self, last: bytes = b"") -> None:
        if last:
            for writer in list(self._clients):
                with contextlib.suppress(OSError):
                    writer.write(last)
                    await writer.drain()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if self._refusals > 0:
            self._refusals -= 1
            try:
                await _refuse(reader, writer, self._refuse_code)
                self.refused += 1
            finally:
                self._tasks.discard(task)
            return
        first = b""
        if self._slow_ids:  # whose CONNECT is it?
            try:
                first = await _packet(reader)
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                self._tasks.discard(task)
                return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        if first:
            self.connects.append(first)
            up_writer.write(first)
        self._clients.add(writer)
        self._upstreams.add(up_writer)
        upstream = asyncio.create_task(self._pipe(reader, up_writer, upstream=True))
        try:
            # The broker's side ends the connection...
            await self._pipe(up_reader, writer, slow_until=_slow_until(first, self._slow_ids))
        finally:
            upstream.cancel()  # ...and with it what the client sends
            with contextlib.suppress(asyncio.CancelledError):
                await upstream
            self._tasks.discard(task)
            self._clients.discard(writer)
            self._upstreams.discard(up_writer)
            self._hung_up.discard(up_writer)
            for stream in (writer, up_writer):
                stream.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: bool = False,
        slow_until: float = 0.0,
    ) -> None:
        hold_after_first = upstream and self._hold_after_first
        hold_replies = not upstream and self._hold_replies
        chunks = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                while not self._open.is_set():  # partition: hold the bytes, send nothing
                    await asyncio.sleep(0.05)
                while hold_after_first and chunks and self._hold_after_first:
                    await asyncio.sleep(0.05)
                while hold_replies and chunks and self._hold_replies:
                    await asyncio.sleep(0.05)
                while time.monotonic() < slow_until:
                    await asyncio.sleep(0.05)
                chunks += 1
                if upstream:
                    self.client_chunks += 1
                if writer in self._hung_up:
                    continue  # the broker's side is closed: lost, as with a dead connection
                writer.write(data)
                await writer.drain()
        while not self._open.is_set():  # a partition holds a close as it holds bytes
            await asyncio.sleep(0.05)
        writer.close()


async def _packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet, as read."""
    head = await reader.readexactly(1)
    length, shift, size = 0, 0, b""
    while True:
        byte = await reader.readexactly(1)
        size += byte
        length |= (byte[0] & 0x7F) << shift
        shift += 7
        if not byte[0] & 0x80:
            break
    return head + size + await reader.readexactly(length)


def _slow_until(connect: bytes, slow: dict[bytes, float]) -> float:
    """Until when the broker's answers to the client ``connect`` names are held (its id's
    bytes, prefixed by their length, as MQTT writes a string); 0.0 if not held."""
    return max(
        (until for key, until in slow.items() if len(key).to_bytes(2, "big") + key in connect),
        default=0.0,
    )


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, code: int) -> None:
    """Read one CONNECT, answer a CONNACK with reason ``code`` (session present 0), close."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        await _packet(reader)
        writer.write(bytes((0x20, 3, 0, code, 0)))  # flags, reason, no properties
        await writer.drain()
    writer.close()
