"""``ingest local``: a broker, an embedded store, both daemons and the read API on one machine.

For trying the service without Docker and without MongoDB. The embedded store is the
mongoeco emulator on its SQLite engine, persisting to ``--data-dir``: it is NOT MongoDB
and not for production. ``--mongodb-uri`` and ``--mqtt-url`` point the same daemons at a
real MongoDB and a real broker instead. Every part but the store is a child process
started as its own command (``ingest run``, ``ingest api``), with the same flags. Each
gets every setting as a flag and no ``INGEST_*`` variable: the parts run as ``ingest
local`` decides, whatever else the shell exports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ingest import local_store
from ingest.config import DEFAULT_METRICS_PORT, Mode
from ingest.errors import ConfigError, StartupError

logger = logging.getLogger(__name__)

MOSQUITTO_INSTALL = (
    "install it (Debian/Ubuntu: sudo apt-get install mosquitto "
    "mosquitto-clients; Fedora: sudo dnf install mosquitto; macOS: brew "
    "install mosquitto), point --mosquitto at it, or give --mqtt-url of a "
    "broker you run"
)
LOCAL_EXTRA = "pip install 'iot-ingest[local]' (from a clone: pip install -e '.[local]')"
STORE_LABEL = "embedded emulator (mongoeco on SQLite): NOT MongoDB, not for production"
# The data dir is created private; every file in it (the store's, the broker's, the lock)
# is created under umask 077 (0600). An existing directory keeps its mode.
PRIVATE_DIR = 0o700
PRIVATE_UMASK = 0o077
STOP_TIMEOUT = 30.0  # a daemon drains within --shutdown-timeout (10 s) and its own watchdog
READY_POLL = 0.2


@dataclass(frozen=True, slots=True)
class LocalSettings:
    """What ``ingest local`` starts and where."""

    data_dir: Path
    modes: tuple[str, ...]
    mqtt_url: str | None  # None: start mosquitto on 127.0.0.1:mqtt_port
    mqtt_port: int
    # --mqtt-port left at its default: a broker already there (a distribution's mosquitto
    # service) is used rather than refused.
    mqtt_port_given: bool
    mongodb_uri: str | None  # None: start the embedded store on 127.0.0.1:store_port
    store_port: int
    metrics_port: int | None  # bucket's port; timeseries gets the next one
    db: str
    topics: tuple[str, ...]
    mapping: str | None  # a mapping file (absolute path), for every daemon
    presets: tuple[str, ...]  # for every daemon, after the mapping file's rules
    api_port: int
    mosquitto: str | None
    log_level: str
    # The environment of every part: ours without any INGEST_* variable.
    child_env: dict[str, str] = field(repr=False)
    # INGEST_* variables that are not settings of ingest local: used by no part.
    ignored_env: tuple[str, ...]

    @property
    def api_mode(self) -> Mode:
        """The layout the read API serves: the first daemon's (bucket when both run)."""
        return cast("Mode", self.modes[0])

    def check_ports(self) -> None:
        """Refuse two parts on one port, naming the flags (before anything starts)."""
        parts = [
            (f"the {mode} daemon's metrics", "--metrics-port", self.metrics_port_of(mode))
            for mode in self.modes
        ] + [("the read API", "--api-port", self.api_port)]
        if self.mongodb_uri is None:
            parts.append(("the embedded store", "--store-port", self.store_port))
        if self.mqtt_url is None:
            parts.append(("the broker", "--mqtt-port", self.mqtt_port))
        seen: dict[int, tuple[str, str]] = {}
        for part, flag, port in parts:
            if port in seen:
                raise ConfigError(
                    f"{flag}: {port} is also the port of {seen[port][0]} "
                    f"({seen[port][1]}); choose another"
                )
            seen[port] = (part, flag)

    @property
    def front(self) -> frozenset[str]:
        """The parts stopped first: the daemons (they ack through the broker) and the API."""
        return frozenset({*self.modes, "api"})

    def metrics_port_of(self, mode: str) -> int:
        """Each mode's own metrics port."""
        if self.metrics_port is None:
            return DEFAULT_METRICS_PORT[mode]
        return self.metrics_port + (1 if mode == "timeseries" else 0)


