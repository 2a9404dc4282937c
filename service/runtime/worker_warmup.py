"""Start Spark's Python workers while the driver is still setting up its queries.

Without this, a query's first micro-batch starts the Python workers that read and decode its Kafka
ranges: the daemon, one forked worker per task slot, and each worker's imports (pandas, pyarrow,
confluent-kafka, the decoders), all on the path to the first commit. Before that, the driver spends
some seconds registering the data sources and planning, one helper process at a time, with the
other cores idle. `warm_workers` runs one tiny job of one task per slot in the background at that
moment: the workers it starts import what the readers import and then stay
(spark.python.worker.reuse), so the first batch's tasks find them ready.

`warmup_modules` chooses what they import from the compiled plan and the input formats: nothing
when no query reads Kafka, else the readers (`READER_MODULES`), what the plan's operators read with
(`OPERATOR_MODULES`) and the decoders of the formats in use (`FORMAT_MODULES`).
tests/unit/service/runtime/test_worker_warmup.py checks that these name modules that exist and that
a worker which imported them loads nothing more to unpickle a pipeline's reader. Figures:
docs/design/runtime-tuning.md.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

READER_MODULES = (
    "connectors.kafka.range_reader",
    "service.kafka_to_delta.source.changes_source",
    "service.kafka_to_delta.source.partition_changes",
    "service.kafka_to_delta.source.piece_reducer",
    "service.kafka_to_delta.source.decode_stage",
    "service.kafka_to_delta.source.debezium_columns",
)
"""What a worker that reads and decodes Kafka ranges imports."""
FORMAT_MODULES = {"avro-confluent": ("connectors.schema_registry.avro_codec", "connectors.schema_registry.client")}
"""What a worker imports besides `READER_MODULES` to decode an input format."""
DATABASE_MODULES = ("service.kafka_to_delta.source.database_ranges", "service.kafka_to_delta.source.database_decoder")
"""What a worker imports besides `READER_MODULES` to read a database source's ranges."""
OPERATOR_MODULES = {"materializer": ("service.kafka_to_delta.source.bucket_packing",)}
"""What a worker imports besides `READER_MODULES` for a kind of stateful operator of the plan (the
bucket materializer's changes are packed per bucket where they are read)."""


def warmup_modules(plan: Mapping[str, Any], formats: Iterable[str], databases: bool = False) -> tuple[str, ...]:
    """The modules warmed workers import for the queries of `plan` (a compiled plan document) and the
    database sources (`databases`) reading `formats`: none when nothing reads Kafka (exports only)."""
    if not plan.get("pipelines") and not databases:
        return ()
    kinds = sorted({str(node.get("kind")) for node in plan.get("nodes", ())})
    extra = [name for kind in kinds for name in OPERATOR_MODULES.get(kind, ())]
    extra += [name for found in sorted(set(formats)) for name in FORMAT_MODULES.get(found, ())]
    if databases:
        extra += list(DATABASE_MODULES)
    return READER_MODULES + tuple(dict.fromkeys(extra))


def warm_workers(spark: SparkSession, modules: tuple[str, ...] = READER_MODULES) -> threading.Thread:
    """Start one worker per task slot in the background, each importing `modules`; the thread doing it."""
    slots = max(1, spark.sparkContext.defaultParallelism)
    thread = threading.Thread(target=_quietly, args=(spark, slots, modules), name="python-worker-warmup", daemon=True)
    thread.start()
    return thread


def warm(spark: SparkSession, slots: int, modules: tuple[str, ...]) -> list[int]:
    """Run one task per slot that imports `modules`; the process ids of the workers that ran them."""

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name in modules:
            importlib.import_module(name)
        for batch in batches:
            yield pa.RecordBatch.from_arrays([pa.array([os.getpid()] * batch.num_rows, pa.int64())], names=["pid"])

    return [row.pid for row in spark.range(0, slots, 1, slots).mapInArrow(load, "pid long").collect()]


def _quietly(spark: SparkSession, slots: int, modules: tuple[str, ...]) -> None:
    try:
        warm(spark, slots, modules)
    except Exception as error:  # only the head start is lost
        log.debug("python worker warm-up failed: %s", error)
