"""Several consumer processes (``--workers N``): one shared subscription group, one endpoint.

The parent validates the settings, binds the public metrics port, forks N workers and
then only supervises: it passes SIGTERM/SIGINT on (as SIGUSR1), serves /metrics,
/healthz and /readyz by asking each worker on its private port (127.0.0.1) and merging
the answers, and exits when they have all exited. Each worker is the daemon of
``ingest run --workers 1`` with:

* client id: worker 0 keeps ``--client-id`` (and so the session, with the messages the
  broker queued for it, of a daemon that ran with one worker); worker k uses
  ``<client-id>-w<k>``;
* shared group: ``--shared-group``, or the client id (characters other than letters,
  digits, ``_`` and ``-`` replaced by ``-``) when it is not given.

Sessions outlive a change of the worker count, so two things are cleaned up at start
(also with one worker, where nothing else of this module runs):

* the session of ``--client-id`` may hold the other form of each filter (plain or shared):
  the source unsubscribes it after subscribing (``Settings.other_subscriptions``);
* the sessions of workers that no longer exist (``<client-id>-w<k>`` for k >= N) hold
  the messages the broker queued for them, and as members of the group they would go on
  receiving a share of the new ones: :func:`retire_sessions` resumes each one, takes its
  messages through the normal pipeline (written, then acknowledged), and ends it.

A worker that exits unexpectedly stops the others gracefully and the parent exits with
status 1: the process supervisor (systemd, Docker, Kubernetes) restarts the whole daemon,
whose sessions then resume. A start-up error of a worker is reported by the parent as one
line, with the status a single daemon would exit with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import signal
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from ingest import app, paho_hooks
from ingest.config import MAX_WORKERS
from ingest.errors import ConfigError, IncompatibleError, SchemaError, StartupError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from multiprocessing.connection import Connection
    from types import TracebackType

    from ingest.config import Settings

logger = logging.getLogger(__name__)

# auto stops here: past a few workers one mosquitto (single-threaded) is the limit, and
# each worker holds its own buffers (--max-buffered-bytes each). See docs/scaling.md.
AUTO_MAX = 8
SESSION_EXPIRY = 7 * 86400  # as MqttSource's
PROBE_TIMEOUT = 5.0
# A worker's answer to the parent's /metrics, /healthz, /readyz: well inside the usual
# scrape and probe timeouts (10 s and 5 s), so the parent still answers when one is stuck.
ASK_TIMEOUT = 2.0
IDLE_SECONDS = 2.0  # a retired session with nothing new for this long has been drained
# A retired session still busy after this long holds a subscription we do not know of
# (a changed --shared-group): it is left alone rather than keeping the daemon from starting.
DRAIN_MAX_SECONDS = 60.0
POLL_SECONDS = 0.5
PARENT_POLL_SECONDS = 1.0
DRAIN = signal.SIGUSR1  # parent to worker: drain and stop; a second one forces
# Gauges of the workers merged by another rule than the sum (a counter or a histogram is
# always summed): 1 only while every worker is connected or up; info is the same in all.
GAUGE_RULES: dict[str, Callable[[Iterable[float]], float]] = {
    "ingest_mqtt_connected": min,
    "ingest_mongodb_up": min,
    "ingest_info": max,
}
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (ConfigError, StartupError, SchemaError, IncompatibleError)}


def auto_workers() -> int:
    """The CPUs this process may use (affinity and cgroup quota), at most AUTO_MAX."""
    cpus = os.process_cpu_count() or 1
    quota = cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, quota)
    return max(1, min(cpus, AUTO_MAX))


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The CPU quota of this cgroup (v2 ``cpu.max``, else v1 CFS), rounded up; None: none."""
    try:
        quota, period = (root / "cpu.max").read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text(encoding="ascii").strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text(encoding="ascii").strip()
        except OSError:
            return None
    if quota in {"max", "-1"}:
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def worker_settings(settings: Settings, index: int) -> Settings:
    """The settings of worker ``index``: its client id, the group, a private metrics port."""
    return replace(settings, client_id=worker_client_id(settings.client_id, index),
                   shared_group=settings.shared_group or settings.derived_group,
                   metrics_host="127.0.0.1", metrics_port=0)


def worker_client_id(client_id: str, index: int) -> str:
    """Worker 0 keeps the configured client id; worker k is ``<client-id>-w<k>``."""
    return client_id if index == 0 else f"{client_id}-w{index}"


