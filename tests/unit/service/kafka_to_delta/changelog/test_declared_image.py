"""A record that declares its columns is read as its schema declares them (`changelog.declared_image`): the
same values spelled otherwise give the same changelog row text, the one the bulk decoder writes."""

from __future__ import annotations

import json

import pyarrow as pa

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.declared_image import DeclaredImage
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.source.decode_stage import batch_decoder

_TYPES = {"id": "int64", "amount": "float64", "name": "string", "ratio": "float32"}


def test_an_image_in_declared_form_is_returned_as_it_is() -> None:
    image = {"id": 1, "amount": 2.5, "name": "a", "ratio": None}
    assert DeclaredImage(_TYPES)(image) is image


def test_declared_order_missing_columns_null_undeclared_ones_dropped() -> None:
    image = {"extra": [1], "name": "a", "id": 1, "amount": 2.5}
    declared = DeclaredImage(_TYPES)(image)
    assert list(declared.items()) == [("id", 1), ("amount", 2.5), ("name", "a"), ("ratio", None)]
    assert list(image) == ["extra", "name", "id", "amount"]  # never changed in place


def test_a_float_columns_integer_literal_is_its_float() -> None:
    declared = DeclaredImage(_TYPES)({"id": 7, "amount": 12345678901234567890, "name": None, "ratio": 1})
    assert declared == {"id": 7, "amount": 1.2345678901234567e19, "name": None, "ratio": 1.0}
    assert type(declared["id"]) is int and type(declared["ratio"]) is float
    assert DeclaredImage(_TYPES)({"id": 1, "amount": True, "name": None, "ratio": None})["amount"] is True
    beyond = 10**400  # beyond any float: left as it is, for the fit check to refuse
    assert DeclaredImage(_TYPES)({"id": 1, "amount": beyond, "name": None, "ratio": None})["amount"] == beyond


def _schema() -> dict:
    fields = [{"field": "id", "type": "int64", "optional": False}, {"field": "amount", "type": "double", "optional": True},
              {"field": "name", "type": "string", "optional": True}]
    image = {"type": "struct", "optional": True, "fields": fields}
    return {"type": "struct", "fields": [{**image, "field": "before"}, {**image, "field": "after"},
                                         {"field": "op", "type": "string"}]}


def test_the_same_values_spelled_otherwise_give_one_row_text() -> None:
    spellings = ['{"id":1,"amount":1.0,"name":"a"}', '{"name":"a","amount":1,"id":1}', '{"id":1,"amount":1e0,"name":"a"}',
                 '{ "amount" : 1.00, "id" : 1, "name" : "a" }']
    values = [('{"schema":%s,"payload":{"before":null,"after":%s,"op":"u"}}' % (json.dumps(_schema()), after)).encode()
              for after in spellings]
    values.append(b'{"schema":%s,"payload":{"before":null,"after":{"id":1,"name":"a"},"op":"u"}}'
                  % json.dumps(_schema()).encode())  # a declared column left out: null
    n = len(values)
    batch = pa.RecordBatch.from_pydict({
        "key": [b'{"id":1}'] * n, "value": values, "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(n), pa.int64()), "timestamp": pa.nulls(n, RAW_SCHEMA.field("timestamp").type),
        "headers": pa.nulls(n, RAW_SCHEMA.field("headers").type)}, schema=RAW_SCHEMA)
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    rows = batch_decoder(pipeline)(batch).column(Column.ROW).to_pylist()
    assert rows[:4] == ['{"id":1,"amount":1.0,"name":"a"}'] * 4
    assert rows[4] == '{"id":1,"amount":null,"name":"a"}'
