"""grafana/dashboards/sensors.json and its data source: built into Grafana, and answered.

The provisioning must work in a Grafana without internet access: every data source and
panel type is one Grafana 11 ships built in, and the compose stack installs no plugin.
The "Sensor readings" data source is Grafana's Prometheus data source pointed at
``ingest api`` with the API's token; every query of the dashboard on it (panels and
variables), with Grafana's macros and the variables filled in, is answered by a real API
over both layouts with data.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import promql_parser
import yaml

from ingest.cli import api_settings_from, build_parser
from tests.api.test_api import NOW, apis, fleet, get, write_both  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "grafana" / "dashboards" / "sensors.json"
DATASOURCES = ROOT / "grafana" / "provisioning" / "datasources"
COMPOSE = ROOT / "deploy" / "compose.yaml"
# What Grafana 11 (the stack's grafana/grafana:11.3.0) ships without plugins: its core
# data sources and panels (public/app/plugins/datasource and public/app/plugins/panel).
BUILT_IN_DATASOURCES = {
    "prometheus", "loki", "graphite", "influxdb", "elasticsearch", "mysql",
    "grafana-postgresql-datasource", "mssql", "tempo", "jaeger", "zipkin", "cloudwatch",
    "stackdriver", "grafana-azure-monitor-datasource", "grafana-testdata-datasource",
    "opentsdb", "alertmanager", "parca", "grafana-pyroscope-datasource", "grafana",
    "dashboard", "mixed",
}  # fmt: skip
BUILT_IN_PANELS = {
    "timeseries", "table", "barchart", "stat", "gauge", "bargauge", "text", "piechart",
    "heatmap", "histogram", "logs", "nodeGraph", "state-timeline", "status-history",
    "trend", "xychart", "geomap", "canvas", "news", "dashlist", "alertlist", "annolist",
    "candlestick", "flamegraph", "traces", "datagrid", "row",
}  # fmt: skip
_VARIABLE = re.compile(r"\$\{?(\w+)(?::\w+)?\}?")
GRAFANA_MACROS = {"__interval", "__range", "__rate_interval"}


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


def test_only_built_in_data_sources_and_panels_and_no_plugin() -> None:
    sources = provisioned()
    assert {s["type"] for s in sources.values()} <= BUILT_IN_DATASOURCES
    assert sources["iot-api"]["type"] == "prometheus"
    data = dashboard()
    assert data["uid"] == "iot-sensors"
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        assert panel["type"] in BUILT_IN_PANELS, panel["title"]
        assert panel["datasource"]["uid"] in sources, panel["title"]
        assert panel["datasource"]["type"] == sources[panel["datasource"]["uid"]]["type"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
    for variable in data["templating"]["list"]:
        assert variable["datasource"] == {"type": "prometheus", "uid": "iot-api"}
        assert variable["refresh"] == 2  # on time range change
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    assert "GF_INSTALL_PLUGINS" not in grafana["environment"]
    assert "GF_PLUGINS_PREINSTALL" not in grafana["environment"]


def test_every_query_parses_and_uses_defined_variables() -> None:
    data = dashboard()
    names = {v["name"] for v in data["templating"]["list"]} | GRAFANA_MACROS
    for where, expr in expressions(data):
        for used in _VARIABLE.findall(expr):
            assert used in names, f"{where}: ${used} is not defined"
        promql_parser.parse(filled(expr))


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
    # the data source sends the API's token, read by Grafana from the same file
    assert [t.name for t in settings.tokens] == ["line-1"]
    assert source["jsonData"]["httpHeaderName1"] == "Authorization"
    assert source["secureJsonData"]["httpHeaderValue1"] == f"Bearer $__file{{{mounted}}}"
    volume = f"api-token:{Path(mounted).parent}:ro"
    assert volume in service["volumes"]
    assert volume in compose["services"]["grafana"]["volumes"]


def expressions(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable on the API."""
    out = []
    for panel in data["panels"]:
        if panel["datasource"]["uid"] != "iot-api":
            continue
        out += [(f"panel {panel['title']!r}", t["expr"]) for t in panel["targets"]]
    for variable in data["templating"]["list"]:
        out.append((f"variable {variable['name']}", variable["query"]["query"]))
    return [(w, e) for w, e in out if not e.startswith("label_values(")]


def filled(expr: str, interval: str = "1h") -> str:
    """An expression with Grafana's macros and the variables filled in (a multi-value
    variable as Grafana formats it for Prometheus: a regex alternation)."""
    values = {
        "__interval": interval,
        "__range": "4h",
        "__rate_interval": "4m",
        "sensor": "s1|s2",
        "measurement": "temp",
    }
    return _VARIABLE.sub(lambda m: values[m.group(1)], expr)


async def test_every_query_is_answered_by_both_layouts(apis: dict[str, Any]) -> None:  # noqa: F811
    data = dashboard()
    end = NOW.timestamp()
    for panel in data["panels"]:
        if panel["datasource"]["uid"] != "iot-api":
            continue
        for target in panel["targets"]:
            for interval in ("1h", "10m"):  # bucket statistics, and raw readings
                expr = filled(target["expr"], interval)
                if target["instant"]:
                    path = "/api/v1/query?" + urlencode({"query": expr, "time": end})
                else:
                    params = {"query": expr, "start": end - 4 * 3600, "end": end, "step": 600}
                    path = "/api/v1/query_range?" + urlencode(params)
                for mode in ("bucket", "timeseries"):
                    answer = await get(apis, mode, path)
                    assert answer["status"] == "success"
                    assert answer["data"]["result"], (panel["title"], mode, expr)
    for variable in data["templating"]["list"]:
        label = re.fullmatch(r"label_values\((\w+)\)", variable["query"]["query"])
        assert label is not None
        for mode in ("bucket", "timeseries"):
            window = urlencode({"start": end - 4 * 3600, "end": end})
            answer = await get(apis, mode, f"/api/v1/label/{label.group(1)}/values?{window}")
            assert answer["data"], (variable["name"], mode)
