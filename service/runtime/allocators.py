"""The native allocators' settings: set in the environment before pyarrow or deltalake is loaded.

- `_RJEM_MALLOC_CONF`: delta-rs's own jemalloc gives freed pages back within about a second
  (its default keeps them for 10 s, out of reach of `malloc_trim`, after every MERGE).
- `ARROW_DEFAULT_MEMORY_POOL`: Arrow allocates from the C library, which gives back what a
  micro-batch freed at `malloc_trim` (`memory_release`); `jemalloc` trades memory for a faster
  large first batch.

`apply_allocator_defaults()` runs when the `service` package is imported (`service/__init__.py`),
which is before anything of the service loads pyarrow or deltalake: the CLI entry point, and the
local Spark processes, which inherit the driver's environment. An operator's own setting wins.
Executors of a cluster take them from `spark.executorEnv.<name>`. Figures:
docs/design/runtime-tuning.md.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ALLOCATOR_DEFAULTS = {
    "_RJEM_MALLOC_CONF": "dirty_decay_ms:1000,muzzy_decay_ms:0",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}
"""Environment variable -> the service's default."""


def apply_allocator_defaults(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each allocator variable `environ` does not set already; the values in effect."""
    for name, value in ALLOCATOR_DEFAULTS.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in ALLOCATOR_DEFAULTS}
