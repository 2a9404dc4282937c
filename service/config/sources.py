"""Where configuration comes from: config files and the process environment. The only module that reads either.

- A config file is YAML (`read_config_file`); a compiled plan given to `run --plan` is JSON
  (`read_plan_file`: its per-operator state TTLs override the config's). Config strings may
  reference environment variables as `${NAME}` (`interpolate`): secrets stay out of the file;
  a missing variable is an error naming it.
- A few options belong to one process rather than to a config file and are read from its
  environment here: `ARCHIVE_DIR_ENV` (where the JVM class archives are kept, or none) and the
  test hook switch `BATCH_MARKER_ENV` (inert unless a test sets it).

Everything else in the tree gets its configuration from a `Settings` built from these; the
repository check tests/unit/service/config/test_one_definition.py fails on a read elsewhere.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from vocabulary.errors import ConfigError

ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""`${NAME}` in a config string: replaced by the value of environment variable NAME."""
ARCHIVE_DIR_ENV = "CDC_LAKEHOUSE_JVM_ARCHIVE_DIR"
"""Where JVM class archives are kept (default ~/.cache/cdc-lakehouse); an empty value turns them off."""
BATCH_MARKER_ENV = "CDC_LAKEHOUSE_TEST_BATCH_MARKER"
"""A test hook, not an operating option: see service/runtime/test_hooks.py."""


def read_config_file(path: Path) -> Any:
    """The parsed YAML of a config file (None when empty); errors name the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def read_plan_file(path: str | Path) -> Any:
    """The parsed JSON of a compiled plan file (its shape is checked by the plan module); errors name the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: not a readable plan ({error})") from None


def interpolate(node: Any, source: str) -> Any:
    """`node` with every `${NAME}` in its strings replaced by that environment variable's value."""
    if isinstance(node, dict):
        return {k: interpolate(v, source) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, source) for v in node]
    if isinstance(node, str):
        return ENV_REFERENCE.sub(lambda m: _required_variable(m.group(1), source), node)
    return node


def _required_variable(name: str, source: str) -> str:
    """The value of a variable a config string references; an error naming it when unset."""
    if name not in os.environ:
        raise ConfigError(f"{source}: environment variable ${{{name}}} is not set")
    return os.environ[name]


def jvm_archive_dir() -> str | None:
    """`ARCHIVE_DIR_ENV` as set (None when unset; empty or blank turns archives off)."""
    return os.environ.get(ARCHIVE_DIR_ENV)


def batch_marker() -> str | None:
    """`BATCH_MARKER_ENV` as set: the path a test arms to hold a micro-batch; None when unset."""
    return os.environ.get(BATCH_MARKER_ENV)


def mask_salt(variable: str, where: str) -> str:
    """The salt of a pipeline's masked columns: the value of environment `variable` (`where` names the
    pipeline in the error when it is unset or empty)."""
    salt = os.environ.get(variable)
    if not salt:
        raise ConfigError(f"{where}: environment variable {variable} (columns.salt_env, the masking salt) is not set")
    return salt


def mask_salt_if_set(variable: str | None) -> str | None:
    """The salt as `mask_salt` reads it, or None when `variable` is None or unset (the plan names a fingerprint)."""
    return os.environ.get(variable) or None if variable else None
