"""A materializer state rebuilt from the Delta table (`service.kafka_to_delta.plan.state_rebuild`), waiting in a new
checkpoint: `<checkpoint>/rebuilt_state/` holds the state rows (`seed.parquet`, the bucket stage's
`SEED_SCHEMA`) and where the source starts (`seed.json`). The pipeline reads it on every start
(`load_seed`): Spark applies an initial state on the first micro-batch of a checkpoint only, and
starting offsets only before that batch, so keeping the seed in place changes nothing later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from service.runtime.checkpoints import local_path

SEED_DIR = "rebuilt_state"
SEED_ROWS = "seed.parquet"
SEED_INFO = "seed.json"


@dataclass(frozen=True)
class Seed:
    """The materializer's initial state and the offsets to start reading at (startingOffsets JSON)."""

    initial_state: DataFrame
    starting_offsets: str


def load_seed(spark: SparkSession, checkpoint_dir: str) -> Seed | None:
    """The seed of a checkpoint made by `rebuild-state`; None when there is none."""
    root = local_path(checkpoint_dir)
    directory = None if root is None else root / SEED_DIR
    if directory is None or not (directory / SEED_INFO).exists():
        return None
    info = json.loads((directory / SEED_INFO).read_text())
    return Seed(spark.read.parquet(str(directory / SEED_ROWS)), json.dumps(info["starting_offsets"]))
