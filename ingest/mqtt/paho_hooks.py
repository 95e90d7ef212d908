"""The one place that reaches into paho-mqtt, the client that aiomqtt 2.x wraps.

aiomqtt gives us connection handling, reconnects and subscribe; two things it lacks:

* Manual acknowledgement. Without it paho sends PUBACK as soon as a message arrives,
  before it is written, and a crash loses it. With it, :func:`ack` sends the PUBACK
  after the write.
* A lean receive path. paho reads one packet per readable event, in three ``recv``
  calls (command byte, length, body); :func:`install` makes each readable event read
  a burst of packets from a 64 KiB buffer, and parses the QoS 0 and 1 PUBLISH packets
  that lie whole in that buffer without paho's reader (a lock, a dict and three reads
  a packet). And for every MQTT 5 PUBLISH, paho builds a
  ``Properties`` object
  (rebuilding its lookup tables each time), an ``MQTTMessage`` with a
  ``threading.Condition``, a debug log line, and aiomqtt wraps that again in its own
  ``Message`` and ``Topic``. That is most of the CPU a message costs. :func:`install`
  replaces paho's PUBLISH handler for QoS 0 and 1 with a direct parse of the packet
  (topic, packet id, the Subscription Identifiers among the properties, payload) and
  hands ``(topic, payload, mid, qos, dup, retain, subscription)`` to our callback.
  Skipping the other properties is safe because our CONNECT advertises no Topic Alias
  Maximum (so the broker may not alias topics) and nothing else in them changes what a
  message is. QoS 2 keeps paho's own handler (it tracks PUBREC/PUBREL state) and
  reaches the same callback through ``on_message``.

* Pausing the reader. :func:`install` returns the connection's :class:`Reader`; its
  :meth:`~Reader.pause` takes paho's socket off the event loop (``remove_reader``) and ends
  the current read burst after the packet being handled, so TCP and the broker hold the
  backlog; :meth:`~Reader.resume` puts it back and reads what was already buffered (in
  our buffer or in the TLS object, which the kernel socket no longer signals). While
  paused, paho's client-side keepalive check is suspended (its PINGRESP waits unread
  behind the data): PINGREQ still goes out every keepalive, so the broker keeps the
  connection and the session, and the check is re-armed on resume.

Every paho and aiomqtt internal used here (the methods in :data:`REQUIRED`, the callback
properties, ``_in_packet``, ``_sock``, the keepalive state in
:data:`KEEPALIVE_ATTRIBUTES` and ``time_func``, aiomqtt's ``_client``, callbacks and
``_disconnected``) is checked at
start-up by :func:`check_compatible`, which refuses to run on other shapes
(tests/mqtt/test_paho_contract.py holds the behaviour behind each). pyproject.toml pins
paho-mqtt and aiomqtt to the minor versions those tests cover.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import socket
from importlib.metadata import version
from typing import TYPE_CHECKING, Any, Protocol

import paho.mqtt.client as paho_client
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from ingest.errors import IncompatibleError
from ingest.mqtt import wire

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiomqtt

type Deliver = wire.Deliver  # topic, payload, mid, qos, dup, retain, subscription
# Gets CONNACK's session-present flag and whether the broker takes Subscription
# Identifiers (its Subscription Identifiers Available property; absent means it does).
type OnSession = Callable[[bool, bool], None]
RECV_BYTES = 65536
PUBACK = 0x40
READ_BURST = 500  # packets handled per readable event, at most
RECV_BURST = 200  # socket reads per readable event, at most (12.5 MiB)
# A read shorter than this ends the burst once handled: the broker sends no faster than
# we read, and reading again at once would take a few packets a system call; the event
# loop's other work (the pipeline taking them) lets the socket fill meanwhile.
SHORT_READ = 8192
TCP_ESTABLISHED = 1  # tcpi_state in Linux's struct tcp_info


# paho Client methods the hooks call or replace, with their parameters (after self).
REQUIRED: dict[str, tuple[str, ...]] = {
    "_packet_read": (),
    "_loop_rc_handle": ("rc",),
    "_sock_recv": ("bufsize",),
    "_handle_publish": (),
    "_packet_queue": ("command", "packet", "mid", "qos", "info"),
    "loop_read": ("max_packets",),
    "ack": ("mid", "qos"),
    "manual_ack_set": ("on",),
    "loop_misc": (),
    "_send_pingreq": (),
}
# paho Client attributes the paused keepalive reads or re-arms.
KEEPALIVE_ATTRIBUTES = ("_keepalive", "_ping_t", "_last_msg_out", "_last_bytes_received")
CALLBACKS = ("on_connect", "on_disconnect", "on_message")  # paho properties we chain
# paho's packet-in-progress dict, read by handle_publish and by the reader's contract
IN_PACKET_KEYS = frozenset(
    {
        "command",
        "have_remaining",
        "remaining_count",
        "remaining_mult",
        "remaining_length",
        "packet",
        "to_process",
        "pos",
    }
)
AIOMQTT_CALLBACKS = ("_on_connect", "_on_disconnect")  # (client, userdata, flags/..., rc, props)
SUPPORTED = "paho-mqtt 2.2.x with aiomqtt 2.5.x"


def check_compatible(client: aiomqtt.Client) -> None:
    """Refuse to run (one line) unless paho and aiomqtt have the internals the hooks use."""
    problem = _incompatibility(client)
    if problem is not None:
        raise IncompatibleError(
            f"paho-mqtt {version('paho-mqtt')} with aiomqtt {version('aiomqtt')} is not "
            f"supported ({problem}); install {SUPPORTED}"
        )


def _incompatibility(client: aiomqtt.Client) -> str | None:
    """The first internal the installed paho/aiomqtt lack or changed, or None."""
    cls = paho_client.Client
    paho: Any = getattr(client, "_client", None)
    checks: list[tuple[str, Callable[[], bool]]] = [
        *(
            (
                f"paho Client.{name}({', '.join(params)})",
                functools.partial(_takes, getattr(cls, name, None), params, 1),
            )
            for name, params in REQUIRED.items()
        ),
        *(
            (
                f"paho Client.{name} property",
                functools.partial(lambda n: isinstance(getattr(cls, n, None), property), name),
            )
            for name in CALLBACKS
        ),
        (
            "paho MQTTErrorCode.MQTT_ERR_AGAIN/NO_CONN",
            lambda: all(
                hasattr(MQTTErrorCode, n)
                for n in ("MQTT_ERR_SUCCESS", "MQTT_ERR_AGAIN", "MQTT_ERR_NO_CONN")
            ),
        ),
        (
            "paho ReasonCode.is_failure",
            lambda: isinstance(getattr(ReasonCode, "is_failure", None), property),
        ),
        (
            "paho ConnectFlags.session_present",
            lambda: "session_present" in getattr(paho_client.ConnectFlags, "_fields", ()),
        ),
        ("aiomqtt Client._client (a paho Client)", lambda: isinstance(paho, cls)),
        (
            "paho callback API version 2 in aiomqtt",
            lambda: getattr(paho, "_callback_api_version", None) == CallbackAPIVersion.VERSION2,
        ),
        (
            "paho Client._in_packet keys",
            lambda: (
                isinstance(getattr(paho, "_in_packet", None), dict)
                and set(paho._in_packet) == IN_PACKET_KEYS  # noqa: SLF001
            ),
        ),
        ("paho Client._sock", lambda: hasattr(paho, "_sock")),
        *(
            (
                f"paho Client.{name} (a number)",
                functools.partial(lambda n: isinstance(getattr(paho, n, None), int | float), name),
            )
            for name in KEEPALIVE_ATTRIBUTES
        ),
        ("paho time_func", lambda: callable(getattr(paho_client, "time_func", None))),
        (
            "aiomqtt Client._disconnected (a Future)",
            lambda: isinstance(getattr(client, "_disconnected", None), asyncio.Future),
        ),
        *(
            (
                f"aiomqtt Client.{name}(client, userdata, flags, reason_code, properties)",
                functools.partial(_takes, getattr(client, name, None), 5),
            )
            for name in AIOMQTT_CALLBACKS
        ),
    ]
    return next((f"{what}: missing or changed" for what, holds in checks if not holds()), None)


def _takes(function: object, params: tuple[str, ...] | int, skip: int = 0) -> bool:
    """Whether ``function`` is callable with these parameter names (or this many)."""
    if not callable(function):
        return False
    names = tuple(inspect.signature(function).parameters)[skip:]
    return len(names) == params if isinstance(params, int) else names == params


def _paho(client: aiomqtt.Client) -> Any:  # noqa: ANN401 - paho's client, untyped internals
    return client._client  # noqa: SLF001


def install(
    client: aiomqtt.Client, deliver: Deliver, on_session: OnSession, on_lost: Callable[[], None]
) -> Reader:
    """Switch on manual acks and route every received PUBLISH to ``deliver``.

    Returns the connection's :class:`Reader`, which ``deliver`` may pause.

    ``on_session`` gets the session-present flag of an accepted CONNACK (aiomqtt drops
    it; a refusal says nothing about the session) and whether the broker takes
    Subscription Identifiers, before any redelivered message of that session;
    ``on_lost`` is called as soon as the connection
    is gone, so nothing more is acknowledged on it.
    """
    paho = _paho(client)
    paho.manual_ack_set(True)  # noqa: FBT003
    original = paho._handle_publish  # noqa: SLF001
    aiomqtt_on_connect = paho.on_connect
    aiomqtt_on_disconnect = paho.on_disconnect

    def on_connect(*args: Any) -> None:  # noqa: ANN401 - paho's callback signature
        flags, reason, properties = args[2], args[3], args[4]
        if not reason.is_failure:  # a refusal says nothing about the session
            on_session(
                bool(flags.session_present),
                getattr(properties, "SubscriptionIdentifierAvailable", 1) != 0,
            )
        aiomqtt_on_connect(*args)

    def on_disconnect(*args: Any) -> None:  # noqa: ANN401 - paho's callback signature
        on_lost()
        aiomqtt_on_disconnect(*args)

    def on_message(_client: object, _userdata: object, message: Any) -> None:  # noqa: ANN401
        found = tuple(getattr(message.properties, "SubscriptionIdentifier", ()))
        deliver(
            message.topic,
            message.payload,
            message.mid,
            message.qos,
            bool(message.dup),
            bool(message.retain),
            found if len(found) > 1 else found[0] if found else 0,
        )

    def handle_publish() -> MQTTErrorCode:
        packet = paho._in_packet  # noqa: SLF001
        command = packet["command"]
        qos = (command & 0x06) >> 1
        if qos == 2:
            return original()  # type: ignore[no-any-return]
        body = bytes(packet["packet"])
        wire.deliver_publish(deliver, command, body, 0, len(body))
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    paho.on_message = on_message
    paho.on_connect = on_connect
    paho.on_disconnect = on_disconnect
    paho._handle_publish = handle_publish  # noqa: SLF001
    return _buffer_reads(client, paho, deliver)


class Reader(Protocol):
    """A connection's socket reader, as the source sees it."""

    @property
    def paused(self) -> bool:
        """Whether reading is paused."""

    def pause(self) -> None:
        """Stop reading the socket after the packet being handled."""

    def resume(self) -> None:
        """Read the socket again, starting with what is already buffered."""


