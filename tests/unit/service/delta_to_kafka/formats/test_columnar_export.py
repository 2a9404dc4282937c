"""The column-by-column export encoder writes the same bytes as TO_CHANGELOG + the record layout row by row.

Random change feeds (several commits, rows of a commit shuffled, updates as -U/+U pairs,
values that need escaping or exact float text) are encoded both ways under every record
layout and option that changes the bytes; flushes that need state go to the row path.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pyarrow as pa
import pytest

from service.config.exports import ExportSettings
from service.delta_to_kafka.changelog.feed_changes import pair_changes
from service.delta_to_kafka.changelog.to_changelog import ToChangelog
from service.delta_to_kafka.formats import export_encoder, json_columns
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.json_columns import dump, json_fragments
from service.delta_to_kafka.formats.output_formats import KafkaRecordEncoder

NOW = 1_700_000_000.25
T0 = datetime(2024, 5, 1, 12, 0, 0, 250_000, tzinfo=timezone.utc)
SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("name", pa.string()), ("amount", pa.float64()),
                    ("active", pa.bool_()), ("price", pa.decimal128(10, 2)), ("seen", pa.timestamp("us", "UTC"))])
ODD_TEXT = ['plain', 'quo"te', 'back\\slash', 'new\nline', 'ctl\x01', 'é ☃', '', None]
ODD_FLOATS = [0.0, -0.0, 1.0, 0.25, 1e-7, 1e15, 123456.789, float("nan"), float("inf"), 3.3e22, None]


def _row(rng: random.Random, key: tuple[int, str], version: int) -> dict:
    return {"id": key[0], "region": key[1], "name": rng.choice(ODD_TEXT), "amount": rng.choice(ODD_FLOATS),
            "active": rng.choice([True, False, None]), "price": Decimal(rng.randint(-999, 99999)) / 100,
            "seen": T0 + timedelta(microseconds=rng.randint(0, 10**9) + version)}


def random_feed(seed: int, commits: int = 4, keys: int = 30) -> pa.Table:
    """A change feed of `commits` versions over `keys` keys, commit rows shuffled."""
    rng = random.Random(seed)
    live: dict[tuple[int, str], dict] = {}
    rows: list[tuple[str, int, dict]] = []
    for version in range(commits):
        commit = []
        for key in rng.sample([(i, rng.choice("ab")) for i in range(keys)], keys // 2):
            if key not in live:
                live[key] = _row(rng, key, version)
                commit.append(("insert", live[key]))
            elif rng.random() < 0.3:
                commit.append(("delete", live.pop(key)))
            else:
                new = _row(rng, key, version)
                commit += [("update_preimage", live[key]), ("update_postimage", new)]
                live[key] = new
        rng.shuffle(commit)
        rows += [(kind, version, row) for kind, row in commit]
    data = {c: pa.array([row[c] for _, _, row in rows], SCHEMA.field(c).type) for c in SCHEMA.names}
    data["_change_type"] = pa.array([kind for kind, _, _ in rows])
    data["_commit_version"] = pa.array([v for _, v, _ in rows], pa.int64())
    data["_commit_timestamp"] = pa.array([T0 + timedelta(seconds=v) for _, v, _ in rows], pa.timestamp("us", "UTC"))
    return pa.table(data)


LAYOUTS = [
    {"preset": "debezium"},
    {"preset": "debezium", "passthrough": ["_commit_version", "name"], "produces_full_deletes": False},
    {"preset": "flat"},
    {"preset": "flat", "passthrough": ["_commit_timestamp", "_commit_version"], "produces_full_deletes": True},
    {"preset": "deletion-flag"},
    {"before": "b", "after": "a", "passthrough": ["name", "_commit_version"]},
    {"before": "img", "after": "img", "tombstones": True},
    {"op_mapping": {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}, "passthrough": ["amount"]},
    {"op_mapping": {"INSERT": "I", "UPDATE_BEFORE": "UB", "UPDATE_AFTER": "UA", "DELETE": "D"},
     "before": "before", "after": "after", "tombstones": True},
    {"op_mapping": {"INSERT, UPDATE_AFTER": "up", "DELETE": "del"}},
    {"preset": "debezium", "compaction": "none"},
    {"preset": "flat", "compaction": "none", "tombstones": True},
]


def export(layout: dict) -> ExportSettings:
    return ExportSettings(name="e", table="t", topic="t.changes", primary_key=("id", "region"), **layout)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(i) for i in range(len(LAYOUTS))])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_column_by_column_equals_row_by_row(layout, seed):
    settings, feed = export(layout), random_feed(seed)
    encoder = ExportEncoder(settings, clock=lambda: NOW)
    columnar = encoder._by_column(feed, int(NOW * 1000))
    assert columnar is not None  # a stateless flush: the column path was taken
    rows = KafkaRecordEncoder(settings).encode(ToChangelog(settings).encode_flush(feed, NOW), int(NOW * 1000))
    assert columnar == rows
    assert encoder(feed) == rows


@pytest.mark.parametrize("layout", LAYOUTS, ids=[str(i) for i in range(len(LAYOUTS))])
@pytest.mark.parametrize("run", [1, 3, 17])
def test_runs_of_changes_give_the_whole_flush(layout, run, monkeypatch):
    """A stateless flush encoded run after run (`slices`) writes the whole flush's records in order,
    whether a run's rows are a slice of the feed or taken from it (a shuffled feed)."""
    monkeypatch.setattr(export_encoder, "SLICE_CHANGES", run)
    settings = export(layout)
    shuffled = random_feed(6)
    shuffled = shuffled.take(pa.array(random.Random(6).sample(range(shuffled.num_rows), shuffled.num_rows)))
    for feed in (random_feed(5), shuffled):
        rows = KafkaRecordEncoder(settings).encode(ToChangelog(settings).encode_flush(feed, NOW), int(NOW * 1000))
        parts = list(ExportEncoder(settings, clock=lambda: NOW).slices(feed))
        assert len(parts) > 1
        assert [record for part in parts for record in part] == rows


