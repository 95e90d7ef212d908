"""grafana/dashboards/sensors.json: its structure, its data source, and URLs the API answers.

Every Infinity query (panels and variables) names the provisioned data source by uid,
asks an endpoint of the API with parameters it knows, and uses only variables the
dashboard defines; with Grafana's macros filled in, each URL is asked of a real API
over both layouts and must answer 200 with the field the query's root selector reads.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlsplit

import yaml

from ingest.api.query_params import ENDPOINT_PARAMETERS
from ingest.api.server import ReadApi, api_client
from ingest.cli import api_settings_from, build_parser
from ingest.config import ApiSettings
from tests.api.test_api import NOW, apis, fleet, get, write_both  # noqa: F401 - fixtures

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "dashboards" / "sensors.json"
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources"
COMPOSE = ROOT / "deploy" / "compose.yaml"
INFINITY = "yesoreyeram-infinity-datasource"
GRAFANA_MACROS = {"__from", "__to", "__interval_ms", "__interval"}
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?")


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def provisioned() -> dict[str, dict[str, Any]]:
    sources: dict[str, dict[str, Any]] = {}
    for path in DATASOURCES.glob("*.yaml"):
        for source in yaml.safe_load(path.read_text())["datasources"]:
            sources[source["uid"]] = source
    return sources


def queries(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, Infinity query) for every panel target and query variable."""
    for panel in data["panels"]:
        for target in panel["targets"]:
            yield f"panel {panel['title']!r}", target
    for variable in data["templating"]["list"]:
        yield f"variable {variable['name']}", variable["query"]["infinityQuery"]


