"""The per-batch reduction to net changes exists as a pair: `net_changes` (Spark, after a stateful
FROM_CHANGELOG stage) and `last_rows` + `filled_images` (Arrow, where a range is read and in the
regular join). Both keep each key's last change in source order, turn a retraction into a delete and
fill the columns it left unchanged from the key's earlier images; this test holds them equal."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from service.kafka_to_delta.materialize.fill_unchanged import filled_images, filled_net
from service.kafka_to_delta.materialize.last_change import last_rows
from service.kafka_to_delta.materialize.net_changes import net_changes
from service.kafka_to_delta.rows.arrow import CHANGELOG_SCHEMA
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.rows.spark import CHANGELOG_SPARK_SCHEMA

_RETRACTIONS = ("-U", "-D")


def _changelog(seed: int, records: int = 120, keys: int = 12) -> list[dict]:
    """Changelog rows of one topic in two partitions, in source order; some updates leave a column unchanged,
    in some of them the before image too (a null of an update under ignore_null_updates)."""
    rnd = random.Random(seed)
    rows, offsets = [], [0, 0]
    for _ in range(records):
        key = rnd.randrange(keys)
        partition = rnd.randrange(2)
        offset = offsets[partition]
        offsets[partition] += 1
        image = {"id": key, "a": rnd.randrange(100), "b": rnd.randrange(100)}
        roll = rnd.random()
        if roll < 0.2:
            kinds = [("-D", image, None)]
        elif roll < 0.45:
            before = (image, None) if rnd.random() < 0.5 else ({"id": key, "a": image["a"]}, ["b"])
            kinds = [("-U", *before), ("+U", {"id": key, "a": image["a"] + 1}, ["b"])]
        elif roll < 0.6:
            kinds = [("+U", {"id": key, "a": image["a"]}, ["b"])]
        else:
            kinds = [("+I" if roll < 0.8 else "+U", image, None)]
        for index, (kind, row, unchanged) in enumerate(kinds):
            rows.append({
                Column.TOPIC: "t", Column.PARTITION: partition, Column.OFFSET: offset, Column.CHANGE_INDEX: index,
                Column.TIMESTAMP: 1_700_000_000_000 + len(rows), Column.KIND: kind, Column.KEY: json.dumps([key]),
                Column.ROW: json.dumps(row, separators=(",", ":")),
                Column.UNCHANGED: None if unchanged is None else json.dumps(unchanged),
            })
    return [{name: row.get(name) for name in CHANGELOG_SCHEMA.names} for row in rows]


def _by_key(table: pa.Table) -> dict[str, tuple]:
    return {
        row[Column.KEY]: (row[Column.KIND], json.loads(row[Column.ROW]),
                          None if row[Column.UNCHANGED] is None else json.loads(row[Column.UNCHANGED]))
        for row in table.select([Column.KEY, Column.KIND, Column.ROW, Column.UNCHANGED]).to_pylist()
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_spark_and_the_arrow_reduction_agree(spark, seed):
    rows = _changelog(seed)
    changes = pa.Table.from_pylist(rows, schema=CHANGELOG_SCHEMA).sort_by(
        [(c, "ascending") for c in (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX)]
    )
    arrow_side = filled_images(last_rows(changes, Column.KEY), changes)
    kinds = ["-D" if kind in _RETRACTIONS else "+U" for kind in arrow_side.column(Column.KIND).to_pylist()]
    arrow_side = arrow_side.set_column(arrow_side.schema.get_field_index(Column.KIND), Column.KIND,
                                       pa.array(kinds, pa.string()))
    spark_side = filled_net(net_changes(spark.createDataFrame(rows, CHANGELOG_SPARK_SCHEMA)).toArrow())
    assert _by_key(spark_side) == _by_key(arrow_side)
    assert any(row[Column.UNCHANGED] for row in rows)  # the workload exercises the filling
