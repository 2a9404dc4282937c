"""The materializer state of a stopped checkpoint, read with Spark's state reader (`statestore`).

`rebuild-state` takes the rows from the Delta table; what the table cannot say about a row is
where it came from: its upsert key (with several topics, the topic is part of it), the Kafka
position and the sequence_by values it was applied with, and the tombstones of deleted upsert
keys. The old checkpoint's state holds all of that for every key it still remembers: the last
live row of a key is the row the table shows (`materializer_state.PkState`).

Read only for the bucket stage's layout (value state `keys`, one document per bucket) and at the
micro-batch the table holds; anything else (another layout, a state version Spark cannot read)
gives None and the rebuild falls back to the table alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from service.kafka_to_delta.materialize.bucket_document import decode_bucket
from service.kafka_to_delta.materialize.key_state import LiveRow, Tombstone, decode_state

log = logging.getLogger(__name__)
BUCKET_STATE = "keys"


@dataclass
class OldState:
    """Per primary key: the row the table shows as the rules remember it, and the key's tombstones."""

    shown: dict[str, LiveRow] = field(default_factory=dict)
    tombstones: dict[str, dict[str, Tombstone]] = field(default_factory=dict)


def read_old_state(spark: SparkSession, checkpoint: Path, batch: int) -> OldState | None:
    """The materializer state of `checkpoint` after micro-batch `batch`; None when it cannot be read.

    The checkpoint must still be at the path it ran at: Spark's state schema files name it."""
    try:
        frame = (spark.read.format("statestore").option("stateVarName", BUCKET_STATE)
                 .option("batchId", str(batch)).load(str(checkpoint)))
        blobs = [row[0] for row in frame.select("value.keys").toLocalIterator()]
    except Exception as error:  # noqa: BLE001 - any reader failure means "rebuild from the table alone"
        log.warning("checkpoint %s: materializer state not readable (%s): rebuilding from the table alone",
                    checkpoint, str(error).splitlines()[0][:300])
        return None
    old = OldState()
    for blob in blobs:
        for pk, (text, _) in decode_bucket(blob).items():
            state = decode_state(text)
            if state.rows:
                old.shown[pk] = state.rows[-1]
            if state.tombstones:
                old.tombstones[pk] = state.tombstones
    return old
