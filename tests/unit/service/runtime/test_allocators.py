"""The allocator settings are in the environment before pyarrow or deltalake is loaded, and an
operator's own setting wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from service.runtime.allocators import ALLOCATOR_DEFAULTS, apply_allocator_defaults

# Records the allocator variables at the moment pyarrow or deltalake is first imported, then imports
# the CLI's module as `cdc-lakehouse` does and loads both libraries.
_PROBE = """
import importlib.abc, json, os, sys
NAMES = %r
seen = {}

class Probe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("pyarrow", "deltalake") and name not in seen:
            seen[name] = {key: os.environ.get(key) for key in NAMES}
        return None

sys.meta_path.insert(0, Probe())
import service.__main__
import deltalake, pyarrow
print(json.dumps({"seen": seen, "pool": pyarrow.default_memory_pool().backend_name}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_DEFAULTS}
    done = subprocess.run([sys.executable, "-c", _PROBE % (list(ALLOCATOR_DEFAULTS),)], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cli_sets_the_allocators_before_pyarrow_and_deltalake_load() -> None:
    found = _probe()
    assert set(found["seen"]) == {"pyarrow", "deltalake"}
    for library, values in found["seen"].items():
        assert values == ALLOCATOR_DEFAULTS, library
    assert found["pool"] == "system"


def test_an_operators_own_setting_wins() -> None:
    found = _probe(ARROW_DEFAULT_MEMORY_POOL="jemalloc", _RJEM_MALLOC_CONF="dirty_decay_ms:0")
    assert found["seen"]["pyarrow"] == {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "_RJEM_MALLOC_CONF": "dirty_decay_ms:0"}
    assert found["pool"] == "jemalloc"


def test_apply_sets_only_what_is_missing() -> None:
    environ = {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    assert apply_allocator_defaults(environ) == {**ALLOCATOR_DEFAULTS, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    assert environ["_RJEM_MALLOC_CONF"] == ALLOCATOR_DEFAULTS["_RJEM_MALLOC_CONF"]
