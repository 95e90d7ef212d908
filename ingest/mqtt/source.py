"""MQTT: connect, subscribe, reconnect with backoff, hand out messages, ack after write.

The session is persistent (MQTT 5, Clean Start off, a session expiry) under a stable client
id, so messages published while the daemon is away wait at the broker. Every QoS 1/2
message is acknowledged only after its write (paho's manual ack), and the broker sends
at most Receive Maximum unacknowledged messages: that is the backpressure.

Received messages wait in the connection's inbox until the pipeline takes them. The inbox
is bounded in messages (``max_inflight_messages``) and in bytes (a quarter of
``max_buffered_bytes``, :data:`INBOX_SHARE`): over either bound, reading the socket
pauses (after the packet being read), so TCP and the broker hold the backlog, QoS 0
included; it resumes once the inbox is down to half of both bounds. When a connection
ends, its inbox's QoS 1 messages are left to the broker to resend; its QoS 0 messages,
which the broker does not resend, are taken first on the next connection, or by the
drain of a stop (:meth:`MqttSource.hand_over`); a stop that cannot write them counts them
in ``ingest_messages_lost_total``.

Which written messages get their PUBACK, when and on which connection (arrival order,
DUP redeliveries adopted or acknowledged again, packet ids reused while unacknowledged)
is the ledger's business (ingest/mqtt/acks.py); the source reports arrivals, writes and
connections to it and sends the PUBACKs it asks for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from ingest import accel
from ingest.errors import IngestError, StartupError
from ingest.model import Inbound
from ingest.mqtt import _inbox_py, paho_hooks
from ingest.mqtt.acks import AckLedger
from ingest.mqtt.subscriptions import SKIPPED, Memory, Subscriptions, identifier
from ingest.retry import backoff

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ingest.config import Settings
    from ingest.metrics import Health, Metrics

logger = logging.getLogger(__name__)
YIELD_EVERY = 500  # messages decoded between two yields to the event loop
# Seconds the broker keeps the daemon's session (and queues for it) while it is away.
SESSION_EXPIRY = 7 * 86400
# Seconds of reading (paused time does not count) a SUBACK or UNSUBACK may take.
ANSWER_TIMEOUT = 10.0
# Seconds the remembered filters may take to be read or written (at connect only).
MEMORY_TIMEOUT = 5.0
# Seconds a worker's first subscriptions wait for the other workers to be connected
# (:func:`start_together`); past them, each goes on alone.
TOGETHER_TIMEOUT = 10.0
# A connection's inbox and the delivery of its messages into it, written once in
# _inbox_py.py and compiled as _inbox_c where built (ingest/accel.py).
INBOX_SHARE = _inbox_py.INBOX_SHARE
INBOX_MESSAGE_BYTES = _inbox_py.INBOX_MESSAGE_BYTES
_Inbox = accel.pick(_inbox_py.Inbox, "ingest.mqtt._inbox_c", "Inbox")
_Receiver = accel.pick(_inbox_py.Receiver, "ingest.mqtt._inbox_c", "Receiver")


# The barrier of --workers (start_together): set in each worker process before its source
# is made.
_together: Any = None


def start_together(barrier: Any) -> None:  # noqa: ANN401 - a multiprocessing Barrier
    """Make this process's source wait at ``barrier`` before its first subscriptions.

    With ``--workers N`` the workers' sessions hold one shared subscription of each filter:
    a filter a restart unsubscribes (another ``--topic``, another form) goes on taking
    messages until the last worker has unsubscribed it, while today's takes them from
    the first worker's SUBACK, so a message published in between comes through both
    (a reading without a time of its own stored twice). Each worker connects, then waits
    here for the others (at most ``TOGETHER_TIMEOUT`` s), and all of them send their
    requests at once.
    """
    global _together  # noqa: PLW0603 - one per process, set before the source is made
    _together = barrier


# Takes a message at once if it can: True taken, False refused, None: await the sink.
type TakeNow = Callable[[Inbound], bool | None]
# Takes a message without its readings, acknowledged in turn (False: refused, stopping).
type Skip = Callable[[Inbound], bool]


def _not_now(_message: Inbound) -> bool | None:
    """A ``take_now`` that leaves every message to the sink."""
    return None


class MqttSource:
    """Consumes the configured topics and acknowledges messages on request."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        health: Health,
        session_expiry: int = SESSION_EXPIRY,
        memory: Memory | None = None,
    ) -> None:
        self._settings = settings
        # Today's filters (those a drain unsubscribes, when draining): a message that
        # came through another subscription is skipped (ingest/mqtt/subscriptions.py).
        self._subscriptions = Subscriptions(settings.subscriptions)
        self._memory = memory
        self._recalled = False  # the remembered filters are dealt with (once a process)
        # The remembered filters not wanted now, recalled before the first connection and
        # unsubscribed on it; None once taken (or if none could be recalled).
        self._early: tuple[str, ...] | None = None
        self._recall_next = True  # False: the recall before connecting failed just now
        # Filters unsubscribed by this start or a recent one (and when): recorded as
        # retired, their messages taken where today's filters match the topic.
        self._retired: dict[str, float] = {}
        # Before the first subscriptions: the other workers (start_together), once; not
        # for a retired worker's session being drained.
        self._together = None if settings.drain_only else _take_together()
        self._refused = False  # a subscription refused on this process's connections
        self._skip: Skip | None = None
        self._metrics = metrics
        self._health = health
        self._session_expiry = session_expiry
        self._client: aiomqtt.Client | None = None
        self._generation = 0
        # Which QoS 1 messages are owed a PUBACK, and when (ingest/mqtt/acks.py).
        self._ledger = AckLedger(settings.max_inflight_messages, self._send_pubacks)
        # QoS 0 messages read on a connection that ended before the pipeline took them:
        # the daemon's only copy (the broker does not resend QoS 0), taken first on the
        # next connection, or counted as lost if the daemon stops first.
        self._carried: list[Inbound] = []
        # At a stop: the QoS 0 messages read and not taken when taking stopped, for the
        # pipeline to take before it drains (hand_over); ready once they are known.
        self._handover: deque[Inbound] = deque()
        self._handover_ready = asyncio.Event()
        # The first connection resumed a session, which may hold the other form of each
        # filter (see _connected); None until the first CONNACK.
        self._resumed: bool | None = None
        paho_hooks.check_compatible(
            aiomqtt.Client(settings.mqtt.host, protocol=aiomqtt.ProtocolVersion.V5)
        )
        self._stop = asyncio.Event()
        self._release = asyncio.Event()
        self._inbox: _inbox_py.Inbox | None = None  # the current connection's
        metrics.inbox_limit_bytes.set(max(1, settings.max_buffered_bytes // INBOX_SHARE))

    def sync_metrics(self) -> None:
        """Move the inbox's size, the pause's time and the ledger's counts into the metrics.

        Before a scrape: the ledger counts in plain ints (a Prometheus counter takes a lock
        on every inc()).
        """
        if self._inbox is not None:
            self._inbox.sync_metrics()
        reused, adopted, reacked, acked_late = self._ledger.take_counts()
        metrics = self._metrics
        for counter, count in (
            (metrics.packet_id_reused, reused),
            (metrics.redeliveries_adopted, adopted),
            (metrics.redeliveries_reacked, reacked),
            (metrics.messages_acked, acked_late),
        ):
            if count:
                counter.inc(count)

    def _new_client(self) -> aiomqtt.Client:
        mqtt = self._settings.mqtt
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.ReceiveMaximum = self._settings.max_inflight_messages
        props.SessionExpiryInterval = self._session_expiry
        return aiomqtt.Client(
            mqtt.host,
            mqtt.port,
            username=mqtt.username,
            password=mqtt.password,
            identifier=self._settings.client_id,
            keepalive=self._settings.mqtt_keepalive,
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=False,
            properties=props,
            tls_context=mqtt.ssl_context(),
            logger=logging.getLogger("ingest.mqtt.client"),
        )

    def ack_all(self, messages: list[Inbound]) -> int:
        """Acknowledge written messages; how many PUBACKs went out (AckLedger.written)."""
        return self._ledger.written(messages)

    def _send_pubacks(self, messages: list[Inbound]) -> None:
        """The ledger's PUBACKs, in its order, as one packet write on the current connection."""
        client = self._client
        assert client is not None, "the ledger sends only while connected"
        paho_hooks.ack_many(client, [message.mid for message in messages])

    def holds(self, message: Inbound) -> bool:
        """Whether the pipeline may still take ``message`` (asked after it waited for I/O).

        A QoS 1/2 message only while its connection lasts: once the connection ends, a
        message not yet taken is forgotten and the broker resends it, so taking it late
        would write it without acknowledging it, and take its redelivery as new. QoS 0
        ones always (the daemon's only copy).
        """
        if not message.qos:
            return True
        inbox = self._inbox
        return (
            inbox is not None
            and inbox.generation == message.generation
            and inbox.current is message
        )

    def stop_consuming(self) -> None:
        """Stop taking messages but keep the connection so acks can still go out."""
        self._stop.set()

    def release(self) -> None:
        """Let :meth:`run` disconnect and return (after the last ack)."""
        self._stop.set()
        self._release.set()
        self._lost()  # what hand_over did not give the pipeline

    def _skipped(self, message: Inbound) -> bool | None:
        """Skip a message that came through an old subscription; None: no way to skip.

        Taken without its readings and acknowledged in turn, counted by reason.
        """
        if self._skip is None:
            return None
        taken = self._skip(message)
        if taken:
            self._metrics.messages_skipped.labels(SKIPPED[type(message)]).inc()
        return taken

    async def hand_over(self, sink: Callable[[Inbound], Awaitable[bool]]) -> None:
        """After :meth:`stop_consuming`: give ``sink`` the QoS 0 messages read and not taken.

        The broker does not send them again, so they are taken (and written with the rest
        of the drain) rather than lost; QoS 1 ones are left to the broker. Waits until the
        source has stopped taking. What is left when this is cancelled (the shutdown
        timeout) is counted as lost by :meth:`release`.
        """
        await self._handover_ready.wait()
        handover = self._handover
        while handover:
            message = handover[0]
            taken = self._skipped(message) if type(message) is not Inbound else None
            if not (await sink(message) if taken is None else taken):
                return
            handover.popleft()

    def _stopped_taking(self) -> None:
        """Taking has stopped: the QoS 0 messages carried so far go to :meth:`hand_over`."""
        self._handover.extend(self._carried)
        self._carried = []
        self._handover_ready.set()

    async def run(
        self,
        sink: Callable[[Inbound], Awaitable[bool]],
        take_now: TakeNow = _not_now,
        skip: Skip | None = None,
    ) -> None:
        """Connect, consume into ``sink`` and reconnect until stopped.

        ``take_now``, if given, is tried first for each message: it takes the message
        at once and says whether it did, or returns None for ``sink`` to take it (and
        wait as needed): one coroutine less per message. ``skip``, if given, takes the
        messages that came through a subscription not made today (their readings are
        not wanted: acknowledged in turn, never stored); without it they go to ``sink``.

        A first connection that no retry can fix (credentials, client id, authorisation,
        a certificate that does not verify) stops the daemon with :class:`StartupError`; a
        broker not reachable yet is waited for, and said so at once.
        """
        self._skip = skip
        try:
            await self._run(sink, take_now)
        except BaseException:
            self._lost()  # cancelled (a stop past its timeout) or failed
            raise
        if self._release.is_set():
            self._lost()  # read during the drain; else the drain has yet to take them

    async def _run(self, sink: Callable[[Inbound], Awaitable[bool]], take_now: TakeNow) -> None:
        attempt, connected_once = 0, False
        self._health.mqtt_started = True
        address = f"{self._settings.mqtt.host}:{self._settings.mqtt.port}"
        # Before the first connection: a resumed session's backlog arrives at once, ahead
        # of the SUBACK, and what the old filters queued is told apart with their record.
        self._early = await self._recall(self._wanted_filters())
        self._recall_next = self._early is not None  # failed: on the next connection
        while not self._stop.is_set():
            try:
                client = self._new_client()
                inbox = self._receiver(client)
                async with client:
                    attempt, connected_once = 0, True
                    self._connected(client)
                    await self._consume_until_stopped(client, inbox, sink, take_now)
            except aiomqtt.MqttError as exc:
                attempt += 1
                delay = backoff(attempt, base=0.5)
                fatal = None if connected_once else self._fatal(exc, address)
                if fatal is not None:
                    raise fatal from None
                if connected_once:
                    logger.warning(
                        "MQTT connection to %s lost (%s)%s; retrying in %.1fs",
                        address,
                        exc,
                        _lost_hint(exc, self._settings.client_id),
                        delay,
                    )
                elif attempt == 1:
                    logger.warning(
                        "cannot reach the MQTT broker at %s (%s): waiting for it, "
                        "retrying with backoff; check --mqtt-url if it does not "
                        "come up",
                        address,
                        exc,
                    )
                else:
                    logger.info(
                        "MQTT broker at %s still not reachable (%s); retrying in %.1fs",
                        address,
                        exc,
                        delay,
                    )
                self._metrics.mqtt_reconnects.inc()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
            finally:
                self._disconnected()
        self._stopped_taking()  # when stopped between connections (else done already)

    def count_lost(self, count: int) -> None:
        """Count QoS 0 messages lost elsewhere (taken by the pipeline, never written)."""
        self._metrics.messages_lost.inc(count)

    def _lost(self) -> None:
        """Count and log the QoS 0 messages read and never taken: stopping loses them."""
        lost = len(self._carried) + len(self._handover)
        self._carried = []
        self._handover.clear()
        if lost:
            self.count_lost(lost)
            logger.warning(
                "stopping with %d QoS 0 messages read from the broker and not "
                "taken by the pipeline: they are lost (the broker does not send "
                "QoS 0 again); counted in ingest_messages_lost_total",
                lost,
            )

    def _fatal(self, exc: aiomqtt.MqttError, address: str) -> StartupError | None:
        """A first connection failure no retry can fix, as one line; None otherwise."""
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            ca = self._settings.mqtt.ca_file or "the system's CAs"
            return StartupError(
                f"--mqtt-ca-file: the broker at {address} presented a certificate that does "
                f"not verify against {ca} ({exc}); give the CA that signed it, and the host "
                "name the certificate names in --mqtt-url"
            )
        if _refused_for_good(exc):
            return StartupError(
                f"--mqtt-url: the broker at {address} refused the connection ({exc}); check "
                "the user and password (--mqtt-url, --mqtt-password-file), the broker's ACL "
                "and --client-id"
            )
        return None

    def _receiver(self, client: aiomqtt.Client) -> _inbox_py.Inbox:
        """Route this connection's messages into a fresh inbox (see paho_hooks)."""
        if self._inbox is not None:
            self._close(self._inbox)  # the previous connection's (usually closed already)
        generation = self._generation + 1  # the number _connected() gives this connection
        inbox = self._inbox = _Inbox(self._settings, self._metrics, self._health, generation)
        inbox.seed(self._carried)  # before anything new: the order they were read in
        self._carried = []
        deliver = _Receiver(inbox, self._ledger.arrived, self._subscriptions).deliver

        def on_session(present: bool, identifiers: bool) -> None:
            inbox.identified = identifiers
            self._resumed = present if self._resumed is None else self._resumed
            # Without the old session no redelivery will come: earlier entries can never
            # be acknowledged (their readings are still written, at least once).
            if not present:
                self._ledger.new_session(generation)

        def on_lost() -> None:
            if self._client is client:
                self._disconnected()  # acks from now on wait for the next connection

        inbox.reader = paho_hooks.install(client, deliver, on_session, on_lost)
        return inbox

    def _connected(self, client: aiomqtt.Client) -> None:
        self._generation += 1
        self._client = client
        self._ledger.connected(self._generation)

    async def _subscribe(self, client: aiomqtt.Client, inbox: _inbox_py.Inbox) -> None:
        wanted = self._settings.qos
        subscriptions = self._wanted_filters()
        remembered = await self._remembered(subscriptions)  # None: nothing to record now
        # Also unsubscribed: the other form (plain or shared) a session of another
        # --workers count may hold (ingest/pipeline/workers.py), and the filters an earlier
        # run of this client id subscribed that are not wanted now. "No subscription
        # existed" (0x11) is the usual answer. Only for a session that existed before this
        # process: a new one holds nothing else.
        if self._settings.drain_only:
            unsubscribe = self._settings.subscriptions
        else:
            unsubscribe = self._settings.other_subscriptions if self._resumed else ()
        unsubscribe = tuple(dict.fromkeys((*unsubscribe, *(remembered or ()))))
        together, self._together = self._together, None
        if together is not None:
            await _meet(together)
        # Sent at once, today's filters first: the broker takes a connection's requests in
        # order, so a message published before it takes the unsubscription comes through
        # both filters only if the broker takes it between the two requests (readings
        # without a time of their own would be stored twice), never through neither.
        # Waiting for the SUBACK first would leave that window open for as long as the
        # SUBACK sits behind the backlog the session sends ahead of it. After a refusal
        # (this process's), the SUBACK is waited for: a broker refusing again must not
        # take the old filters away, even for a moment, at every attempt.
        subscribing = [
            (topic, asyncio.ensure_future(self._subscribe_one(client, inbox, topic)))
            for topic in subscriptions
        ]
        at_once = not self._refused
        unsubscribing = _unsubscribing(client, unsubscribe) if at_once else []
        try:
            for topic, request in subscribing:
                granted = await _answered(request, inbox, f"subscribing {topic!r}")
                codes = [code if isinstance(code, int) else code.value for code in granted]
                if any(code != wanted for code in codes):
                    # 0x80 and above: refused (e.g. ACL); a lower QoS would silently turn
                    # the ack-after-write guarantee into at-most-once.
                    self._refused = True
                    await self._keep(client, inbox, unsubscribing, subscriptions)
                    raise aiomqtt.MqttError(
                        f"broker answered {codes} to subscribing {topic!r} at QoS {wanted}"
                    )
            if not at_once:
                unsubscribing = _unsubscribing(client, unsubscribe)
            for topic, answer in unsubscribing:
                await _answered(answer, inbox, f"unsubscribing {topic!r}")
        finally:
            _forget([*subscribing, *unsubscribing])
        if remembered:
            logger.info(
                "unsubscribed from %s: subscribed by an earlier run of client id %s "
                "and not wanted now",
                ", ".join(remembered),
                self._settings.client_id,
            )
        if remembered is not None:
            # What the session holds from now on (a retired worker's: nothing), and the
            # filters unsubscribed now or lately, whose messages may still be resent.
            now = time.time()
            self._retired |= dict.fromkeys(remembered, now)
            self._recalled = await self._record_filters(list(subscriptions), self._retired)
        self._health.mqtt_connected = True
        self._metrics.mqtt_connected.set(1)
        logger.info(
            "connected to %s:%d as %s; subscribed to %s",
            self._settings.mqtt.host,
            self._settings.mqtt.port,
            self._settings.client_id,
            ", ".join(subscriptions) or "nothing (draining)",
        )

    def _subscribe_one(
        self, client: aiomqtt.Client, inbox: _inbox_py.Inbox, topic: str
    ) -> Awaitable[Any]:
        """The SUBSCRIBE of one filter, sent now; its answer, the granted codes, later."""
        # Retained messages only when the subscription is new, not again on every
        # reconnect of the persistent session. Retain As Published off: the RETAIN flag
        # then marks exactly the retained messages sent because of a subscription (old
        # state; --retained says what to do with them), never a live publish.
        options = SubscribeOptions(
            qos=self._settings.qos,
            retainAsPublished=False,
            retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB,
        )
        props = None
        if inbox.identified:  # every message it brings carries the filter's identifier
            props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
            props.SubscriptionIdentifier = identifier(topic)
        return client.subscribe(topic, options=options, properties=props, timeout=math.inf)

    async def _keep(
        self,
        client: aiomqtt.Client,
        inbox: _inbox_py.Inbox,
        unsubscribing: Sequence[tuple[str, Awaitable[Any]]],
        subscriptions: tuple[str, ...],
    ) -> None:
        """Today's filter was refused: subscribe again what was unsubscribed with it.

        So the session goes on queueing what the old filters bring until a start that
        works (lost: only what the broker took between the unsubscription and this).
        """
        kept = [topic for topic, _ in unsubscribing if topic not in subscriptions]
        try:
            for topic, request in unsubscribing:
                await _answered(request, inbox, f"unsubscribing {topic!r}")
            for topic in kept:
                await _answered(
                    self._subscribe_one(client, inbox, topic), inbox, f"subscribing {topic!r}"
                )
        except aiomqtt.MqttError as exc:
            logger.warning("could not subscribe again to %s: %s", ", ".join(kept), exc)

    async def _remembered(self, subscriptions: tuple[str, ...]) -> tuple[str, ...] | None:
        """The remembered filters to unsubscribe on this connection (see :meth:`_recall`)."""
        early, self._early = self._early, None
        if early is not None:  # recalled before connecting (see _run)
            return early
        if not self._recall_next:  # it failed just before this first connection
            self._recall_next = True
            return None
        return await self._recall(subscriptions)

    def _wanted_filters(self) -> tuple[str, ...]:
        """Today's filters (a retired worker being drained: none)."""
        return () if self._settings.drain_only else self._settings.subscriptions

    async def _recall(self, subscriptions: tuple[str, ...]) -> tuple[str, ...] | None:
        """The filters an earlier run of this client id subscribed that are not wanted now.

        Once a process (on its first connection; again on the next if MongoDB failed).
        Before subscribing, the remembered filters and today's are recorded together: a
        stop between the subscriptions and the record after them still leaves every
        filter the session may hold known to the next start. None when there is no
        record to keep, or it could not be read or written (nothing is recorded then:
        the old filters stay recorded for the next start).
        """
        if self._memory is None or self._recalled:
            return None
        try:
            recalled = await asyncio.wait_for(self._memory.recall(), MEMORY_TIMEOUT)
        except (IngestError, TimeoutError) as exc:
            self._forgetful(exc)
            return None
        before = None if recalled is None else recalled.filters
        old = tuple(topic for topic in before or () if topic not in subscriptions)
        # Unsubscribed by an earlier start: what they queued may still be resent (their
        # identifiers), unless a crash lost nothing; a filter wanted again is today's.
        self._retired = {
            topic: at
            for topic, at in (recalled.retired if recalled is not None else {}).items()
            if topic not in subscriptions and topic not in old
        }
        if (before is None or set(before) != set(subscriptions)) and not (
            await self._record_filters([*subscriptions, *old], self._retired)
        ):
            return None
        # What they queued before today's filters existed arrives from now on.
        self._subscriptions.retire((*old, *self._retired))
        return old

    async def _record_filters(self, filters: list[str], retired: dict[str, float]) -> bool:
        """Record what the session may hold; False (logged) if MongoDB failed."""
        assert self._memory is not None
        try:
            await asyncio.wait_for(self._memory.record(filters, retired), MEMORY_TIMEOUT)
        except (IngestError, TimeoutError) as exc:
            self._forgetful(exc)
            return False
        return True

    def _forgetful(self, exc: BaseException) -> None:
        logger.warning(
            "cannot read or record the filters client id %s subscribed (%s): "
            "subscriptions of an earlier run that are not wanted now stay at the "
            "broker until the next start; what comes through them is skipped, "
            "counted in ingest_messages_skipped_total",
            self._settings.client_id,
            exc or type(exc).__name__,
        )

    def _disconnected(self) -> None:
        self._client = None
        self._ledger.disconnected()
        self._health.mqtt_connected = False
        self._metrics.mqtt_connected.set(0)

    async def _consume_until_stopped(
        self,
        client: aiomqtt.Client,
        inbox: _inbox_py.Inbox,
        sink: Callable[[Inbound], Awaitable[bool]],
        take_now: TakeNow,
    ) -> None:
        # Consuming starts before the subscription is confirmed: a resumed session's
        # backlog arrives ahead of the SUBACK and can be more than the inbox holds, so the
        # inbox must drain (and reading resume) for the SUBACK to be read at all, however
        # long the pipeline takes (a MongoDB outage): the SUBACK's timeout counts only the
        # time spent reading (see _answered), next to the watch for a lost connection.
        consume = asyncio.create_task(self._consume(inbox, sink, take_now), name="mqtt-consume")
        # Our receive path bypasses aiomqtt's queue, so its iterator only ever ends by
        # raising MqttError when the connection drops: a public way to watch for that.
        watch = asyncio.create_task(_until_disconnected(client), name="mqtt-watch")
        stop: asyncio.Task[Any] = asyncio.create_task(self._stop.wait(), name="mqtt-stop")
        subscribed = asyncio.create_task(self._subscribe(client, inbox), name="mqtt-subscribe")
        try:
            waiting = {consume, watch, stop, subscribed}
            while True:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if subscribed in done:
                    subscribed.result()  # a refused subscription raises: a failed connection
                if done - {subscribed}:
                    break
            for task in (watch, consume):
                if task.done():
                    task.result()  # re-raise the disconnect or a failure
                    return
            consume.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consume
            self._close(inbox)  # what it had read: QoS 1 left to the broker, QoS 0 carried
            self._stopped_taking()
            logger.info("stopped consuming; waiting for in-flight batches before disconnect")
            await self._release.wait()
        finally:
            if self._client is client:
                self._disconnected()
            self._close(inbox)
            for task in (consume, watch, stop, subscribed):
                if task.done() and not task.cancelled():
                    task.exception()  # seen: a drop during the drain is handled by on_lost
                task.cancel()

    def _close(self, inbox: _inbox_py.Inbox) -> None:
        """End a connection's inbox: the messages the pipeline never took.

        They are left in the inbox, or were cut off while waiting for buffer space
        (``current``). QoS 1 ones are forgotten: the broker redelivers them. QoS 0 ones
        are the daemon's only copy: they are carried over to the next connection's inbox.
        Called when the connection ends and again (doing nothing more) when the next one
        begins.
        """
        for message in inbox.close():
            if message.qos:
                self._ledger.forget(message)
            else:
                self._carried.append(message)

    async def _consume(
        self,
        inbox: _inbox_py.Inbox,
        sink: Callable[[Inbound], Awaitable[bool]],
        take_now: TakeNow = _not_now,
    ) -> None:
        messages, wake, drain, usual = inbox.messages, inbox.wake, inbox.drain, Inbound
        while True:
            count = 0
            while messages:
                # The messages take_now takes, up to YIELD_EVERY, in one call; then the one
                # it left (now the inbox's current), if any.
                message = drain(take_now, YIELD_EVERY)
                if message is None:
                    if messages:
                        await asyncio.sleep(0)  # let the writers and the acker run
                    continue
                # (not usual: a message through an old subscription)
                taken = take_now(message) if type(message) is usual else self._skipped(message)
                if taken is None:
                    taken = await sink(message)
                if not taken:
                    if message.qos:
                        self._ledger.forget(message)
                    else:  # refused while stopping: counted as lost when run() ends
                        self._carried.append(message)
                inbox.current = None
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            wake.clear()
            await wake.wait()


# CONNACK reason codes that no retry can fix: bad protocol, client id, credentials,
# authorisation, banned, authentication method (MQTT 5; MQTT 3.1.1 uses 1, 2, 4, 5).
_REFUSED_FOR_GOOD = frozenset({1, 2, 4, 5, 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C})


def _refused_for_good(exc: aiomqtt.MqttError) -> bool:
    if not isinstance(exc, MqttConnectError) or exc.rc is None:
        return False
    code = exc.rc if isinstance(exc.rc, int) else exc.rc.value
    return code in _REFUSED_FOR_GOOD


async def _until_disconnected(client: aiomqtt.Client) -> None:
    try:
        async for _ in client.messages:
            pass
    except aiomqtt.MqttError as exc:
        # aiomqtt's iterator says only "Disconnected during message iteration"; the
        # broker's reason (e.g. 0x8E session taken over) is in the disconnect it recorded.
        disconnected = getattr(client, "_disconnected", None)
        if (
            isinstance(disconnected, asyncio.Future)
            and disconnected.done()
            and not disconnected.cancelled()
            and isinstance(disconnected.exception(), aiomqtt.MqttError)
        ):
            raise disconnected.exception() from exc  # type: ignore[misc]
        raise


def _lost_hint(exc: aiomqtt.MqttError, client_id: str) -> str:
    """What to do about a lost connection, when its reason says."""
    code = getattr(exc, "rc", None)
    if getattr(code, "value", code) == _SESSION_TAKEN_OVER:
        return (
            f"; another client connected with client id {client_id}: give each "
            "daemon its own --client-id (or --shared-group to split the topics)"
        )
    return ""


_SESSION_TAKEN_OVER = 0x8E


def _unsubscribing(
    client: aiomqtt.Client, topics: tuple[str, ...]
) -> list[tuple[str, asyncio.Future[Any]]]:
    """The UNSUBSCRIBE of each of ``topics``, sent now (in order); their answers later."""
    return [
        (topic, asyncio.ensure_future(client.unsubscribe(topic, timeout=math.inf)))
        for topic in topics
    ]


def _forget(requests: list[tuple[str, asyncio.Future[Any]]]) -> None:
    """Cancel the requests still unanswered.

    An answer no one awaited (the connection's loss, raised by the one awaited first) is
    taken, so that asyncio does not log it as never retrieved.
    """
    for _, request in requests:
        if request.done() and not request.cancelled():
            request.exception()
        request.cancel()


def _take_together() -> Any:  # noqa: ANN401 - a multiprocessing Barrier, or None
    """The barrier of :func:`start_together`, for the one source that waits at it."""
    global _together
    barrier, _together = _together, None
    return barrier


async def _meet(barrier: Any) -> None:  # noqa: ANN401 - a multiprocessing Barrier
    """Wait (reading meanwhile) until every worker is here, or TOGETHER_TIMEOUT s."""
    try:
        await asyncio.to_thread(_wait_at, barrier)
    except asyncio.CancelledError:
        barrier.abort()  # releases the thread, and the other workers
        raise


def _wait_at(barrier: Any) -> None:  # noqa: ANN401 - a multiprocessing Barrier
    try:
        barrier.wait(TOGETHER_TIMEOUT)
    except threading.BrokenBarrierError:
        logger.info(
            "subscribing without waiting for the other workers any longer (%.0f s)",
            TOGETHER_TIMEOUT,
        )


async def _answered[T](request: Awaitable[T], inbox: _inbox_py.Inbox, what: str) -> T:
    """The broker's answer to ``request``, or MqttError after ANSWER_TIMEOUT s of reading.

    The answer may sit behind a backlog the paused reader has not read yet (a resumed
    session's messages arrive ahead of the SUBACK), so time paused does not count; a
    broker that does not answer while we read gets the connection made again.
    """
    task = asyncio.ensure_future(request)
    waited = 0.0
    try:
        while True:
            start = time.monotonic()
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if done:
                return task.result()
            if not inbox.paused:
                waited += time.monotonic() - start
            if waited >= ANSWER_TIMEOUT:
                raise aiomqtt.MqttError(
                    f"{what}: no answer from the broker in "
                    f"{ANSWER_TIMEOUT:.0f} s of reading (timed out)"
                )
    finally:
        task.cancel()
