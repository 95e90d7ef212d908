"""Settings from the command line and ``INGEST_*`` environment; configuration errors."""

from __future__ import annotations

import argparse
import dataclasses
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ingest.cli import build_parser, main, settings_from
from ingest.config import Settings, parse_mqtt_url, validate
from ingest.errors import ConfigError
from ingest.pipeline.workers import auto_workers
from tests.support.procs import clean_env

if TYPE_CHECKING:
    from collections.abc import Mapping

ROOT = Path(__file__).resolve().parents[1]


def settings(*argv: str, env: Mapping[str, str] | None = None, command: str = "run") -> Settings:
    env = {} if env is None else env
    return settings_from(build_parser(env).parse_args([command, *argv]), env)


def subparser(env: Mapping[str, str], command: str) -> argparse.ArgumentParser:
    parser = build_parser(env)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def option_actions(command: str) -> list[argparse.Action]:
    return [a for a in subparser({}, command)._actions if a.option_strings and a.dest != "help"]


def env_var(action: argparse.Action) -> str:
    return "INGEST_" + action.option_strings[0].removeprefix("--").upper().replace("-", "_")


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    s = settings()
    assert s.mode == "bucket"
    assert (s.mqtt.host, s.mqtt.port, s.mqtt.tls) == ("localhost", 1883, False)
    assert (s.mqtt.username, s.mqtt.password) == (None, None)
    assert s.topics == ("sensors/#",)
    assert s.subscriptions == ("sensors/#",)
    assert s.shared_group is None
    assert s.mongodb_uri == "mongodb://localhost:27017"
    assert s.db == "iot"
    assert s.collection == "buckets"
    assert s.rejects_collection == "rejects"
    assert s.metrics_port == 9108
    assert s.qos == 1
    assert s.bucket_span_seconds is None
    assert s.span_seconds == 3600
    assert s.bucket_max_readings == 3600
    assert s.batch_size == 10_000
    assert s.flush_interval == 1.0
    assert s.granularity == "seconds"
    assert s.retained == "ignore"
    assert s.dry_run is False
    assert s.client_id == f"ingest-bucket-{socket.gethostname()}"


def test_every_flag_default_is_the_settings_default() -> None:
    # cli.py repeats each default of Settings for its flag: a drift between the two
    # would make `ingest run` and the library (loadgen, the benchmarks) disagree.
    # Two defaults are the CLI's own: the client id names the host, and --workers
    # defaults to the machine's CPUs.
    ran, library = settings(), Settings()
    differ = {
        f.name
        for f in dataclasses.fields(Settings)
        if getattr(ran, f.name) != getattr(library, f.name)
    }
    assert differ <= {"client_id", "workers"}
    assert ran.workers == auto_workers()


def test_timeseries_mode_defaults_to_the_readings_collection() -> None:
    s = settings("--mode", "timeseries")
    assert s.collection == "readings"
    assert s.client_id == f"ingest-timeseries-{socket.gethostname()}"
    assert settings("--mode", "timeseries", "--collection", "mine").collection == "mine"
    assert settings(env={"INGEST_MODE": "timeseries"}).collection == "readings"


def test_init_db_uses_the_same_common_defaults() -> None:
    s = settings(command="init-db")
    assert (s.mode, s.db, s.collection, s.mongodb_uri) == (
        "bucket",
        "iot",
        "buckets",
        "mongodb://localhost:27017",
    )
    assert settings("--mode", "timeseries", command="init-db").collection == "readings"


def test_bucket_span_seconds_sets_the_span() -> None:
    assert settings("--bucket-span-seconds", "600").span_seconds == 600


# --------------------------------------------------------------------------- environment


@pytest.mark.parametrize("command", ["run", "init-db"])
def test_every_flag_documents_its_env_variable(command: str) -> None:
    actions = option_actions(command)
    assert actions
    for action in actions:
        assert action.help is not None
        # "[env INGEST_X]", or "[env INGEST_X, comma-separated]" for --topic
        assert re.search(rf"\[env {env_var(action)}[],]", action.help), action.option_strings


