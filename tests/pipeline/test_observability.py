"""The Grafana dashboard is true: every query works against a real Prometheus.

Both daemons (bucket and timeseries, ``--dry-run``, each in its own shared-subscription
group as in deploy/compose.yaml) consume good and bad readings from the test broker; a real
``prometheus`` (Debian package) scrapes them every second with the ``ingest`` job of
deploy/prometheus/prometheus.yml; then every target of grafana/dashboards/ingest.json is
evaluated through the HTTP API and must parse and return data for both modes.

Grafana's ``$__rate_interval`` is at least four scrape intervals (20 s with the stack's
5 s); here it becomes ``RATE_WINDOW`` (30 s), which holds every sample of this short run.

The MongoDB-exporter panels (metrics ``mongodb_*``) can only be checked to parse: the
exporter needs a real MongoDB server to read ``top`` and ``collStats`` from, and none can
run on these machines (the wire emulator does not implement those commands). Their metric
names are those of Percona's mongodb_exporter with ``--collector.topmetrics`` and
``--collector.collstats``; check those panels on a machine with Docker (see
docs/development.md, "Deployment files"). Debian's ``prometheus-mongodb-exporter`` does
not help: it is a 2018 build with other metric names, and it too would have no server to
read. No data is faked for them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.support.procs import ROOT, free_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.support.procs import Daemon

DASHBOARD = ROOT / "grafana" / "dashboards" / "ingest.json"
PROVISIONING = ROOT / "grafana" / "provisioning"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RATE_WINDOW = "30s"
MODES = {"bucket", "timeseries"}
# A metric of the exporter: mongodb_... but not ingest_mongodb_up.
EXPORTER_METRIC = re.compile(r"(?<![\w:])mongodb_\w+")


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def graph_panels() -> list[dict[str, Any]]:
    """Every panel that draws something (rows only group them)."""
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of the dashboard."""
    return [(p["title"], t["refId"], t["expr"]) for p in graph_panels() for t in p["targets"]]


def concrete(expr: str) -> str:
    """The query as Grafana sends it, with our test window for ``$__rate_interval``."""
    out = expr.replace("$__rate_interval", RATE_WINDOW)
    assert "$" not in out, f"unknown Grafana variable in {expr!r}"
    return out


def test_dashboard_structure() -> None:
    board = dashboard()
    assert board["uid"]
    assert board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    uid = next(d["uid"] for d in datasources if d["type"] == "prometheus")
    for panel in graph_panels():
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, title
        assert panel["targets"], f"{title} has no query"
        assert panel["description"], f"{title} has no description"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], title
            assert target["expr"].strip(), title
    for row in (p for p in board["panels"] if p["type"] == "row"):
        assert not row.get("targets"), "rows only group panels"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "iot-ingest.yaml").read_text())[
        "providers"
    ]
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_dashboard_covers_what_operators_look_at() -> None:
    exprs = " ".join(expr for _, _, expr in targets())
    for metric in (
        "ingest_readings_accepted_total",
        "ingest_readings_written_total",
        "ingest_messages_received_total",
        "ingest_batch_write_seconds_bucket",
        "ingest_batch_readings_bucket",
        "ingest_buffered_readings",
        "ingest_readings_rejected_total",
        "ingest_mqtt_connected",
        "mongodb_top_insert_count",
        "mongodb_collstats_storageStats_storageSize",
    ):
        assert metric in exprs, f"no panel shows {metric}"


# --- against a real Prometheus ---------------------------------------------------------


def prometheus_config(scrape: dict[str, str]) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml's ingest job, pointed at our daemons, every 1 s."""
    deployed = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    job = next(j for j in deployed["scrape_configs"] if j["job_name"] == "ingest")
    job["static_configs"] = [
        {"targets": [target], "labels": {"service": service}} for service, target in scrape.items()
    ]
    job.update(scrape_interval="1s", scrape_timeout="1s")
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job],
    }


