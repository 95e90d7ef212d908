"""Fixtures: a real mosquitto, MongoDB (real if INGEST_TEST_MONGODB_URI, else the emulator),
unique names per test, and the daemon as a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from typing import TYPE_CHECKING, Any

import aiomqtt
import pytest
from hypothesis import HealthCheck, settings
from pymongo import AsyncMongoClient

from tests.support.procs import Broker, Daemon, start_emulator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator
    from pathlib import Path

# Two Hypothesis profiles instead of per-test example counts: "dev" (few examples, a fresh
# draw each run: quick feedback) and "ci" (more examples, derandomized: the same draw on
# every run, so a failure repeats). CI (the CI variable, set by .ci/run's caller and by
# GitHub Actions) gets "ci"; HYPOTHESIS_PROFILE names either. The property tests are about
# what the code returns, not how fast: a per-example deadline or a "too slow" health check
# fails them at random on a loaded machine (the suite runs two processes per core, beside
# brokers and daemons).
settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    settings.get_profile("dev"),
    max_examples=150,
    derandomize=True,
    database=None,
    print_blob=True,
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

MONGO_ENV = "INGEST_TEST_MONGODB_URI"
REAL_MONGODB = bool(os.environ.get(MONGO_ENV))
SHARDED_ENV = "INGEST_TEST_MONGODB_SHARDED_URI"  # a mongos, e.g. compose's "sharded" profile
# Set by coverage.py (pyproject.toml's [tool.coverage.run] patch) when it measures the
# processes the tests start.
COVERAGE = bool(os.environ.get("COVERAGE_PROCESS_CONFIG"))


# Fixtures that start a process (a broker, the MongoDB emulator, a daemon, a browser,
# Prometheus, Docker): a test that uses one, directly or through another fixture, is marked
# ``process``, and ``scripts/test --fast`` (``-m "not process"``) runs the others.
PROCESS_FIXTURES = frozenset(
    {
        "mongo_uri",  # the emulator (and mongo, db, daemon...)
        "broker",
        "persistent",
        "local",  # tests/test_local.py: ingest local
        "fakemongo",  # tests/test_bench_e2e.py: bench/fakemongo
        "prometheus",  # tests/pipeline/test_observability.py
        "api_process",  # tests/api/conftest.py: ingest api
        "stack",  # tests/test_stack.py: docker compose
        "auth_broker",  # tests/test_bench.py
        "deployed_broker",  # tests/test_deploy.py
        "device_broker",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    process = pytest.mark.process
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(process)
    skip = pytest.mark.skip(
        reason=f"needs a real MongoDB server: set {MONGO_ENV} (the emulator cannot answer this)"
    )
    skip_sharded = pytest.mark.skip(
        reason=f"needs a sharded cluster: set {SHARDED_ENV} to a "
        "mongos (docker compose --profile sharded)"
    )
    for item in items:
        if "real_mongodb" in item.keywords and not REAL_MONGODB:
            item.add_marker(skip)
        if "sharded_cluster" in item.keywords and not os.environ.get(SHARDED_ENV):
            item.add_marker(skip_sharded)


@pytest.fixture(autouse=True)
def _processes_only_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test not marked ``process`` that starts one fails, naming the marker: so
    ``scripts/test --fast`` never starts a process, and the marker stays true."""
    if request.node.get_closest_marker("process") is None:

        def refuse(*_args: object, **_kwargs: object) -> None:
            raise AssertionError(
                "this test starts a process: mark it @pytest.mark.process (or use a fixture "
                "of tests/conftest.py's PROCESS_FIXTURES)"
            )

        monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


@pytest.fixture(scope="session")
def mongo_uri() -> Iterator[str]:
    if REAL_MONGODB:
        yield os.environ[MONGO_ENV]
        return
    proc, uri = start_emulator()
    try:
        yield uri
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="session")
async def mongo(mongo_uri: str) -> AsyncIterator[AsyncMongoClient[dict[str, Any]]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_uri, tz_aware=True)
    yield client
    await client.close()


@pytest.fixture
def db_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def db(mongo: AsyncMongoClient[dict[str, Any]], db_name: str) -> AsyncIterator[Any]:
    yield mongo[db_name]
    await mongo.drop_database(db_name)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("mosquitto"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def persistent(tmp_path: Path) -> Iterator[Broker]:
    """A broker of the test's own, with persistence: restartable without losing sessions."""
    directory = tmp_path / "persistent"
    directory.mkdir()
    broker = Broker(directory, persistence=True)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def topic_root() -> str:
    """A unique first topic level per test, so tests never see each other's messages."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["bucket", "timeseries"])
def mode(request: pytest.FixtureRequest) -> str:
    """Both storage modes, for the behaviour they share."""
    return str(request.param)


@pytest.fixture
def daemon(
    tmp_path: Path,
    broker: Broker,
    mongo_uri: str,
    db_name: str,
    topic_root: str,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Daemon]]:
    """Factory: start ``ingest run`` against the test broker and database (in the test's
    ``mode`` if it uses that fixture, else bucket mode), subscribed to the test's topic
    root (``rule_topics=True``: to the mapping rules' filters, as without ``--topic``)."""
    mode = request.getfixturevalue("mode") if "mode" in request.fixturenames else "bucket"
    started: list[Daemon] = []

    def start(
        *extra: str,
        wait_ready: bool = True,
        client_id: str | None = None,
        mongodb_uri: str | None = None,
        broker_url: str | None = None,
        rule_topics: bool = False,
        env: dict[str, str] | None = None,
    ) -> Daemon:
        topics = [] if rule_topics else ["--topic", f"{topic_root}/#"]
        args = [
            "--mqtt-url",
            broker_url or broker.url,
            *topics,
            "--mongodb-uri",
            mongodb_uri or mongo_uri,
            "--db",
            db_name,
            "--client-id",
            client_id or f"ingest-{topic_root}",
            "--flush-interval",
            "0.2",
            "--log-level",
            "debug",
            "--mode",
            mode,
            "--workers",
            "1",
            *extra,
        ]
        proc = Daemon(args, tmp_path / f"daemon-{len(started)}.log", env=env or {})
        started.append(proc)
        return proc.start(wait_ready=wait_ready)

    yield start
    for proc in started:
        if proc.process and proc.process.poll() is None:
            if COVERAGE:  # a daemon saves its coverage data when it exits, not when killed
                proc.process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.process.wait(timeout=10)
            proc.process.kill()
            proc.process.wait()


@pytest.fixture
def publish(broker: Broker) -> Callable[..., Any]:
    """Publish ``(topic, payload)`` pairs at QoS 1 and wait for each PUBACK (to the
    session's broker, or ``to``)."""

    async def send(
        messages: list[tuple[str, bytes | str]],
        qos: int = 1,
        retain: bool = False,
        to: Broker | None = None,
    ) -> None:
        async with aiomqtt.Client(
            "127.0.0.1", (to or broker).port, identifier=f"pub-{uuid.uuid4().hex[:8]}"
        ) as client:
            for topic, payload in messages:
                await client.publish(topic, payload, qos=qos, retain=retain)

    return send