# --- one worker (also the whole daemon with --workers 1) ---

async def run_one(settings: Settings, shutdown: app.Shutdown | None = None,
                  metrics_sock: socket.socket | None = None, retire: bool = True) -> None:
    """Retire the sessions of workers beyond ``settings.workers``, then run the daemon."""
    if shutdown is None:
        shutdown = app.Shutdown(_deadline(settings))
        app.install_signal_handlers(shutdown)
    if retire:
        await retire_sessions(settings, shutdown)
    await app.run(settings, shutdown, metrics_sock=metrics_sock)


def _deadline(settings: Settings) -> float:
    return settings.shutdown_timeout + app.DISCONNECT_TIMEOUT + app.WATCHDOG_SLACK


async def retire_sessions(settings: Settings, shutdown: app.Shutdown) -> None:
    """Drain and end the sessions of workers ``settings.workers`` and up, while they exist.

    Worker ids are contiguous, so the first one without a session ends the search. A
    broker that cannot be reached is left to the daemon's own connection to report.
    """
    for index in range(settings.workers, MAX_WORKERS):
        client_id = worker_client_id(settings.client_id, index)
        try:
            if not await session_exists(settings, client_id):
                return
        except (aiomqtt.MqttError, OSError) as exc:
            logger.debug("not looking for retired sessions: %s", exc)
            return
        if shutdown.requested.is_set():
            return
        logger.info("taking the messages queued for %s (a worker of an earlier run with "
                    "more workers), then ending its session", client_id)
        if not await drain_session(settings, client_id, shutdown):
            return


def _client(settings: Settings, client_id: str, clean_start: bool,
            expiry: int) -> aiomqtt.Client:
    mqtt = settings.mqtt
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = expiry
    props.ReceiveMaximum = 1  # a probe takes as little as it can; nothing is acknowledged
    return aiomqtt.Client(mqtt.host, mqtt.port, username=mqtt.username,
                          password=mqtt.password, identifier=client_id,
                          protocol=aiomqtt.ProtocolVersion.V5, clean_start=clean_start,
                          properties=props, tls_context=mqtt.ssl_context(),
                          timeout=PROBE_TIMEOUT, logger=logging.getLogger("ingest.mqtt"))


async def session_exists(settings: Settings, client_id: str) -> bool:
    """Whether the broker holds a session for ``client_id``; leaves none if it did not."""
    client = _client(settings, client_id, clean_start=False, expiry=SESSION_EXPIRY)
    present: list[bool] = []
    paho_hooks.install(client, lambda *_: None, present.append, lambda: None)
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
    drain = replace(settings, client_id=client_id, drain_only=True, workers=1,
                    shared_group=settings.shared_group or settings.derived_group,
                    metrics_host="127.0.0.1", metrics_port=0)
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
        await asyncio.wait({run, idle, stop}, timeout=DRAIN_MAX_SECONDS,
                           return_when=asyncio.FIRST_COMPLETED)
        drained = idle.done()
        if not (drained or run.done() or stop.done()):
            logger.warning("session %s still receives messages after %.0f s: it holds a "
                           "subscription other than %s (was --shared-group changed?); "
                           "leaving it (its new messages wait there for a daemon that uses "
                           "its subscription, or until it expires)", client_id,
                           DRAIN_MAX_SECONDS, ", ".join(drain.subscriptions))
            inner.requested.set()
        elif drained:
            logger.info("nothing new for %s for %.0f s: stopping its drain", client_id,
                        IDLE_SECONDS)
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
        now = (values.get("ingest_messages_received_total", -1.0),
               values.get("ingest_messages_acked_total", -2.0))
        steady = values.get("ingest_mqtt_connected") == 1 and now[0] == now[1] and now == last
        quiet = quiet + POLL_SECONDS if steady else 0.0
        last = now


