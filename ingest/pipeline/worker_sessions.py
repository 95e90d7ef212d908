"""Sessions of another worker count: found at start, drained through the pipeline, ended.

Worker k of ``--workers N`` (k > 0) has the client id ``<client-id>-w<k>`` and a
persistent session. When the daemon starts with fewer workers, the sessions of the
workers that no longer exist still hold the messages the group handed them, and, still
members of the group, would go on receiving a share of the new ones: worker 0 (or the
single daemon) resumes each one without subscribing, unsubscribes the group, takes its
messages (written, then acknowledged), and ends the session.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client.parser import text_string_to_metric_families

from ingest.config import MAX_WORKERS
from ingest.mqtt import client_lock, paho_hooks
from ingest.mqtt.source import SESSION_EXPIRY
from ingest.pipeline import app
from ingest.pipeline.workers_endpoint import ask, listen

if TYPE_CHECKING:
    from ingest.config import Settings

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = 5.0
IDLE_SECONDS = 2.0  # a retired session with nothing new for this long has been drained
# A retired session still busy after this long holds a subscription we do not know of
# (a changed --shared-group): it is left alone rather than keeping the daemon from starting.
DRAIN_MAX_SECONDS = 60.0
POLL_SECONDS = 0.5


def worker_client_id(client_id: str, index: int) -> str:
    """Worker 0 keeps the configured client id; worker k is ``<client-id>-w<k>``."""
    return client_id if index == 0 else f"{client_id}-w{index}"


def deadline(settings: Settings) -> float:
    """The watchdog's deadline after a signal, as the single daemon's."""
    return settings.shutdown_timeout + app.DISCONNECT_TIMEOUT + app.WATCHDOG_SLACK


async def retire_sessions(settings: Settings, shutdown: app.Shutdown) -> None:
    """Drain and end the sessions of workers ``settings.workers`` and up, while they exist.

    Worker ids are contiguous, so the first one without a session ends the search, as
    does one that a running daemon on this host uses (ingest/mqtt/client_lock.py). A broker that
    cannot be reached is left to the daemon's own connection to report.
    """
    for index in range(settings.workers, MAX_WORKERS):
        client_id = worker_client_id(settings.client_id, index)
        try:
            # A session a live process on this host uses is not a retired one: even a
            # probe would take it over.
            held = client_lock.claim(settings, client_id)
        except client_lock.SessionInUseError as exc:
            logger.info(
                "not looking for retired sessions from %s on: a running daemon (pid %s) uses it",
                client_id,
                exc.pid or "unknown",
            )
            return
        try:
            if not await _retire(settings, client_id, shutdown):
                return
        finally:
            if held is not None:
                held.close()


async def _retire(settings: Settings, client_id: str, shutdown: app.Shutdown) -> bool:
    """Drain and end one retired worker's session; False once there is nothing more."""
    try:
        if not await session_exists(settings, client_id):
            return False
    except (aiomqtt.MqttError, OSError) as exc:
        logger.debug("not looking for retired sessions: %s", exc)
        return False
    if shutdown.requested.is_set():
        return False
    logger.info(
        "taking the messages queued for %s (a worker of an earlier run with "
        "more workers), then ending its session",
        client_id,
    )
    return await drain_session(settings, client_id, shutdown)


def _client(settings: Settings, client_id: str, clean_start: bool, expiry: int) -> aiomqtt.Client:
    mqtt = settings.mqtt
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = expiry
    props.ReceiveMaximum = 1  # a probe takes as little as it can; nothing is acknowledged
    return aiomqtt.Client(
        mqtt.host,
        mqtt.port,
        username=mqtt.username,
        password=mqtt.password,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=clean_start,
        properties=props,
        tls_context=mqtt.ssl_context(),
        timeout=PROBE_TIMEOUT,
        logger=logging.getLogger("ingest.mqtt.client"),
    )


async def session_exists(settings: Settings, client_id: str) -> bool:
    """Whether the broker holds a session for ``client_id``; leaves none if it did not."""
    client = _client(settings, client_id, clean_start=False, expiry=SESSION_EXPIRY)
    present: list[bool] = []
    paho_hooks.install(
        client, lambda *_: None, lambda found, _ids: present.append(found), lambda: None
    )
    async with client:
        pass
    if present and present[0]:
        return True  # what it sent without an ack is sent again on the next connection
    await end_session(settings, client_id)  # the probe created one: remove it
    return False


async def end_session(settings: Settings, client_id: str) -> None:
    """Discard the broker's session of ``client_id`` (Clean Start, then expiry 0)."""
    async with _client(settings, client_id, clean_start=True, expiry=0):
        pass


async def drain_session(settings: Settings, client_id: str, outer: app.Shutdown) -> bool:
    """Take the messages queued in a retired worker's session, then end it.

    True when drained and ended; False when a signal came first (the session is kept,
    with what is left in it, for the next start).
    """
    drain = replace(
        settings,
        client_id=client_id,
        drain_only=True,
        workers=1,
        shared_group=settings.shared_group or settings.derived_group,
        metrics_host="127.0.0.1",
        metrics_port=0,
        metrics_tokens=(),
        metrics_tls_cert=None,
        metrics_tls_key=None,
    )
    sock = listen("127.0.0.1", 0)
    port = int(sock.getsockname()[1])
    # No watchdog of its own: it would end the whole process once the drain is over (the
    # daemon's own Shutdown guards the process).
    inner = app.Shutdown(None)
    run = asyncio.create_task(app.run(drain, inner, metrics_sock=sock), name="drain-session")
    idle = asyncio.create_task(_until_idle(port), name="drain-idle")
    stop = asyncio.create_task(outer.requested.wait(), name="drain-stop")
    forced = asyncio.create_task(outer.forced.wait(), name="drain-forced")
    try:
        await asyncio.wait(
            {run, idle, stop}, timeout=DRAIN_MAX_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        drained = idle.done()
        if not (drained or run.done() or stop.done()):
            logger.warning(
                "session %s still receives messages after %.0f s: it holds a "
                "subscription other than %s (was --shared-group changed?); "
                "leaving it (its new messages wait there for a daemon that uses "
                "its subscription, or until it expires)",
                client_id,
                DRAIN_MAX_SECONDS,
                ", ".join(drain.subscriptions),
            )
            inner.requested.set()
        elif drained:
            logger.info(
                "nothing new for %s for %.0f s: stopping its drain", client_id, IDLE_SECONDS
            )
            inner.requested.set()  # as a signal would, without saying there was one
        elif not run.done():
            inner.signal()
            await asyncio.wait({run, forced}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                inner.signal()
        await run
    finally:
        for task in (idle, stop, forced):
            task.cancel()
    if not drained:
        return False
    await end_session(settings, client_id)
    logger.info("session %s drained and ended", client_id)
    return True


async def _until_idle(port: int) -> None:
    """Return once connected, all received acknowledged and nothing new for IDLE_SECONDS."""
    last: tuple[float, float] | None = None
    quiet = 0.0
    while quiet < IDLE_SECONDS:
        await asyncio.sleep(POLL_SECONDS)
        status, text = await ask(port, "/metrics")
        values = _values(text) if status == 200 else {}
        now = (
            values.get("ingest_messages_received_total", -1.0),
            values.get("ingest_messages_acked_total", -2.0),
        )
        steady = values.get("ingest_mqtt_connected") == 1 and now[0] == now[1] and now == last
        quiet = quiet + POLL_SECONDS if steady else 0.0
        last = now


def _values(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }
