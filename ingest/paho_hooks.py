"""The one place that reaches into paho-mqtt, the client that aiomqtt 2.x wraps.

aiomqtt gives us connection handling, reconnects and subscribe; two things it lacks:

* Manual acknowledgement. Without it paho sends PUBACK as soon as a message arrives,
  before it is written, and a crash loses it. With it, :func:`ack` sends the PUBACK
  after the write.
* A lean receive path. paho reads one packet per readable event, in three ``recv``
  calls (command byte, length, body); :func:`install` makes each readable event read
  a burst of packets from a 64 KiB buffer. And for every MQTT 5 PUBLISH, paho builds a
  ``Properties`` object
  (rebuilding its lookup tables each time), an ``MQTTMessage`` with a
  ``threading.Condition``, a debug log line, and aiomqtt wraps that again in its own
  ``Message`` and ``Topic``. That is most of the CPU a message costs. :func:`install`
  replaces paho's PUBLISH handler for QoS 0 and 1 with a direct parse of the packet
  (topic, packet id, properties skipped, payload) and hands ``(topic, payload, mid, qos)``
  to our callback. Skipping the properties is safe because our CONNECT advertises no
  Topic Alias Maximum (so the broker may not alias topics) and we set no subscription
  identifiers. QoS 2 keeps paho's own handler (it tracks PUBREC/PUBREL state) and
  reaches the same callback through ``on_message``.

Tested by the end-to-end tests through a real mosquitto; pinned to paho-mqtt 2.x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paho.mqtt.enums import MQTTErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiomqtt

type Deliver = Callable[[str, bytes, int, int, bool], None]  # topic, payload, mid, qos, dup
RECV_BYTES = 65536
PUBACK = 0x40
PUBACK_HEAD = bytes((PUBACK, 2))
READ_BURST = 500


def _paho(client: aiomqtt.Client) -> Any:  # noqa: ANN401 - paho's client, untyped internals
    return client._client  # noqa: SLF001


def install(client: aiomqtt.Client, deliver: Deliver,
            on_session: Callable[[bool], None], on_lost: Callable[[], None]) -> None:
    """Switch on manual acks and route every received PUBLISH to ``deliver``.

    ``on_session`` gets CONNACK's session-present flag (aiomqtt drops it), before any
    redelivered message of that session; ``on_lost`` is called as soon as the connection
    is gone, so nothing more is acknowledged on it.
    """
    paho = _paho(client)
    paho.manual_ack_set(True)  # noqa: FBT003
    original = paho._handle_publish  # noqa: SLF001
    aiomqtt_on_connect = paho.on_connect
    aiomqtt_on_disconnect = paho.on_disconnect

    def on_connect(*args: Any) -> None:  # noqa: ANN401 - paho's callback signature
        flags = args[2]
        on_session(bool(getattr(flags, "session_present", False)))
        aiomqtt_on_connect(*args)

    def on_disconnect(*args: Any) -> None:  # noqa: ANN401 - paho's callback signature
        on_lost()
        aiomqtt_on_disconnect(*args)

    def on_message(_client: object, _userdata: object, message: Any) -> None:  # noqa: ANN401
        deliver(message.topic, message.payload, message.mid, message.qos, bool(message.dup))

    def handle_publish() -> MQTTErrorCode:
        packet = paho._in_packet  # noqa: SLF001
        command = packet["command"]
        qos = (command & 0x06) >> 1
        if qos == 2:
            return original()  # type: ignore[no-any-return]
        data = packet["packet"]
        end = 2 + int.from_bytes(data[0:2])
        topic = bytes(data[2:end]).decode("utf-8", "replace")
        mid = 0
        if qos:
            mid = int.from_bytes(data[end:end + 2])
            end += 2
        dup = bool(command & 0x08)
        deliver(topic, bytes(data[_skip_properties(data, end):]), mid, qos, dup)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    paho.on_message = on_message
    paho.on_connect = on_connect
    paho.on_disconnect = on_disconnect
    paho._handle_publish = handle_publish  # noqa: SLF001
    _buffer_reads(paho)


class _Buffered:
    """paho's small reads served from one large ``recv``; packets read in bursts."""

    def __init__(self, paho: Any) -> None:  # noqa: ANN401
        self._paho = paho
        self._raw_recv = paho._sock_recv  # noqa: SLF001 - keeps paho's TLS/error handling
        self._data = b""
        self._pos = 0
        self._burst_over = False

    def sock_recv(self, bufsize: int) -> bytes:
        if self._pos >= len(self._data):
            if self._burst_over:
                # Yield to the event loop: the socket stays readable and paho keeps the
                # partial packet, so the next readable event resumes exactly here.
                raise BlockingIOError
            data = self._raw_recv(RECV_BYTES)  # raises BlockingIOError when nothing is left
            if not data:
                return b""  # EOF: paho treats it as a lost connection
            self._data, self._pos = data, 0
        start = self._pos
        self._pos = start + bufsize
        return self._data[start:self._pos]

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:  # noqa: ARG002 - paho's API
        """Read up to READ_BURST packets, then finish the bytes already buffered.

        Bytes are never left in our buffer (the event loop only calls again when the
        socket is readable), and the work per call stays bounded by READ_BURST packets
        plus one buffer, so a busy connection cannot starve the other tasks.
        """
        paho = self._paho
        self._burst_over = False
        packets = 0
        while True:
            if paho._sock is None:  # noqa: SLF001
                return MQTTErrorCode.MQTT_ERR_NO_CONN
            rc = paho._packet_read()  # noqa: SLF001
            if rc > 0:
                return paho._loop_rc_handle(rc)  # type: ignore[no-any-return]  # noqa: SLF001
            if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            packets += 1
            self._burst_over = packets >= READ_BURST


def _buffer_reads(paho: Any) -> None:  # noqa: ANN401
    buffered = _Buffered(paho)
    paho._sock_recv = buffered.sock_recv  # noqa: SLF001
    paho.loop_read = buffered.loop_read


def _skip_properties(data: bytes | bytearray, pos: int) -> int:
    """Position just past an MQTT 5 property block (a variable byte integer length)."""
    length, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return pos + length
        shift += 7


def ack(client: aiomqtt.Client, mid: int, qos: int) -> None:
    """Send the PUBACK (QoS 1) or PUBCOMP (QoS 2) for a message we have written."""
    _paho(client).ack(mid, qos)


def ack_many(client: aiomqtt.Client, mids: list[int]) -> None:
    """Send the PUBACKs of QoS 1 messages, in this order, as one packet write.

    The bytes are exactly paho's (``0x40 0x02`` and the packet id: an MQTT 5 PUBACK
    without reason code means success); queued once, they cost one ``send`` instead of
    two system calls and an event-loop callback per message.
    """
    blob = b"".join(PUBACK_HEAD + mid.to_bytes(2, "big") for mid in mids)
    _paho(client)._packet_queue(PUBACK, blob, 0, 0)  # noqa: SLF001
