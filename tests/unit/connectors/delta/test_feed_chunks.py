"""Row chunks of a change feed: bounded, never between the rows of one key in one version, covering every row once."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from connectors.delta.feed_chunks import (
    COMMIT_ROW,
    VersionLayout,
    canonical_order,
    chunk_end,
    chunk_of_version,
    number_rows,
)

KEY = ("id",)


def rows_in_range(feed: pa.Table, start: tuple[int, int], end: tuple[int, int]) -> pa.Table:
    """The rows of a numbered feed at offsets in [start, end)."""
    places = list(zip(feed.column("_commit_version").to_pylist(), feed.column(COMMIT_ROW).to_pylist()))
    return feed.filter(pa.array([start <= place < end for place in places]))


def version_feed(seed: int, version: int, keys: int) -> pa.Table:
    """One version's feed in delta-rs's arbitrary order: inserts, deletes and -U/+U pairs."""
    rng = random.Random(seed * 1000 + version)
    rows = []
    for key in rng.sample(range(keys * 3), keys):
        kind = rng.choice(["insert", "delete", "update"])
        rows += [("update_preimage", key), ("update_postimage", key)] if kind == "update" else [(kind, key)]
    rng.shuffle(rows)
    return pa.table({"id": pa.array([k for _, k in rows], pa.int64()),
                     "_change_type": pa.array([t for t, _ in rows], pa.string()),
                     "_commit_version": pa.array([version] * len(rows), pa.int64())})


@pytest.mark.parametrize("max_rows", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("seed", [1, 2])
def test_chunks_are_bounded_cover_every_row_once_and_keep_pairs(seed, max_rows):
    feeds = [version_feed(seed, v, keys) for v, keys in enumerate([0, 9, 1, 25, 4])]
    layouts = {v: VersionLayout.of(f.select(["id", "_change_type"]), KEY) for v, f in enumerate(feeds)}
    numbered = number_rows(canonical_order(pa.concat_tables(feeds), KEY))
    start, seen = (0, 0), []
    while start < (len(feeds), 0):
        end = chunk_end(start, len(feeds), max_rows, None, layouts.__getitem__)
        assert end > start
        chunk = rows_in_range(numbered, start, end)
        pairs = {(r["_commit_version"], r["id"]) for r in chunk.to_pylist() if r["_change_type"] == "update_preimage"}
        posts = {(r["_commit_version"], r["id"]) for r in chunk.to_pylist() if r["_change_type"] == "update_postimage"}
        assert pairs == posts  # -U and +U of one update in the same chunk
        assert chunk.num_rows <= max(max_rows, 2)
        seen += [(r["_commit_version"], r[COMMIT_ROW]) for r in chunk.to_pylist()]
        if start[0] == end[0] or end[1] == 0 and start[0] == end[0] - 1:  # within one version: as an executor reads it
            version, feed = start[0], feeds[start[0]]
            batches = [feed.slice(i, 3) for i in range(0, feed.num_rows, 3)]
            alone = chunk_of_version(feed.select(["id", "_change_type"]), batches, feed.schema, KEY, start[1],
                                     end[1] if end[0] == version else 0)
            assert alone == chunk
        start = end
    assert seen == [(r["_commit_version"], r[COMMIT_ROW]) for r in numbered.to_pylist()]


def test_max_versions_also_bounds_a_chunk():
    feeds = [version_feed(3, v, 4) for v in range(6)]
    layouts = {v: VersionLayout.of(f, KEY) for v, f in enumerate(feeds)}
    assert chunk_end((1, 0), 6, 10_000, 2, layouts.__getitem__) == (3, 0)


def test_canonical_order_puts_the_before_image_first_and_numbers_rows_per_version():
    feed = pa.table({"id": [2, 1, 1, 2], "_change_type": ["insert", "update_postimage", "update_preimage", "delete"],
                     "_commit_version": pa.array([5, 5, 5, 6], pa.int64())})
    numbered = number_rows(canonical_order(feed, KEY))
    assert [(r["id"], r["_change_type"], r[COMMIT_ROW]) for r in numbered.to_pylist()] == [
        (1, "update_preimage", 0), (1, "update_postimage", 1), (2, "insert", 2), (2, "delete", 0)]


def test_a_replayed_batch_drops_the_rows_at_or_before_the_committed_position():
    from service.delta_to_kafka.export_position import PositionError
    from service.delta_to_kafka.pipeline import after_position

    numbered = number_rows(canonical_order(pa.concat_tables([version_feed(5, v, 3) for v in range(3)]), KEY))
    places = [(r["_commit_version"], r[COMMIT_ROW]) for r in numbered.to_pylist()]
    kept = after_position(numbered, (1, 2))  # committed: versions to 0 and the first 2 rows of version 1
    assert [(r["_commit_version"], r[COMMIT_ROW]) for r in kept.to_pylist()] == [p for p in places if p >= (1, 2)]
    assert after_position(numbered.drop_columns([COMMIT_ROW]), (2, 0)).num_rows == numbered.num_rows - sum(
        1 for r in numbered.to_pylist() if r["_commit_version"] < 2)
    with pytest.raises(PositionError, match="max_rows_per_trigger"):
        after_position(numbered.drop_columns([COMMIT_ROW]), (1, 2))


@pytest.mark.parametrize("names", [["id"], ["id", "region"]])
def test_rows_of_keys_keeps_exactly_the_rows_of_those_keys(names):
    from connectors.delta.feed_chunks import rows_of_keys

    rows = pa.table({"id": pa.array([1, 1, 2, 3, 3], pa.int64()), "region": ["a", "b", "a", "a", "a"],
                     "v": [10, 11, 12, 13, 14]})
    keys = pa.table({"id": pa.array([1, 3], pa.int64()), "region": ["b", "a"]}).select(names)
    kept = rows_of_keys([rows.slice(0, 2), rows.slice(2)], keys, rows.schema)
    assert sorted(kept.column("v").to_pylist()) == ([10, 11, 13, 14] if names == ["id"] else [11, 13, 14])


@pytest.mark.parametrize("offset", [0, 3])
def test_take_rows_of_raw_string_views_equals_the_take_of_their_strings(offset):
    """delta-rs gives string views, which Arrow cannot take or filter: `take_rows` takes their views."""
    from connectors.delta.feed_chunks import take_rows

    rng = random.Random(offset)
    texts = [None if rng.random() < 0.2 else "x" * rng.randrange(0, 40) + str(i) for i in range(60)]
    strings = pa.table({"s": pa.chunked_array([texts[:25], texts[25:]], pa.string()), "n": list(range(60))})
    views = pa.table({"s": strings.column("s").cast(pa.string_view()), "n": strings.column("n")}).slice(offset)
    at = [rng.randrange(0, 60 - offset) for _ in range(80)]
    taken = take_rows(views, at)
    assert taken.column("s").type == pa.string_view()
    assert taken.column("s").cast(pa.string()).to_pylist() == strings.slice(offset).column("s").take(at).to_pylist()
    assert taken.column("n").to_pylist() == [n + offset for n in at]
    present = [i for i, text in enumerate(texts[offset:]) if text is not None]
    assert take_rows(views, present).column("s").null_count == 0


def test_a_version_rest_hands_out_each_later_chunk_and_keeps_what_follows():
    """Rows read ahead serve every later chunk they cover, a short last one included (no second stream)."""
    from connectors.delta.feed_chunks import VersionRest

    rows = pa.table({"v": list(range(100, 130)), COMMIT_ROW: pa.array(range(100, 130), pa.int64())})
    rest = VersionRest()
    rest.keep("t", 4, rows, to_end=True)
    assert rest.take("t", 4, 100, 128).column("v").to_pylist() == list(range(100, 128))
    assert rest.take("t", 4, 128, 0).column("v").to_pylist() == [128, 129]
    assert rest.take("t", 4, 130, 0) is None
    rest.keep("t", 4, rows, to_end=False)
    assert rest.take("t", 4, 100, 110).num_rows == 10
    assert rest.take("t", 4, 110, 0) is None  # to the version's end, but the rows do not reach it
    rest.keep("t", 4, rows, to_end=True)
    assert rest.take("t", 4, 101, 110) is None  # not where the rows start: dropped
    assert rest.take("t", 4, 110, 120) is None
