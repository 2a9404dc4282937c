"""Where a whole export's driver time goes, without Spark or Kafka: the batches' reads and encodes.

Builds the export benchmark's table (`export_tables.py`), plans the micro-batches as the
change-feed source does (`chunk_end` over `VersionLayout`s, `--max-rows` feed rows, one version
per batch), then per batch does what `ExportPipeline._process_batch` does before publishing:
`read_batch` (delta-rs in this process, split versions read ahead) and the encoder. Prints per
batch the read and encode seconds (wall and CPU) and at the end this process's peak RSS; with
`--profile FILE` writes cProfile's statistics of the whole loop.

    .venv/bin/python bench/export_batches_profile.py --changes 200000 --table realistic
    .venv/bin/python bench/export_batches_profile.py --changes 200000 --format avro --registry URL
"""

from __future__ import annotations

import argparse
import cProfile
import resource
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
from export_benchmark import build_table_apart

from connectors.delta.change_feed import feed_schema, keys_of, read_batch
from connectors.delta.delta_rs import DeltaRsTable
from connectors.delta.feed_chunks import VersionLayout, VersionRest, chunk_end
from connectors.schema_registry import SchemaRegistryClient
from service.config.exports import DEFAULT_MAX_ROWS_PER_TRIGGER, ExportSettings
from service.delta_to_kafka.formats.avro_serializers import TableAvroSerializer
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.pipeline import feed_rows, sort_feed

KEYS = ("id",)


def encoder_for(args: argparse.Namespace, uri: str) -> ExportEncoder:
    """The export's encoder for the flags' layout."""
    layout = {"preset": "debezium", "input_changelog": args.input_changelog}
    topic = f"profile.{uuid.uuid4().hex[:8]}"
    if args.format != "avro":
        return ExportEncoder(ExportSettings(name="p", table="t", topic=topic, primary_key=KEYS, **layout))
    layout.update({"format": "avro-confluent", "schema_registry_url": args.registry})
    settings = ExportSettings(name="p", table="t", topic=topic, primary_key=KEYS, **layout)
    client = SchemaRegistryClient(args.registry)
    return ExportEncoder(settings, *(TableAvroSerializer(settings, uri, {}, role, client) for role in ("key", "value")))


def batches(uri: str, max_rows: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) offsets of the export's micro-batches, one version at most per batch."""
    following = DeltaRsTable(uri, {}).version() + 1
    layouts: dict[int, VersionLayout] = {}

    def layout(version: int) -> VersionLayout:
        if version not in layouts:
            layouts[version] = VersionLayout.of(keys_of(uri, None, version, KEYS), KEYS)
        return layouts[version]

    offsets, begin = [], (0, 0)
    while begin < (following, 0):
        end = chunk_end(begin, following, max_rows, 1, layout)
        offsets.append((begin, end))
        begin = end
    return offsets


def main() -> None:
    """Print per-batch figures and the peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=["simple", "realistic"], default="realistic")
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS_PER_TRIGGER)
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--registry", help="a running registry for --format avro")
    parser.add_argument("--input-changelog", choices=["retract", "upsert"], default="retract")
    parser.add_argument("--profile", help="write cProfile statistics of the batch loop to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-batches-profile-") as tmp:
        uri = str(Path(tmp) / "table")
        build_table_apart(uri, args.changes, shape=args.table)
        plan = batches(uri, args.max_rows)
        schema = feed_schema(DeltaRsTable(uri, {}).schema(), numbered=True)
        encoder = encoder_for(args, uri)
        rest = VersionRest()
        profile = cProfile.Profile() if args.profile else None
        base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        total = [0.0, 0.0, 0.0, 0.0]
        rows = 0
        if profile:
            profile.enable()
        for start, end in plan:
            wall, cpu = time.perf_counter(), time.process_time()
            feed = sort_feed(pa.concat_tables([schema.empty_table(), *read_batch(uri, None, schema, start, end, KEYS,
                                                                                  args.max_rows, rest)]))
            read_wall, read_cpu = time.perf_counter() - wall, time.process_time() - cpu
            wall, cpu = time.perf_counter(), time.process_time()
            records = encoder(feed_rows(feed))
            if args.input_changelog == "upsert":
                encoder.state_changes()
            encode_wall, encode_cpu = time.perf_counter() - wall, time.process_time() - cpu
            rows += feed.num_rows
            del feed, records
            pa.default_memory_pool().release_unused()
            for i, figure in enumerate((read_wall, read_cpu, encode_wall, encode_cpu)):
                total[i] += figure
            print(f"{start} -> {end}: read {read_wall:6.2f} s (CPU {read_cpu:6.2f}), encode {encode_wall:6.2f} s "
                  f"(CPU {encode_cpu:6.2f}), peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB",
                  flush=True)
        if profile:
            profile.disable()
            profile.dump_stats(args.profile)
        print(f"{rows:,} feed rows in {len(plan)} batches: read {total[0]:.2f} s (CPU {total[1]:.2f}), encode "
              f"{total[2]:.2f} s (CPU {total[3]:.2f}): {rows / (total[1] + total[3]):,.0f} feed rows per CPU second; "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB "
              f"(after the table build {base_rss:,.0f} MiB)")


if __name__ == "__main__":
    main()
