"""The read API's parameters and paging, without a server (and one paging case through it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from multidict import MultiDict

from ingest.api.query_params import ParamError, Params, encode_cursor, parse_duration, parse_time
from ingest.api.read_queries import Cursor, SeriesKey, merge_rows
from ingest.cli import api_settings_from, build_parser, main
from tests.api.test_api import get, serving

if TYPE_CHECKING:
    from pathlib import Path

NOW = datetime(2026, 5, 1, 12, tzinfo=UTC)


def params(**query: str | list[str]) -> Params:
    multi: MultiDict[str] = MultiDict()
    for key, value in query.items():
        for item in value if isinstance(value, list) else [value]:
            multi.add(key, item)
    return Params(multi, lambda name: multi.getall(name, []), NOW)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("30", 30_000),
        ("5m", 300_000),
        ("1.5h", 5_400_000),
        ("1d", 86_400_000),
        ("2w", 1_209_600_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration("step", text) == ms


@pytest.mark.parametrize("text", ["", "-5m", "5 minutes", "0", "0.1ms", "1y"])
def test_bad_durations_name_the_parameter(text: str) -> None:
    with pytest.raises(ParamError) as caught:
        parse_duration("step", text)
    assert caught.value.parameter == "step"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("now-90m", NOW - timedelta(minutes=90)),
        ("2026-05-01T08:00:00Z", datetime(2026, 5, 1, 8, tzinfo=UTC)),
        ("2026-05-01T10:00:00+02:00", datetime(2026, 5, 1, 8, tzinfo=UTC)),
        ("1777622400000", datetime(2026, 5, 1, 8, tzinfo=UTC)),  # Grafana's ${__from}
        # the ends of the range a time may name
        ("0", datetime(1970, 1, 1, tzinfo=UTC)),
        ("now-2939w", datetime(1970, 1, 2, 12, tzinfo=UTC)),
        ("9998-12-31T23:59:59.999Z", datetime(9998, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
    ],
)
def test_times(text: str, expected: datetime) -> None:
    assert parse_time("since", text, NOW) == expected


@pytest.mark.parametrize(
    "text",
    [
        "1969-12-31T23:59:59.999Z",
        "9999-01-01T00:00:00Z",
        "253370764800000",
        "now-2940w",
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "²",
        "٣",
        "1" * 5000,
    ],
)
def test_times_out_of_range_or_in_other_digits_name_the_parameter(text: str) -> None:
    with pytest.raises(ParamError) as caught:
        parse_time("until", text, NOW)
    assert caught.value.parameter == "until"


def test_a_limit_may_have_leading_zeros_of_any_length() -> None:
    assert params(limit="0" * 5000 + "25").limit(100, 1000) == 25
    assert params(limit="01000").limit(100, 1000) == 1000
    assert parse_time("since", "0" * 5000 + "1777622400000", NOW) == datetime(
        2026, 5, 1, 8, tzinfo=UTC
    )


def test_a_step_may_be_a_year_at_most() -> None:
    assert params(step="365d").step_ms(1000) == 365 * 86_400_000
    for text in ("366d", "53w", "9" * 400, "99999999999999999999w"):
        with pytest.raises(ParamError) as caught:
            params(step=text).step_ms(1000)
        assert caught.value.parameter == "step"


def test_sensors_and_measurements_are_lists_in_order_without_repeats() -> None:
    p = params(sensor=["b,a", "b", "c"], measurement="temp")
    assert p.sensors() == ["b", "a", "c"]
    assert p.measurements(required=True) == ["temp"]
    with pytest.raises(ParamError, match="at most 100"):
        params(sensor=",".join(f"s{i}" for i in range(101))).sensors()
    for reserved in ("ts", "meta", "units", "tags"):
        with pytest.raises(ParamError):
            params(measurement=reserved).measurements(required=True)


def test_cursors_round_trip_and_are_checked() -> None:
    cursor = encode_cursor("r", "s1", {"path": "/boot", "host": "h1"}, 1_777_622_400_000)
    assert params(cursor=cursor).reading_cursor() == Cursor(
        SeriesKey("s1", (("host", "h1"), ("path", "/boot"))), 1_777_622_400_000
    )
    for bad in (
        encode_cursor("r", "s1", {}, "x"),
        encode_cursor("r", "s1", 1, 1),
        encode_cursor("r", "s1", {"$gt": "a"}, 1),  # a tag name goes into a query
        encode_cursor("r", "s1", {"a.b": "x"}, 1),
        encode_cursor("r", "s1", {"a": 1}, 1),
        encode_cursor("r", "a\x01", {}, 1),
        encode_cursor("s", "s1", {}),
        "!!!",
    ):
        with pytest.raises(ParamError) as caught:
            params(cursor=bad).reading_cursor()
        assert caught.value.parameter == "cursor"
    assert params(cursor=encode_cursor("s", "h1", {"path": "/"})).sensor_cursor() == SeriesKey(
        "h1", (("path", "/"),)
    )


def test_tag_selectors() -> None:
    p = params(tag=["path:/boot", "path:/", "host:h1:8080", "path:/boot", "empty:"])
    assert p.tags() == {"path": ["/boot", "/"], "host": ["h1:8080"], "empty": [""]}
    assert params().tags() == {}
    assert params(tag="path:a,b").tags() == {"path": ["a,b"]}  # never split
    for bad in (
        "path",
        "a.b:x",
        "$where:1",
        "sensor_id:s1",
        ":x",
        "path:a\x01",
        "path:" + "x" * 257,
    ):
        with pytest.raises(ParamError) as caught:
            params(tag=bad).tags()
        assert caught.value.parameter == "tag"
    with pytest.raises(ParamError, match="at most 20"):
        params(tag=[f"k{i}:v" for i in range(21)]).tags()


def test_only_a_literal_comma_separates_sensor_ids() -> None:
    multi: MultiDict[str] = MultiDict([("sensor", "a,b"), ("sensor", "c,d")])
    raw = {"sensor": ["a%2Cb", "c,d"]}
    p = Params(multi, lambda name: multi.getall(name, []), NOW, raw=lambda name: raw.get(name, []))
    assert p.sensors() == ["a,b", "c", "d"]


def rows(*spec: tuple[str, int, int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "sensor_id": s,
            "tags": {"sensor_id": s},
            "ts": datetime.fromtimestamp(ms / 1000, UTC),
            "_id": n,
            **values,
        }
        for s, ms, n, values in spec
    ]


def test_rows_of_one_instant_merge_and_a_cut_instant_waits() -> None:
    fetched = rows(
        ("a", 1000, 1, {"x": 1, "seq": 0}),
        ("a", 1000, 2, {"y": 2, "x": 9, "seq": 5}),
        ("a", 2000, 3, {"x": 3}),
        ("b", 2000, 4, {"x": 4}),
    )
    merged = merge_rows(fetched, complete=True)
    assert [
        (k.sensor_id, ms, {n: d[n] for n in ("x", "y", "seq") if n in d}) for k, ms, d in merged
    ] == [("a", 1000, {"x": 1, "y": 2, "seq": 0}), ("a", 2000, {"x": 3}), ("b", 2000, {"x": 4})]
    # a full fetch may have cut the last instant: it is left for the next one
    assert [ms for _, ms, _ in merge_rows(fetched, complete=False)] == [1000, 2000]


async def test_timeseries_documents_at_one_instant_are_one_reading_across_pages(
    mongo: Any, db: Any, db_name: str
) -> None:
    await db.create_collection("readings", timeseries={"timeField": "ts", "metaField": "meta"})
    ts = datetime(2026, 5, 1, 11, 5, tzinfo=UTC)  # before the served clock (11:10)
    # each instant written in three batches (three documents)
    await db.readings.insert_many(
        [
            {"ts": ts + timedelta(seconds=s), "meta": {"sensor_id": "s1"}, f"m{i}": float(i)}
            for s in range(3)
            for i in range(3)
        ]
    )
    async with serving(mongo, db_name, "timeseries") as url:
        import aiohttp  # noqa: PLC0415

        async with aiohttp.ClientSession() as http:
            apis = {"timeseries": url, "http": http}
            base = "/api/readings?sensor=s1&since=2026-05-01T11:00:00Z&limit=1"
            got, path = [], base
            while path:
                page = await get(apis, "timeseries", path)
                got += page["readings"]
                path = f"{base}&cursor={page['next']}" if page["next"] else ""
    assert [r["values"] for r in got] == [{"m0": 0.0, "m1": 1.0, "m2": 2.0}] * 3
    assert [r["ts"] for r in got] == [f"2026-05-01T11:05:0{s}.000Z" for s in range(3)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api-port", "70000"], "--api-port: must be between 0 and 65535"),
        (["--mongodb-uri", "http://x"], "--mongodb-uri: must start with mongodb://"),
        (["--mongodb-uri-file", "/nonexistent/uri"], "--mongodb-uri-file: cannot read"),
        (["--query-timeout", "0"], "--query-timeout: must be a finite number greater than 0"),
        (["--collection", "a.b"], "--collection: use letters"),
    ],
)
def test_api_command_refuses_bad_flags_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["api", *argv], env={}) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ingest: error: {message}")
    assert err.count("\n") == 1


def test_api_flags_come_from_the_environment_too() -> None:
    env = {"INGEST_MODE": "timeseries", "INGEST_API_PORT": "9000", "INGEST_DB": "plant"}
    settings = api_settings_from(build_parser(env).parse_args(["api"]))
    assert (settings.mode, settings.port, settings.db, settings.collection) == (
        "timeseries",
        9000,
        "plant",
        "readings",
    )


def test_the_page_order_comes_from_the_daemons_presets_and_mapping_file(tmp_path: Path) -> None:
    mapping = tmp_path / "mine.toml"
    mapping.write_text(
        '[page]\nfirst = ["soil_*"]\nlast = ["rssi"]\n\n'
        '[[rule]]\nname = "plants"\ntopic = "plants/{sensor_id}"\nformat = "json"\n'
    )
    env = {"INGEST_PRESET": "zigbee2mqtt,shelly"}
    args = build_parser(env).parse_args(["api", "--mapping", str(mapping)])
    first, last = api_settings_from(args, env).page_order
    # the file's patterns, then the presets' in the order given
    assert first[:3] == ("soil_*", "temperature", "humidity")
    assert first.index("apower") > first.index("soil_moisture")
    assert last[:2] == ("rssi", "battery*")
    assert "temperature_t?" in last
    # the daemon reads the same file: the table is checked and left out of the rules
    from ingest.devices.mapping import Mapping  # noqa: PLC0415

    assert [r.name for r in Mapping.load(str(mapping), []).rules] == ["plants"]
    # without presets, file and --grafana-url: the API's defaults and no Grafana link
    plain = api_settings_from(build_parser({}).parse_args(["api"]))
    assert plain.page_order == ((), ())
    assert plain.grafana_url == ""


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ('first = ["a b"]', "[page] first: a list of at most 100 measurement names or patterns"),
        ("last = 3", "[page] last: a list of at most 100"),
        ('order = ["x"]', "[page]: unknown key(s) order (known: first, last)"),
    ],
)
def test_a_bad_page_table_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], page: str, message: str
) -> None:
    mapping = tmp_path / "bad.toml"
    mapping.write_text(f'[page]\n{page}\n\n[[rule]]\nname = "x"\ntopic = "x/#"\n')
    for command in (["api"], ["check", "--topic-name", "x/y", "{}"]):
        assert main([*command, "--mapping", str(mapping)], env={}) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ingest: error: --mapping {mapping}: {message}"), err
        assert err.count("\n") == 1