def _samples(action: argparse.Action) -> tuple[tuple[str, object], tuple[str, object]]:
    """Two different (text, parsed value) pairs for a flag: one for env, one for argv."""
    if action.choices:
        first, *_, last = list(action.choices)
        return (str(last), last), (str(first), first)
    kind = getattr(action.type, "__name__", None)
    if kind == "int":
        return ("7", 7), ("8", 8)
    if kind == "float":
        return ("2.5", 2.5), ("3.5", 3.5)
    assert action.type is None, action
    return ("from-env", "from-env"), ("from-cli", "from-cli")


# --topic, --preset, --dry-run, --sensor-id-from-topic and --shard read their variables
# after parsing (--preset:
# tests/devices/test_mapping_cli.py); the others are tested here.
GENERIC = [
    (command, action.dest)
    for command in ("run", "init-db")
    for action in option_actions(command)
    if action.dest not in {"topic", "dry_run", "shard", "preset", "sensor_id_from_topic"}
]


@pytest.mark.parametrize(("command", "dest"), GENERIC, ids=[f"{c}-{d}" for c, d in GENERIC])
def test_env_sets_the_flag_and_the_command_line_wins(command: str, dest: str) -> None:
    action = next(a for a in option_actions(command) if a.dest == dest)
    (env_text, env_value), (cli_text, cli_value) = _samples(action)
    assert env_value != cli_value
    env = {env_var(action): env_text}
    parser = build_parser(env)
    assert getattr(parser.parse_args([command]), dest) == env_value
    flag = action.option_strings[0]
    assert getattr(parser.parse_args([command, flag, cli_text]), dest) == cli_value


