"""Configuration is defined once: one base, one name rule, one definition of each value set, one reader.

Scans the product's sources (vocabulary/, connectors/, service/) and fails when
- a settings model does not derive from `SettingsModel`, is not frozen and strict about keys, or
  lives outside service/config/;
- the name rule is written anywhere but service/config/base.py;
- a `Literal` value set is written at more than one place, or a settings `Literal` lives outside
  service/config/choices.py;
- a module other than service/config/sources.py reads the environment or a file, unless the read
  is listed in `NOT_CONFIGURATION` with the reason it is not configuration.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

import service.config
from service.config.base import NAME_PATTERN, TOPIC_PATTERN, SettingsModel

REPO = Path(__file__).resolve().parents[4]
PRODUCT = ("vocabulary", "connectors", "service")
CONFIG = "service/config"
READER = "service/config/sources.py"
"""The one module that reads config files and the environment."""
CONFIG_FORMATS = {"yaml", "tomllib", "tomli", "configparser", "dotenv"}
"""Parsers of config files: imported by `READER` alone, never allowed elsewhere."""

NOT_CONFIGURATION: dict[tuple[str, str], str] = {
    # Environment: variables the service writes for native libraries and Spark's processes, or
    # reads the way the platform's own tools do; none of them is a setting of the service.
    ("service/runtime/allocators.py", "environment"):
        "sets the native allocators' defaults (an operator's own value wins) before pyarrow loads",
    ("service/runtime/spark_session.py", "environment"):
        "sets PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON and SPARK_LOCAL_IP defaults for Spark's launcher",
    ("service/runtime/sql_parser.py", "environment"):
        "sets SPARK_LOCAL_IP and PYSPARK_PYTHON defaults for the parser's bare JVM, as spark_session does",
    ("service/runtime/jvm_class_archive.py", "environment"):
        "JAVA_HOME: finds the java executable exactly as Spark's launcher (spark-class) does",
    ("connectors/maven_jars.py", "environment"):
        "the cache directory of resolved Maven jars (a build tool of its own; connectors/ cannot "
        "import service/)",
    # Files: state the service wrote itself (checkpoints, stored plans, progress), never configuration.
    ("service/operations/status.py", "file"): "a streaming query's checkpoint (metadata, offsets)",
    ("service/kafka_to_delta/plan/state_rebuild.py", "file"):
        "a checkpoint: its metadata, offsets and the plan stored in it",
    ("service/kafka_to_delta/plan/upgrades.py", "file"): "the plan stored in a checkpoint",
    ("service/kafka_to_delta/sink/commits_behind.py", "file"): "a batch's changes written ahead into its checkpoint",
    ("service/kafka_to_delta/plan/rebuilt_seed.py", "file"): "the seed info written by rebuild-state",
    ("connectors/kafka/watermarks.py", "file"): "the per-partition event-time progress file (state)",
    ("connectors/delta/small_commit.py", "file"): "a Delta table's log entry it writes (table data)",
    ("connectors/delta/deletion_vectors.py", "file"): "a Delta table's deletion vector files (table data)",
    ("connectors/delta/log_replay.py", "file"): "a Delta table's log: checkpoint and entries (table data)",
    ("connectors/kafka/apache_broker.py", "file"):
        "the local broker's own server.properties (written by it) and its log file",
    ("connectors/kafka/local_broker.py", "file"): "the local broker's log file (written)",
    ("service/runtime/quarantine.py", "file"):
        "a database source's quarantined tables, written by its own query (state)",
    ("service/kafka_to_delta/plan/table_routes.py", "file"): "the tables a database source's query wrote (state)",
    ("service/runtime/checkpoints.py", "file"): "a streaming query's offset log (where a batch began)",
}
"""(module, kind) -> why that module's reads are not configuration."""

_ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb"}
_FILE_READS = {"read_text", "read_bytes"}


def _product_files() -> list[Path]:
    return sorted(path for root in PRODUCT for path in (REPO / root).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _trees() -> dict[str, ast.Module]:
    return {_relative(path): ast.parse(path.read_text(), str(path)) for path in _product_files()}


TREES = _trees()


def _reads(tree: ast.Module) -> set[str]:
    """Kinds of reads in one module: `environment`, `file`, `config-format`."""
    kinds: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr in _ENVIRONMENT_NAMES:
                kinds.add("environment")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if {alias.name for alias in node.names} & _ENVIRONMENT_NAMES:
                kinds.add("environment")
        elif isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Name) and function.id == "open":
                kinds.add("file")
            elif isinstance(function, ast.Attribute) and function.attr in _FILE_READS:
                kinds.add("file")
            elif isinstance(function, ast.Attribute) and function.attr == "load" and isinstance(
                function.value, ast.Name
            ) and function.value.id == "json":
                kinds.add("file")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(name.split(".")[0] in CONFIG_FORMATS for name in names):
                kinds.add("config-format")
    return kinds


