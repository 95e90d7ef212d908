"""The one endpoint of ``--workers N``: /metrics, /healthz and /readyz of every worker.

The parent asks each worker on its private port (127.0.0.1) and merges the answers:
counters and histograms summed, gauges by :data:`GAUGE_RULES`, health only when every
worker answers 200, naming those that do not. The ``process_*`` metrics (memory, CPU) are
not merged: each process keeps its own, labelled ``process="worker-<index>"``, and the
parent adds its own as ``process="parent"``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from prometheus_client import CollectorRegistry, Metric, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from ingest.metrics import HttpEndpoint, cannot_listen

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Iterable

    from ingest.tokens import TokenSet

logger = logging.getLogger(__name__)

PROCESS_PREFIX = "process_"  # prometheus_client's ProcessCollector
# A worker's answer to the parent's /metrics, /healthz, /readyz: well inside the usual
# scrape and probe timeouts (10 s and 5 s), so the parent still answers when one is stuck.
ASK_TIMEOUT = 2.0
# Gauges of the workers merged by another rule than the sum (a counter or a histogram is
# always summed): 1 only while every worker is connected or up; info is the same in all.
GAUGE_RULES: dict[str, Callable[[Iterable[float]], float]] = {
    "ingest_mqtt_connected": min,
    "ingest_mongodb_up": min,
    "ingest_info": max,
    "ingest_build_info": max,
}


@dataclass(slots=True)
class Endpoint:
    """A worker's private endpoint, and the last /metrics text it answered."""

    index: int
    port: int
    metrics: str = ""


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket, for a server that starts later (or in another process)."""
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise cannot_listen(host, port, exc) from None
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


class AggregateServer(HttpEndpoint):
    """The public /metrics, /healthz and /readyz, answered by asking every worker."""

    def __init__(
        self,
        sock: socket.socket,
        workers: list[Endpoint],
        tokens: TokenSet | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._sock = sock
        self._workers = workers
        self._server = None
        self.tokens, self.tls = tokens, tls
        self._own = CollectorRegistry()  # the parent's own process_* metrics
        ProcessCollector(registry=self._own)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._handle, sock=self._sock, ssl=self.tls)
        host, port = self._sock.getsockname()[:2]
        logger.info(
            "metrics and health of %d workers on %s://%s:%d/metrics%s",
            len(self._workers),
            "https" if self.tls else "http",
            host,
            port,
            " (a bearer token needed)" if self.tokens else "",
        )
        return self

    async def _route(self, path: bytes) -> tuple[bytes, bytes, bytes]:
        text = b"text/plain; charset=utf-8"
        if path == b"/metrics":
            answers = await self._ask_all("/metrics")
            for worker, (status, body) in zip(self._workers, answers, strict=True):
                if status == 200:
                    worker.metrics = body
            # A worker that does not answer in time counts with its last answer, so the
            # sums do not fall back (a counter reset to Prometheus) while it is busy.
            answered = [w for w in self._workers if w.metrics]
            merged = merge(
                [*(w.metrics for w in answered), generate_latest(self._own).decode()],
                [*(f"worker-{w.index}" for w in answered), "parent"],
            )
            return b"200 OK", CONTENT_TYPE_LATEST.encode(), merged
        if path in {b"/healthz", b"/readyz"}:
            answers = await self._ask_all(path.decode())
            problems = [
                (w.index, body.strip())
                for w, (status, body) in zip(self._workers, answers, strict=True)
                if status != 200
            ]
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


def merge(texts: list[str], processes: list[str] | None = None) -> bytes:
    """The workers' metrics as one: counters and histograms summed, gauges by GAUGE_RULES.

    With ``processes`` (a name for each text), the ``process_*`` families are kept apart
    instead, each sample labelled with its process: a sum of start times or of file
    descriptor limits means nothing, and the memory of each process is what is bounded.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for index, text in enumerate(texts):
        for family in text_string_to_metric_families(text):
            if processes is not None and family.name.startswith(PROCESS_PREFIX):
                for sample in family.samples:
                    sample.labels["process"] = processes[index]
            if family.name not in families:
                families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
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
