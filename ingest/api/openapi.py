"""The read API described in OpenAPI 3.1, served at ``/openapi.json``.

Built from the same tables the handlers use (:data:`ingest.api.query_params.ENDPOINT_PARAMETERS`,
:data:`ingest.api.query_params.LIMITS`, the ranges of times and steps), so the description lists
exactly the parameters each endpoint reads; tests/api/test_openapi.py checks it against the
routes and validates real answers against its schemas.
"""

from __future__ import annotations

from typing import Any

from ingest.api.query_params import (
    EARLIEST,
    ENDPOINT_PARAMETERS,
    LATEST,
    LIMITS,
    MAX_MEASUREMENTS,
    MAX_POINTS,
    MAX_SEARCH,
    MAX_SENSORS,
    MAX_STEP,
    MAX_TAG_PARAMETERS,
    MAX_WINDOW,
)
from ingest.api.read_queries import iso

type Schema = dict[str, Any]

_TIME = (
    f"ISO 8601 with a zone (2026-05-01T08:00:00Z), epoch milliseconds "
    f"(1777622400000), now, or now-<duration> (now-15m); from {iso(EARLIEST)} up to "
    f"(not including) {iso(LATEST)}."
)
_DURATION = (
    "A duration: 500ms, 30s, 5m, 1.5h, 1d, 1w; a bare number is seconds; from 1ms "
    f"to {MAX_STEP.days}d."
)
_NAMES = "Repeat the parameter or separate names by commas."

# (what the parameter is, where it differs by endpoint: endpoint -> text)
_ABOUT: dict[str, tuple[str, dict[str, str]]] = {
    "since": (
        f"Start of the window (included). {_TIME}",
        {
            "sensors": "Default: 24 hours before until.",
            "readings": "Default: 1 hour before until.",
            "series": "Default: 1 hour before until; rounded down to a whole step.",
            "rejects": "Default: 1 hour ago.",
        },
    ),
    "until": (
        f"End of the window (excluded). {_TIME} Default: now.",
        {"series": "Rounded up to a whole step."},
    ),
    "sensor": (
        (
            f"Sensor ids, at most {MAX_SENSORS}. Repeat the parameter or separate ids "
            "by a literal comma; a percent-encoded comma (%2C) is part of an id "
            "(sensor=a%2Cb asks for the sensor 'a,b')."
        ),
        {},
    ),
    "tag": (
        (
            f"Select series by tag: key:value (path:/boot), repeatable, at most "
            f"{MAX_TAG_PARAMETERS}, never split on commas. A series is selected when, for "
            "every key given, its tag of that key has one of the values given for it "
            "(tag=path:/&tag=path:/boot: either; tag=path:/&tag=host:h1: both)."
        ),
        {},
    ),
    "measurement": (
        f"Measurement names, at most {MAX_MEASUREMENTS}. {_NAMES}",
        {"readings": "Only readings with one of them, and only their values."},
    ),
    "step": (
        (
            f"{_DURATION} Default: 1m. Steps are aligned to the epoch; at most "
            f"{MAX_POINTS} points (steps x sensors x measurements) per answer."
        ),
        {},
    ),
    "search": (
        (
            "Only series whose sensor id, or one of whose tags written key=value "
            "(path=/boot), holds this text, ignoring case; at most "
            f"{MAX_SEARCH} characters."
        ),
        {},
    ),
    "limit": ("How many entries one answer holds at most.", {}),
    "cursor": ("The next value of the previous answer of the same endpoint.", {}),
}
_REQUIRED = {"readings": {"sensor"}, "series": {"sensor", "measurement"}}
_LISTS = {"sensor", "measurement", "tag"}  # repeatable
_SUMMARIES = {
    "sensors": "The series (sensor id and tags) that reported in a window: readings count, "
    "measurements, last seen, units, descriptive tags",
    "readings": "Raw readings of some series in a window, by series then time, paged",
    "series": "min/avg/max/count per step of some series' measurements",
    "rejects": "The latest rejections and their count by reason",
    "info": "What this API serves (layout, collection), the Grafana dashboard's address "
    "and the page's order of measurements",
}


def _parameter(endpoint: str, name: str) -> Schema:
    about, per_endpoint = _ABOUT[name]
    description = f"{about} {per_endpoint.get(endpoint, '')}".strip()
    schema: Schema
    if name in _LISTS:
        schema = {"type": "array", "items": {"type": "string"}}
    elif name == "limit":
        default, most = LIMITS[endpoint]
        schema = {"type": "integer", "minimum": 1, "maximum": most, "default": default}
    else:
        schema = {"type": "string"}
    out: Schema = {
        "name": name,
        "in": "query",
        "required": name in _REQUIRED.get(endpoint, ()),
        "description": description,
        "schema": schema,
    }
    if schema["type"] == "array":
        out |= {"style": "form", "explode": True}
    return out