def _config_modules() -> list[ModuleType]:
    names = [info.name for info in pkgutil.iter_modules(service.config.__path__, "service.config.")]
    return [importlib.import_module(name) for name in names]


def _settings_models() -> list[type[BaseModel]]:
    """Every pydantic model defined in service/config/."""
    return [
        member
        for module in _config_modules()
        for _, member in inspect.getmembers(module, inspect.isclass)
        if issubclass(member, BaseModel) and member.__module__ == module.__name__
    ]


def _literal_sets(tree: ast.Module) -> list[tuple[frozenset[str], int]]:
    """Value sets of the `Literal[...]` of more than one string written in one module, with lines."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript):
            continue
        target = node.value
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name != "Literal" or not isinstance(node.slice, ast.Tuple):
            continue
        values = [item.value for item in node.slice.elts if isinstance(item, ast.Constant)]
        if len(values) > 1 and all(isinstance(value, str) for value in values):
            found.append((frozenset(values), node.lineno))
    return found


def test_every_settings_model_derives_from_the_one_frozen_base() -> None:
    models = _settings_models()
    assert len(models) > 10  # the scan sees the models
    for model in models:
        if model is SettingsModel:
            continue
        assert issubclass(model, SettingsModel), f"{model.__module__}.{model.__name__} must derive from SettingsModel"
        assert model.model_config.get("frozen") is True, f"{model.__name__} is not frozen"
        assert model.model_config.get("extra") == "forbid", f"{model.__name__} accepts unknown keys"


def test_settings_models_live_in_the_config_package() -> None:
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if "BaseModel" in bases:
                assert module == "service/config/base.py", f"{module}: {node.name} is a pydantic model: derive it " \
                    "from service.config.base.SettingsModel in service/config/"
            if "SettingsModel" in bases:
                assert module.startswith(f"{CONFIG}/"), f"{module}: settings model {node.name} belongs in {CONFIG}/"


def test_the_name_rule_is_written_once() -> None:
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in (NAME_PATTERN, TOPIC_PATTERN):
                assert module == "service/config/base.py", f"{module}:{node.lineno}: use service.config.base.Name"
            if module.startswith(f"{CONFIG}/") and isinstance(node, ast.keyword) and node.arg == "pattern":
                assert module == "service/config/base.py", f"{module}: a pattern belongs in service/config/base.py"


def test_each_literal_value_set_is_defined_once() -> None:
    places: dict[frozenset[str], list[str]] = defaultdict(list)
    for module, tree in TREES.items():
        for values, line in _literal_sets(tree):
            places[values].append(f"{module}:{line}")
            if module.startswith(f"{CONFIG}/"):
                assert module == "service/config/choices.py", (
                    f"{module}:{line}: settings value sets are defined in service/config/choices.py"
                )
    repeated = {tuple(sorted(values)): where for values, where in places.items() if len(where) > 1}
    assert not repeated, f"Literal value sets written more than once (import the one definition): {repeated}"


def test_only_the_config_reader_reads_config_files_and_the_environment() -> None:
    found = {(module, kind) for module, tree in TREES.items() for kind in _reads(tree)}
    assert ("service/config/sources.py", "environment") in found and (READER, "config-format") in found
    unexplained = sorted(
        f"{module}: {kind}" for module, kind in found if module != READER and (module, kind) not in NOT_CONFIGURATION
    )
    assert not unexplained, (
        "reads of the environment or files outside service/config/sources.py: read configuration through "
        f"it, or list a read that is not configuration in NOT_CONFIGURATION with why: {unexplained}"
    )


def test_the_list_of_reads_that_are_not_configuration_is_current() -> None:
    found = {(module, kind) for module, tree in TREES.items() for kind in _reads(tree)}
    stale = sorted(f"{module}: {kind}" for module, kind in NOT_CONFIGURATION if (module, kind) not in found)
    assert not stale, f"NOT_CONFIGURATION names reads that no longer exist (remove them): {stale}"


@pytest.mark.parametrize("source, kinds", [
    ("import os\nx = os.environ.get('A')\n", {"environment"}),
    ("from os import getenv\n", {"environment"}),
    ("import yaml\n", {"config-format"}),
    ("from pathlib import Path\nPath('a').read_text()\n", {"file"}),
    ("open('a')\n", {"file"}),
    ("import json\njson.load(handle)\n", {"file"}),
    ("producer.open()\nPath('a').write_text('x')\n", set()),
])
def test_the_scan_sees_each_kind_of_read(source: str, kinds: set[str]) -> None:
    assert _reads(ast.parse(source)) == kinds


def test_the_scan_sees_a_repeated_literal() -> None:
    tree = ast.parse('A = Literal["x", "y"]\nB = Literal["y", "x"]\nC = Literal["only"]\n')
    assert [values for values, _ in _literal_sets(tree)] == [frozenset({"x", "y"})] * 2
