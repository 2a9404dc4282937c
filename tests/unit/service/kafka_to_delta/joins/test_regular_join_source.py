"""The regular join's input decoding without Spark: each record decoded by its input's decoder and
tagged with its side; the one starting-offsets option both inputs share."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.joins import RegularJoinSettings
from service.kafka_to_delta.joins.join_source import starting_offsets
from service.kafka_to_delta.joins.regular_join_source import SIDE, SidesDecoder
from vocabulary.errors import ConfigError


def settings(left_start: object = "earliest", right_start: object = "earliest") -> RegularJoinSettings:
    return RegularJoinSettings.model_validate({
        "name": "j", "table": "t", "type": "inner", "primary_key": ["order_id"],
        "left": {"topics": ["orders"], "primary_key": ["order_id"], "join_key": ["customer_id"],
                 "starting_offsets": left_start},
        "right": {"topics": ["customers"], "primary_key": ["id"], "join_key": ["id"],
                  "from_changelog": {"preset": "flat"}, "starting_offsets": right_start},
    })


def records(*items: tuple[str, dict, dict]) -> pa.RecordBatch:
    n = len(items)
    return pa.RecordBatch.from_pydict({
        "key": [json.dumps(k).encode() for _, k, _ in items], "value": [json.dumps(v).encode() for _, _, v in items],
        "topic": [t for t, _, _ in items], "partition": [0] * n, "offset": list(range(n)),
        "timestamp": [0] * n, "headers": [None] * n,
    }, schema=RAW_SCHEMA)


def test_each_record_is_decoded_by_its_inputs_decoder_and_tagged_with_its_side():
    batch = records(
        ("orders", {"order_id": 1}, {"before": None, "after": {"order_id": 1, "customer_id": 7}, "op": "c"}),
        ("customers", {"id": 7}, {"op": "INSERT", "id": 7, "name": "ann"}),
    )
    out = pa.Table.from_batches(list(SidesDecoder(settings())([batch])))
    rows = {r[SIDE]: r for r in out.to_pylist()}
    assert json.loads(rows["left"]["row"]) == {"order_id": 1, "customer_id": 7} and rows["left"]["kind"] == "+I"
    assert json.loads(rows["right"]["row"]) == {"id": 7, "name": "ann"} and rows["right"]["key"] == "[7]"


def test_both_inputs_share_one_starting_offsets_option():
    assert starting_offsets(settings()) == "earliest"
    both = starting_offsets(settings({"orders": {"0": 5}}, {"customers": {"0": 2}}))
    assert json.loads(both) == {"orders": {"0": 5}, "customers": {"0": 2}}
    with pytest.raises(ConfigError, match="both inputs"):
        starting_offsets(settings("earliest", "latest"))
