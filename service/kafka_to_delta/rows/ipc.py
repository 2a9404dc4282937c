"""Arrow tables as one binary value, for what crosses the JVM as a single cell (payloads, packed net rows).

The buffers are LZ4-compressed: the JVM copies such values several times on their way to the
driver, and compressed payloads keep its collector's work small (`docs/design/layout.md`). A payload
that does not cross the JVM (handed over in a file, `rows.payload_spool`) is written uncompressed,
straight into its file (`write_stream`): there the compression was only work for the writer and the
reader (on a range of the realistic capture, about a tenth of its decode and reduce). Readers
(`pyarrow.ipc.open_stream`) read either.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from service.kafka_to_delta.rows.arrow import joined_tables
from service.kafka_to_delta.rows.names import typed_names

_COMPRESSED = pa.ipc.IpcWriteOptions(compression="lz4")
_UNCOMPRESSED = pa.ipc.IpcWriteOptions(compression=None)


def write_stream(table: pa.Table, sink: pa.NativeFile, compressed: bool) -> None:
    """`table` as an Arrow IPC stream into `sink` (LZ4-compressed buffers where `compressed`)."""
    with pa.ipc.new_stream(sink, table.schema, options=_COMPRESSED if compressed else _UNCOMPRESSED) as writer:
        writer.write_table(table)


def ipc_bytes(table: pa.Table, compressed: bool = True) -> bytes:
    """`table` as an Arrow IPC stream (LZ4-compressed buffers unless not `compressed`)."""
    sink = pa.BufferOutputStream()
    write_stream(table, sink, compressed)
    return sink.getvalue().to_pybytes()


def unpack_tables(values: Iterable[bytes]) -> pa.Table | None:
    """The tables of packed values (`ipc_bytes`) as one; None when there are none. Typed image columns
    (`names.TYPED_PREFIX`) that differ in type between the tables are left out."""
    tables = [pa.ipc.open_stream(pa.py_buffer(value)).read_all() for value in values]
    return joined_tables(tables, "default") if tables else None


def table_records(table: pa.Table) -> list[dict]:
    """The rows of `table` as plain Python records (zipped from whole columns: a fifth faster than
    `Table.to_pylist`)."""
    names = table.column_names
    return [dict(zip(names, row)) for row in zip(*(column.to_pylist() for column in table.columns))]


def unpack_changes(values: Iterable[bytes]) -> list[dict]:
    """The changes of packed values (`STAGE_FIELDS`), as plain Python records (without typed image columns)."""
    table = unpack_tables(values)
    return [] if table is None else table_records(table.drop_columns(typed_names(table.column_names)))
