"""Reduce one micro-batch of changelog rows to at most one net change per primary key.

This is the path without the materializer (`upsert_materialize: none`, or `auto` when the
upsert key is the primary key and one input feeds the table): the last change of a key in
source order (topic, partition, offset, change_index: a record may hold a -U and its +U) wins.
A retraction (-U, -D) as the last change deletes the key. Rows that failed an earlier stage
are kept, one row each, so the driver can act on them.

When the last change leaves columns unchanged (Debezium could not read them: a TOAST value),
the key's row images of the batch from its last complete one (or delete) on travel along in
`EARLIER_IMAGES`: the stored value may only exist in this batch, the sink fills it from there
(after a delete, with null: `fill_unchanged`).

Both this reduction and the materializer produce `NET_SCHEMA`.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Iterable, Iterator

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.kafka_to_delta.materialize.fill_unchanged import DELETED_ROW
from service.kafka_to_delta.rows.ipc import ipc_bytes
from service.kafka_to_delta.rows.names import (
    CHANGES_COLUMN,
    EARLIER_IMAGES,
    PACKED_COLUMN,
    error_group_key,
)
from service.kafka_to_delta.rows.spark import NET_ARROW_SCHEMA, NET_SCHEMA
from vocabulary.changes import ChangeKind

_TRUNCATE_KEY_PREFIX = "\u0000truncate:"
TRUNCATE = "TRUNCATE"
_IMAGE_KINDS = (ChangeKind.INSERT.value, ChangeKind.UPDATE_BEFORE.value, ChangeKind.UPDATE_AFTER.value)


_NET_VALUES = itemgetter(*NET_ARROW_SCHEMA.names)


def net_table(rows: list[dict]) -> pa.Table:
    """`NET_SCHEMA` rows (dicts holding every name) as a table, built column by column from the rows'
    value tuples: 600 rows in 1.1-1.4 ms, against 2.0 ms a column at a time with `dict.get` and 4.5 ms
    row by row with `Table.from_pylist`."""
    columns = zip(*map(_NET_VALUES, rows)) if rows else [()] * len(NET_ARROW_SCHEMA)
    arrays = [pa.array(values, field.type) for values, field in zip(columns, NET_ARROW_SCHEMA)]
    return pa.Table.from_arrays(arrays, schema=NET_ARROW_SCHEMA)


def pack_net(rows: list[dict]) -> bytes:
    """`NET_SCHEMA` rows (dicts holding every name) as one Arrow IPC stream (`net_table`)."""
    return ipc_bytes(net_table(rows))


def unpack_net(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`NET_SCHEMA` record batches from a stream of either net rows or packed ones (`PACKED_NET_SPARK_SCHEMA`)."""
    for batch in batches:
        if batch.schema.names != [PACKED_COLUMN]:
            yield batch
            continue
        for blob in batch.column(0).to_pylist():
            yield from pa.ipc.open_stream(blob)

_CARRIED = ("kind", "row", "types", "unchanged", "topic", "partition", "offset", "timestamp")
_ERROR_CARRIED = ("error", "handling", "stage", "raw_key", "raw_value", "headers")


def _group_key() -> Column:
    coordinates = F.concat_ws(":", F.col("topic"), F.col("partition"), F.col("offset"))
    return (
        F.when(F.col("error").isNotNull(), F.concat(F.lit(error_group_key("")), coordinates))
        .when(F.col("kind") == TRUNCATE, F.concat(F.lit(_TRUNCATE_KEY_PREFIX), coordinates))
        .otherwise(F.col("key"))
    )


def _net_kind(kind: Column) -> Column:
    retraction = kind.isin(ChangeKind.UPDATE_BEFORE.value, ChangeKind.DELETE.value)
    return F.when(kind.isNull() | (kind == TRUNCATE), kind).when(retraction, F.lit(ChangeKind.DELETE.value)).otherwise(
        F.lit(ChangeKind.UPDATE_AFTER.value)
    )


def _image_aggregates(order: Column) -> list[Column]:
    """The key's last complete row image (or delete, whose row is `DELETED_ROW`) and its images
    that left columns unchanged."""
    deleted = F.col("kind") == ChangeKind.DELETE.value
    image = F.struct(order.alias("order"), F.when(deleted, F.lit(DELETED_ROW)).otherwise(F.col("row")).alias("row"),
                     F.when(deleted, F.lit(None).cast("string")).otherwise(F.col("unchanged")).alias("unchanged"))
    is_image = F.col("kind").isin(*_IMAGE_KINDS)
    complete = F.max_by(image, F.when((is_image & F.col("unchanged").isNull()) | deleted, order))
    partial = F.collect_list(F.when(is_image & F.col("unchanged").isNotNull(), image))
    return [complete.alias("complete"), partial.alias("partial")]


def _earlier_images() -> Column:
    """Row images from the last complete one on, in source order; null unless the net row lacks columns."""
    complete = F.col("complete")
    since = F.filter(F.col("partial"), lambda image: complete.isNull() | (image["order"] > complete["order"]))
    images = F.array_sort(F.when(complete.isNull(), since).otherwise(F.concat(F.array(complete), since)))
    shown = F.transform(images, lambda image: F.struct(image["row"].alias("row"),
                                                       image["unchanged"].alias("unchanged")))
    return F.when(F.col("last.unchanged").isNotNull(), shown)


def net_changes(changelog: DataFrame) -> DataFrame:
    """One row per key: the last change in source order, plus one row per failed record."""
    order = F.struct("topic", "partition", "offset", "change_index")
    carried = [F.col(c) for c in _CARRIED + _ERROR_CARRIED]
    last = F.max_by(F.struct(*carried, F.col("key").alias("source_key")), order)
    grouped = changelog.groupBy(_group_key().alias("group_key")).agg(
        last.alias("last"), F.count("*").alias(CHANGES_COLUMN), *_image_aggregates(order)
    )
    zero = F.lit(0).cast("long")
    columns = {
        "key": F.col("last.source_key"),
        "kind": _net_kind(F.col("last.kind")),
        CHANGES_COLUMN: F.col(CHANGES_COLUMN).cast("long"),
        **{c: F.col(f"last.{c}") for c in _CARRIED if c != "kind"},
        **{c: F.col(f"last.{c}") for c in _ERROR_CARRIED},
        **{c: zero for c in ("conflicts", "rollbacks", "stale_dropped", "cleared_state_warnings", "state_bytes")},
        EARLIER_IMAGES: _earlier_images(),
    }
    return grouped.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in NET_SCHEMA.fields])
