"""What warmed Python workers import: chosen from the plan, naming modules that exist, and enough
for every reader a pipeline's source unpickles (no Spark started here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark import cloudpickle

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.plan.compiled_plan import compile_plan
from service.kafka_to_delta.source.bucket_packing import PackedBuckets
from service.kafka_to_delta.source.decode_stage import DecodedRanges, batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.runtime.worker_warmup import (
    FORMAT_MODULES,
    OPERATOR_MODULES,
    READER_MODULES,
    warmup_modules,
)

REGISTRY = {"url": "http://127.0.0.1:9"}
_WATCHED = ("service", "connectors", "vocabulary", "pandas", "pyarrow", "numpy", "fastavro", "confluent_kafka",
            "deltalake")

# Imports the warm-up modules, then unpickles a reader as a reading task does; prints what that loaded.
_WORKER = """
import importlib, json, pickle, sys
modules, path, watched = json.loads(sys.argv[1]), sys.argv[2], tuple(json.loads(sys.argv[3]))
for name in modules:
    importlib.import_module(name)
before = set(sys.modules)
pickle.loads(open(path, "rb").read())
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in watched)))
"""


def _pipeline(shape: str, format_name: str) -> dict:
    pipeline: dict = {"name": "p", "topics": ["t"], "table": "t", "primary_key": ["id"], "format": format_name}
    if format_name == "avro-confluent":
        pipeline["schema_registry"] = REGISTRY
    if shape == "materialized":
        pipeline.update(topics=["t", "u"], on_conflict="nothing")
    if shape == "ordered":
        pipeline["from_changelog"] = {"preset": "debezium", "order_by": "ts"}
    return pipeline


def _reader(shape: str, settings) -> object:
    """The reducer a pipeline of `shape` pickles into its source (`IngestPipeline.start`)."""
    pipeline = settings.pipelines[0]
    if shape == "plain":
        return PartitionReducer(batch_decoder(pipeline), pipeline.primary_key)
    if shape == "materialized":
        return PackedBuckets(DecodedRanges(pipeline, None), 16)
    return DecodedRanges(pipeline, None)


def test_every_named_module_exists() -> None:
    names = list(READER_MODULES) + [n for group in (FORMAT_MODULES, OPERATOR_MODULES) for v in group.values() for n in v]
    assert [name for name in names if importlib.util.find_spec(name) is None] == []


def test_exports_alone_warm_nothing_and_a_pipeline_warms_its_readers() -> None:
    assert warmup_modules({"pipelines": [], "nodes": []}, []) == ()
    plain = settings_from_mapping({"pipelines": [_pipeline("plain", "json")]})
    assert warmup_modules(compile_plan(plain), ["json"]) == READER_MODULES


@pytest.mark.parametrize("format_name", ["json", "avro-confluent"])
@pytest.mark.parametrize("shape", ["plain", "materialized", "ordered"])
def test_a_warmed_worker_loads_nothing_more_to_unpickle_a_reader(shape: str, format_name: str, tmp_path: Path) -> None:
    settings = settings_from_mapping({"pipelines": [_pipeline(shape, format_name)]})
    modules = warmup_modules(compile_plan(settings), [format_name])
    path = tmp_path / "reader.pickle"
    path.write_bytes(cloudpickle.dumps(_reader(shape, settings)))
    done = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(modules), str(path), json.dumps(_WATCHED)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], "warm-up misses what the reader loads"


_DATABASE_WORKER = """
import importlib, json, pickle, sys
modules, path, watched = json.loads(sys.argv[1]), sys.argv[2], tuple(json.loads(sys.argv[3]))
for name in modules:
    importlib.import_module(name)
before = set(sys.modules)
reducers = pickle.loads(open(path, "rb").read())
reducers._reducer("public_orders", ("id",))  # what reading a range builds
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in watched)))
"""


def test_a_database_source_warms_its_readers_and_decoders(tmp_path: Path) -> None:
    from service.kafka_to_delta.source.database_ranges import TableReducers
    from service.runtime.worker_warmup import DATABASE_MODULES

    settings = settings_from_mapping({"databases": [{"name": "inv", "topic_pattern": r"db\.(?P<table>\w+)"}]})
    modules = warmup_modules(compile_plan(settings), ["json"], databases=True)
    assert set(DATABASE_MODULES) <= set(modules) and all(importlib.util.find_spec(n) for n in DATABASE_MODULES)
    path = tmp_path / "reducers.pickle"
    path.write_bytes(cloudpickle.dumps(TableReducers(settings.databases[0])))
    done = subprocess.run([sys.executable, "-c", _DATABASE_WORKER, json.dumps(modules), str(path),
                           json.dumps(_WATCHED)], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], "warm-up misses what the reader loads"