def test_structure_and_data_source() -> None:
    data = dashboard()
    assert data["uid"] == "iot-sensors"
    sources = provisioned()
    assert sources["iot-api"]["type"] == INFINITY
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids))
    kinds = {panel["type"] for panel in data["panels"]}
    assert {"timeseries", "table", "barchart"} <= kinds
    names = {v["name"] for v in data["templating"]["list"]}
    assert names == {"sensor", "measurement"}
    for panel in data["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["datasource"] == {"type": INFINITY, "uid": "iot-api"}
        assert panel.get("repeat") in {None, *names}
    for variable in data["templating"]["list"]:
        assert variable["datasource"] == {"type": INFINITY, "uid": "iot-api"}
        assert variable["query"]["queryType"] == "infinity"
        assert variable["refresh"] == 2  # on time range change: the API is asked per window
    for where, query in queries(data):
        assert query["datasource"] == {"type": INFINITY, "uid": "iot-api"}, where
        assert query["type"] == "json", where
        assert query["source"] == "url", where
        assert query["parser"] == "backend", where


def test_series_panel_draws_each_series_named_by_its_tags() -> None:
    panel = next(p for p in dashboard()["panels"] if p["type"] == "timeseries")
    target = panel["targets"][0]
    columns = {c["selector"]: c["type"] for c in target["columns"]}
    assert columns == {
        "t": "timestamp",
        "series": "string",
        "min": "number",
        "avg": "number",
        "max": "number",
    }
    # rows of every series (the root selector reads each one's label), made one field per
    # series and figure by Infinity (format timeseries: a long frame becomes wide, the
    # string column a label), named by that label in the legend
    assert target["format"] == "timeseries"
    assert target["root_selector"].startswith("series.($label := label;")
    assert panel["fieldConfig"]["defaults"]["displayName"] == (
        "${__field.labels.series} ${__field.name}"
    )
    # a sensor id is sent percent-encoded: a comma in it is not a separator
    assert "sensor=${sensor:percentencode}" in target["url"]


def test_tables_and_bars_name_series_by_their_label() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    assert '"series": label' in panels["Last seen"]["targets"][0]["root_selector"]
    bars = panels["Readings per series"]
    assert bars["options"]["xField"] == "series"
    assert [c["selector"] for c in bars["targets"][0]["columns"]] == ["series", "readings"]


def test_time_columns_parse_the_api_times() -> None:
    # The API writes ISO 8601 UTC with milliseconds and Z (reads.iso); the backend
    # parser reads them with Go's RFC 3339 layout, fractional seconds included.
    for where, query in queries(dashboard()):
        for column in query["columns"]:
            if column["type"] == "timestamp":
                assert column["timestampFormat"] == "2006-01-02T15:04:05.999999999Z07:00", where


async def test_urls_ask_existing_endpoints_with_known_parameters_and_variables() -> None:
    data = dashboard()
    variables = {v["name"] for v in data["templating"]["list"]} | GRAFANA_MACROS
    client = api_client(ApiSettings())
    routes = {
        r.resource.canonical
        for r in ReadApi(ApiSettings(), client).app().router.routes()
        if r.resource is not None
    }
    await client.close()
    for where, query in queries(data):
        url = urlsplit(query["url"])
        assert url.path in routes, f"{where}: {url.path} is not an API endpoint"
        known = ENDPOINT_PARAMETERS[url.path.removeprefix("/api/")]
        for name, value in parse_qsl(url.query):
            assert name in known, f"{where}: {url.path} does not read {name}"
            for used in _VARIABLE.findall(value):
                assert used in variables, f"{where}: ${used} is not defined"
    for panel in data["panels"]:
        for used in _VARIABLE.findall(panel["title"]):
            assert used in variables, f"panel title uses undefined ${used}"


def filled(url: str, sensor: str = "s1") -> str:
    """A dashboard URL with Grafana's macros and the variables filled in (percent-encoded
    where the URL says so, as Infinity sends every value)."""
    since = int((NOW.timestamp() - 4 * 3600) * 1000)
    values = {
        "__from": str(since),
        "__to": str(int(NOW.timestamp() * 1000)),
        "__interval_ms": "600000",
        "sensor": sensor,
        "measurement": "temp",
    }
    return _VARIABLE.sub(lambda m: quote(values[m.group(1)], safe=""), url)


async def test_every_query_is_answered_by_both_layouts(apis: dict[str, Any]) -> None:  # noqa: F811
    for where, query in queries(dashboard()):
        for mode in ("bucket", "timeseries"):
            answer = await get(apis, mode, filled(query["url"]))
            # the first name in the root selector that the answer has: what it reads
            key = next(w for w in re.findall(r"[a-z_]+", query["root_selector"]) if w in answer)
            assert answer[key], f"{where} ({mode}): nothing under {key}"
    # the series panel of s2 (two series: its tag changed) gets both, each with its label
    panel = next(p for p in dashboard()["panels"] if p["type"] == "timeseries")
    for mode in ("bucket", "timeseries"):
        answer = await get(apis, mode, filled(panel["targets"][0]["url"], "s2"))
        assert [s["label"] for s in answer["series"]] == ["s2{room=attic}", "s2{room=hall}"]


def test_compose_runs_the_api_where_the_data_source_points(tmp_path: Path) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    service = compose["services"]["api"]
    env = {k: str(v) for k, v in service["environment"].items()}
    mounted = env["INGEST_API_TOKENS_FILE"]
    (tmp_path / "token").write_text(secrets.token_urlsafe(32) + "\n")
    env["INGEST_API_TOKENS_FILE"] = str(tmp_path / "token")
    settings = api_settings_from(build_parser(env).parse_args(service["command"]), env)
    source = provisioned()["iot-api"]
    assert source["url"] == f"http://api:{settings.port}"
    assert source["url"] in source["jsonData"]["allowedHosts"]
    # the data source sends the API's token, read by Grafana from the same file
    assert [t.name for t in settings.tokens] == ["line-1"]
    assert source["jsonData"]["auth_method"] == "bearerToken"
    assert source["secureJsonData"]["bearerToken"] == f"$__file{{{mounted}}}"
    volume = f"api-token:{Path(mounted).parent}:ro"
    assert volume in service["volumes"]
    assert volume in compose["services"]["grafana"]["volumes"]
    grafana = compose["services"]["grafana"]["environment"]
    assert grafana["GF_INSTALL_PLUGINS"].split()[0] == INFINITY
