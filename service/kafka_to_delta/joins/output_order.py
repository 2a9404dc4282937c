"""A join's output columns in the documented order (left or probe columns, then right or build columns),
whatever types its inputs declare.

The sink types a batch from the `types` its rows carry (declared: a Connect schema block, Avro) and
infers the other columns from the values, declared columns first; a new table takes that order. When
only the right (build) input declares its types, its columns would come first. `in_output_order`
hands the sink one complete types map in the rows' own column order: declared types as the rows carry
them (merged as the sink merges them), the other columns inferred from the batch's upserts as the sink
infers them. A batch without declared types, or without upserts, is left as it is.
"""

from __future__ import annotations

import orjson
import pyarrow as pa

from connectors.delta.arrow_types import infer_types, merge_types
from service.kafka_to_delta.formats.debezium_json import compact_json
from vocabulary.changes import ChangeKind


def in_output_order(net: pa.Table) -> pa.Table:
    """`net` (key, kind, row, types) with every row's `types` the batch's complete map in column order."""
    texts = net.column("types").to_pylist()
    if all(text is None for text in texts):
        return net
    images = [text for kind, text in zip(net.column("kind").to_pylist(), net.column("row").to_pylist())
              if kind != ChangeKind.DELETE.value and text is not None]
    if not images:
        return net
    declared: dict[str, str] = {}
    for text in dict.fromkeys(t for t in texts if t is not None):
        declared = merge_types(declared, orjson.loads(text))
    rows = [orjson.loads(text) for text in images]
    inferred = infer_types(rows)
    ordered = {}
    for column in dict.fromkeys(c for row in rows for c in row):
        kind = declared.get(column) or inferred.get(column)
        if kind is not None:
            ordered[column] = kind
    ordered.update({c: k for c, k in declared.items() if c not in ordered})
    whole = compact_json(ordered)
    index = net.schema.get_field_index("types")
    return net.set_column(index, net.schema.field(index), pa.array([whole] * net.num_rows, pa.string()))