def _object(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


_STRING: Schema = {"type": "string"}
_INSTANT: Schema = {"type": "string", "format": "date-time"}
_NEXT: Schema = {
    "type": ["string", "null"],
    "description": "A cursor for the next page, or null when this was the last.",
}
_VALUE: Schema = {"type": ["number", "boolean", "string"]}
_TAGS: Schema = {
    "type": "object",
    "additionalProperties": _STRING,
    "description": "The series' identity tags (keys in name order; {} for none).",
}
_LABEL: Schema = {
    "type": "string",
    "description": "The series' display name: h1, or h1{path=/boot} with tags.",
}
_WINDOW = {"since": _INSTANT, "until": _INSTANT}
_ANSWERS: dict[str, Schema] = {
    "sensors": _object(
        {
            **_WINDOW,
            "sensors": {
                "type": "array",
                "items": _object(
                    {
                        "sensor_id": _STRING,
                        "tags": _TAGS,
                        "label": _LABEL,
                        "first_seen": _INSTANT,
                        "last_seen": _INSTANT,
                        "readings": {"type": "integer"},
                        "measurements": {"type": "array", "items": _STRING},
                        "units": {"type": "object", "additionalProperties": _STRING},
                        "info": {
                            "type": "object",
                            "additionalProperties": _STRING,
                            "description": "Descriptive tags (not part of the series), the latest "
                            "stored.",
                        },
                    }
                ),
            },
            "next": _NEXT,
        }
    ),
    "readings": _object(
        {
            **_WINDOW,
            "readings": {
                "type": "array",
                "items": _object(
                    {
                        "sensor_id": _STRING,
                        "tags": _TAGS,
                        "ts": _INSTANT,
                        "seq": {"type": "integer"},
                        "values": {"type": "object", "additionalProperties": _VALUE},
                    },
                    ["sensor_id", "tags", "ts", "values"],
                ),
            },
            "next": _NEXT,
        }
    ),
    "series": _object(
        {
            **_WINDOW,
            "step_seconds": {"type": "number"},
            "source": {"enum": ["stats", "readings"]},
            "series": {
                "type": "array",
                "items": _object(
                    {
                        "sensor_id": _STRING,
                        "tags": _TAGS,
                        "label": _LABEL,
                        "measurement": _STRING,
                        "unit": {"type": ["string", "null"]},
                        "points": {
                            "type": "array",
                            "items": _object(
                                {
                                    "t": _INSTANT,
                                    "count": {"type": "integer"},
                                    "min": {"type": "number"},
                                    "avg": {"type": "number"},
                                    "max": {"type": "number"},
                                }
                            ),
                        },
                    }
                ),
            },
        }
    ),
    "rejects": _object(
        {
            "since": _INSTANT,
            "rejects": {
                "type": "array",
                "items": _object(
                    {
                        "at": _INSTANT,
                        "mode": _STRING,
                        "topic": _STRING,
                        "reason": _STRING,
                        "detail": _STRING,
                        "payload_bytes": {"type": "integer"},
                    },
                    ["at", "reason"],
                ),
            },
            "reasons": {
                "type": "array",
                "items": _object({"reason": _STRING, "count": {"type": "integer"}}),
            },
        }
    ),
    "info": _object(
        {
            "mode": {"enum": ["bucket", "timeseries"]},
            "db": _STRING,
            "collection": _STRING,
            "bucket_span_seconds": {"type": ["integer", "null"]},
            "grafana_dashboard": {
                "type": ["string", "null"],
                "description": "The Grafana Sensors dashboard (--grafana-url), or null.",
            },
            "measurement_order": _object(
                {
                    "first": {"type": "array", "items": _STRING},
                    "last": {"type": "array", "items": _STRING},
                },
            ),
        }
    ),
}
_ERROR = _object({"error": _object({"parameter": _STRING, "message": _STRING}, ["message"])})


def _json(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(endpoint: str) -> Schema:
    error = {"$ref": "#/components/schemas/error"}
    responses = {
        "200": _json("The answer.", {"$ref": f"#/components/schemas/{endpoint}"}),
        "400": _json("A bad or unknown parameter, named in the error.", error),
    }
    responses["401"] = _json(
        "No token, an unknown one, or an expired session (with --api-tokens-file).", error
    )
    if endpoint != "info":
        responses["429"] = _json(
            "The caller already runs --api-max-concurrent-queries "
            "queries; retry after Retry-After seconds.",
            error,
        )
        responses["503"] = _json("MongoDB did not answer in time or refused the query.", error)
    return {
        "get": {
            "operationId": endpoint,
            "summary": _SUMMARIES[endpoint],
            "parameters": [_parameter(endpoint, n) for n in ENDPOINT_PARAMETERS[endpoint]],
            "responses": responses,
        }
    }


def description(version: str) -> Schema:
    """The OpenAPI 3.1 document of the read API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "iot-ingest read API",
            "version": version,
            "description": "Read-only: sensors, raw readings, series and rejections of "
            "one collection (bucket or timeseries layout). Times are "
            "answered as ISO 8601 UTC with milliseconds. The sensors and "
            f"readings windows span at most {MAX_WINDOW.days} days.",
        },
        "paths": {f"/api/{e}": _operation(e) for e in ENDPOINT_PARAMETERS},
        "components": {
            "schemas": {**_ANSWERS, "error": _ERROR},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token of the API's --api-tokens-file.",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "ingest_session",
                    "description": "The page's session, from POST /login.",
                },
            },
        },
        # Either, when the API has tokens; without --api-tokens-file none is needed.
        "security": [{"bearer": []}, {"session": []}, {}],
    }
