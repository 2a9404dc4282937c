"""The state one range's vectorised decode holds (`RangeState`: the fields of
`debezium_columns.RangeColumns`, which its parts `version_parse` and `envelope_rows` read and extend),
and the columns of its changelog rows besides the row columns: the key text, retraction, schema version
(`GROUP_COLUMN`), image and source columns, the JSON list of the columns left to the sink, a flag per
column holding the unavailable-value placeholder (`_FLAG`), and the texts `RangeColumns.with_texts` adds;
with the helpers the parts share (`_mask`, `_shown`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.arrow_types import TypeName
from service.kafka_to_delta.formats.debezium_json import JsonDocuments
from service.kafka_to_delta.rows.names import Column
from service.kafka_to_delta.source.vector_plan import VectorPlan
from service.kafka_to_delta.source.wrapper_layouts import Layout, Layouts

_META = ("__vec_key", "__vec_retract", "__vec_group", "__vec_image", "__vec_topic", "__vec_partition",
         "__vec_offset", "__vec_change_index", "__vec_timestamp", "__vec_unchanged")
_KEY, _RETRACT, _GROUP, _IMAGE, _TOPIC, _PARTITION, _OFFSET, _CHANGE_INDEX, _TIMESTAMP, _UNCHANGED = _META
GROUP_COLUMN, KEY_COLUMN = _GROUP, _KEY
"""The net rows' schema version (a `Layouts` index, or `wrapper_layouts.BARE`)."""
SOURCE_COLUMNS = {Column.TOPIC: _TOPIC, Column.PARTITION: _PARTITION, Column.OFFSET: _OFFSET,
                  Column.CHANGE_INDEX: _CHANGE_INDEX, Column.TIMESTAMP: _TIMESTAMP}
"""A changelog row's source columns -> the columns holding them here."""
TEXT_COLUMNS = ("__vec_row_text", "__vec_kind", "__vec_unchanged_text")
ROW_TEXT, KIND, UNCHANGED_TEXT = TEXT_COLUMNS
"""The columns `RangeColumns.with_texts` adds to each changelog row."""
_FLAG = "__vec_kept__"
"""Prefix of the per-column flag of a value left unchanged (the placeholder)."""
_RECORD = "__record"
_INFERRED_KINDS = {pa.int64(): TypeName.INT64, pa.float64(): TypeName.FLOAT64, pa.bool_(): TypeName.BOOL,
                   pa.string(): TypeName.STRING}
_ERROR_COLUMN = re.compile(r"Column\((/[^)]*)\)")


def _mask(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), np.bool_)


def _shown(error: Exception) -> str:
    """An Arrow error without the values it may quote (rows may carry personal data): its kind,
    and the column path when it names one."""
    column = _ERROR_COLUMN.search(str(error))
    return type(error).__name__ + (f" at {column.group(1)}" if column else "")


@dataclass
class RangeState:
    """What `RangeColumns` holds of one range while it decodes its chunks (its parts share it)."""

    plan: VectorPlan
    documents: JsonDocuments | Any
    """The value decoder: JSON documents, or the Confluent Avro decoder."""
    changes: int = 0
    topic: str | None = None
    partition: int | None = None
    layouts: Layouts | None = None
    bare_types: dict[str, pa.DataType] = field(default_factory=dict)
    """Columns of schema-less documents of known type (parsed as such in later batches)."""
    order: dict[str, None] = field(default_factory=dict)
    """Every row column, in order of first appearance (null-typed ones included)."""
    net: pa.Table | None = None
    """The last change per key of the chunks reduced so far (`reduced` folds in those added since)."""
    odd: list[int] = field(default_factory=list)
    """Offsets of the records left to the record-by-record way."""
    avro: Any = None
    """The bulk Avro decoder (`avro_columns.BulkAvroDecoder`) when the values are Confluent Avro."""
    _avro_groups: dict[int, int] = field(default_factory=dict)
    typed_groups: set[int] = field(default_factory=set)
    """Groups whose columns arrive typed (Avro): no JSON value checks."""
    nested_types: dict[int, dict[str, pa.DataType]] = field(default_factory=dict)
    """Per group: nested columns parsed with the type Arrow inferred for them (`_valid_lists`)."""
    held: dict[str, pa.Table] = field(default_factory=dict)
    """Per column a placeholder stood for: the key's latest image value of the range holding it,
    null where a delete came after it (`_track_placeholders`), once `_held_pending` is folded in."""
    with_texts: bool = False
    """Whether each changelog row also carries its image as the text the record-by-record way writes
    (`ROW_TEXT`, from the values in the reference document's form), its change kind (`KIND`) and its
    unchanged columns (`UNCHANGED_TEXT`): the decode stage's rows (`changelog_columns`)."""
    with_typed: bool = False
    """With `with_texts`: each changelog row of a record declaring its columns (Avro, JSON with a schema block)
    also carries its image's columns typed as the row's declared types type them (`TYPED_PREFIX` columns,
    `TYPED_IMAGE` where they hold the image)."""
    _pending: list[pa.Table] = field(default_factory=list)
    """Changelog rows of chunks added since the last `reduced`."""
    _held_pending: dict[str, list[pa.Table]] = field(default_factory=dict)
    reads_envelope: ClassVar[bool] = False
    """Whether the changelog rows take envelope fields besides the op and the images (then they are parsed)."""

    def _layout(self, group: int) -> Layout:
        assert self.layouts is not None
        return self.layouts.known[group]
