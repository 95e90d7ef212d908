"""The stack tier: deploy/compose.yaml brought up unmodified, checked as a user relies on it.

Runs with ``scripts/test-stack`` (which sets INGEST_TEST_STACK=1) wherever Docker Compose v2
and an engine answer; skipped with the reason otherwise. One compose project, named uniquely
per run, serves the whole module; it is taken down with its volumes afterwards, also on
failure. The services started are those whose images are present (pulled or built) where it
runs: the image is built, the other images are not fetched by the tests.

The tests run in file order and share the stack: each publishes its own fleet (unique
sensor ids), so none depends on another's data, but later ones restart services.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
from pymongo import MongoClient

from tests.support.procs import ROOT, eventually, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
BENCH_OUT = DEPLOY / "bench-out"
DASHBOARD = ROOT / "grafana" / "dashboards" / "ingest.json"
OPT_IN = "INGEST_TEST_STACK"
# Always started; the image of the daemons is built by `up --build`.
CORE = ("mosquitto", "mongodb", "ingest-bucket", "ingest-timeseries", "prometheus", "api")
# Started when their image is present (no stand-in exists for them on machines without a
# registry; the GitHub workflow pulls them).
OPTIONAL = {
    "mongodb-exporter": "percona/mongodb_exporter:0.42.0",
    "grafana": "grafana/grafana:11.3.0",
}
DAEMONS = {"ingest-bucket": "bucket", "ingest-timeseries": "timeseries"}
COLLECTIONS = {"bucket": "buckets", "timeseries": "readings"}
# The host ports the stack publishes: free ones picked now (the compose file's defaults,
# 1883, 27017, 9090, 3000 and 8080, may be taken on the machine that runs the tier).
HOST_PORTS = {
    f"{name}_HOST_PORT": free_port() for name in ("MQTT", "MONGODB", "PROMETHEUS", "GRAFANA", "API")
}
MQTT_PORT = HOST_PORTS["MQTT_HOST_PORT"]
MONGODB_URI = f"mongodb://127.0.0.1:{HOST_PORTS['MONGODB_HOST_PORT']}/?directConnection=true"
MQTT_URL = f"mqtt://sensor@127.0.0.1:{MQTT_PORT}"
SENSOR_PASSWORD_FILE = DEPLOY / "secrets" / "mqtt-sensor-password"
PROMETHEUS = f"http://127.0.0.1:{HOST_PORTS['PROMETHEUS_HOST_PORT']}"
GRAFANA = f"http://127.0.0.1:{HOST_PORTS['GRAFANA_HOST_PORT']}"
API = f"http://127.0.0.1:{HOST_PORTS['API_HOST_PORT']}"
GRACE_SECONDS = 30  # stop_grace_period of the ingest services


def _answers(argv: list[str]) -> str | None:
    """The command's stdout, or None when it fails or is missing."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def why_not() -> str | None:
    """Why the stack tier cannot run here, or None when it can."""
    if not os.environ.get(OPT_IN):
        return (
            f"the stack tier runs with scripts/test-stack ({OPT_IN}=1; needs Docker "
            "Compose v2 and a running engine)"
        )
    if shutil.which("docker") is None:
        return "no docker command on PATH (the stack tier needs Docker Compose v2)"
    version = _answers(["docker", "compose", "version", "--short"])
    if version is None or not version.lstrip("v").startswith("2."):
        return f"Docker Compose v2 is not available (docker compose version: {version})"
    if _answers(["docker", "version", "--format", "{{.Server.Version}}"]) is None:
        return "no Docker engine answers (start dockerd or set DOCKER_HOST)"
    return None


