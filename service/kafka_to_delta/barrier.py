"""The event-time rules every stateful ingest stage shares: what the watermark releases, and when
state has outlived its TTL.

Below the stages (FROM_CHANGELOG's ORDER BY, the materializer's key and bucket stages, the regular
join), so each applies the same rule: a row is released once the watermark reaches its event time
(`event time <= watermark`); state last touched at `t` has outlived a TTL once `t + ttl <= now`
(`now`: the watermark, or the wall clock where a stage counts in processing time). A TTL of 0 never
expires anything. `outlived` is the reference for one value; `outlived_mask` its Arrow twin for a
column of them (`tests/unit/service/kafka_to_delta/test_barrier.py` holds them equal).
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

Row = TypeVar("Row")


def released(rows: Iterable[Row], watermark_ms: int, event_time: Callable[[Row], int]) -> tuple[list[Row], list[Row]]:
    """(rows the watermark reached, rows that wait), each in the order given."""
    due: list[Row] = []
    wait: list[Row] = []
    for row in rows:
        (due if event_time(row) <= watermark_ms else wait).append(row)
    return due, wait


def outlived(touched_ms: int | None, ttl_ms: int, now_ms: int) -> bool:
    """Whether state last touched at `touched_ms` has outlived `ttl_ms` at `now_ms` (never without a
    TTL or a touch time)."""
    return bool(ttl_ms) and touched_ms is not None and touched_ms + ttl_ms <= now_ms


def outlived_mask(touched_ms: pa.Array | pa.ChunkedArray, ttl_ms: int, now_ms: int) -> pa.Array | pa.ChunkedArray:
    """`outlived` for a column of touch times: true where the state has outlived the TTL (a null
    touch time never expires)."""
    if not ttl_ms:
        return pa.array([False] * len(touched_ms), pa.bool_())
    return pc.fill_null(pc.less_equal(pc.add(touched_ms, ttl_ms), now_ms), False)


def expires_at(touched_ms: int | None, ttl_ms: int) -> int | None:
    """When state last touched at `touched_ms` outlives `ttl_ms` (None: never)."""
    return None if not ttl_ms or touched_ms is None else touched_ms + ttl_ms
