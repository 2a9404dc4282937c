"""Where the export's read of the change feed spends its time (no encoding, no Kafka).

Builds the export benchmark's table (`--table realistic` by default, `--changes` feed rows),
then times, for one MERGE version split into `--max-rows` chunks as the export splits it:

- delta-rs alone, in this process: `load_cdf` of the whole version (all columns, then the key
  columns and change types only), and streaming it batch by batch;
- the change-feed source's own read of each chunk in this process (`ChangeFeedStreamReader.read`:
  key columns, canonical order, the chunk's keys kept from the stream), the executor's work;
- the driver's planning read (`VersionLayout` of the version: key columns and change types);
- the Spark route the export took: the streaming query's `DataFrame.toArrow()` per micro-batch
  (executor Python worker reads, the JVM converts Arrow to rows and back, the driver collects);
- the export's read now: `read_batch` in the driver's process for the same offsets.

    .venv/bin/python bench/export_read_probe.py --changes 300000
    .venv/bin/python bench/export_read_probe.py --changes 300000 --skip-spark
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from export_benchmark import build_table

from connectors.delta.change_feed import (
    DeltaChangeFeedSource,
    feed_schema,
    keys_of,
    load_feed,
    read_batch,
    stream_feed,
)
from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.feed_chunks import chunk_end

KEYS = ("id",)


def timed(label: str, work) -> object:
    """Run `work()`, print its seconds; returns its result."""
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    rows = result.num_rows if isinstance(result, pa.Table) else None
    size = f", {result.nbytes / 2**20:,.0f} MiB" if isinstance(result, pa.Table) else ""
    rate = f", {rows / seconds:,.0f} rows/s" if rows else ""
    print(f"{label:<58}{seconds:8.2f} s{'' if rows is None else f'  {rows:,} rows'}{rate}{size}")
    return result


def chunks(uri: str, version: int, max_rows: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) offsets the source plans for `version` in chunks of `max_rows`."""
    from connectors.delta.feed_chunks import VersionLayout

    layout = VersionLayout.of(keys_of(uri, None, version, KEYS), KEYS)
    offsets, begin = [], (version, 0)
    while begin < (version + 1, 0):
        end = chunk_end(begin, version + 1, max_rows, 1, lambda _v: layout)
        offsets.append((begin, end))
        begin = end
    return offsets


def probe_in_process(uri: str, version: int, max_rows: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """delta-rs and the source's reads in this process."""
    timed(f"delta-rs load_cdf, version {version}, all columns", lambda: load_feed(uri, None, version, version))
    timed(f"delta-rs load_cdf, version {version}, key + change type",
          lambda: keys_of(uri, None, version, KEYS))
    timed(f"delta-rs stream, version {version}, all columns",
          lambda: pa.concat_tables(list(stream_feed(uri, None, version))))
    offsets = timed("driver planning (layout of the version)", lambda: chunks(uri, version, max_rows))
    schema = feed_schema(DeltaRsTable(uri).schema(), numbered=True)
    options = {"path": uri, "maxrowspertrigger": str(max_rows), "keycolumns": ",".join(KEYS)}
    source = DeltaChangeFeedSource(options)
    reader = source.streamReader(source.schema())
    for begin, end in offsets:
        ranges = reader.partitions({"version": begin[0], "row": begin[1]}, {"version": end[0], "row": end[1]})
        timed(f"source read (executor's work) {begin} -> {end}",
              lambda: pa.Table.from_batches([b for r in ranges for b in reader.read(r)], schema))
        timed(f"read_batch (the export's read now) {begin} -> {end}",
              lambda: pa.concat_tables(list(read_batch(uri, None, schema, begin, end, KEYS, max_rows))))
    return offsets


def probe_spark(uri: str, max_rows: int, first_version: int, workdir: Path) -> None:
    """The streaming query's DataFrame.toArrow() per micro-batch (the Spark route)."""
    from service.config.settings import SparkSettings
    from service.runtime.spark_session import build_spark

    spark = timed("Spark session start", lambda: build_spark(SparkSettings(master="local[*]")))
    spark.dataSource.register(DeltaChangeFeedSource)
    times: list[tuple[int, int, float]] = []

    def collect(frame, batch_id: int) -> None:
        started = time.perf_counter()
        rows = frame.toArrow().num_rows
        times.append((batch_id, rows, time.perf_counter() - started))

    query = (spark.readStream.format("delta_cdf").option("path", uri)
             .option("startingVersion", str(first_version)).option("maxVersionsPerTrigger", "1")
             .option("maxRowsPerTrigger", str(max_rows)).option("keyColumns", ",".join(KEYS)).load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(workdir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    for batch_id, rows, seconds in times:
        print(f"{'Spark route: batch ' + str(batch_id) + ' toArrow()':<58}{seconds:8.2f} s  {rows:,} rows, "
              f"{rows / seconds:,.0f} rows/s")
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=300_000)
    parser.add_argument("--table", default="realistic")
    parser.add_argument("--max-rows", type=int, default=100_000)
    parser.add_argument("--skip-spark", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-read-probe-") as tmp:
        uri = str(Path(tmp) / "table")
        plan = timed("build table", lambda: build_table(uri, args.changes, shape=args.table))
        print(f"plan: {plan}")
        probe_in_process(uri, 2, args.max_rows)
        if not args.skip_spark:
            probe_spark(uri, args.max_rows, 2, Path(tmp))


if __name__ == "__main__":
    main()