REASON = why_not()
pytestmark = [pytest.mark.stack, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


class Stack:
    """One compose project of deploy/compose.yaml."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.env = {
            **os.environ,
            "BENCH_UID": str(os.getuid()),
            "BENCH_GID": str(os.getgid()),
            **{name: str(port) for name, port in HOST_PORTS.items()},
        }
        self.services: list[str] = []

    def compose(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose -p <project> -f deploy/compose.yaml ARGS``."""
        argv = ["docker", "compose", "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=ROOT,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[2:])} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def up(self) -> None:
        """Build the image and start the services, waiting until they are healthy."""
        self.compose(
            "up", "-d", "--build", "--wait", "--wait-timeout", "300", *self.services, timeout=1500
        )

    def containers(self) -> list[dict[str, Any]]:
        """``docker compose ps`` as dicts (one per container, stopped ones included)."""
        out = self.compose("ps", "--all", "--format", "json").stdout.strip()
        if out.startswith("["):
            return list(json.loads(out))
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def inspect(self, service: str) -> dict[str, Any]:
        """``docker inspect`` of the service's container."""
        cid = self.compose("ps", "--all", "-q", service).stdout.split()[0]
        done = subprocess.run(
            ["docker", "inspect", cid], capture_output=True, text=True, timeout=60, check=True
        )
        return dict(json.loads(done.stdout)[0])

    def logs(self, service: str) -> str:
        """The service's log."""
        return self.compose("logs", "--no-color", service).stdout

    def metric(self, service: str, name: str, **labels: str) -> float:
        """Sum of a metric's samples (with these labels) on a daemon's /metrics, read
        inside its container."""
        port = 9108 if service == "ingest-bucket" else 9109
        code = (
            "import urllib.request; print(urllib.request.urlopen("
            f"'http://127.0.0.1:{port}/metrics', timeout=5).read().decode())"
        )
        text = self.compose("exec", "-T", service, "python", "-c", code).stdout
        pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        return sum(
            float(value)
            for found, value in pattern.findall(text)
            if all(label in found for label in wanted)
        )

    async def healthy(self, timeout: float = 180) -> None:
        """Wait until every started service runs and is healthy again (no recreation)."""

        def ready() -> bool:
            states = {c["Service"]: c for c in self.containers()}
            return all(
                states.get(name, {}).get("State") == "running"
                and (name == "mongodb-exporter" or states[name]["Health"] == "healthy")
                for name in self.services
            )

        await eventually(ready, timeout=timeout, interval=2)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The stack, up and healthy; down with its volumes afterwards, whatever happened."""
    running = Stack(os.environ.get(f"{OPT_IN}_PROJECT") or f"iotstack{uuid.uuid4().hex[:8]}")
    present = {
        name
        for name, image in OPTIONAL.items()
        if _answers(["docker", "image", "inspect", image]) is not None
    }
    running.services = [*CORE, *(name for name in OPTIONAL if name in present)]
    before = set(BENCH_OUT.iterdir())
    try:
        running.up()
        yield running
    finally:
        failed = running.compose("ps", "--all", check=False).stdout
        sys.stderr.write(f"stack {running.project}:\n{failed}\n")
        running.compose(
            "--profile",
            "bench",
            "down",
            "--volumes",
            "--remove-orphans",
            "--timeout",
            "10",
            check=False,
        )
        for path in set(BENCH_OUT.iterdir()) - before:
            path.unlink()


@pytest.fixture(scope="module")
def mongo(stack: Stack) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(
        MONGODB_URI, tz_aware=True, serverSelectionTimeoutMS=30000
    )
    yield client
    client.close()


def loadgen(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run this checkout's ``loadgen`` against the stack's published ports."""
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def publish_fleet(tmp_path: Path, sensors: int = 6, count: int = 60) -> Path:
    """Publish a fleet as the sensor user at QoS 1 (every message acked by the broker);
    returns its manifest. Small: the mongo:8.0 stand-in (an emulator) inserts about ten
    time-series documents a second, and the daemons must still be writing when a test
    restarts or stops something."""
    manifest = tmp_path / f"fleet-{uuid.uuid4().hex[:6]}.json"
    done = loadgen(
        "publish",
        f"--mqtt-url={MQTT_URL}",
        f"--mqtt-password-file={SENSOR_PASSWORD_FILE}",
        f"--sensors={sensors}",
        f"--count={count}",
        "--rate=0",
        "--qos=1",
        f"--sensor-prefix=st{uuid.uuid4().hex[:6]}",
        f"--manifest={manifest}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return manifest


def verify(manifest: Path) -> dict[str, Any]:
    """``loadgen verify --mode both`` of a fleet, as JSON."""
    done = loadgen(
        "verify", f"--manifest={manifest}", f"--mongodb-uri={MONGODB_URI}", "--mode=both", "--json"
    )
    assert done.returncode in {0, 1}, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


async def settled(stack: Stack, manifest: Path, timeout: float = 240) -> dict[str, Any]:
    """``loadgen verify`` of a fleet by mode, once nothing is missing and the daemons hold
    nothing more."""

    def done() -> bool:
        return all(mode["missing"] == 0 for mode in verify(manifest)["modes"]) and all(
            stack.metric(s, "ingest_buffered_readings") == 0 for s in DAEMONS
        )

    await eventually(done, timeout=timeout, interval=2)
    return {mode["mode"]: mode for mode in verify(manifest)["modes"]}


def exact(report: dict[str, Any]) -> None:
    """Every reading once, with its values, in that mode."""
    counts = {
        key: report[key]
        for key in ("missing", "duplicated", "wrong", "unexpected", "bad_documents")
    }
    assert counts == dict.fromkeys(counts, 0), report


async def arrived_exactly_once(stack: Stack, manifest: Path, timeout: float = 240) -> None:
    """Every reading of the fleet once in each mode."""
    for report in (await settled(stack, manifest, timeout)).values():
        exact(report)


def never_restarted(stack: Stack) -> None:
    """The daemons' containers are the ones started first (a crash would restart them)."""
    for service in DAEMONS:
        state = stack.inspect(service)
        assert state["RestartCount"] == 0, f"{service} restarted:\n{stack.logs(service)}"
        assert state["State"]["Status"] == "running", service


def http_json(url: str, auth: tuple[str, str] | None = None) -> Any:
    """GET a JSON document."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def promql(query: str, at: float | None = None) -> list[dict[str, Any]]:
    """Result of an instant query."""
    params = {"query": query, **({"time": str(at)} if at is not None else {})}
    body = http_json(f"{PROMETHEUS}/api/v1/query?{urllib.parse.urlencode(params)}")
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def mqtt_client(user: str | None, secret: str | None = None) -> aiomqtt.Client:
    if user is not None and secret is None:
        secret = (DEPLOY / "secrets" / f"mqtt-{user}-password").read_text().strip()
    return aiomqtt.Client(
        "127.0.0.1",
        MQTT_PORT,
        username=user,
        password=secret,
        identifier=f"stack-{uuid.uuid4().hex[:8]}",
        protocol=aiomqtt.ProtocolVersion.V5,
        timeout=10,
    )


# --- the stack as started ----------------------------------------------------------------


def test_every_service_started_is_healthy(stack: Stack) -> None:
    containers = {c["Service"]: c for c in stack.containers()}
    # api-token is a one-shot step the api and Grafana wait for: done, not running
    token_step = containers.pop("api-token")
    assert (token_step["State"], token_step["ExitCode"]) == ("exited", 0)
    assert set(containers) == set(stack.services)
    for name, container in containers.items():
        assert container["State"] == "running", f"{name}:\n{stack.logs(name)}"
        if name != "mongodb-exporter":  # no healthcheck: Prometheus's up{} is its health
            assert container["Health"] == "healthy", f"{name}:\n{stack.logs(name)}"
    image = stack.inspect("ingest-bucket")["Config"]
    assert image["User"] == "10001:10001"
    assert image["Healthcheck"]["Test"][0] == "CMD"


def test_the_daemons_run_the_compiled_accelerators_without_a_compiler(stack: Stack) -> None:
    """The image's build stage compiled them; its runtime stage carries no compiler."""
    for service in DAEMONS:
        assert stack.metric(service, "ingest_build_info", accelerated="true") == 1, stack.logs(
            service
        )
        assert "accelerators: compiled (" in stack.logs(service)
    found = stack.compose(
        "exec", "-T", "ingest-bucket", "sh", "-c", "command -v gcc cc c99 || true"
    ).stdout
    assert found.strip() == ""


async def test_readings_published_as_sensor_land_in_both_modes(
    stack: Stack, mongo: MongoClient[dict[str, Any]]
) -> None:
    sensor = f"stack-{uuid.uuid4().hex[:8]}"
    sent = [{"ts": 1_790_000_000 + i, "seq": i, "temp": 20.5 + i, "hum": 40 + i} for i in range(3)]
    async with mqtt_client("sensor") as client:
        for reading in sent:
            await client.publish(f"sensors/{sensor}/readings", json.dumps(reading), qos=1)
    db = mongo["iot"]

    def timeseries() -> list[dict[str, Any]]:
        return list(db["readings"].find({"meta.sensor_id": sensor}, {"_id": 0}).sort("seq"))

    def buckets() -> list[dict[str, Any]]:
        return list(db["buckets"].find({"sensor_id": sensor}))

    docs = await eventually(lambda: len(timeseries()) == 3 and timeseries(), timeout=60)
    assert [(d["ts"].timestamp(), d["seq"], d["temp"], d["hum"]) for d in docs] == [
        (r["ts"], r["seq"], r["temp"], r["hum"]) for r in sent
    ]
    found = await eventually(
        lambda: sum(b["count"] for b in buckets()) == 3 and buckets(), timeout=60
    )
    assert len(found) == 1, "three readings of one hour: one bucket"
    bucket = found[0]
    # The compose daemons run two workers: a sensor's messages are spread over both, so
    # the bucket's readings keep the order the writes reached MongoDB, not the sensor's.
    assert sorted(
        (r["ts"].timestamp(), r["seq"], r["temp"], r["hum"]) for r in bucket["readings"]
    ) == [(r["ts"], r["seq"], r["temp"], r["hum"]) for r in sent]
    temp = bucket["stats"]["temp"]
    assert (temp["min"], temp["max"], temp["sum"], temp["count"]) == (20.5, 22.5, 64.5, 3)
    # The read API of the stack (the bucket layout) answers with the same readings.
    query = urllib.parse.urlencode(
        {"sensor": sensor, "since": "2026-09-21T00:00:00Z", "until": "2026-09-22T00:00:00Z"}
    )
    token = stack.compose("exec", "-T", "api", "cat", "/run/ingest-api/token").stdout.strip()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{API}/api/readings?{query}", timeout=10)
    refused.value.close()  # the error holds the answer's connection
    assert refused.value.code == 401
    request = urllib.request.Request(
        f"{API}/api/readings?{query}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        readings = json.loads(answer.read())["readings"]
    assert [(r["seq"], r["values"]) for r in readings] == [
        (r["seq"], {"temp": r["temp"], "hum": r["hum"]}) for r in sent
    ]


async def test_the_daemons_user_cannot_publish_and_anonymous_clients_are_refused(
    stack: Stack, mongo: MongoClient[dict[str, Any]]
) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with mqtt_client(None):
            pass
    with pytest.raises(aiomqtt.MqttError):
        async with mqtt_client("sensor", "not-the-password"):
            pass
    sensor = f"stack-{uuid.uuid4().hex[:8]}"
    async with mqtt_client("ingest") as daemon_user, mqtt_client("sensor") as sensor_user:
        await daemon_user.publish(
            f"sensors/{sensor}/readings",
            json.dumps({"ts": 1_790_000_000, "seq": 0, "temp": 1}),
            qos=1,
        )
        # Published after the refused one on another connection: once it is stored, the
        # first would have been too.
        await sensor_user.publish(
            f"sensors/{sensor}-ok/readings",
            json.dumps({"ts": 1_790_000_000, "seq": 0, "temp": 2}),
            qos=1,
        )
    readings = mongo["iot"]["readings"]
    await eventually(
        lambda: readings.count_documents({"meta.sensor_id": f"{sensor}-ok"}) == 1, timeout=60
    )
    assert readings.count_documents({"meta.sensor_id": sensor}) == 0
    assert mongo["iot"]["buckets"].count_documents({"sensor_id": sensor}) == 0


async def test_prometheus_has_both_daemons_as_healthy_targets(stack: Stack) -> None:
    def ingest_targets() -> dict[str, str]:
        body = http_json(f"{PROMETHEUS}/api/v1/targets?state=active")
        return {
            t["labels"]["service"]: t["health"]
            for t in body["data"]["activeTargets"]
            if t["labels"]["job"] == "ingest"
        }

    await eventually(
        lambda: ingest_targets() == dict.fromkeys(DAEMONS, "up"), timeout=60, interval=1
    )
    modes = {r["metric"]["service"]: r["metric"]["mode"] for r in promql("ingest_info")}
    assert modes == DAEMONS


# --- restarts, stops ---------------------------------------------------------------------


@pytest.mark.parametrize("service", ["mosquitto", "mongodb"])
async def test_the_daemons_survive_a_restart_without_losing_or_doubling_a_reading(
    stack: Stack, tmp_path: Path, service: str
) -> None:
    """A fleet published (and acked by the broker), then the service restarted at once,
    while the daemons are still writing it: every reading lands once in each mode.

    One documented limit is reported as an expected failure, not hidden: in timeseries
    mode a write whose outcome is unknown (the server went away mid-request) is retried
    and may store readings twice (docs: delivery guarantees). Any duplicate without such
    a retry, any in bucket mode, and any reading missing fail."""
    retried = stack.metric("ingest-timeseries", "ingest_write_errors_total", kind="transient")
    manifest = publish_fleet(tmp_path)
    stack.compose("restart", service, timeout=300)
    found = await settled(stack, manifest)
    never_restarted(stack)
    await stack.healthy()
    exact(found["bucket"])
    timeseries = found["timeseries"]
    doubled = timeseries["duplicated"]
    if doubled:
        timeseries = {**timeseries, "duplicated": 0}
    exact(timeseries)
    if doubled:
        retries = (
            stack.metric("ingest-timeseries", "ingest_write_errors_total", kind="transient")
            - retried
        )
        assert retries > 0, f"{doubled} readings stored twice without a retried write"
        pytest.xfail(
            f"timeseries mode stored {doubled} of {timeseries['expected']} readings "
            f"twice after {retries:.0f} retried write(s) of unknown outcome: the "
            "documented limit (a time-series collection has no unique index)"
        )


async def test_stop_drains_and_acks_within_the_grace_period(stack: Stack, tmp_path: Path) -> None:
    """``docker compose stop`` of the daemons while they hold readings: each writes and
    acks what it holds, exits 0 well within its grace period, and after ``start`` nothing
    is redelivered (bucket mode would count a redelivered reading as a duplicate,
    timeseries mode would store it twice)."""
    manifest = publish_fleet(tmp_path)
    started = time.monotonic()
    stack.compose("stop", *DAEMONS, timeout=120)
    elapsed = time.monotonic() - started
    assert elapsed < GRACE_SECONDS, f"stop took {elapsed:.1f}s"
    for service in DAEMONS:
        state = stack.inspect(service)["State"]
        log = stack.logs(service)
        assert state["ExitCode"] == 0, log
        assert "signal received: draining in-flight batches" in log, log
        assert "in-flight batches written and acknowledged" in log, log
    stack.compose("start", *DAEMONS)
    await stack.healthy()
    await arrived_exactly_once(stack, manifest)
    assert stack.metric("ingest-bucket", "ingest_duplicate_readings_total") == 0


# --- observability -----------------------------------------------------------------------


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the provisioned dashboard."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    board = json.loads(DASHBOARD.read_text())
    return [
        (p.get("title", ""), t["expr"])
        for p in panels(board["panels"])
        for t in p.get("targets", [])
        if t.get("expr")
    ]


async def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    """Each query of grafana/dashboards/ingest.json, with Grafana's $__rate_interval as a
    minute; those on the MongoDB exporter's metrics only where the exporter runs."""
    exporter = "mongodb-exporter" in stack.services
    queries = [
        (title, expr)
        for title, expr in dashboard_queries()
        if exporter or "mongodb_" not in expr.replace("ingest_mongodb_", "")
    ]
    assert len(queries) >= 15

    def empty() -> list[str]:
        return [
            f"{title}: {expr}"
            for title, expr in queries
            if not promql(expr.replace("$__rate_interval", "1m"))
        ]

    deadline = time.monotonic() + 120
    while (missing := empty()) and time.monotonic() < deadline:
        await asyncio.sleep(5)
    assert not missing, "queries without data:\n" + "\n".join(missing)


async def test_grafana_loads_its_provisioning_and_answers_health(stack: Stack) -> None:
    if "grafana" not in stack.services:
        pytest.skip(f"no {OPTIONAL['grafana']} image here (no stand-in exists for it)")
    health = await eventually(lambda: http_json(f"{GRAFANA}/api/health"), timeout=60)
    assert health["database"] == "ok"
    board = http_json(f"{GRAFANA}/api/dashboards/uid/iot-ingest")
    assert board["dashboard"]["title"]
    admin = ("admin", os.environ.get("GRAFANA_ADMIN_PASSWORD", "admin-change-me"))
    source = http_json(f"{GRAFANA}/api/datasources/uid/prometheus", auth=admin)
    assert source["url"] == "http://prometheus:9090"
    check = http_json(f"{GRAFANA}/api/datasources/uid/prometheus/health", auth=admin)
    assert check["status"] == "OK", check
    # Provisioning: every logger=provisioning.* line, none at level=error.
    errors = [
        line
        for line in stack.logs("grafana").splitlines()
        if "level=error" in line and "logger=provisioning" in line
    ]
    assert not errors, "\n".join(errors)


# --- the benchmark, the volumes ----------------------------------------------------------


def test_the_bench_profile_writes_markdown_json_and_png(stack: Stack) -> None:
    before = set(BENCH_OUT.iterdir())
    # The service's own command; a smaller workload than its preset's 1,000 readings (the
    # emulator behind the mongo:8.0 stand-in is slow), set through loadgen's environment.
    done = stack.compose(
        "--profile",
        "bench",
        "run",
        "--rm",
        "--build",
        "-e",
        "LOADGEN_COUNT=200",
        "-e",
        "LOADGEN_QUERY_RUNS=1",
        "-e",
        "LOADGEN_WAIT_TIMEOUT=600",
        "loadgen",
        timeout=1500,
        check=False,
    )
    written = set(BENCH_OUT.iterdir()) - before
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    suffixes = sorted(p.suffix for p in written)
    assert suffixes == [".json", ".md", ".png"], written
    report = json.loads(next(p for p in written if p.suffix == ".json").read_text())
    assert report["chart_skipped"] is None, report["chart_skipped"]
    assert set(report["modes"]) == set(DAEMONS.values())
    png = next(p for p in written if p.suffix == ".png").read_bytes()
    assert png.startswith(b"\x89PNG")


async def test_named_volumes_survive_down_and_up(stack: Stack, tmp_path: Path) -> None:
    """Readings stored, Prometheus's samples, and the broker's persistent sessions with
    their queued messages: a fleet published while the daemons are stopped is queued at
    the broker, survives ``down`` and ``up`` there, and is written after it."""
    stored = publish_fleet(tmp_path)
    await arrived_exactly_once(stack, stored)
    stack.compose("stop", *DAEMONS, timeout=120)
    queued = publish_fleet(tmp_path)
    scraped_at = time.time()
    stack.compose("down", timeout=300)
    assert not stack.containers()
    stack.up()
    await arrived_exactly_once(stack, stored)
    await arrived_exactly_once(stack, queued)
    assert promql("ingest_info", at=scraped_at - 5), "Prometheus lost its samples"
