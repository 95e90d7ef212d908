"""``/openapi.json`` describes the real API: its routes, each endpoint's parameters (no
more, no fewer, required where the API requires them) and the shape of its answers."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from ingest import __version__
from ingest.api.openapi import description
from ingest.api.server import ReadApi
from ingest.config import ApiSettings
from tests.api.test_api import apis, get  # noqa: F401 - fixtures

DOC = description(__version__)
# a valid value of each parameter, for each endpoint's happy path
VALID = {
    "since": "2026-05-01T08:00:00Z",
    "until": "2026-05-01T10:00:00Z",
    "sensor": "s1,s2",
    "measurement": "temp,on",
    "step": "1h",
    "limit": "5",
    "cursor": "",
    "tag": "room:kitchen",
    "search": "s",
}


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    )


def test_the_description_lists_exactly_the_api_routes(mongo: Any) -> None:
    app = ReadApi(ApiSettings(), mongo).app()
    routes = {
        r.resource.canonical
        for r in app.router.routes()
        if r.method == "GET"
        and r.resource is not None
        and r.resource.canonical.startswith("/api/")
        # Prometheus' query API (ingest.api.prom_http) is described by Prometheus' docs
        and not r.resource.canonical.startswith("/api/v1/")
    }
    assert set(DOC["paths"]) == routes
    assert DOC["openapi"] == "3.1.0"
    for schema in DOC["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def query(names: list[str]) -> str:
    return "&".join(f"{n}={VALID[n]}" for n in names)


async def test_each_endpoint_reads_the_parameters_described_and_refuses_others(
    apis: dict[str, Any],  # noqa: F811
) -> None:
    known = {p["name"] for op in DOC["paths"].values() for p in op["get"]["parameters"]}
    for path, operation in DOC["paths"].items():
        parameters = operation["get"]["parameters"]
        names = [p["name"] for p in parameters]
        required = [p["name"] for p in parameters if p["required"]]
        endpoint = path.removeprefix("/api/")
        answer = validator(endpoint)
        for mode in ("bucket", "timeseries"):
            # every parameter described, at once: an answer of the described shape
            body = await get(apis, mode, f"{path}?{query(names)}")
            answer.validate(body)
            # only the required ones: an answer too
            answer.validate(await get(apis, mode, f"{path}?{query(required)}"))
            # each required one left out: a 400 naming it
            for name in required:
                rest = [n for n in names if n != name]
                error = await get(apis, mode, f"{path}?{query(rest)}", status=400)
                validator("error").validate(error)
                assert error["error"]["parameter"] == name, (path, error)
            # a parameter of another endpoint: a 400 naming it
            for name in sorted(known - set(names)):
                error = await get(apis, mode, f"{path}?{query([*required, name])}", status=400)
                assert error["error"]["parameter"] == name, (path, error)
                assert "unknown parameter" in error["error"]["message"]


async def test_answers_with_data_match_their_schemas(apis: dict[str, Any]) -> None:  # noqa: F811
    window = "since=2026-05-01T08:00:00Z&until=2026-05-01T11:00:00Z"
    for mode in ("bucket", "timeseries"):
        sensors = await get(apis, mode, f"/api/sensors?{window}")
        assert sensors["sensors"]
        validator("sensors").validate(sensors)
        readings = await get(apis, mode, f"/api/readings?sensor=s1,s2&{window}&limit=50")
        assert readings["next"]
        assert any("seq" in r for r in readings["readings"])
        validator("readings").validate(readings)
        series = await get(
            apis, mode, f"/api/series?sensor=s1,s2,s3&measurement=temp,hum,on&{window}&step=10m"
        )
        assert series["series"]
        validator("series").validate(series)
        rejects = await get(apis, mode, "/api/rejects")
        assert rejects["rejects"]
        validator("rejects").validate(rejects)
        validator("info").validate(await get(apis, mode, "/api/info"))


async def test_the_api_serves_its_description(apis: dict[str, Any]) -> None:  # noqa: F811
    async with apis["http"].get(apis["bucket"] + "/openapi.json") as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        assert await resp.json() == DOC
