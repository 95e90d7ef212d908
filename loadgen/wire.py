"""A minimal MQTT 3.1.1 publisher on a plain socket: the cheapest publish path in Python.

Publishing is all a load generator does, so it writes PUBLISH packets itself, many per
``sendall``, instead of going through a general client (paho builds each packet in
Python, takes locks and makes one system call per message). It speaks just enough MQTT:
CONNECT/CONNACK, PUBLISH at QoS 0 or 1, PUBACK, PINGREQ/PINGRESP, DISCONNECT.
"""

from __future__ import annotations

import select
import socket
import struct
import time

CONNACK, PUBACK, PINGRESP = 0x20, 0x40, 0xD0
USERNAME_FLAG, PASSWORD_FLAG, CLEAN_SESSION = 0x80, 0x40, 0x02
# CONNACK return codes of MQTT 3.1.1 (section 3.2.2.3).
REFUSALS = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"


class WireError(OSError):
    """The broker refused us or the connection broke."""


class RefusedError(WireError):
    """The broker answered CONNACK with a refusal; retrying will not help."""

    def __init__(self, code: int) -> None:
        self.code = code
        super().__init__(
            f"broker refused the connection: {REFUSALS.get(code, 'unknown reason')}"
            f" (return code {code})"
        )


def remaining_length(size: int) -> bytes:
    """MQTT variable-length encoding of a packet's remaining length."""
    out = bytearray()
    while True:
        size, digit = size >> 7, size & 0x7F
        out.append(digit | 0x80 if size else digit)
        if not size:
            return bytes(out)


def publish_packet(topic: bytes, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    """One PUBLISH packet (no retain, no dup)."""
    if qos == 0:
        head = struct.pack("!H", len(topic)) + topic
        return b"\x30" + remaining_length(len(head) + len(payload)) + head + payload
    head = struct.pack("!H", len(topic)) + topic + struct.pack("!H", packet_id)
    return b"\x32" + remaining_length(len(head) + len(payload)) + head + payload


def _field(data: bytes) -> bytes:
    return struct.pack("!H", len(data)) + data


def connect_packet(
    client_id: str, keepalive: int, username: str | None = None, password: str | None = None
) -> bytes:
    """CONNECT with a clean session, no will, and the user name and password if given.

    MQTT 3.1.1 allows a password only with a user name; one without is ignored.
    """
    flags = CLEAN_SESSION
    payload = _field(client_id.encode())
    if username is not None:
        flags |= USERNAME_FLAG
        payload += _field(username.encode())
        if password is not None:
            flags |= PASSWORD_FLAG
            payload += _field(password.encode())
    body = b"\x00\x04MQTT\x04" + bytes([flags]) + struct.pack("!H", keepalive) + payload
    return b"\x10" + remaining_length(len(body)) + body


class Connection:
    """One MQTT connection that publishes and counts PUBACKs."""

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        keepalive: int = 60,
        timeout: float = 10.0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.username, self._password = username, password
        self.keepalive = keepalive
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self.acked: list[int] = []
        self.pongs = 0
        self.last_write = 0.0

    def connect(self) -> None:
        """Open the socket, send CONNECT, wait for a successful CONNACK."""
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._buffer.clear()
        self.write(connect_packet(self.client_id, self.keepalive, self.username, self._password))
        deadline = time.monotonic() + self.timeout
        while True:
            packet = self._next_packet()
            if packet is not None:
                kind, body = packet
                if kind != CONNACK or len(body) < 2:
                    raise WireError(f"expected CONNACK, got packet type {kind >> 4}")
                if body[1] != 0:
                    raise RefusedError(body[1])
                return
            if time.monotonic() > deadline:
                raise WireError("no CONNACK from the broker")
            self._fill(deadline - time.monotonic())

    def write(self, data: bytes) -> None:
        """Send bytes, blocking while the socket is full (that is the backpressure)."""
        if self._sock is None:
            raise WireError("not connected")
        self._sock.sendall(data)
        self.last_write = time.monotonic()

    def poll(self, timeout: float = 0.0) -> None:
        """Read what the broker sent (PUBACKs into ``acked``, PINGRESPs into ``pongs``)."""
        self._fill(timeout)
        while (packet := self._next_packet()) is not None:
            kind, body = packet
            if kind & 0xF0 == PUBACK and len(body) >= 2:
                self.acked.append(struct.unpack_from("!H", body)[0])
            elif kind == PINGRESP:
                self.pongs += 1

    def ping(self, timeout: float) -> bool:
        """PINGREQ and wait for the answer: the broker has then read all we sent before."""
        before = self.pongs
        self.write(PINGREQ)
        deadline = time.monotonic() + timeout
        while self.pongs == before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(remaining)
        return True

    def keep_alive(self, now: float) -> None:
        """Send a PINGREQ when nothing was written for half the keepalive."""
        if now - self.last_write > self.keepalive / 2:
            self.write(PINGREQ)

    def close(self, clean: bool = True) -> None:
        """DISCONNECT (when ``clean``) and close the socket."""
        if self._sock is None:
            return
        try:
            if clean:
                self._sock.sendall(DISCONNECT)
        except OSError:
            pass
        finally:
            self._sock.close()
            self._sock = None

    def _fill(self, timeout: float) -> None:
        sock = self._sock
        if sock is None:
            raise WireError("not connected")
        readable, _, _ = select.select([sock], [], [], max(0.0, timeout))
        if not readable:
            return
        data = sock.recv(65536)
        if not data:
            raise WireError("the broker closed the connection")
        self._buffer += data

    def _next_packet(self) -> tuple[int, bytes] | None:
        buf = self._buffer
        size, shift, pos = 0, 0, 1
        while True:
            if pos >= len(buf):
                return None
            digit = buf[pos]
            size |= (digit & 0x7F) << shift
            pos += 1
            if not digit & 0x80:
                break
            shift += 7
        if len(buf) < pos + size:
            return None
        kind, body = buf[0], bytes(buf[pos : pos + size])
        del buf[: pos + size]
        return kind, body