def _values(text: str) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket, for a server that starts later (or in another process)."""
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise StartupError(
            f"--metrics-port: cannot listen on {host}:{port} ({reason}): another process "
            "uses it (the other mode's daemon?); choose a free --metrics-port (0: any) or "
            "--metrics-host") from None
    sock.setblocking(False)  # noqa: FBT003
    return sock


async def ask(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from a worker's private endpoint: (status, body); (0, why) if no answer."""
    try:
        async with asyncio.timeout(ASK_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nHost: worker\r\n\r\n".encode())
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
    except TimeoutError:
        return 0, "no answer"
    except OSError as exc:
        return 0, f"no answer ({exc.strerror or exc})"
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return int(head.split(b" ", 2)[1]), body.decode()
    except (IndexError, ValueError):
        return 0, "no answer (malformed reply)"


# --- the parent ---

@dataclass(slots=True)
class Worker:
    """A worker process as the parent sees it."""

    index: int
    process: multiprocessing.process.BaseProcess
    port: int
    report: Connection
    metrics: str = ""  # the last /metrics text it answered


def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` workers until a signal; the exit status of the daemon."""
    public = listen(settings.metrics_host, settings.metrics_port)
    socks = [listen("127.0.0.1", 0) for _ in range(settings.workers)]
    context = multiprocessing.get_context("fork")  # the workers share the parsed settings
    workers = []
    for index, sock in enumerate(socks):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_worker_main, name=f"ingest-worker-{index}",
            args=(worker_settings(settings, index), index, sock, send, [public, *socks]),
            daemon=False)
        process.start()
        send.close()
        workers.append(Worker(index, process, int(sock.getsockname()[1]), receive))
    for sock in socks:
        sock.close()
    import uvloop  # noqa: PLC0415 - as in the CLI

    return uvloop.run(_supervise(settings, workers, public))


async def _supervise(settings: Settings, workers: list[Worker], public: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    exited: asyncio.Queue[Worker] = asyncio.Queue()
    state = _Stopping(workers)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, state.signal)
    for worker in workers:
        loop.add_reader(worker.process.sentinel, _on_exit, loop, exited, worker)
    logger.info("%d workers: client ids %s; shared group %s", len(workers),
                ", ".join(worker_client_id(settings.client_id, w.index) for w in workers),
                settings.shared_group or settings.derived_group)
    async with AggregateServer(public, workers):
        for _ in workers:
            state.exited(await exited.get())
    if state.error is not None:
        raise state.error
    return 1 if state.failed else 0


class _Stopping:
    """The parent's view of the shutdown: who asked, what failed."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.signals = 0  # signals passed on to the workers
        self.failed = False
        self.error: Exception | None = None  # the first start-up error a worker reported

    def signal(self) -> None:
        """SIGTERM/SIGINT to the parent: the first drains every worker, the next forces."""
        self.signals += 1
        logger.info("signal received: %s every worker",
                    "forcing" if self.signals > 1 else "draining")
        _signal_all(self.workers)

    def exited(self, worker: Worker) -> None:
        """A worker has exited: unasked, it fails the daemon and stops the others."""
        code = worker.process.exitcode or 0
        report = _report(worker)
        self.error = self.error or report
        unasked = self.signals == 0
        if code != 0 or unasked:
            self.failed = True
        if unasked:
            if report is None:  # a start-up error is said once, by the CLI
                logger.error("worker %d exited with status %s; stopping the others",
                             worker.index, _status(code))
            self.signals = 1
            _signal_all(self.workers)


def _on_exit(loop: asyncio.AbstractEventLoop, exited: asyncio.Queue[Worker],
             worker: Worker) -> None:
    loop.remove_reader(worker.process.sentinel)
    worker.process.join()
    exited.put_nowait(worker)


def _signal_all(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.process.exitcode is None and worker.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, DRAIN)


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else str(code)


def _report(worker: Worker) -> Exception | None:
    """The start-up error a worker reported, as the exception the CLI prints in one line."""
    try:
        if not worker.report.poll():
            return None
        kind, message = worker.report.recv()
    except (EOFError, OSError):
        return None
    return _ERRORS.get(kind, StartupError)(message)


def _worker_main(settings: Settings, index: int, sock: socket.socket, report: Connection,
                 inherited: list[socket.socket]) -> None:
    """A worker process: the daemon of one worker; errors go to the parent, not stderr."""
    for other in inherited:
        if other is not sock:
            other.close()
    # Ctrl-C reaches the whole process group, and systemd signals the whole cgroup: a
    # worker takes its signals from the parent only (SIGUSR1: drain, again: force).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    early: list[int] = []  # a SIGUSR1 before the event loop handles it
    signal.signal(signal.SIGUSR1, lambda signum, _frame: early.append(signum))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s %(name)s [worker {index}]: %(message)s"))
    if settings.mapping is not None:  # this process's own copy (forked)
        settings.mapping.spread_arrivals(index, settings.workers)
    import uvloop  # noqa: PLC0415 - as in the CLI

    code = 0
    try:
        uvloop.run(_worker(settings, sock, os.getppid(), early, retire=index == 0))
    except tuple(_ERRORS.values()) as exc:
        report.send((type(exc).__name__, str(exc)))
        code = 2 if isinstance(exc, ConfigError) else 1
    except Exception:
        logger.exception("worker %d failed", index)
        code = 1
    report.close()
    sys.exit(code)


async def _worker(settings: Settings, sock: socket.socket, parent: int, early: list[int],
                  retire: bool) -> None:
    shutdown = app.Shutdown(_deadline(settings))
    asyncio.get_running_loop().add_signal_handler(DRAIN, shutdown.signal)
    for _ in early:
        shutdown.signal()
    orphaned = asyncio.create_task(_until_orphaned(parent, shutdown), name="watch-parent")
    try:
        await run_one(settings, shutdown, sock, retire=retire)
    finally:
        orphaned.cancel()


async def _until_orphaned(parent: int, shutdown: app.Shutdown) -> None:
    """Drain and stop if the parent is gone (killed without a chance to signal us)."""
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says that a parent died
        await asyncio.sleep(PARENT_POLL_SECONDS)
    logger.warning("the parent process is gone: draining and stopping")
    shutdown.signal()


class AggregateServer:
    """The public /metrics, /healthz and /readyz, answered by asking every worker."""

    def __init__(self, sock: socket.socket, workers: list[Worker]) -> None:
        self._sock = sock
        self._workers = workers
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, sock=self._sock)
        host, port = self._sock.getsockname()[:2]
        logger.info("metrics and health of %d workers on http://%s:%d/metrics",
                    len(self._workers), host, port)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].split(b"?", 1)[0] if b" " in request else b""
            status, ctype, body = await self._route(path)
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (status, ctype, len(body), body))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError) as exc:
            logger.debug("metrics request dropped: %s", exc)
        finally:
            writer.close()

    async def _route(self, path: bytes) -> tuple[bytes, bytes, bytes]:
        text = b"text/plain; charset=utf-8"
        if path == b"/metrics":
            answers = await self._ask_all("/metrics")
            for worker, (status, body) in zip(self._workers, answers, strict=True):
                if status == 200:
                    worker.metrics = body
            # A worker that does not answer in time counts with its last answer, so the
            # sums do not fall back (a counter reset to Prometheus) while it is busy.
            merged = merge([w.metrics for w in self._workers if w.metrics])
            return b"200 OK", CONTENT_TYPE_LATEST.encode(), merged
        if path in {b"/healthz", b"/readyz"}:
            answers = await self._ask_all(path.decode())
            problems = [(w.index, body.strip())
                        for w, (status, body) in zip(self._workers, answers, strict=True)
                        if status != 200]
            if problems:
                return b"503 Service Unavailable", text, _problems(problems, answers)
            return b"200 OK", text, b"ok\n" if path == b"/healthz" else b"ready\n"
        return b"404 Not Found", text, b"not found\n"

    async def _ask_all(self, path: str) -> list[tuple[int, str]]:
        return list(await asyncio.gather(*(ask(w.port, path) for w in self._workers)))


def _problems(problems: list[tuple[int, str]], answers: list[tuple[int, str]]) -> bytes:
    """Each worker's problem, named; said once when every worker has the same one."""
    if len(problems) == len(answers) and len({text for _, text in problems}) == 1:
        return f"{problems[0][1]} (every worker)\n".encode()
    return ("; ".join(f"worker {index}: {text}" for index, text in problems) + "\n").encode()


def merge(texts: list[str]) -> bytes:
    """The workers' metrics as one: counters and histograms summed, gauges by GAUGE_RULES."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation,
                                               family.type, family.unit)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sample.labels.items()))
                samples.setdefault(key, []).append(sample.value)
    for name, family in families.items():
        combine = GAUGE_RULES.get(name, sum) if family.type == "gauge" else sum
        for (sample_name, labels), found in values[name].items():
            family.add_sample(sample_name, dict(labels), float(combine(found)))
    return generate_latest(_Families(list(families.values())))


class _Families(CollectorRegistry):
    """A registry that exposes already collected families."""

    def __init__(self, families: list[Metric]) -> None:
        super().__init__(auto_describe=False)
        self._families = families

    def collect(self) -> Any:  # noqa: ANN401 - prometheus_client's untyped protocol
        """The families, as they are."""
        return iter(self._families)