class _Buffered:
    """paho's small reads served from one large ``recv``; packets read in bursts.

    The contract with the event loop, which calls :meth:`loop_read` whenever the socket
    is readable: when :meth:`loop_read` returns, no complete packet is left unhandled in
    our buffer or in paho's, and no byte is left in our buffer but the start of a
    PUBLISH whose rest is still to come, unless the socket itself may still hold more
    (then it is readable and the event loop calls again). paho's ``_packet_read``
    returns "try again" in two cases: the socket had nothing (our ``sock_recv`` raised
    ``BlockingIOError``) or it made 100 ``recv`` calls for one packet body, which says
    nothing about the socket or our buffer; only the first ends the call.

    Our buffer is refilled by :meth:`_more`, and a QoS 0/1 PUBLISH cut by the end of a
    read (one a read, when reads are small) is completed there by the next read and
    parsed like the others, instead of going through paho's reader (three ``sock_recv``
    calls, a lock and a dict, then the copy ``handle_publish`` parses).
    """

    def __init__(
        self,
        client: aiomqtt.Client,
        paho: Any,  # noqa: ANN401
        deliver: Deliver,
    ) -> None:
        self._client = client
        self._paho = paho
        self._deliver = deliver
        self._raw_recv = paho._sock_recv  # noqa: SLF001 - keeps paho's TLS/error handling
        self._raw_misc = paho.loop_misc
        self._loop = asyncio.get_running_loop()
        self._paused = False
        self._closing = False  # the peer has closed: read up to its EOF, pause no more
        self._pinged = 0.0  # paho's clock: the last PINGREQ sent while paused
        self._data = b""
        self._pos = 0
        self._packets = 0  # packets handled in this call of loop_read
        self._recvs = 0  # socket reads in this call of loop_read
        self._waiting = False  # the last "try again" came from us: the buffer is empty

    def sock_recv(self, bufsize: int) -> bytes:
        """Serve ``bufsize`` bytes at most from the buffer, refilling it from the socket."""
        if self._pos >= len(self._data) and not self._more():
            if self._waiting:
                # The socket is empty, or the burst is over: then the socket stays
                # readable and paho keeps the partial packet, so the next readable event
                # resumes exactly here.
                raise BlockingIOError
            return b""  # EOF: paho treats it as a lost connection
        start = self._pos
        self._pos = start + bufsize
        return self._data[start : self._pos]

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:  # noqa: ARG002 - paho's API
        """Read packets until the buffer is empty and the socket is, or the burst is over.

        The work per call stays bounded (READ_BURST packets or RECV_BURST socket reads),
        so a busy connection cannot starve the other tasks.
        """
        paho = self._paho
        self._packets = self._recvs = 0
        while True:
            if paho._sock is None:  # noqa: SLF001
                return MQTTErrorCode.MQTT_ERR_NO_CONN
            if self._paused:
                # The packet just handled paused us: the rest waits in the socket, our
                # buffer or paho's packet in progress.
                self._absorb_pending()
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            self._waiting = False
            went_on = self._buffered()
            if went_on:
                continue  # handled from the buffer, or it grew: check the pause
            if went_on is None:
                return MQTTErrorCode.MQTT_ERR_SUCCESS  # the rest is still to come
            rc = paho._packet_read()  # noqa: SLF001
            if rc > 0:
                return paho._loop_rc_handle(rc)  # type: ignore[no-any-return]  # noqa: SLF001
            if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                if self._waiting:
                    return MQTTErrorCode.MQTT_ERR_SUCCESS
                continue  # paho's 100 reads per round: the packet goes on from our buffer
            self._packets += 1

    def _publishes(self) -> bool:
        """Handle the complete QoS 0/1 PUBLISH packets at the front of the buffer.

        paho's ``_packet_read`` costs three ``sock_recv`` calls, a lock and a new dict
        per packet; between packets (paho holds no partial one) a PUBLISH whose bytes are
        all in our buffer is parsed here instead (:func:`wire.scan`), exactly as
        ``handle_publish`` parses paho's copy of it. Stops at anything else (another
        packet type, QoS 2, a packet not complete in the buffer), which paho's reader
        then handles, and after a packet that paused the reader. Returns whether any
        packet was handled.
        """
        handled = wire.scan(self._data, self, self._deliver)
        if not handled:
            return False
        self._packets += handled
        self._paho._last_bytes_received = paho_client.time_func()  # noqa: SLF001
        return True

    def _buffered(self) -> bool | None:
        """Go on from our buffer without paho's reader, between packets.

        True: packets were handled (:meth:`_publishes`), or the buffer, empty or ending
        in a cut PUBLISH, got more bytes (:meth:`_more`); None: the socket had nothing
        more, or the burst is over; False: the next packet is paho's to read (another
        type, QoS 2, a long one), or the socket is at its end (paho's reader, reading
        the same end, reports the lost connection).
        """
        if self._paho._in_packet["command"] != 0:  # noqa: SLF001 - paho holds a packet
            return False
        if self._publishes():
            return True
        # A PUBLISH cut at the end is completed by the next read, unless it is longer than
        # a read (paho's reader then reads it piece by piece, without copies).
        if self._pos < len(self._data) and not wire.cut_publish(self._data, self._pos, RECV_BYTES):
            return False
        if self._more():
            return True
        return None if self._waiting else False

    def _more(self) -> bool:
        """Read the socket onto what is left of our buffer; False if nothing came.

        Nothing: the socket is empty or the burst is over (``_waiting``), or the socket is
        at its end.
        """
        if self._packets >= READ_BURST or self._recvs >= RECV_BURST:
            self._waiting = True  # yield to the event loop
            return False
        self._recvs += 1
        try:
            data = self._raw_recv(RECV_BYTES)
        except BlockingIOError:
            self._waiting = True
            return False
        if not data:
            return False
        if len(data) < SHORT_READ:
            self._recvs = RECV_BURST  # the last read of this burst (see SHORT_READ)
        self._data, self._pos = self._data[self._pos :] + data, 0
        return True

    def _absorb_pending(self) -> None:
        """Move what the TLS object has decrypted into our buffer.

        aiomqtt's reader callback calls :meth:`loop_read` again while the TLS socket has
        ``pending()`` bytes; paused, we take them (at most one TLS record) so that its
        loop ends.
        """
        pending = getattr(self._paho._sock, "pending", None)  # noqa: SLF001
        if pending is None or pending() <= 0:
            return
        data = self._raw_recv(pending())
        self._data = self._data[self._pos :] + data
        self._pos = 0

    @property
    def paused(self) -> bool:
        """Whether reading is paused."""
        return self._paused

    def pause(self) -> None:
        """Take the socket off the event loop; the current burst ends after this packet."""
        sock = self._paho._sock  # noqa: SLF001
        if self._paused or sock is None or self._closing:
            return
        self._paused = True
        self._pinged = 0.0
        self._loop.remove_reader(sock.fileno())

    def resume(self) -> None:
        """Put the socket back on the event loop, re-arm the keepalive, read the buffer.

        Bytes already in our buffer or in the TLS object do not make the kernel socket
        readable, so one read is scheduled directly.
        """
        paho = self._paho
        if not self._paused:
            return
        self._paused = False
        sock = paho._sock  # noqa: SLF001
        if sock is None:
            return  # gone meanwhile; a reconnect starts a new, unpaused reader
        # The answers to the PINGREQs sent while paused are behind the data not yet read:
        # the keepalive check starts afresh.
        paho._last_bytes_received = paho_client.time_func()  # noqa: SLF001
        paho._ping_t = 0  # noqa: SLF001
        self._loop.add_reader(sock.fileno(), self._readable)
        self._loop.call_soon(self._readable)

    def _readable(self) -> None:
        """The reader callback after a resume: aiomqtt's own, which a pause removed."""
        client, paho = self._client, self._paho
        try:
            while True:
                self.loop_read()
                pending = getattr(paho._sock, "pending", None)  # noqa: SLF001
                if self._paused or pending is None or pending() <= 0:
                    break
        except Exception as exc:  # noqa: BLE001 - handed to aiomqtt, as its callback does
            disconnected = client._disconnected  # noqa: SLF001
            if not disconnected.done():
                disconnected.set_exception(exc)

    def loop_misc(self) -> MQTTErrorCode:
        """Keepalive and timeouts (paho's); while paused, PINGREQs without the PINGRESP check.

        paho closes the connection when its PINGRESP has not been read within a
        keepalive; paused, we do not read it. PINGREQ still goes out once per keepalive
        (the broker closes a connection silent for 1.5 keepalives), and the check is
        re-armed by :meth:`resume`. A connection the broker closed is noticed from the
        kernel's TCP state (called about once a second by aiomqtt), since its EOF is not
        read either.
        """
        paho = self._paho
        if not self._paused or paho._sock is None:  # noqa: SLF001
            return self._raw_misc()  # type: ignore[no-any-return]
        if _peer_closed(paho._sock):  # noqa: SLF001
            # Unread, the broker's FIN (a restart, a takeover) would go unnoticed until
            # a PINGREQ failed. What the broker sent before it waits in the socket, QoS 0
            # messages too, which no one sends again: read it all, past the inbox's
            # bound (the socket's buffer bounds it); the EOF then ends the connection.
            self._closing = True
            self.resume()
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        keepalive = paho._keepalive  # noqa: SLF001
        now = paho_client.time_func()
        last = max(self._pinged, paho._last_msg_out)  # noqa: SLF001
        if keepalive and now - last >= keepalive:
            paho._send_pingreq()  # noqa: SLF001
            self._pinged = paho._last_msg_out = now  # noqa: SLF001
        paho._ping_t = 0  # noqa: SLF001 - its PINGRESP waits unread behind the data
        return MQTTErrorCode.MQTT_ERR_SUCCESS


def _peer_closed(sock: Any) -> bool:  # noqa: ANN401 - a socket or an SSLSocket
    """Whether the peer has closed its side of a TCP connection (Linux; else False)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 1)
    except (OSError, AttributeError):
        return False
    return bool(info) and info[0] != TCP_ESTABLISHED


def _buffer_reads(
    client: aiomqtt.Client,
    paho: Any,  # noqa: ANN401
    deliver: Deliver,
) -> _Buffered:
    buffered = _Buffered(client, paho, deliver)
    paho._sock_recv = buffered.sock_recv  # noqa: SLF001
    paho.loop_read = buffered.loop_read
    paho.loop_misc = buffered.loop_misc
    return buffered


def ack(client: aiomqtt.Client, mid: int, qos: int) -> None:
    """Send the PUBACK (QoS 1) or PUBCOMP (QoS 2) for a message we have written."""
    _paho(client).ack(mid, qos)


def ack_many(client: aiomqtt.Client, mids: list[int]) -> None:
    """Send the PUBACKs of QoS 1 messages, in this order, as one packet write.

    The bytes are exactly paho's (``0x40 0x02`` and the packet id: an MQTT 5 PUBACK
    without reason code means success); queued once, they cost one ``send`` instead of
    two system calls and an event-loop callback per message.
    """
    _paho(client)._packet_queue(PUBACK, wire.pubacks(mids), 0, 0)  # noqa: SLF001