def test_a_run_the_columns_cannot_write_hands_the_rest_to_the_row_path(monkeypatch):
    """The row path writes the same bytes: after the runs already given, its records follow."""
    monkeypatch.setattr(export_encoder, "SLICE_CHANGES", 4)
    settings = export({"preset": "debezium"})
    feed = random_feed(8)
    encoder = ExportEncoder(settings, clock=lambda: NOW)
    columnar, calls = encoder.columnar, []

    def refuses_the_third_run(*args):
        calls.append(1)
        if len(calls) == 3:
            raise TypeError("no JSON form")
        return type(columnar).encode(columnar, *args)

    monkeypatch.setattr(columnar, "encode", refuses_the_third_run)
    parts = list(encoder.slices(feed))
    rows = KafkaRecordEncoder(settings).encode(ToChangelog(settings).encode_flush(feed, NOW), int(NOW * 1000))
    assert len(calls) == 3 and len(parts) == 3
    assert [record for part in parts for record in part] == rows


def test_flushes_that_need_state_take_the_row_path():
    settings = export({"preset": "debezium", "state_ttl_seconds": 60})
    lone_before = random_feed(1, commits=1).slice(0, 0)
    half = pa.concat_tables([lone_before, random_feed(4, commits=2)])
    half = half.filter(pa.compute.not_equal(half.column("_change_type"), "update_postimage"))
    assert pair_changes(half, settings.primary_key, compact=True) is None
    encoder = ExportEncoder(settings, clock=lambda: NOW)
    assert encoder(half) == KafkaRecordEncoder(settings).encode(
        ToChangelog(settings).encode_flush(half, NOW), int(NOW * 1000))
    assert not encoder.changelog.stateless  # the -U images wait in state; later flushes use the row path


def test_fragments_are_the_exact_json_of_each_value():
    values = [1e-5, 9.99e-6, 999999999999999.9, 1e15, -2.5, 7.0, float("-inf"), None]
    assert json_fragments(pa.array(values)).to_pylist() == ["null" if v is None else dump(v) for v in values]
    big = pa.array([2**64 - 1, None], pa.uint64())
    assert json_fragments(big).to_pylist() == [str(2**64 - 1), "null"]


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_strings_to_escape_are_found_across_scan_blocks(block, monkeypatch):
    """Quotes, backslashes and control characters anywhere, a block boundary inside a value or not."""
    monkeypatch.setattr(json_columns, "_SCAN_BLOCK", block)
    rng = random.Random(block)
    alphabet = ['a', 'ß', '"', '\\', '\n', '\x01', ' ', '🏷', 'z']
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(300)] + [None]
    column = pa.array(values).slice(5)  # an offset into the buffers, as a sliced feed gives
    assert json_fragments(column).to_pylist() == ["null" if v is None else dump(v) for v in values[5:]]
    leading = ["", None, "", 'a"', "\x02", "", 'q"\\"'] + values  # empty rows before a block's first byte
    assert json_fragments(pa.array(leading)).to_pylist() == ["null" if v is None else dump(v) for v in leading]


def test_string_views_as_delta_rs_reads_them():
    settings = export({"preset": "debezium"})
    feed = random_feed(7)
    views = pa.table([c.cast(pa.string_view()) if pa.types.is_string(c.type) else c for c in feed.columns],
                     names=feed.column_names)
    encoder = ExportEncoder(settings, clock=lambda: NOW)
    columnar = encoder._by_column(views, int(NOW * 1000))
    assert columnar is not None
    rows = ToChangelog(settings).encode_flush(feed, NOW)
    assert columnar == KafkaRecordEncoder(settings).encode(rows, int(NOW * 1000))


@pytest.mark.parametrize("layout", [{"preset": "debezium"}, {"before": "b", "after": "a", "compaction": "none"},
                                    {"op_mapping": {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}}],
                         ids=["debezium", "images", "combined"])
@pytest.mark.parametrize("seed", [1, 2])
def test_upsert_input_keeps_the_same_state_column_by_column(layout, seed):
    settings = export({"input_changelog": "upsert", "state_ttl_seconds": 3600, **layout})
    feed = random_feed(seed, commits=5)
    encoder, reference = ExportEncoder(settings, clock=lambda: NOW), ToChangelog(settings)
    rows = KafkaRecordEncoder(settings)
    versions = feed.column("_commit_version")
    for version in range(5):
        flush = feed.filter(pa.compute.equal(versions, version))
        assert encoder._by_column(flush, int(NOW * 1000)) is not None  # whole pairs: the column path
        assert encoder(flush) == rows.encode(reference.encode_flush(flush, NOW), int(NOW * 1000))
        assert encoder.state_changes() == reference.state_changes()
        assert encoder.state_entries() == reference.state_entries() > 0
    assert encoder.snapshot() == reference.snapshot()
