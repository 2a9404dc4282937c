"""Import weight: what the code promises to keep out of a process stays out of it.

- The plain path (a JSON pipeline without state: the supervisor and the readers its workers import)
  never loads pandas (the materializer's, imported where it is used).
- A JSON-only process never loads the schema registry's REST client, its HTTP stack or fastavro.
- The processes that create a pipeline's source and plan its reads load neither the decoders nor
  Arrow: they unpickle the source class only (`changes_source`, `connectors.kafka.source`); the
  memory release they import loads pyarrow only when it runs.

Each check imports in a fresh interpreter and lists what got loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyspark import cloudpickle

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.source.changes_source import changes_source
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.runtime.worker_warmup import READER_MODULES

PANDAS = "pandas"
REGISTRY_CLIENT = ("connectors.schema_registry.client", "connectors.schema_registry.avro_codec",
                   "confluent_kafka.schema_registry", "fastavro", "httpx", "requests")
DECODERS = ("connectors.kafka.range_reader", "service.kafka_to_delta.source.decode_stage",
            "service.kafka_to_delta.source.partition_changes", "service.kafka_to_delta.formats",
            "service.kafka_to_delta.changelog")
ARROW = "pyarrow"
PLAIN = {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]}

_LIST = """
import importlib, json, pickle, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
for path in sys.argv[2:]:
    pickle.loads(open(path, "rb").read())
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(modules: list[str], pickles: list[Path] = ()) -> set[str]:
    """The modules a fresh interpreter holds after importing `modules` and unpickling `pickles`."""
    done = subprocess.run([sys.executable, "-c", _LIST, json.dumps(modules), *map(str, pickles)],
                          capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _any_of(loaded: set[str], names: tuple[str, ...] | str) -> list[str]:
    names = (names,) if isinstance(names, str) else names
    return sorted(m for m in loaded for n in names if m == n or m.startswith(n + "."))


def test_the_plain_path_never_loads_pandas_nor_the_registry_client() -> None:
    loaded = _loaded(["service.__main__", "service.supervisor.runner", *READER_MODULES])
    assert _any_of(loaded, PANDAS) == []
    assert _any_of(loaded, REGISTRY_CLIENT) == []


def test_the_planning_processes_load_neither_decoders_nor_arrow(tmp_path: Path) -> None:
    pipeline = settings_from_mapping({"pipelines": [PLAIN]}).pipelines[0]
    source = changes_source("plain", PartitionReducer(batch_decoder(pipeline), pipeline.primary_key))
    path = tmp_path / "source.pickle"
    path.write_bytes(cloudpickle.dumps(source))
    loaded = _loaded(["service.kafka_to_delta.source.changes_source", "connectors.kafka.source",
                      "service.runtime.memory_release"], [path])
    assert _any_of(loaded, DECODERS) == []
    assert _any_of(loaded, (ARROW, PANDAS)) == []
