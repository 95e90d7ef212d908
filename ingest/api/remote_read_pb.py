"""Prometheus remote read messages, built with ``protobuf`` at import (no generated code).

The messages and field numbers are those of Prometheus' ``prompb/remote.proto`` and
``prompb/types.proto`` (package ``prometheus``, proto3), the ones remote read uses: a
``ReadRequest`` of queries (time range, label matchers, hints) and a ``ReadResponse`` of
time series with samples. Written as a ``FileDescriptorProto`` as
:mod:`ingest.devices.formats.sparkplug_pb` is, so no ``protoc`` step is needed. Fields of
those files that remote read of float samples never sends (exemplars, histograms,
chunks) are left out: a parser keeps them as unknown fields.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "prometheus"
_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {
    "double": _F.TYPE_DOUBLE,
    "int64": _F.TYPE_INT64,
    "string": _F.TYPE_STRING,
    "bool": _F.TYPE_BOOL,
}
# message -> (name, number, type, repeated); a type not in _TYPES is a message or an enum
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "Sample": [("value", 1, "double", False), ("timestamp", 2, "int64", False)],
    "Label": [("name", 1, "string", False), ("value", 2, "string", False)],
    "LabelMatcher": [
        ("type", 1, ".prometheus.LabelMatcher.Type", False),
        ("name", 2, "string", False),
        ("value", 3, "string", False),
    ],
    "ReadHints": [
        ("step_ms", 1, "int64", False),
        ("func", 2, "string", False),
        ("start_ms", 3, "int64", False),
        ("end_ms", 4, "int64", False),
        ("grouping", 5, "string", True),
        ("by", 6, "bool", False),
        ("range_ms", 7, "int64", False),
    ],
    "TimeSeries": [
        ("labels", 1, ".prometheus.Label", True),
        ("samples", 2, ".prometheus.Sample", True),
    ],
    "Query": [
        ("start_timestamp_ms", 1, "int64", False),
        ("end_timestamp_ms", 2, "int64", False),
        ("matchers", 3, ".prometheus.LabelMatcher", True),
        ("hints", 4, ".prometheus.ReadHints", False),
    ],
    "ReadRequest": [
        ("queries", 1, ".prometheus.Query", True),
        ("accepted_response_types", 2, ".prometheus.ReadRequest.ResponseType", True),
    ],
    "QueryResult": [("timeseries", 1, ".prometheus.TimeSeries", True)],
    "ReadResponse": [("results", 1, ".prometheus.QueryResult", True)],
}
_ENUMS = {
    "LabelMatcher": ("Type", ["EQ", "NEQ", "RE", "NRE"]),
    "ReadRequest": ("ResponseType", ["SAMPLES", "STREAMED_XOR_CHUNKS"]),
}
MATCHER_OPS = {0: "=", 1: "!=", 2: "=~", 3: "!~"}
SAMPLES, STREAMED_XOR_CHUNKS = 0, 1


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="ingest_prometheus_remote.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        if name in _ENUMS:
            enum_name, values = _ENUMS[name]
            enum = message.enum_type.add(name=enum_name)
            for number, value in enumerate(values):
                enum.value.add(name=value, number=number)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(
                name=field_name,
                number=number,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if kind in _TYPES:
                field.type = _TYPES[kind]
            else:
                field.type_name = kind
                is_enum = kind.rsplit(".", 1)[-1] in {"Type", "ResponseType"}
                field.type = _F.TYPE_ENUM if is_enum else _F.TYPE_MESSAGE
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
ReadRequest: Any = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName(f"{PACKAGE}.ReadRequest")
)
ReadResponse: Any = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName(f"{PACKAGE}.ReadResponse")
)
