"""The export's read keeps a batch's rows in (version, `_commit_row`) order without copying when they are already."""

from __future__ import annotations

import pyarrow as pa

from connectors.delta.feed_chunks import COMMIT_ROW
from service.delta_to_kafka.pipeline import after_position, sort_feed


def _feed(places: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"_commit_version": pa.array([v for v, _ in places], pa.int64()),
                     COMMIT_ROW: pa.array([r for _, r in places], pa.int64()),
                     "n": list(range(len(places)))})


def test_a_feed_in_order_is_kept_as_it_is():
    feed = _feed([(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (3, 0)])
    assert sort_feed(feed) is feed
    assert after_position(feed, (1, 0)) is feed


def test_a_feed_out_of_order_is_sorted_stably():
    places = [(2, 0), (1, 1), (1, 0), (2, 0), (1, 1), (0, 5)]
    ordered = sort_feed(_feed(places))
    expected = sorted(range(len(places)), key=lambda i: places[i])  # sorted() is stable
    assert ordered.column("n").to_pylist() == expected
    versions_only = sort_feed(_feed(places).drop_columns([COMMIT_ROW]))
    assert versions_only.column("n").to_pylist() == sorted(range(len(places)), key=lambda i: places[i][0])


def test_rows_before_the_position_are_dropped():
    feed = _feed([(1, 0), (1, 1), (2, 0), (2, 1)])
    assert after_position(feed, (1, 1)).column("n").to_pylist() == [1, 2, 3]
    assert after_position(feed, (2, 0)).column("n").to_pylist() == [2, 3]


def test_chunks_read_ahead_equal_chunks_read_alone(tmp_path, monkeypatch):
    """A split version read chunk after chunk with rows read ahead gives each chunk's rows exactly, streaming less."""
    from deltalake import DeltaTable, write_deltalake

    from connectors.delta import change_feed
    from connectors.delta.change_feed import feed_schema, keys_of, read_batch
    from connectors.delta.feed_chunks import VersionLayout, VersionRest, chunk_end

    uri = str(tmp_path / "t")
    ids = list(range(0, 3000, 3)) + list(range(1, 3000, 3))  # two files, keys interleaved
    for part in (ids[:1000], ids[1000:]):
        write_deltalake(uri, pa.table({"id": pa.array(part, pa.int64()), "v": [f"x{i}" * (i % 7) for i in part]}),
                        mode="append", configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(uri).update(updates={"v": "'updated'"}, predicate="id % 2 = 0")  # version 2: -U/+U pairs
    streams = []
    streamed = change_feed.stream_feed
    monkeypatch.setattr(change_feed, "stream_feed", lambda *a: streams.append(a) or streamed(*a))
    schema = feed_schema(pa.schema([("id", pa.int64()), ("v", pa.string())]), numbered=True)
    for version, max_rows in ((1, 300), (1, 999), (2, 301), (2, 700), (2, 1999)):
        layout = VersionLayout.of(keys_of(uri, None, version, ("id",)), ("id",))
        rest, start, chunks = VersionRest(), (version, 0), 0
        streams.clear()
        while start < (version + 1, 0):
            end = chunk_end(start, version + 1, max_rows, None, lambda _: layout)
            alone = pa.concat_tables(list(read_batch(uri, None, schema, start, end, ("id",), max_rows)))
            ahead = pa.concat_tables(list(read_batch(uri, None, schema, start, end, ("id",), max_rows, rest)))
            assert ahead.equals(alone), (version, max_rows, start, end)
            start, chunks = end, chunks + 1
        alone_streams = chunks if chunks > 1 else 0
        assert len(streams) - alone_streams < alone_streams or chunks == 1, (version, max_rows, streams)