@dataclass
class _Child:
    name: str
    process: asyncio.subprocess.Process
    pump: asyncio.Task[None] | None = None


def find_mosquitto(given: str | None) -> str:
    """The mosquitto binary (Debian installs it in /usr/sbin, often not on PATH)."""
    if given:
        if Path(given).is_file() and os.access(given, os.X_OK):
            return given
        raise StartupError(f"--mosquitto: {given} is not an executable; {MOSQUITTO_INSTALL}")
    for candidate in (
        shutil.which("mosquitto"),
        "/usr/sbin/mosquitto",
        "/usr/local/sbin/mosquitto",
        "/opt/homebrew/sbin/mosquitto",
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    raise StartupError(f"mosquitto not found: {MOSQUITTO_INSTALL}")


def check_free(port: int, flag: str, what: str) -> None:
    """Refuse at once, naming the flag, when a port we would listen on is taken."""
    problem = "something listens there" if _taken(port) else None
    with socket.socket() as sock:
        # As the parts themselves bind: connections closed a moment ago (TIME_WAIT, after
        # a Ctrl-C and a restart) do not hold the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            problem = os.strerror(exc.errno) if exc.errno else str(exc)
    if problem is not None:
        raise StartupError(f"{flag}: 127.0.0.1:{port} is already in use ({problem}): {what}")


def _find_prctl() -> Any:  # noqa: ANN401 - a ctypes function
    """Linux's prctl, looked up before any fork (the child must only call it)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM if ``ingest local`` itself is killed."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def lock_data_dir(data_dir: Path) -> Any:  # noqa: ANN401 - an open file
    """Hold ``data_dir`` for this process, so two runs never share one store file."""
    import fcntl  # noqa: PLC0415 - POSIX only, like the rest of this command

    data_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    handle = (data_dir / ".lock").open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "?"
        handle.close()
        raise StartupError(
            f"--data-dir: {data_dir} is in use by another ingest local (pid "
            f"{owner}); stop it or choose another --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class Local:
    """Starts, watches and stops the parts, in order."""

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.children: list[_Child] = []
        self.stop = asyncio.Event()
        self.signals = 0
        self._store: Any = None
        self.running_broker: str | None = None
        self._lock: Any = None

    def _signal(self) -> None:
        self.signals += 1
        self.stop.set()
        if self.signals > 1:  # a second Ctrl-C: the daemons stop without draining
            for child in self.children:
                if child.name in self.settings.front and child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)

    async def run(self) -> int:
        """Everything up, a banner, then wait for Ctrl-C or a part that fails."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._signal)
        umask = os.umask(PRIVATE_UMASK)
        try:
            self._lock = lock_data_dir(self.settings.data_dir)
            self._preflight()
            mongodb_uri = self.settings.mongodb_uri or await self._start_store()
            mqtt_url = self.settings.mqtt_url or self.running_broker or await self._start_broker()
            for mode in self.settings.modes:
                await self._start_daemon(mode, mqtt_url, mongodb_uri)
            failed = await self._wait_ready(
                {mode: self.settings.metrics_port_of(mode) for mode in self.settings.modes}
            )
            if failed is None and not self.stop.is_set():
                # After the daemons, which create the collection the API checks at start.
                await self._start_api(mongodb_uri)
                failed = await self._wait_ready({"api": self.settings.api_port})
            if failed is None and not self.stop.is_set():
                self._banner(mqtt_url, mongodb_uri)
                failed = await self._watch()
        finally:
            await self._stop_all()
            os.umask(umask)
        if failed is not None:
            raise StartupError(
                f"the {failed.name} part stopped (exit status "
                f"{failed.process.returncode}); its last lines are above"
            )
        return 0

    def _preflight(self) -> None:
        s = self.settings
        if s.mqtt_url is None:
            if not s.mqtt_port_given and _taken(s.mqtt_port):
                self.running_broker = f"mqtt://127.0.0.1:{s.mqtt_port}"
                logger.warning(
                    "a broker already listens on 127.0.0.1:%d (a mosquitto "
                    "service?): using it; --mqtt-port N starts a private one "
                    "instead",
                    s.mqtt_port,
                )
            else:
                find_mosquitto(s.mosquitto)
                check_free(
                    s.mqtt_port,
                    "--mqtt-port",
                    "a broker runs there; use it with --mqtt-url "
                    f"mqtt://127.0.0.1:{s.mqtt_port} or choose another --mqtt-port",
                )
        if s.mongodb_uri is None:
            try:
                import mongoeco  # noqa: F401, PLC0415 - optional extra
            except ImportError:
                raise StartupError(
                    "the embedded store needs the [local] extra: "
                    f"{LOCAL_EXTRA}; or give --mongodb-uri of a MongoDB"
                ) from None
            check_free(
                s.store_port,
                "--store-port",
                "a MongoDB or another store runs there; use it with --mongodb-uri "
                "or choose another --store-port",
            )
        for mode in s.modes:
            check_free(
                s.metrics_port_of(mode),
                "--metrics-port",
                "choose another --metrics-port (bucket uses it, timeseries the next)",
            )
        check_free(s.api_port, "--api-port", "choose another --api-port")

    async def _start_store(self) -> str:
        from mongoeco.wire.proxy import AsyncMongoEcoProxyServer  # noqa: PLC0415 - optional extra

        path = self.settings.data_dir / "store.sqlite"
        engine = local_store.engine_class()(path=str(path))
        self._store = AsyncMongoEcoProxyServer(
            engine=engine, host="127.0.0.1", port=self.settings.store_port
        )
        try:
            await self._store.start()
        except OSError as exc:
            self._store = None
            raise StartupError(
                f"--store-port: cannot listen on 127.0.0.1:"
                f"{self.settings.store_port} ({exc.strerror or exc}); choose "
                "another --store-port"
            ) from None
        logger.info("store: %s, in %s", STORE_LABEL, path)
        return f"mongodb://127.0.0.1:{self.settings.store_port}/?directConnection=true"

    async def _start_broker(self) -> str:
        s = self.settings
        directory = (s.data_dir / "mosquitto").resolve()
        directory.mkdir(exist_ok=True)
        conf = directory / "mosquitto.conf"
        # As root, mosquitto switches to its own user, who could not write here.
        user = "user root\n" if os.geteuid() == 0 else ""
        conf.write_text(
            f"listener {s.mqtt_port} 127.0.0.1\nallow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {directory}/\n"
            f"log_dest file {directory}/mosquitto.log\n{user}",
            encoding="utf-8",
        )
        process = await asyncio.create_subprocess_exec(
            find_mosquitto(s.mosquitto),
            "-c",
            str(conf),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=s.child_env,
        )
        child = _Child("mosquitto", process)
        child.pump = asyncio.create_task(_pump(process, "mosquitto"), name="pump-mosquitto")
        self.children.append(child)
        for _ in range(100):
            if process.returncode is not None:
                break
            if await _listening(s.mqtt_port):
                return f"mqtt://127.0.0.1:{s.mqtt_port}"
            await asyncio.sleep(0.1)
        raise StartupError(
            f"mosquitto did not start on 127.0.0.1:{s.mqtt_port}: see {directory}/mosquitto.log"
        )

    async def _start_daemon(self, mode: str, mqtt_url: str, mongodb_uri: str) -> None:
        s = self.settings
        args = [
            "run",
            "--mode",
            mode,
            "--mqtt-url",
            mqtt_url,
            "--db",
            s.db,
            "--client-id",
            f"ingest-local-{mode}",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(s.metrics_port_of(mode)),
            "--log-level",
            s.log_level,
            # One process per mode: the embedded store, not the daemon, is the limit.
            "--workers",
            "1",
        ]
        for topic in s.topics:
            args += ["--topic", topic]
        if s.mapping is not None:
            args += ["--mapping", s.mapping]
        for preset in s.presets:
            args += ["--preset", preset]
        await self._spawn(mode, args, mongodb_uri)

    async def _start_api(self, mongodb_uri: str) -> None:
        s = self.settings
        await self._spawn(
            "api",
            [
                "api",
                "--mode",
                s.api_mode,
                "--db",
                s.db,
                "--api-host",
                "127.0.0.1",
                "--api-port",
                str(s.api_port),
                "--log-level",
                s.log_level,
                *(["--mapping", s.mapping] if s.mapping is not None else []),
                *(arg for preset in s.presets for arg in ("--preset", preset)),
            ],
            mongodb_uri,
        )

    async def _spawn(self, name: str, args: list[str], mongodb_uri: str) -> None:
        """``ingest <args>`` as a child whose output is ours, prefixed with ``name``.

        The MongoDB URI goes in the child's environment, not on its command line, where
        any user of the machine could read its password (``ps``).
        """
        env = {**self.settings.child_env, "INGEST_MONGODB_URI": mongodb_uri}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ingest",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=env,
        )
        child = _Child(name, process)
        child.pump = asyncio.create_task(_pump(process, name), name=f"pump-{name}")
        self.children.append(child)

    async def _wait_ready(self, ports: dict[str, int]) -> _Child | None:
        """Poll each part's /readyz; a part that exits meanwhile is the failure."""
        waiting = dict(ports)
        while waiting and not self.stop.is_set():
            for child in self.children:
                if child.process.returncode is not None:
                    return child
            for name, port in list(waiting.items()):
                if await _ready(port):
                    del waiting[name]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), READY_POLL)
        return None

    async def _watch(self) -> _Child | None:
        """Until Ctrl-C (None) or a part that exits on its own (that part)."""
        stop = asyncio.create_task(self.stop.wait(), name="local-stop")
        exits = {
            asyncio.create_task(c.process.wait(), name=f"exit-{c.name}"): c for c in self.children
        }
        done, _ = await asyncio.wait({stop, *exits}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, *exits):
            task.cancel()
        gone = [exits[task] for task in done if task in exits]
        return gone[0] if gone and not self.stop.is_set() else None

    async def _stop_all(self) -> None:
        """Daemons and API first (daemons ack through the broker), then broker, then store."""
        daemons = [c for c in self.children if c.name in self.settings.front]
        brokers = [c for c in self.children if c.name not in self.settings.front]
        for group in (daemons, brokers):
            for child in group:
                if child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            for child in group:
                try:
                    await asyncio.wait_for(child.process.wait(), STOP_TIMEOUT)
                except TimeoutError:
                    logger.warning("%s did not stop in %.0f s: killed", child.name, STOP_TIMEOUT)
                    child.process.kill()
                    await child.process.wait()
                if child.pump is not None:
                    await child.pump
        if self._store is not None:
            await local_store.close(self._store)
            self._store = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _broker_note(self) -> str:
        if self.settings.mqtt_url is not None:
            return ""
        if self.running_broker is not None:
            return "  (already running: not started, nor stopped, by ingest local)"
        return f"  (mosquitto, data in {self.settings.data_dir / 'mosquitto'})"

    def _banner(self, mqtt_url: str, mongodb_uri: str) -> None:
        s = self.settings
        python = shlex.quote(sys.executable)
        lines = [
            "",
            "iot-ingest is running locally. Ctrl-C stops everything.",
            *self._parts(mqtt_url, mongodb_uri),
            "",
            *self._publish(mqtt_url),
            "Look at the data:",
            f"  curl -s http://127.0.0.1:{s.api_port}/api/sensors",
        ]
        queries = {
            "bucket": 'buckets.find_one({}, {"_id": 0}, sort=[("bucket_start", -1)])',
            "timeseries": 'readings.find_one({}, {"_id": 0}, sort=[("ts", -1)])',
        }
        for mode in s.modes:
            code = (
                f'from pymongo import MongoClient; print(MongoClient("{_redact(mongodb_uri)}")'
                f'["{s.db}"].{queries[mode]})'
            )
            lines.append(f"  {python} -c {shlex.quote(code)}")
        lines += ["Metrics and readiness:"]
        lines += [
            f"  curl -s http://127.0.0.1:{s.metrics_port_of(mode)}/metrics | grep "
            f"'^ingest_readings'   # and /readyz"
            for mode in s.modes
        ]
        print("\n".join(lines), flush=True)  # noqa: T201 - the command's output for its user

    def _parts(self, mqtt_url: str, mongodb_uri: str) -> list[str]:
        """The banner's lines naming each part and its address."""
        s = self.settings
        store = (
            f"{mongodb_uri}  {STORE_LABEL}, file {s.data_dir / 'store.sqlite'}"
            if s.mongodb_uri is None
            else f"{_redact(mongodb_uri)}  (MongoDB)"
        )
        lines = [
            f"  broker     {mqtt_url if s.mqtt_url is None else _redact(mqtt_url)}"
            + self._broker_note(),
            f"  store      {store}",
        ]
        if s.mapping is not None or s.presets:
            given = ([f"--mapping {shlex.quote(s.mapping)}"] if s.mapping is not None else []) + [
                f"--preset {name}" for name in s.presets
            ]
            lines.append(f"  rules      {' '.join(given)}; topics {' '.join(s.topics)}")
        lines += [
            f"  {mode:<10} daemon, metrics http://127.0.0.1:{s.metrics_port_of(mode)}/metrics"
            for mode in s.modes
        ]
        lines.append(
            f"  api        http://127.0.0.1:{s.api_port}/  the page and the read "
            f"API, {s.api_mode} layout"
        )
        return lines

    def _publish(self, mqtt_url: str) -> list[str]:
        """How to publish: a sample reading, or with rules, the command to fill in."""
        s = self.settings
        host_port = mqtt_url.split("://", 1)[1].rsplit("@", 1)[-1]
        host, _, port = host_port.rpartition(":")
        pub = f"  mosquitto_pub -h {host} -p {port} -q 1 -t"
        if s.mapping is None and not s.presets:
            sample = shlex.quote('{"temp": 21.5, "hum": 40}')
            return ["Publish a reading:", f"{pub} {_topic_for(s.topics[0])} -m {sample}"]
        return [
            f"Publish as your devices do, to a topic of {' '.join(s.topics)}:",
            f"{pub} TOPIC -m PAYLOAD",
        ]


