"""The Sparkplug B payload schema, built with ``protobuf`` at import (no generated code).

The messages and field numbers are those of the Sparkplug 3.0 specification's
``sparkplug_b.proto`` (package ``org.eclipse.tahu.protobuf``, proto2), written here as a
``FileDescriptorProto`` so no ``protoc`` step and no generated file are needed. Parsing
runs in protobuf's C implementation (upb). Extension ranges of the schema are left out:
fields in them arrive as unknown fields, which the decoder never reads.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "org.eclipse.tahu.protobuf"
_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_TYPES = {
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
# (name, number, type, repeated, oneof "value"): a type not in _TYPES is a message
# type, named relative to Payload.
type _Field = tuple[str, int, str, bool, bool]

# The scalar members of every ``oneof value`` in the schema, from this field number on.
_VALUE_SCALARS = ("uint32", "uint64", "float", "double", "bool", "string")
_VALUE_NAMES = (
    "int_value",
    "long_value",
    "float_value",
    "double_value",
    "boolean_value",
    "string_value",
)


def _values(first: int) -> list[_Field]:
    return [
        (name, first + i, kind, False, True)
        for i, (name, kind) in enumerate(zip(_VALUE_NAMES, _VALUE_SCALARS, strict=True))
    ]


_MESSAGES: dict[str, list[_Field]] = {
    "Payload": [
        ("timestamp", 1, "uint64", False, False),
        ("metrics", 2, "Metric", True, False),
        ("seq", 3, "uint64", False, False),
        ("uuid", 4, "string", False, False),
        ("body", 5, "bytes", False, False),
    ],
    "Template": [
        ("version", 1, "string", False, False),
        ("metrics", 2, "Metric", True, False),
        ("parameters", 3, "Template.Parameter", True, False),
        ("template_ref", 4, "string", False, False),
        ("is_definition", 5, "bool", False, False),
    ],
    "Template.Parameter": [
        ("name", 1, "string", False, False),
        ("type", 2, "uint32", False, False),
        *_values(3),
        ("extension_value", 9, "Template.Parameter.ParameterValueExtension", False, True),
    ],
    "Template.Parameter.ParameterValueExtension": [],
    "DataSet": [
        ("num_of_columns", 1, "uint64", False, False),
        ("columns", 2, "string", True, False),
        ("types", 3, "uint32", True, False),
        ("rows", 4, "DataSet.Row", True, False),
    ],
    "DataSet.DataSetValue": [
        *_values(1),
        ("extension_value", 7, "DataSet.DataSetValue.DataSetValueExtension", False, True),
    ],
    "DataSet.DataSetValue.DataSetValueExtension": [],
    "DataSet.Row": [("elements", 1, "DataSet.DataSetValue", True, False)],
    "PropertyValue": [
        ("type", 1, "uint32", False, False),
        ("is_null", 2, "bool", False, False),
        *_values(3),
        ("propertyset_value", 9, "PropertySet", False, True),
        ("propertysets_value", 10, "PropertySetList", False, True),
        ("extension_value", 11, "PropertyValue.PropertyValueExtension", False, True),
    ],
    "PropertyValue.PropertyValueExtension": [],
    "PropertySet": [
        ("keys", 1, "string", True, False),
        ("values", 2, "PropertyValue", True, False),
    ],
    "PropertySetList": [("propertyset", 1, "PropertySet", True, False)],
    "MetaData": [
        ("is_multi_part", 1, "bool", False, False),
        ("content_type", 2, "string", False, False),
        ("size", 3, "uint64", False, False),
        ("seq", 4, "uint64", False, False),
        ("file_name", 5, "string", False, False),
        ("file_type", 6, "string", False, False),
        ("md5", 7, "string", False, False),
        ("description", 8, "string", False, False),
    ],
    "Metric": [
        ("name", 1, "string", False, False),
        ("alias", 2, "uint64", False, False),
        ("timestamp", 3, "uint64", False, False),
        ("datatype", 4, "uint32", False, False),
        ("is_historical", 5, "bool", False, False),
        ("is_transient", 6, "bool", False, False),
        ("is_null", 7, "bool", False, False),
        ("metadata", 8, "MetaData", False, False),
        ("properties", 9, "PropertySet", False, False),
        *_values(10),
        ("bytes_value", 16, "bytes", False, True),
        ("dataset_value", 17, "DataSet", False, True),
        ("template_value", 18, "Template", False, True),
        ("extension_value", 19, "Metric.MetricValueExtension", False, True),
    ],
    "Metric.MetricValueExtension": [],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="ingest_sparkplug_b.proto", package=PACKAGE, syntax="proto2"
    )
    payload = proto.message_type.add(name="Payload")
    built: dict[str, descriptor_pb2.DescriptorProto] = {"Payload": payload}
    for path in sorted(_MESSAGES, key=lambda p: p.count(".")):  # parents first
        if path == "Payload":
            continue
        parent, _, name = path.rpartition(".")
        built[path] = (built[parent] if parent else payload).nested_type.add(name=name)
    for path, fields in _MESSAGES.items():
        message = built[path]
        if any(oneof for *_, oneof in fields):
            message.oneof_decl.add(name="value")
        for name, number, kind, repeated, oneof in fields:
            field = message.field.add(
                name=name, number=number, label=_REPEATED if repeated else _OPTIONAL
            )
            if kind in _TYPES:
                field.type = _TYPES[kind]
            else:
                field.type = _F.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.Payload.{kind}"
            if oneof:
                field.oneof_index = 0
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
#: The Sparkplug B ``Payload`` message class (``Payload.FromString(data)`` parses).
Payload: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.Payload"))