class Prometheus:
    """A real prometheus process on a free port."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None
        self.port = free_port()
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def get(self, path: str, **params: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:  # a bad query answers 400 with a JSON error
            body = exc.read()
        result = json.loads(body)
        assert isinstance(result, dict)
        return result

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr, time=f"{time.time():.3f}")

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=2
                ) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def prometheus_dir(tmp_path: Path) -> Path:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    directory = tmp_path / "prometheus"
    directory.mkdir()
    return directory


@pytest.fixture(params=["1", "2"], ids=["one-worker", "two-workers"])
def two_daemons(
    daemon: Callable[..., Daemon], topic_root: str, request: pytest.FixtureRequest
) -> dict[str, Daemon]:
    """Both modes in dry-run, each in its own shared group, like the compose stack; with
    one worker and with two (the endpoint then merges the workers' metrics)."""
    return {
        mode: daemon(
            "--mode",
            mode,
            "--dry-run",
            "--shared-group",
            f"ingest-{mode}",
            "--workers",
            request.param,
            client_id=f"ingest-{mode}-{topic_root}",
        )
        for mode in sorted(MODES)
    }


@pytest.fixture
def prometheus(prometheus_dir: Path, two_daemons: dict[str, Daemon]) -> Iterator[Prometheus]:
    scrape = {f"ingest-{mode}": f"127.0.0.1:{d.metrics_port}" for mode, d in two_daemons.items()}
    server = Prometheus(prometheus_dir, prometheus_config(scrape))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def traffic(topic_root: str, round_no: int) -> list[tuple[str, bytes | str]]:
    """A few good readings and one of each kind of bad input, every round."""
    now = time.time()
    good = [
        (
            f"{topic_root}/s{i}/readings",
            json.dumps({"ts": now, "seq": round_no, "temp": 20 + i, "hum": 40.5}),
        )
        for i in range(5)
    ]
    batch = json.dumps([{"ts": now, "temp": t} for t in range(20)])
    bad: list[tuple[str, bytes | str]] = [
        (f"{topic_root}/s1/readings", "{not json"),
        (f"{topic_root}/s1/readings", json.dumps({"ts": now, "temp": "warm"})),
        (f"{topic_root}/s1/readings", b"\xff\xfe"),
    ]
    return [*good, (f"{topic_root}/batch/readings", batch), *bad]


async def keep_publishing(publish: Callable[..., Any], topic_root: str, stop: asyncio.Event) -> int:
    rounds = 0
    while not stop.is_set():
        await publish(traffic(topic_root, rounds))
        rounds += 1
        await asyncio.sleep(0.2)
    return rounds


def series(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer["status"] == "success", answer
    assert answer["data"]["resultType"] == "vector", answer
    result = answer["data"]["result"]
    assert isinstance(result, list)
    return result


def finite(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in result if math.isfinite(float(s["value"][1]))]


async def test_every_dashboard_query_returns_data(
    prometheus: Prometheus, publish: Callable[..., Any], topic_root: str
) -> None:
    stop = asyncio.Event()
    publisher = asyncio.create_task(keep_publishing(publish, topic_root, stop))
    try:
        # Ready once both targets are up and the written-rate of both modes is above 0,
        # which needs two scrapes after the first batch of each.
        probe = f"sum by (mode) (rate(ingest_readings_written_total[{RATE_WINDOW}])) > 0"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = await asyncio.to_thread(prometheus.query, probe)
            if {s["metric"]["mode"] for s in series(found)} == MODES:
                break
            await asyncio.sleep(0.5)
        else:
            pytest.fail(f"no rates from both daemons after 20 s: {found}")
        await asyncio.sleep(2)  # a couple more scrapes with rejects and batches in them
        answers = {
            (title, ref): (expr, await asyncio.to_thread(prometheus.query, concrete(expr)))
            for title, ref, expr in targets()
        }
        # The check below notices a query that does not parse.
        broken = await asyncio.to_thread(prometheus.query, "sum by (mode (rate(x[1m]))")
        assert (broken["status"], broken["errorType"]) == ("error", "bad_data")
    finally:
        stop.set()
        rounds = await publisher
    assert rounds >= 3

    problems = []
    for (title, ref), (expr, answer) in answers.items():
        if answer.get("status") != "success":
            problems.append(f"{title} [{ref}] does not parse: {answer.get('error')}")
            continue
        if EXPORTER_METRIC.search(expr):
            continue  # parses; no MongoDB here for the exporter to read (see the docstring)
        good = finite(series(answer))
        modes = {s["metric"].get("mode") for s in good}
        if not good:
            problems.append(f"{title} [{ref}] returns no data: {expr}")
        elif "mode" in expr and modes != MODES:
            problems.append(f"{title} [{ref}] has data for {modes}, not both modes: {expr}")
    assert not problems, "\n".join(problems)


def _resident_bytes(pid: int) -> int:
    """What the kernel counts as the process's resident memory (/proc/PID/statm)."""
    pages = int((Path(f"/proc/{pid}/statm")).read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_* read /proc")
@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "two-workers"])
def test_the_daemon_exports_the_memory_and_cpu_of_each_of_its_processes(
    daemon: Callable[..., Daemon], workers: int
) -> None:
    """process_* from a running daemon, as Prometheus scrapes it; with --workers 2 one
    series per process, labelled, never a sum (a sum of start times means nothing)."""
    proc = daemon("--dry-run", "--workers", str(workers))
    assert proc.process is not None
    metrics = proc.metrics()
    if workers == 1:
        names = {"": proc.process.pid}
    else:
        pids = [
            int(p)
            for p in Path(f"/proc/{proc.process.pid}/task/{proc.process.pid}/children")
            .read_text()
            .split()
        ]
        assert len(pids) == workers
        names = {'{process="parent"}': proc.process.pid}
        names |= {f'{{process="worker-{i}"}}': pid for i, pid in enumerate(pids)}
        assert "process_resident_memory_bytes" not in metrics
    for labels, pid in names.items():
        for name in ("process_virtual_memory_bytes", "process_open_fds", "process_max_fds"):
            assert metrics[name + labels] > 0, name + labels
        assert metrics["process_cpu_seconds_total" + labels] >= 0  # a forked worker's: 0 at first
        # Each process's own, not another's: within a quarter of what /proc says now.
        resident = metrics["process_resident_memory_bytes" + labels]
        assert abs(resident - _resident_bytes(pid)) < _resident_bytes(pid) / 4, labels
        started = metrics["process_start_time_seconds" + labels]
        assert time.time() - 120 < started <= time.time()
    assert len([k for k in metrics if k.startswith("process_resident")]) == len(names)
