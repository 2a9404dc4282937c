"""Where an export flush's encoding time goes, without Spark or Kafka: `ExportEncoder` alone.

Builds the export benchmark's table with delta-rs (`export_tables.py`), reads one MERGE
version's change feed with delta-rs (a `--rows`-row slice of it, as one micro-batch), and times
per stage, `--repeat` times (the best run is printed): the column path (pairing, the layout's
values and keys, the `KafkaRecord`s) and the row path (TO_CHANGELOG row by row, then the
record layout), for JSON (debezium preset) and, with `--registry URL`, Confluent Avro. With
`--profile` it also prints cProfile's top functions of one column-path flush.

    .venv/bin/python bench/export_encode_profile.py --table realistic --rows 100000
    .venv/bin/python bench/export_encode_profile.py --table realistic --registry http://127.0.0.1:8081/apis/ccompat/v7
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import pyarrow as pa
from deltalake import DeltaTable
from export_benchmark import build_table

from connectors.schema_registry import SchemaRegistryClient
from service.config.exports import ExportSettings
from service.delta_to_kafka.changelog.feed_changes import pair_changes, plain_strings
from service.delta_to_kafka.changelog.to_changelog import ToChangelog
from service.delta_to_kafka.formats.avro_serializers import TableAvroSerializer
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.output_formats import KafkaRecordEncoder

NOW = 1_700_000_000.0


def _best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def stages(settings: ExportSettings, feed: pa.Table, repeat: int, key=None, value=None) -> dict[str, float]:
    """Seconds per stage of one flush, column path and row path."""
    encoder = ExportEncoder(settings, key, value, clock=lambda: NOW)
    plain = plain_strings(feed)
    changes = pair_changes(plain, settings.primary_key, settings.compaction == "per-flush")
    rows = ToChangelog(settings)
    layout = KafkaRecordEncoder(settings, key, value)
    output = rows.encode_flush(feed, NOW)
    return {
        "column path, whole flush": _best(repeat, lambda: encoder(feed)),
        "  pairing (Arrow sorts)": _best(repeat, lambda: pair_changes(plain, settings.primary_key, True)),
        "  layout + records": _best(repeat, lambda: encoder.columnar.encode(plain, changes, int(NOW * 1000))),
        "row path, whole flush": _best(1, lambda: layout.encode(ToChangelog(settings).encode_flush(feed, NOW),
                                                                 int(NOW * 1000))),
        "  TO_CHANGELOG rows": _best(1, lambda: ToChangelog(settings).encode_flush(feed, NOW)),
        "  layout (serializers)": _best(1, lambda: layout.encode(output, int(NOW * 1000))),
    }


def main() -> None:
    """Print the stage times."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=["simple", "realistic"], default="realistic")
    parser.add_argument("--changes", type=int, default=500_000, help="change-feed rows of the built table")
    parser.add_argument("--rows", type=int, default=100_000, help="feed rows of the flush")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--registry", help="a running registry: also time Avro")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--input-changelog", choices=["retract", "upsert"], default="retract",
                        help="upsert: a stateful export (every key's last image kept in state)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-encode-profile-") as tmp:
        uri = str(Path(tmp) / "table")
        build_table(uri, args.changes, shape=args.table)
        feed = pa.table(DeltaTable(uri).load_cdf(starting_version=1, ending_version=1).read_all())
        feed = feed.slice(0, args.rows).combine_chunks()
        formats = {"json": ({"preset": "debezium", "input_changelog": args.input_changelog}, None, None)}
        if args.registry:
            client = SchemaRegistryClient(args.registry)
            avro = {"preset": "debezium", "format": "avro-confluent", "schema_registry_url": args.registry,
                    "input_changelog": args.input_changelog}
            probe = ExportSettings(name="p", table="t", topic=f"profile.{uuid.uuid4().hex[:8]}", primary_key=("id",),
                                   **avro)
            formats["avro"] = (avro, *(TableAvroSerializer(probe, uri, {}, role, client) for role in ("key", "value")))
        print(f"{args.table} table, one flush of {feed.num_rows:,} feed rows (version 1)")
        for name, (layout, key, value) in formats.items():
            settings = ExportSettings(name="p", table="t", topic=key.export.topic if key else "profile.json",
                                      primary_key=("id",), **layout)
            for stage, seconds in stages(settings, feed, args.repeat, key, value).items():
                print(f"{name:<5} {stage:<28} {seconds:8.2f} s  {feed.num_rows / seconds:>10,.0f} feed rows/s")
            if args.profile:
                encoder = ExportEncoder(settings, key, value, clock=lambda: NOW)
                profile = cProfile.Profile()
                profile.runcall(encoder._by_column, feed, int(NOW * 1000))
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