@pytest.mark.parametrize(
    ("env", "attribute", "expected"),
    [
        ({"INGEST_MODE": "timeseries"}, "mode", "timeseries"),
        ({"INGEST_BATCH_SIZE": "500"}, "batch_size", 500),
        ({"INGEST_FLUSH_INTERVAL": "0.25"}, "flush_interval", 0.25),
        ({"INGEST_QOS": "0"}, "qos", 0),
        ({"INGEST_METRICS_PORT": "0"}, "metrics_port", 0),
        ({"INGEST_DB": "plant7"}, "db", "plant7"),
        ({"INGEST_COLLECTION": "mine"}, "collection", "mine"),
        (
            {"INGEST_MONGODB_URI": "mongodb+srv://cluster.example"},
            "mongodb_uri",
            "mongodb+srv://cluster.example",
        ),
        ({"INGEST_CLIENT_ID": "ingest-7"}, "client_id", "ingest-7"),
        ({"INGEST_BUCKET_SPAN_SECONDS": "60"}, "span_seconds", 60),
        ({"INGEST_BUCKET_MAX_READINGS": "100"}, "bucket_max_readings", 100),
        ({"INGEST_RETENTION_DAYS": "30"}, "retention_days", 30.0),
        ({"INGEST_GRANULARITY": "hours"}, "granularity", "hours"),
        ({"INGEST_RETAINED": "store"}, "retained", "store"),
        ({"INGEST_MAX_MESSAGE_BYTES": "2048"}, "max_message_bytes", 2048),
        ({"INGEST_TOPIC": "a/#"}, "topics", ("a/#",)),
        ({"INGEST_TOPIC": "a/#,b/+/x"}, "topics", ("a/#", "b/+/x")),
        ({"INGEST_TOPIC": " a/# , b "}, "topics", ("a/#", "b")),
        ({"INGEST_SHARED_GROUP": "g"}, "subscriptions", ("$share/g/sensors/#",)),
        ({"INGEST_DRY_RUN": "true"}, "dry_run", True),
        ({"INGEST_DRY_RUN": "TRUE"}, "dry_run", True),
        ({"INGEST_DRY_RUN": "1"}, "dry_run", True),
        ({"INGEST_DRY_RUN": "yes"}, "dry_run", True),
        ({"INGEST_DRY_RUN": "on"}, "dry_run", True),
        ({"INGEST_DRY_RUN": "false"}, "dry_run", False),
        ({"INGEST_DRY_RUN": "0"}, "dry_run", False),
        ({"INGEST_DRY_RUN": ""}, "dry_run", False),
        ({"INGEST_SENSOR_ID_FROM_TOPIC": "true"}, "sensor_id_from_topic", True),
        ({}, "sensor_id_from_topic", False),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_env_reaches_the_settings(env: dict[str, str], attribute: str, expected: object) -> None:
    assert getattr(settings(env=env), attribute) == expected


def test_mqtt_url_from_env() -> None:
    mqtt = settings(env={"INGEST_MQTT_URL": "mqtt://u:p@broker:1884"}).mqtt
    assert (mqtt.host, mqtt.port, mqtt.username, mqtt.password) == ("broker", 1884, "u", "p")


@pytest.mark.parametrize(
    ("env", "argv", "attribute", "expected"),
    [
        ({"INGEST_MODE": "timeseries"}, ["--mode", "bucket"], "mode", "bucket"),
        ({"INGEST_BATCH_SIZE": "500"}, ["--batch-size", "10"], "batch_size", 10),
        ({"INGEST_BATCH_SIZE": "abc"}, ["--batch-size", "10"], "batch_size", 10),
        ({"INGEST_TOPIC": "a,b"}, ["--topic", "x"], "topics", ("x",)),
        ({"INGEST_TOPIC": "a,b"}, ["--topic", "x", "--topic", "y/#"], "topics", ("x", "y/#")),
        ({"INGEST_DRY_RUN": "false"}, ["--dry-run"], "dry_run", True),
        (
            {"INGEST_SENSOR_ID_FROM_TOPIC": "no"},
            ["--sensor-id-from-topic"],
            "sensor_id_from_topic",
            True,
        ),
        ({"INGEST_DB": "envdb"}, ["--db", "clidb"], "db", "clidb"),
        (
            {"INGEST_MQTT_URL": "mqtt://env:1"},
            ["--mqtt-url", "mqtt://cli:2"],
            "mqtt",
            parse_mqtt_url("mqtt://cli:2"),
        ),
    ],
)
def test_command_line_wins_over_env(
    env: dict[str, str], argv: list[str], attribute: str, expected: object
) -> None:
    assert getattr(settings(*argv, env=env), attribute) == expected


def test_env_values_are_validated_like_flags() -> None:
    with pytest.raises(ConfigError, match="--qos"):
        settings(env={"INGEST_QOS": "3"})
    with pytest.raises(ConfigError, match="--mode"):
        settings(env={"INGEST_MODE": "bogus"})
    with pytest.raises(ConfigError, match="INGEST_DRY_RUN"):
        settings(env={"INGEST_DRY_RUN": "maybe"})
    with pytest.raises(ConfigError, match="--topic"):
        settings(env={"INGEST_TOPIC": "a,,b"})


# --------------------------------------------------------------------------- MQTT URL


def test_mqtt_url_with_credentials_and_port() -> None:
    mqtt = settings("--mqtt-url", "mqtt://user:pass@host:1884").mqtt
    assert (mqtt.host, mqtt.port, mqtt.tls) == ("host", 1884, False)
    assert (mqtt.username, mqtt.password) == ("user", "pass")
    assert mqtt.ssl_context() is None


def test_mqtt_url_credentials_are_percent_decoded() -> None:
    mqtt = parse_mqtt_url("mqtt://us%40er:p%40ss%3A%2F@host")
    assert (mqtt.username, mqtt.password) == ("us@er", "p@ss:/")


def test_mqtt_url_username_only_and_empty_password() -> None:
    assert (parse_mqtt_url("mqtt://u@h").username, parse_mqtt_url("mqtt://u@h").password) == (
        "u",
        None,
    )
    assert parse_mqtt_url("mqtt://u:@h").password == ""


def test_mqtts_means_tls_on_8883() -> None:
    mqtt = settings("--mqtt-url", "mqtts://host").mqtt
    assert (mqtt.host, mqtt.port, mqtt.tls) == ("host", 8883, True)
    assert mqtt.ssl_context() is not None
    assert parse_mqtt_url("mqtts://host:8884").port == 8884


def test_mqtt_url_ipv6_host() -> None:
    mqtt = parse_mqtt_url("mqtt://[::1]:1884")
    assert (mqtt.host, mqtt.port) == ("::1", 1884)


@pytest.mark.parametrize(
    "url",
    [
        "mqtt://host:notaport",
        "mqtt://host:70000",
        "http://host",
        "tcp://host:1883",
        "host:1883",
        "mqtt://",
        "mqtt://host/sensors",
        "mqtt://host?x=1",
        "mqtt://[::1",
    ],
)
def test_bad_mqtt_url(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mqtt_url(url)
    message = one_line(str(info.value))
    assert message.startswith("--mqtt-url: ")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mqtt://localhost:99999", "port 99999 is out of range: it must be between 1 and 65535"),
        ("mqtt://user:pass@[::1]:65536", "port 65536 is out of range"),
        ("mqtt://localhost:abc", "port 'abc' is not a number"),
        # An unencoded '/' in the password: the port urlsplit sees is part of the password,
        # which is not quoted.
        ("mqtt://user:99999/x@host", "percent-encode reserved characters"),
    ],
)
def test_a_bad_port_is_said_as_such_and_a_password_is_never_quoted(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_mqtt_url(url)
    assert said in str(info.value)
    assert "99999/x" not in str(info.value)


def test_shared_group_prefixes_every_subscription() -> None:
    s = settings("--shared-group", "g", "--topic", "a/#", "--topic", "b/+/c")
    assert s.subscriptions == ("$share/g/a/#", "$share/g/b/+/c")
    assert s.topics == ("a/#", "b/+/c")


@pytest.mark.parametrize(
    ("topic", "said"),
    [
        ("a/#/b", "'#' must be the last level"),
        ("sensors/#x", "'#' must be a level of its own"),
        ("sensors/a+/readings", "'+' must be a level of its own"),
        ("$share//a/#", "$share/<group>/<filter>"),
        ("$share/g+/a", "$share/<group>/<filter>"),
        ("$share/g/", "the filter is empty"),
        ("a/\x00/b", "U+0000"),
        ("a/\ud800", "valid UTF-8"),
        ("x" * 65_536, "65535 bytes"),
    ],
)
def test_a_topic_filter_mqtt_does_not_allow_is_refused_at_start(topic: str, said: str) -> None:
    """The broker would refuse the subscription; the daemon says at start what to fix."""
    with pytest.raises(ConfigError) as info:
        settings("--topic", topic)
    assert str(info.value).startswith("--topic ")
    assert said in str(info.value)


@pytest.mark.parametrize("topic", ["#", "+", "+/+", "a/+/#", "/", "a//b", "$SYS/#", "$share/g/#"])
def test_topic_filters_mqtt_allows_are_taken(topic: str) -> None:
    assert settings("--topic", topic).topics == (topic,)


@pytest.mark.parametrize("group", ["a/b", "+", "#", "", "x" * 65])
def test_bad_shared_group(group: str) -> None:
    with pytest.raises(ConfigError, match="--shared-group"):
        settings("--shared-group", group)


# --------------------------------------------------------------------------- secret files


def test_mqtt_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "mqtt_password"
    secret.write_text("s3cret\n", encoding="utf-8")
    mqtt = settings(
        "--mqtt-url", "mqtt://user:fromurl@host", "--mqtt-password-file", str(secret)
    ).mqtt
    assert (mqtt.username, mqtt.password, mqtt.host) == ("user", "s3cret", "host")
    from_env = settings(env={"INGEST_MQTT_PASSWORD_FILE": str(secret)}).mqtt
    assert from_env.password == "s3cret"


def test_mongodb_uri_file(tmp_path: Path) -> None:
    secret = tmp_path / "mongodb_uri"
    uri = "mongodb://admin:pw@db.example:27017/?authSource=admin"
    secret.write_text(f"  {uri}\n", encoding="utf-8")
    assert (
        settings("--mongodb-uri", "mongodb://other", "--mongodb-uri-file", str(secret)).mongodb_uri
        == uri
    )
    assert settings(env={"INGEST_MONGODB_URI_FILE": str(secret)}).mongodb_uri == uri
    assert settings("--mongodb-uri-file", str(secret), command="init-db").mongodb_uri == uri


def test_missing_secret_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match="--mqtt-password-file"):
        settings("--mqtt-password-file", str(missing))
    with pytest.raises(ConfigError, match="--mongodb-uri-file"):
        settings("--mongodb-uri-file", str(missing))


def test_repr_hides_secrets() -> None:
    uri = "mongodb://admin:m0ngopw@db.example:27017/?authSource=admin"
    s = settings("--mqtt-url", "mqtt://user:mqttpw@broker:1883", "--mongodb-uri", uri)
    assert s.mqtt.password == "mqttpw"
    assert s.mongodb_uri == uri
    for text in (repr(s), str(s), repr(s.mqtt)):
        assert "mqttpw" not in text
        assert "m0ngopw" not in text
        assert uri not in text
        assert "db.example" not in text
    assert "broker" in repr(s)  # the rest is still shown


# --------------------------------------------------------------------------- errors in-process


def test_main_reports_a_config_error_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--qos", "3"], env={}) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err) == (
        "ingest: error: --qos: must be 0 or 1 (QoS 2 publishes arrive as QoS 1), got 3"
    )


