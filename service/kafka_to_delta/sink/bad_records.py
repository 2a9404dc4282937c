"""What happens to records that could not become changes: the typed policy of each row.

Policies (the `handling` column set by the stage that failed): FAIL stops the pipeline at the
earliest bad record (topic, partition, offset) and nothing of the batch is committed; LOG
writes a warning naming where the record is (never its content) and drops it; SKIP drops it
silently; DEAD_LETTER hands its original bytes to the pipeline's dead-letter store. Every
record dropped is counted by policy and stage.
"""

from __future__ import annotations

import logging
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from service.observability import metrics
from vocabulary.errors import DecodeError, SourceCoordinates

log = logging.getLogger(__name__)
DeadLetterStore = Callable[[pa.Table, int], int]


def _where(row: dict) -> SourceCoordinates:
    key = row.get("raw_key")
    shown = None if key is None else bytes(key).decode("utf-8", errors="replace")[:200]
    return SourceCoordinates(row["topic"], row["partition"], row["offset"], shown)


def failed_rows(net: pa.Table) -> pa.Table:
    """The rows that carry an error."""
    return net.filter(pc.is_valid(net.column("error")))


def handle_bad_records(
    pipeline: str, failed: pa.Table, batch_id: int, dead_letters: DeadLetterStore | None
) -> None:
    """Apply each failed row's policy; raises for FAIL (the earliest such record)."""
    if failed.num_rows == 0:
        return
    rows = failed.to_pylist()
    fatal = [r for r in rows if (r.get("handling") or "FAIL") == "FAIL"]
    if fatal:
        first = min(fatal, key=lambda r: (r["topic"], r["partition"], r["offset"]))
        more = f"; {len(fatal) - 1} more bad record(s) in this batch" if len(fatal) > 1 else ""
        raise DecodeError(f"{first['error']}{more} [stage {first.get('stage') or 'decode'}]", _where(first))
    for row in rows:
        handling, stage = row["handling"], row.get("stage") or "decode"
        metrics.BAD_RECORDS.labels(pipeline, handling, stage).inc()
        if handling == "LOG":
            log.warning("pipeline %s: dropped a bad record at %s [stage %s]: %s",
                        pipeline, _where(row), stage, row["error"])
    letters = failed.filter(pc.equal(failed.column("handling"), "DEAD_LETTER"))
    if letters.num_rows:
        if dead_letters is None:
            first = _where(letters.to_pylist()[0])
            raise DecodeError("DEAD_LETTER policy without a dead_letters store configured", first)
        dead_letters(letters, batch_id)
