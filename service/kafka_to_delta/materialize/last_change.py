"""The last change per key of rows in source order, in Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def last_rows(table: pa.Table, key: str) -> pa.Table:
    """The last row of each `key` value (rows in source order), kept in source order."""
    if table.num_rows == 0:
        return table
    index = pa.array(np.arange(table.num_rows, dtype=np.int64))
    grouped = pa.table({"k": table.column(key), "i": index}).group_by("k", use_threads=False).aggregate(
        [("i", "max")]
    )
    last = grouped.column("i_max")
    return table.take(pc.take(last, pc.sort_indices(last)))