def test_main_reads_the_given_env_not_os_environ(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"], env={"INGEST_BATCH_SIZE": "-5"}) == 2
    assert "--batch-size" in one_line(capsys.readouterr().err)


def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--batch-size", "abc"], env={})
    assert info.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert "--batch-size" in line
    assert "usage" not in line


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"batch_size": 0}, "--batch-size"),
        ({"flush_interval": 0.0}, "--flush-interval"),
        ({"max_buffered_readings": 10, "batch_size": 20}, "--max-buffered-readings"),
        ({"max_inflight_messages": 65536}, "--max-inflight-messages"),
        ({"max_cached_series": 0}, "--max-cached-series"),
        ({"metrics_port": 65536}, "--metrics-port"),
        ({"mongodb_uri": "postgres://x"}, "--mongodb-uri"),
        ({"db": "a.b"}, "--db"),
        ({"collection": "$x"}, "--collection"),
        ({"topics": ()}, "--topic"),
        ({"retention_days": 0.0}, "--retention-days"),
        ({"bucket_span_seconds": 0}, "--bucket-span-seconds"),
        ({"retained": "keep"}, "--retained"),
    ],
)
def test_validate_names_the_flag(overrides: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(Settings(**overrides))  # type: ignore[arg-type]
    assert one_line(str(info.value)).startswith(f"{flag}: ")


def test_default_settings_are_valid() -> None:
    assert validate(Settings()) == Settings()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--flush-interval", "nan"),
        ("--max-past-seconds", "nan"),
        ("--shutdown-timeout", "nan"),
        ("--retention-days", "nan"),
    ],
)
def test_non_finite_numbers_are_rejected(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        settings(flag, value)


# --------------------------------------------------------------------------- the real command


def ingest(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ingest run ...`` with only the given ``INGEST_*`` variables."""
    clean = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "ingest", "run", *argv],
        cwd=ROOT,
        env=clean | dict(env or {}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    return one_line(result.stderr)


BAD_CONFIGS: list[tuple[list[str], dict[str, str], str]] = [
    (["--mqtt-url", "mqtt://host:notaport"], {}, "--mqtt-url"),
    (["--mqtt-url", "http://host"], {}, "--mqtt-url"),
    (["--mode", "bogus"], {}, "--mode"),
    ([], {"INGEST_MODE": "bogus"}, "--mode"),
    (["--retained", "keep"], {}, "--retained"),
    ([], {"INGEST_RETAINED": "keep"}, "--retained"),
    (["--batch-size", "-1"], {}, "--batch-size"),
    (["--flush-interval", "0"], {}, "--flush-interval"),
    (["--qos", "3"], {}, "--qos"),
    (["--qos", "2"], {}, "--qos"),
    ([], {"INGEST_QOS": "3"}, "--qos"),
    ([], {"INGEST_BATCH_SIZE": "abc"}, "INGEST_BATCH_SIZE"),
    ([], {"INGEST_FLUSH_INTERVAL": "soon"}, "INGEST_FLUSH_INTERVAL"),
    ([], {"INGEST_DRY_RUN": "maybe"}, "INGEST_DRY_RUN"),
    (["--mongodb-uri", "postgres://db"], {}, "--mongodb-uri"),
    (["--topic", "sensors/#/readings"], {}, "--topic"),
    (["--no-such-flag"], {}, "--no-such-flag"),
]


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "env", "flag"),
    BAD_CONFIGS,
    ids=[" ".join(a) or " ".join(f"{k}={v}" for k, v in e.items()) for a, e, _ in BAD_CONFIGS],
)
def test_bad_configuration_exits_with_one_line(
    argv: list[str], env: dict[str, str], flag: str
) -> None:
    line = assert_one_line_error(ingest(*argv, env=env))
    assert line.startswith("ingest")
    assert flag in line


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            [],
            {"INGEST_BATCH_SIZE": "x"},
            (
                "ingest run: error: INGEST_BATCH_SIZE: expects a number, got 'x' (the variable of "
                "--batch-size)"
            ),
        ),
        (
            ["--batch-size", "y"],
            {"INGEST_BATCH_SIZE": "x"},
            "ingest run: error: argument --batch-size: expects a number, got 'y'",
        ),
        (
            ["--batch", "y"],
            {"INGEST_BATCH_SIZE": "x"},
            "ingest run: error: argument --batch-size: expects a number, got 'y'",
        ),
    ],
    ids=["variable", "flag-over-variable", "abbreviated-flag"],
)
def test_a_bad_number_is_named_where_it_came_from(
    argv: list[str], env: dict[str, str], line: str
) -> None:
    """The variable when the value came from it, the flag when from the command line."""
    assert assert_one_line_error(ingest(*argv, env=env)) == line


@pytest.mark.process
@pytest.mark.parametrize("flag", ["--mqtt-password-file", "--mongodb-uri-file"])
def test_missing_secret_file_exits_with_one_line(tmp_path: Path, flag: str) -> None:
    missing = tmp_path / "missing-secret"
    line = assert_one_line_error(ingest(flag, str(missing)))
    assert flag in line
    assert str(missing) in line


@pytest.mark.process
@pytest.mark.parametrize(
    "url",
    [
        "mqtt://u:s3cret@host:bad",
        "mqtt://u:s3cret@host:99999",
        "mqtt://u:s3cret@",
        "mqtt://u:s3cret@host/path",
        "ftp://u:s3cret@host",
    ],
)
def test_url_password_never_appears_in_errors(url: str) -> None:
    result = ingest("--mqtt-url", url)
    line = assert_one_line_error(result)
    assert "--mqtt-url" in line
    assert "s3cret" not in result.stderr
    assert "s3cret" not in result.stdout


@pytest.mark.process
@pytest.mark.parametrize("url", ["mqtt://u:s3cret/x@host:1883", "mqtt://u:s3cret#@host:1883"])
def test_url_password_with_reserved_characters_never_appears_in_errors(url: str) -> None:
    result = ingest("--mqtt-url", url)
    assert result.returncode == 2
    assert "s3cret" not in result.stderr


@pytest.mark.process
def test_undecodable_secret_file_exits_with_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"\xff\xfe")
    assert_one_line_error(ingest("--mqtt-password-file", str(secret)))


@pytest.mark.process
def test_bad_log_level_from_env_exits_with_one_line() -> None:
    # Unreachable broker and database: should the daemon ever start, it fails fast.
    result = ingest(
        "--mqtt-url",
        "mqtt://127.0.0.1:9",
        "--mongodb-uri",
        "mongodb://127.0.0.1:9",
        "--metrics-port",
        "0",
        env={"INGEST_LOG_LEVEL": "verbose", "INGEST_DRY_RUN": "true"},
    )
    assert "--log-level" in assert_one_line_error(result)


@pytest.mark.parametrize("url", ["mqtt://host:0", "mqtt://host:1883#frag"])
def test_port_zero_and_fragments_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="--mqtt-url"):
        parse_mqtt_url(url)
