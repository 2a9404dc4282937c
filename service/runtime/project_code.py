"""The project's own Python code, shipped by the driver to a cluster's executors.

On a cluster (any `spark.master` other than `local[...]`) the executors' Python workers decode
Kafka records and keep keyed state with the project's modules. `ship(spark)` zips the packages the
driver runs (`vocabulary`, `service`, `connectors`, as imported here, so a development checkout
ships its working tree) and adds the zip with `SparkContext.addPyFile`: every Python worker of the
application puts it on its path ahead of its site-packages. The executors then need only the
dependencies (an image, a packed environment of `scripts/pack_executor_env.sh`, or an install), and
they can never run other code than the driver's: an upgrade of the service upgrades its executors.
"""

from __future__ import annotations

import importlib
import logging
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PACKAGES = ("vocabulary", "service", "connectors")
"""The project's top-level packages (pyproject.toml's `[tool.setuptools.packages.find]`)."""
ZIP_NAME = "cdc_lakehouse_code.zip"


def package_dirs() -> list[Path]:
    """The directories of the project's packages as this interpreter imports them."""
    return [Path(importlib.import_module(name).__file__).parent for name in PACKAGES]  # type: ignore[arg-type]


def write_zip(target: Path) -> Path:
    """A zip of the project's packages (sources and package data, no bytecode caches) at `target`."""
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for directory in package_dirs():
            for path in sorted(directory.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    archive.write(path, str(path.relative_to(directory.parent)))
    return target


def runs_on_cluster(master: str) -> bool:
    """Whether a session of `master` has executors outside the driver's process."""
    return not master.startswith("local")


def ship(spark: SparkSession) -> Path | None:
    """Add the project's code to the Python path of the application's executors (a cluster only)."""
    context = spark.sparkContext
    if not runs_on_cluster(context.master or "local"):
        return None
    target = Path(tempfile.mkdtemp(prefix="cdc-lakehouse-code-")) / ZIP_NAME
    write_zip(target)
    context.addPyFile(str(target))
    log.info("project code shipped to the executors: %s (%.1f MiB)", target, target.stat().st_size / 2**20)
    return target
