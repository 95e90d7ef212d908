"""Several consumer processes (``--workers N``): one shared subscription group, one endpoint.

The parent validates the settings, binds the public metrics port, forks N workers and
then only supervises: it passes SIGTERM/SIGINT on (as SIGUSR1), serves /metrics,
/healthz and /readyz by asking each worker on its private port (127.0.0.1) and merging
the answers (ingest/pipeline/workers_endpoint.py), and exits when they have all exited. Each worker
is the daemon of ``ingest run --workers 1`` with:

* client id: worker 0 keeps ``--client-id`` (and so the session, with the messages the
  broker queued for it, of a daemon that ran with one worker); worker k uses
  ``<client-id>-w<k>``;
* shared group: ``--shared-group``, or the client id (characters other than letters,
  digits, ``_`` and ``-`` replaced by ``-``) when it is not given.

The CLI takes this host's lock on every worker's client id before the workers are
forked (ingest/mqtt/client_lock.py); they inherit it, so it is held while any of them runs.

Sessions outlive a change of the worker count, so two things are cleaned up at start
(also with one worker, where nothing else of this module runs):

* the session of ``--client-id`` may hold the other form of each filter (plain or shared):
  the source unsubscribes it after subscribing (``Settings.other_subscriptions``);
* the sessions of workers that no longer exist (``<client-id>-w<k>`` for k >= N) hold
  the messages the broker queued for them, and as members of the group they would go on
  receiving a share of the new ones: ingest/pipeline/worker_sessions.py resumes each one, takes its
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
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.devices.decode import ARRIVALS
from ingest.errors import ConfigError, IncompatibleError, SchemaError, StartupError
from ingest.mqtt.source import start_together
from ingest.pipeline import app
from ingest.pipeline.worker_sessions import deadline, retire_sessions, worker_client_id
from ingest.pipeline.workers_endpoint import AggregateServer, Endpoint, listen

if TYPE_CHECKING:
    import socket
    from multiprocessing.connection import Connection

    from ingest.config import Settings

logger = logging.getLogger(__name__)

# auto stops here: past a few workers one mosquitto (single-threaded) is the limit, and
# each worker holds its own buffers (--max-buffered-bytes each). See docs/scaling.md.
AUTO_MAX = 8
PARENT_POLL_SECONDS = 1.0
DRAIN = signal.SIGUSR1  # parent to worker: drain and stop; a second one forces
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls for cls in (ConfigError, StartupError, SchemaError, IncompatibleError)
}


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
    return replace(
        settings,
        client_id=worker_client_id(settings.client_id, index),
        shared_group=settings.shared_group or settings.derived_group,
        metrics_host="127.0.0.1",
        metrics_port=0,
        metrics_tokens=(),
        metrics_tls_cert=None,
        metrics_tls_key=None,
    )


# --- one worker (also the whole daemon with --workers 1) ---


async def run_one(
    settings: Settings,
    shutdown: app.Shutdown | None = None,
    metrics_sock: socket.socket | None = None,
    retire: bool = True,
) -> None:
    """Retire the sessions of workers beyond ``settings.workers``, then run the daemon."""
    if shutdown is None:
        shutdown = app.Shutdown(deadline(settings))
        app.install_signal_handlers(shutdown)
    if retire:
        await retire_sessions(settings, shutdown)
    await app.run(settings, shutdown, metrics_sock=metrics_sock)


# --- the parent ---


@dataclass(slots=True)
class Worker:
    """A worker process as the parent sees it."""

    index: int
    process: multiprocessing.process.BaseProcess
    endpoint: Endpoint
    report: Connection


def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` workers until a signal; the exit status of the daemon."""
    public = listen(settings.metrics_host, settings.metrics_port)
    socks = [listen("127.0.0.1", 0) for _ in range(settings.workers)]
    context = multiprocessing.get_context("fork")  # the workers share the parsed settings
    # Their first subscriptions go out together (ingest/mqtt/source.py start_together).
    together = context.Barrier(settings.workers)
    workers = []
    for index, sock in enumerate(socks):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_worker_main,
            name=f"ingest-worker-{index}",
            args=(
                worker_settings(settings, index),
                index,
                sock,
                send,
                [public, *socks],
                together,
            ),
            daemon=False,
        )
        process.start()
        send.close()
        endpoint = Endpoint(index, int(sock.getsockname()[1]))
        workers.append(Worker(index, process, endpoint, receive))
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
    logger.info(
        "%d workers: client ids %s; shared group %s",
        len(workers),
        ", ".join(worker_client_id(settings.client_id, w.index) for w in workers),
        settings.shared_group or settings.derived_group,
    )
    async with AggregateServer(
        public, [worker.endpoint for worker in workers], **app.metrics_guard(settings)
    ):
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
        logger.info(
            "signal received: %s every worker", "forcing" if self.signals > 1 else "draining"
        )
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
                logger.error(
                    "worker %d exited with status %s; stopping the others",
                    worker.index,
                    _status(code),
                )
            self.signals = 1
            _signal_all(self.workers)


def _on_exit(
    loop: asyncio.AbstractEventLoop, exited: asyncio.Queue[Worker], worker: Worker
) -> None:
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


def _worker_main(
    settings: Settings,
    index: int,
    sock: socket.socket,
    report: Connection,
    inherited: list[socket.socket],
    together: Any,  # noqa: ANN401 - a multiprocessing Barrier
) -> None:
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
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s %(name)s [worker {index}]: %(message)s")
        )
    start_together(together)
    ARRIVALS.spread(index, settings.workers)  # this process's own (forked)
    if settings.mapping is not None:
        settings.mapping.arrivals.spread(index, settings.workers)
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


async def _worker(
    settings: Settings, sock: socket.socket, parent: int, early: list[int], retire: bool
) -> None:
    shutdown = app.Shutdown(deadline(settings))
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