def _taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (a connection is accepted)."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _topic_for(topic_filter: str) -> str:
    """A concrete topic under the subscribed filter, naming the sensor demo-1."""
    parts = topic_filter.split("/")
    concrete = [p for p in parts if p not in {"#", "+"}] or ["sensors"]
    return "/".join([*concrete, "demo-1"] if len(concrete) == 1 else concrete)


def _redact(uri: str) -> str:
    from ingest.config import redact_mongodb_uri  # noqa: PLC0415

    return redact_mongodb_uri(uri)


async def _pump(process: asyncio.subprocess.Process, name: str) -> None:
    """Copy a child's output to our stderr, each line prefixed with the part's name."""
    stream = process.stdout if process.stdout is not None else process.stderr
    if stream is None:
        return
    while line := await stream.readline():
        sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stderr.flush()


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _ready(port: int) -> bool:
    def probe() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    return await asyncio.to_thread(probe)


def main(settings: LocalSettings) -> int:
    """Run ``ingest local`` to the end; 0 after Ctrl-C."""
    logging.getLogger("mongoeco").setLevel(logging.WARNING)
    if settings.ignored_env:
        logger.warning(
            "ignored, as settings of no part: %s (ingest local --help lists what "
            "it takes; ingest run and ingest api take the rest)",
            ", ".join(settings.ignored_env),
        )
    return asyncio.run(Local(settings).run())
