"""TO_CHANGELOG's pairing and per-flush compaction (to_changelog.py states the rules) as Arrow sorts and group-bys.

A flush's feed rows are sorted by (commit version, primary key, side), so the -U/-D row and
the +U/+I row of one key in one commit are neighbours: a change is a run of one or two rows.
Compaction sorts the changes by (key, version) and keeps, per key, the first change's
before image and the last change's after image. The result holds row numbers of the feed,
not images: the record layout takes the images' JSON by row number (`columnar_records`).

Only flushes that need no encoder state are paired here. `pair_changes` returns None, and
the caller falls back to the row-by-row encoder (which also raises the precise errors), when
a commit has a -U without its +U or a +U without its -U (they wait in or read from state),
an unknown change type, a null key, or two images on one side of a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.delta.feed_chunks import run_start_mask
from service.config.exports import ChangeFeedColumn

NO_ROW = -1
_FEED_TYPES = ("update_preimage", "delete", "insert", "update_postimage")  # before side first
_PREIMAGE, _POSTIMAGE = 0, 3
_BEFORE_SIDE_TYPES = 2  # the first two of _FEED_TYPES


@dataclass(frozen=True)
class FeedChanges:
    """A flush's changes in record order, as feed row numbers (NO_ROW where there is no image).

    `before`: the first before image; `after`: the last after image; `last_before`: the last
    commit's before image (a delete's passthrough columns come from it); `last`: a row of the
    last commit (its version, timestamp and key).
    """

    before: np.ndarray
    after: np.ndarray
    last_before: np.ndarray
    last: np.ndarray

    def __len__(self) -> int:
        return len(self.last)

    def __getitem__(self, rows: slice) -> "FeedChanges":
        """The changes in `rows` (a run of the record order)."""
        return FeedChanges(self.before[rows], self.after[rows], self.last_before[rows], self.last[rows])


_DENSE = 2  # a run of changes reads a slice of the feed when its rows span at most this many times their references


def changes_feed(feed: pa.Table, changes: FeedChanges) -> tuple[pa.Table, FeedChanges]:
    """The feed rows `changes` refer to and the changes renumbered to them: a zero-copy slice
    where the rows lie close together (a run of a flush's record order usually does), else the
    rows taken. Records depend only on the rows a change refers to, so a run of changes encodes
    on its own feed to the records it has in the whole flush."""
    numbers = (changes.before, changes.after, changes.last_before, changes.last)
    present = np.concatenate([rows[rows != NO_ROW] for rows in numbers])
    if present.size == 0:
        return feed.slice(0, 0), changes
    low, high = int(present.min()), int(present.max())
    if high - low + 1 <= _DENSE * present.size:
        if low == 0 and high + 1 == feed.num_rows:
            return feed, changes
        renumbered = [np.where(rows == NO_ROW, NO_ROW, rows - low) for rows in numbers]
        return feed.slice(low, high - low + 1), FeedChanges(*renumbered)
    used = np.unique(present)
    renumbered = [np.where(rows == NO_ROW, NO_ROW, np.searchsorted(used, rows)) for rows in numbers]
    return feed.take(pa.array(used)), FeedChanges(*renumbered)


def plain_strings(feed: pa.Table) -> pa.Table:
    """The feed with string and binary views (as delta-rs reads them) as plain strings and binaries: sortable."""
    views = {pa.types.is_string_view: pa.string(), pa.types.is_large_string: pa.string(),
             pa.types.is_binary_view: pa.binary(), pa.types.is_large_binary: pa.binary()}
    columns = []
    for column in feed.columns:
        target = next((plain for test, plain in views.items() if test(column.type)), None)
        columns.append(column if target is None else column.cast(target))
    return pa.table(columns, names=feed.column_names)


def _kinds(feed: pa.Table) -> np.ndarray | None:
    kinds = pc.index_in(feed.column(ChangeFeedColumn.CHANGE_TYPE), value_set=pa.array(_FEED_TYPES))
    if kinds.null_count:
        return None
    return kinds.to_numpy().astype(np.int8)


def _commit_pairs(feed: pa.Table, primary_key: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(before row, after row) of every change per commit and key, in (version, key) order."""
    kinds = _kinds(feed)
    if kinds is None or any(feed.column(c).null_count for c in primary_key):
        return None
    sides = (kinds >= _BEFORE_SIDE_TYPES).astype(np.int8)
    grouping = pa.table([feed.column(ChangeFeedColumn.COMMIT_VERSION), *(feed.column(c) for c in primary_key)],
                        names=["v", *(f"k{i}" for i in range(len(primary_key)))])
    order = pc.sort_indices(grouping.append_column("s", pa.array(sides)),
                            [(name, "ascending") for name in [*grouping.column_names, "s"]]).to_numpy().astype(np.int64)
    starts = np.flatnonzero(run_start_mask(grouping.take(order)))
    sizes = np.diff(np.append(starts, len(order)))
    first, second = order[starts], order[np.minimum(starts + 1, len(order) - 1)]
    pairs = sizes == 2
    if (sizes > 2).any() or (pairs & (sides[first] == sides[second])).any():
        return None  # two images on one side: the row path names the key
    lone = ~pairs
    if (lone & ((kinds[first] == _PREIMAGE) | (kinds[first] == _POSTIMAGE))).any():
        return None  # a half update: state decides
    before = np.where(pairs | (sides[first] == 0), first, NO_ROW)
    after = np.where(pairs, second, np.where(sides[first] == 1, first, NO_ROW))
    return before, after


def _compact(feed: pa.Table, primary_key: tuple[str, ...], changes: FeedChanges) -> FeedChanges:
    """One change per key: the first before image and the last after image; insert-then-delete goes."""
    keys = feed.select(list(primary_key)).take(pa.array(changes.last))
    keys = keys.append_column("__version", feed.column(ChangeFeedColumn.COMMIT_VERSION).take(pa.array(changes.last)))
    order = pc.sort_indices(keys, [(name, "ascending") for name in keys.column_names]).to_numpy().astype(np.int64)
    starts = run_start_mask(keys.select(list(primary_key)).take(pa.array(order)))
    group_first = order[np.flatnonzero(starts)]
    group_last = order[np.append(np.flatnonzero(starts)[1:] - 1, len(order) - 1)]
    before, after = changes.before[group_first], changes.after[group_last]
    kept = (before != NO_ROW) | (after != NO_ROW)
    return FeedChanges(before[kept], after[kept], changes.last_before[group_last][kept], changes.last[group_last][kept])


def pair_changes(feed: pa.Table, primary_key: tuple[str, ...], compact: bool) -> FeedChanges | None:
    """The flush's changes in record order (commit version, then first feed row); None: use the row path.

    The feed's strings must be plain (`plain_strings`).
    """
    if feed.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return FeedChanges(empty, empty, empty, empty)
    pairs = _commit_pairs(feed, primary_key)
    if pairs is None:
        return None
    before, after = pairs
    changes = FeedChanges(before, after, before, np.where(after != NO_ROW, after, before))
    if compact:
        changes = _compact(feed, primary_key, changes)
    # A change's place: its last commit's version, then its first row in the feed.
    versions = feed.column(ChangeFeedColumn.COMMIT_VERSION).to_numpy()[changes.last]
    position = np.where(changes.last_before == NO_ROW, changes.last, np.minimum(changes.last_before, changes.last))
    order = np.lexsort((position, versions))
    return FeedChanges(changes.before[order], changes.after[order], changes.last_before[order], changes.last[order])
