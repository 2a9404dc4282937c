"""TO_CHANGELOG (spec 4.2): every example of the spec as a pure test, config validation, a real
delta-rs change feed, and the round trip of spec 4.5.

Each spec example's input changelog becomes a Delta change feed: +I an `insert` row, -U/+U an
`update_preimage`/`update_postimage` pair of one commit, -D a `delete` row; an upsert stream
(no -U) has `update_postimage` rows alone. Spec watermarks become flush boundaries.

The spec's delete examples under the default `produces_full_deletes => false` are not consistent:
4.2.1.4 defines the default as key columns only, while 4.2.1.1, 4.2.1.2.1, 4.2.1.6, 4.2.2.1 and
4.5 show whole rows. We follow 4.2.1.4; the tests of those examples check the spec's text with
`produces_full_deletes=True` and the key-only default next to it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.config.exports import PRESETS, ExportSettings, parse_op_mapping
from service.config.from_changelog import FromChangelogSettings
from service.delta_to_kafka.changelog.changelog_state import key_bytes
from service.delta_to_kafka.changelog.to_changelog import ChangeFeedError, OutputRecord, ToChangelog
from service.delta_to_kafka.formats.output_formats import KafkaRecordEncoder
from service.kafka_to_delta.changelog.from_changelog import ChangelogRow, FromChangelog
from service.kafka_to_delta.formats.debezium_json import loads
from vocabulary.changes import ChangeKind

INS, UB, UA, D = "insert", "update_preimage", "update_postimage", "delete"
T0 = datetime(2024, 5, 1, 12, 0, 0)
DC = {"op_mapping": {"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"}}
UPSERT_CODES = {"op_mapping": {"INSERT": "c", "DELETE": "d", "UPDATE_AFTER": "u"}}


def feed(*changes: tuple[str, int, dict], schema: dict[str, pa.DataType] | None = None) -> pa.Table:
    """A change feed as delta-rs gives it: (change type, commit version, row) per feed row."""
    columns: dict[str, None] = {}
    for _, _, row in changes:
        columns.update(dict.fromkeys(row))
    data = {c: pa.array([row.get(c) for _, _, row in changes], (schema or {}).get(c)) for c in columns}
    data["_change_type"] = pa.array([kind for kind, _, _ in changes], pa.string())
    data["_commit_version"] = pa.array([v for _, v, _ in changes], pa.uint64())
    data["_commit_timestamp"] = pa.array([T0 + timedelta(seconds=v) for _, v, _ in changes], pa.timestamp("ms"))
    return pa.table(data)


def export(**fields) -> ExportSettings:
    return ExportSettings(**{"name": "e", "table": "t", "topic": "t.changes", "primary_key": ("id",), **fields})


def values(records: list[OutputRecord]) -> list[dict | None]:
    return [record.value for record in records]


def encode(*changes, now: float = 0.0, **fields) -> list[dict | None]:
    return values(ToChangelog(export(**fields)).encode_flush(feed(*changes), now))


def update(version: int, old: dict, new: dict) -> list[tuple[str, int, dict]]:
    return [(UB, version, old), (UA, version, new)]


# --- spec 4.2.1 parameters -----------------------------------------------------------------------


def test_4_2_1_1_default_signature():
    encoder = ToChangelog(export(produces_full_deletes=True))
    flushes = [
        feed((INS, 1, {"id": 5, "name": "name"})),
        feed(*update(2, {"id": 5, "name": "name"}, {"id": 5, "name": "updated_name"})),
        feed((D, 3, {"id": 5, "name": "updated_name"})),
    ]
    assert [values(encoder.encode_flush(f, 0)) for f in flushes] == [
        [{"op": "INSERT", "id": 5, "name": "name"}],
        [{"op": "UPDATE_AFTER", "id": 5, "name": "updated_name"}],
        [{"op": "DELETE", "id": 5, "name": "updated_name"}],
    ]
    assert encode((D, 3, {"id": 5, "name": "updated_name"})) == [{"op": "DELETE", "id": 5}]


def test_4_2_1_2_1_flat_records_ignore_update_before():
    changes = [(INS, 1, {"id": 5, "name": "name"}), *update(2, {"id": 5, "name": "name"},
                                                          {"id": 5, "name": "updated_name"}),
               (D, 3, {"id": 5, "name": "updated_name"})]
    assert encode(*changes, compaction="none", produces_full_deletes=True) == [
        {"op": "INSERT", "id": 5, "name": "name"},
        {"op": "UPDATE_AFTER", "id": 5, "name": "updated_name"},
        {"op": "DELETE", "id": 5, "name": "updated_name"},
    ]


def test_4_2_1_2_2_update_mapping_with_before_after_fields():
    out = encode(*update(1, {"id": 5, "name": "old"}, {"id": 5, "name": "new"}),
                 before="before_state", after="after_state", **DC)
    assert out == [{"op": "u", "before_state": {"id": 5, "name": "old"}, "after_state": {"id": 5, "name": "new"}}]


def _ttl_encoder(ttl: float) -> ToChangelog:
    mapping = {"INSERT": "INSERT", "DELETE": "DELETE", "UPDATE_BEFORE, UPDATE_AFTER": "UPDATE"}
    return ToChangelog(export(state_ttl_seconds=ttl, op_mapping=mapping))


def test_4_2_1_3_1_state_ttl_with_unified_updates():
    encoder = _ttl_encoder(300)
    assert encoder.encode_flush(feed((UB, 1, {"id": 1, "val": 10})), now=1000.0) == []
    assert len(encoder.state) == 1  # the -U waits for its +U
    out = encoder.encode_flush(feed((UA, 2, {"id": 1, "val": 20})), now=1000.0 + 120)
    assert values(out) == [{"op": "UPDATE", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}]
    assert len(encoder.state) == 0


def test_4_2_1_3_1_expired_pending_update_before_makes_the_update_an_insert():
    encoder = _ttl_encoder(300)
    encoder.encode_flush(feed((UB, 1, {"id": 1, "val": 10})), now=1000.0)
    out = encoder.encode_flush(feed((UA, 2, {"id": 1, "val": 20})), now=1000.0 + 301)
    assert values(out) == [{"op": "INSERT", "before": None, "after": {"id": 1, "val": 20}}]  # spec 4.3.3


def test_state_ttl_zero_keeps_the_pending_update_before_forever():
    encoder = _ttl_encoder(0)
    encoder.encode_flush(feed((UB, 1, {"id": 1, "val": 10})), now=0.0)
    out = encoder.encode_flush(feed((UA, 2, {"id": 1, "val": 20})), now=10.0**9)
    assert [r.op for r in out] == ["UPDATE"]


def test_4_2_1_3_2_compaction_per_flush_and_stored_state():
    fields = {"state_ttl_seconds": 7 * 86400, "before": "before_state", "after": "after_state", **DC}
    encoder = ToChangelog(export(**fields))
    first = feed((INS, 1, {"id": 5, "name": "Alice"}),
                 *update(2, {"id": 5, "name": "Alice"}, {"id": 5, "name": "Alice Updated"}))
    assert values(encoder.encode_flush(first, 0)) == [
        {"op": "c", "before_state": None, "after_state": {"id": 5, "name": "Alice Updated"}}
    ]
    second = feed((INS, 3, {"id": 6, "name": "Bob"}),
                  *update(4, {"id": 5, "name": "Alice Updated"}, {"id": 5, "name": "Alice Final"}))
    assert values(encoder.encode_flush(second, 60)) == [
        {"op": "c", "before_state": None, "after_state": {"id": 6, "name": "Bob"}},
        {"op": "u", "before_state": {"id": 5, "name": "Alice Updated"},
         "after_state": {"id": 5, "name": "Alice Final"}},
    ]


def test_4_2_1_3_2_upsert_input_takes_the_before_image_from_stored_state():
    encoder = ToChangelog(export(input_changelog="upsert", before="before_state", after="after_state", **DC))
    encoder.encode_flush(feed((INS, 1, {"id": 5, "name": "Alice"}), (UA, 2, {"id": 5, "name": "Alice Updated"})), 0)
    assert len(encoder.state) == 1  # stored payload for key 5
    out = encoder.encode_flush(feed((UA, 4, {"id": 5, "name": "Alice Final"})), 60)
    assert values(out) == [
        {"op": "u", "before_state": {"id": 5, "name": "Alice Updated"}, "after_state": {"id": 5, "name": "Alice Final"}}
    ]


@pytest.mark.parametrize("changes, expected", [
    ([(INS, 1, {"id": 1, "v": "a"}), *update(2, {"id": 1, "v": "a"}, {"id": 1, "v": "b"})],
     [{"op": "c", "before": None, "after": {"id": 1, "v": "b"}}]),
    ([(INS, 1, {"id": 1, "v": "a"}), (D, 2, {"id": 1, "v": "a"})], []),
    ([*update(1, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}), *update(2, {"id": 1, "v": "b"}, {"id": 1, "v": "c"})],
     [{"op": "u", "before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "c"}}]),
    ([*update(1, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}), (D, 2, {"id": 1, "v": "b"})],
     [{"op": "d", "before": {"id": 1, "v": "a"}, "after": None}]),
    ([(D, 1, {"id": 1, "v": "a"}), (INS, 2, {"id": 1, "v": "z"})],
     [{"op": "u", "before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "z"}}]),
], ids=["insert-update", "insert-delete", "update-update", "update-delete", "delete-insert"])
def test_compaction_keeps_the_final_state_only(changes, expected):
    assert encode(*changes, preset="debezium", tombstones=False) == expected


def test_without_compaction_every_change_of_a_key_is_kept_in_order():
    changes = [(INS, 1, {"id": 1, "v": "a"}), *update(2, {"id": 1, "v": "a"}, {"id": 1, "v": "b"}),
               (D, 3, {"id": 1, "v": "b"})]
    out = encode(*changes, preset="debezium", compaction="none")
    assert [v and v["op"] for v in out] == ["c", "u", "d", None]  # None: the tombstone after the delete


def test_4_2_1_4_1_partial_deletes_by_default():
    assert encode((D, 1, {"id": 5, "name": "Alice", "age": 30}), **UPSERT_CODES) == [{"op": "d", "id": 5}]


def test_4_2_1_4_2_full_deletes():
    out = encode((D, 1, {"id": 5, "name": "Alice", "age": 30}), produces_full_deletes=True, **UPSERT_CODES)
    assert out == [{"op": "d", "id": 5, "name": "Alice", "age": 30}]


def test_4_2_1_5_1_passthrough_keeps_fields_at_the_top_level():
    (value,) = encode((INS, 1, {"id": 1, "name": "Alice", "ts_ms": 1234}),
                      before="before", after="after", passthrough="ts_ms", **DC)
    assert value == {"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}}
    assert list(value) == ["op", "ts_ms", "before", "after"]


def test_4_2_1_6_complete_signature():
    fields = {"before": "before", "after": "after", "op": "op", "state_ttl_seconds": 600,
              "produces_full_deletes": False, "passthrough": ("field1", "field2"), **DC}
    encoder = ToChangelog(export(**fields))
    extra = {"field1": "x", "field2": 7}
    flushes = [feed((INS, 1, {"id": 5, "name": "name", **extra})),
               feed(*update(2, {"id": 5, "name": "name", **extra}, {"id": 5, "name": "updated_name", **extra})),
               feed((D, 3, {"id": 5, "name": "updated_name", **extra}))]
    out = [values(encoder.encode_flush(f, 0)) for f in flushes]
    assert out == [
        [{"op": "c", **extra, "before": None, "after": {"id": 5, "name": "name"}}],
        [{"op": "u", **extra, "before": {"id": 5, "name": "name"}, "after": {"id": 5, "name": "updated_name"}}],
        [{"op": "d", **extra, "before": {"id": 5}, "after": None}],  # key only: see the module docstring
    ]
    full = ToChangelog(export(**{**fields, "produces_full_deletes": True})).encode_flush(flushes[2], 0)
    assert values(full) == [{"op": "d", **extra, "before": {"id": 5, "name": "updated_name"}, "after": None}]


# --- spec 4.2.2 use cases ------------------------------------------------------------------------


def test_4_2_2_1_deletion_flag():
    mapping = {"INSERT, UPDATE_AFTER": "false", "DELETE": "true"}
    out = encode((D, 1, {"id": 5, "name": "A"}), op="deleted", op_mapping=mapping, produces_full_deletes=True)
    assert out == [{"deleted": "true", "id": 5, "name": "A"}]
    changes = [(INS, 1, {"id": 1, "name": "A"}), *update(1, {"id": 2, "name": "B"}, {"id": 2, "name": "C"})]
    assert encode(*changes, preset="deletion-flag") == [
        {"__deleted": "false", "id": 1, "name": "A"}, {"__deleted": "false", "id": 2, "name": "C"}
    ]  # UPDATE_BEFORE is dropped


def test_4_2_2_2_flat_records_with_op_codes():
    mapping = {"INSERT": "I", "DELETE": "D", "UPDATE_AFTER": "U"}
    assert encode((UA, 1, {"id": 7, "val": 50}), op="op_code", op_mapping=mapping) == [
        {"op_code": "U", "id": 7, "val": 50}
    ]
    retract = encode(*update(1, {"id": 7, "val": 40}, {"id": 7, "val": 50}), op="op_code", op_mapping=mapping)
    assert retract == [{"op_code": "U", "id": 7, "val": 50}]


def test_4_2_2_3_retract_to_upsert_flat_or_payload():
    changes = update(1, {"id": 1, "val": 10}, {"id": 1, "val": 20})
    assert encode(*changes, **UPSERT_CODES) == [{"op": "u", "id": 1, "val": 20}]
    assert encode(*changes, before="payload", after="payload", **UPSERT_CODES) == [
        {"op": "u", "payload": {"id": 1, "val": 20}}
    ]


def test_4_2_2_4_upsert_to_upsert_needs_no_state():
    encoder = ToChangelog(export(input_changelog="upsert", before="payload", after="payload", **UPSERT_CODES))
    out = encoder.encode_flush(feed((INS, 1, {"id": 1, "val": 10}), (UA, 2, {"id": 1, "val": 20})), 0)
    assert values(out) == [{"op": "c", "payload": {"id": 1, "val": 20}}]
    assert values(encoder.encode_flush(feed((UA, 3, {"id": 1, "val": 30})), 0)) == [
        {"op": "u", "payload": {"id": 1, "val": 30}}
    ]
    assert len(encoder.state) == 0


def test_4_2_2_5_and_4_2_2_6_partial_and_full_deletes():
    row = {"id": 5, "name": "Alice", "age": 30}
    assert encode((D, 1, row), **UPSERT_CODES) == [{"op": "d", "id": 5}]
    assert encode((D, 1, row), produces_full_deletes=True, **UPSERT_CODES) == [{"op": "d", **row}]


def test_4_2_2_7_retract_to_retract_buffers_the_update_before():
    fields = {"before": "before", "after": "after", "state_ttl_seconds": 3600, **DC}
    expected = [{"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}]
    assert encode(*update(1, {"id": 1, "val": 10}, {"id": 1, "val": 20}), **fields) == expected
    encoder = ToChangelog(export(**fields))
    assert encoder.encode_flush(feed((UB, 1, {"id": 1, "val": 10})), 0) == []
    assert values(encoder.encode_flush(feed((UA, 2, {"id": 1, "val": 20})), 3599)) == expected


def test_4_2_2_8_upsert_to_retract_fills_before_from_state():
    fields = {"before": "before", "after": "after", "state_ttl_seconds": 3600, "input_changelog": "upsert",
              **UPSERT_CODES}
    encoder = ToChangelog(export(**fields))
    assert values(encoder.encode_flush(feed((INS, 1, {"id": 1, "val": 10})), 0)) == [
        {"op": "c", "before": None, "after": {"id": 1, "val": 10}}
    ]
    assert values(encoder.encode_flush(feed((UA, 2, {"id": 1, "val": 20})), 60)) == [
        {"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}
    ]
    late = encoder.encode_flush(feed((UA, 3, {"id": 1, "val": 30})), 60 + 3601)
    assert values(late) == [{"op": "c", "before": None, "after": {"id": 1, "val": 30}}]  # state expired: 4.3.3


def test_4_2_2_9_passthrough_with_combined_updates():
    fields = {"before": "before", "after": "after", "passthrough": "ts_ms", **DC}
    assert encode((INS, 1, {"id": 1, "name": "Alice", "ts_ms": 1234}), **fields) == [
        {"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}}
    ]
    out = encode(*update(2, {"id": 1, "name": "Alice", "ts_ms": 1234}, {"id": 1, "name": "Al", "ts_ms": 1300}),
                 **fields)
    assert out == [{"op": "u", "ts_ms": 1300, "before": {"id": 1, "name": "Alice"}, "after": {"id": 1, "name": "Al"}}]


# --- feed handling -------------------------------------------------------------------------------


def test_pre_and_post_images_out_of_order_within_a_commit_are_paired_per_key():
    changes = [(UA, 1, {"id": 1, "v": "new1"}), (UA, 1, {"id": 2, "v": "new2"}), (INS, 1, {"id": 3, "v": "c"}),
               (UB, 1, {"id": 2, "v": "old2"}), (UB, 1, {"id": 1, "v": "old1"})]
    out = ToChangelog(export(preset="debezium")).encode_flush(feed(*changes), 0)
    assert [(r.key, r.value["before"], r.value["after"]) for r in out] == [
        ({"id": 1}, {"id": 1, "v": "old1"}, {"id": 1, "v": "new1"}),
        ({"id": 2}, {"id": 2, "v": "old2"}, {"id": 2, "v": "new2"}),
        ({"id": 3}, None, {"id": 3, "v": "c"}),
    ]
    assert [r.position for r in out] == [0, 1, 2]


def test_separate_update_records_keep_before_then_after():
    changes = [(UA, 1, {"id": 1, "v": "new"}), (UB, 1, {"id": 1, "v": "old"})]
    out = encode(*changes, before="before", after="after")
    assert out == [{"op": "UPDATE_BEFORE", "before": {"id": 1, "v": "old"}, "after": None},
                   {"op": "UPDATE_AFTER", "before": None, "after": {"id": 1, "v": "new"}}]


def test_records_are_ordered_by_commit_version_then_first_appearance():
    # delta-rs returns versions out of order; the encoder orders them.
    changes = [(INS, 3, {"id": 9, "v": "x"}), (INS, 1, {"id": 2, "v": "a"}), (INS, 1, {"id": 1, "v": "b"}),
               (INS, 2, {"id": 5, "v": "c"})]
    out = ToChangelog(export()).encode_flush(feed(*changes), 0)
    assert [(r.commit_version, r.key["id"], r.position) for r in out] == [(1, 2, 1), (1, 1, 2), (2, 5, 3), (3, 9, 0)]
    assert out[0].commit_timestamp == (T0 + timedelta(seconds=1)).replace(tzinfo=timezone.utc)


def test_tombstone_follows_each_delete():
    out = ToChangelog(export(tombstones=True)).encode_flush(feed((D, 1, {"id": 5, "v": "x"})), 0)
    assert [(r.key, r.value, r.op) for r in out] == [({"id": 5}, {"op": "DELETE", "id": 5}, "DELETE"),
                                                     ({"id": 5}, None, None)]


def test_commit_metadata_can_be_passed_through():
    (value,) = encode((INS, 4, {"id": 1, "v": "x"}), preset="debezium",
                      passthrough=("_commit_version", "_commit_timestamp"))
    assert value["_commit_version"] == 4
    assert value["_commit_timestamp"] == (T0 + timedelta(seconds=4)).replace(tzinfo=timezone.utc)
    assert value["after"] == {"id": 1, "v": "x"}


def test_composite_primary_key():
    out = ToChangelog(export(primary_key=("a", "b"))).encode_flush(
        feed((D, 1, {"a": 1, "b": "x", "v": 0}), (INS, 1, {"a": 1, "b": "y", "v": 1})), 0)
    assert [(r.key, r.value) for r in out] == [
        ({"a": 1, "b": "x"}, {"op": "DELETE", "a": 1, "b": "x"}),
        ({"a": 1, "b": "y"}, {"op": "INSERT", "a": 1, "b": "y", "v": 1}),
    ]


@pytest.mark.parametrize("changes, fields, message", [
    ([(INS, 3, {"id": 1}), (INS, 3, {"id": 1})], {},
     r"commit version 3 feed row 1: key <redacted #[0-9a-f]{12}> has two after"),
    ([(INS, 1, {"id": None, "v": 1})], {}, r"commit version 1 feed row 0: primary key column 'id' is null"),
    ([("truncate", 2, {"id": 1})], {}, r"commit version 2 feed row 0: unknown _change_type 'truncate'"),
    ([(INS, 1, {"key": 1})], {}, r"table 't' has no column 'id'"),
    ([(INS, 1, {"id": 1, "op": "x"})], {}, r"op field 'op' clashes with a table column"),
    ([(INS, 1, {"id": 1})], {"preset": "debezium", "passthrough": "loaded_at"}, r"has no column 'loaded_at'"),
])
def test_bad_feeds_fail_naming_where(changes, fields, message):
    with pytest.raises(ChangeFeedError, match=message):
        ToChangelog(export(**fields)).encode_flush(feed(*changes), 0)


def test_state_snapshot_restores_a_pending_update_before():
    fields = {"state_ttl_seconds": 60, **DC}
    encoder = ToChangelog(export(**fields))
    stamp = datetime(2024, 1, 1, tzinfo=timezone.utc)
    encoder.encode_flush(feed((UB, 1, {"id": 1, "ts": stamp})), now=100.0)
    restored = ToChangelog(export(**fields))
    restored.restore(encoder.snapshot())
    out = restored.encode_flush(feed((UA, 2, {"id": 1, "ts": stamp + timedelta(days=1)})), now=150.0)
    later = stamp + timedelta(days=1)
    assert values(out) == [{"op": "u", "before": {"id": 1, "ts": stamp}, "after": {"id": 1, "ts": later}}]


def test_state_records_carry_pending_and_previous_images_to_a_new_encoder():
    fields = {"before": "before", "after": "after", "state_ttl_seconds": 3600, "input_changelog": "upsert", **DC}
    encoder = ToChangelog(export(**fields))
    encoder.encode_flush(feed((INS, 1, {"id": 1, "val": 10}), (INS, 1, {"id": 2, "val": 5}),
                              (UB, 1, {"id": 3, "val": 7})), now=0)
    topic = dict(encoder.state_changes())  # one record per key: the compacted state topic's content
    assert encoder.state_entries() == len(topic) == 3
    encoder.encode_flush(feed((D, 2, {"id": 2, "val": 5})), now=1)
    deleted = encoder.state_changes()
    assert deleted == [(key_bytes((2,)), None)]  # a tombstone for key 2
    topic = {k: v for k, v in {**topic, **dict(deleted)}.items() if v is not None}
    restored = ToChangelog(export(**fields))
    restored.restore_state(topic)
    assert restored.state_entries() == 2
    out = restored.encode_flush(feed((UA, 3, {"id": 1, "val": 11}), (UA, 3, {"id": 3, "val": 8})), now=2)
    assert values(out) == [{"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 11}},
                           {"op": "u", "before": {"id": 3, "val": 7}, "after": {"id": 3, "val": 8}}]


# --- config validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"op_mapping": {"MY_INSERT": "NEW_INSERT"}}, r"entry 'MY_INSERT': unknown change kind 'MY_INSERT'"),
    ({"op_mapping": {"INSERT": "c", "INSERT, UPDATE_AFTER": "u", "DELETE": "d"}},
     r"entry 'INSERT, UPDATE_AFTER': INSERT is already mapped by entry 'INSERT'"),
    ({"op_mapping": {"INSERT, DELETE": "x", "UPDATE_AFTER": "u"}},
     r"entries \['INSERT, DELETE'\]: INSERT, DELETE cannot share the code 'x'"),
    ({"op_mapping": {"INSERT": "x", "DELETE": "x", "UPDATE_AFTER": "u"}},
     r"entries \['DELETE', 'INSERT'\]: INSERT, DELETE cannot share"),
    ({"op_mapping": {"INSERT": "c", "UPDATE_AFTER": "u"}}, r"no code for DELETE"),
    ({"op_mapping": {"INSERT": "", "UPDATE_AFTER": "u", "DELETE": "d"}}, r"entry 'INSERT': the output code is empty"),
    ({"before": "b"}, r"set both before and after"),
    ({"passthrough": ("ts", "ts"), "before": "b", "after": "a"}, r"passthrough 'ts' is listed twice"),
    ({"passthrough": "op", "before": "b", "after": "a"}, r"passthrough 'op' clashes with the op/before/after"),
    ({"passthrough": "a", "before": "b", "after": "a"}, r"passthrough 'a' clashes"),
    ({"passthrough": "id"}, r"passthrough 'id' is a primary key column"),
    ({"passthrough": "_change_type"}, r"passthrough '_change_type' cannot be passed through"),
    ({"preset": "debezium", "passthrough": "ts_ms"}, r"passthrough 'ts_ms' clashes with the Debezium envelope"),
    ({"preset": "debezium", "before": "old"}, r"Debezium envelope has the fields op, before and after"),
    ({"preset": "debezium", "op_mapping": {"INSERT": "I", "UPDATE_AFTER": "u", "DELETE": "d"}},
     r"op codes c, r, u, d; op_mapping gives \['I'\]"),
    ({"preset": "debezium", "op_mapping": {"INSERT": "c", "UPDATE_BEFORE": "r", "UPDATE_AFTER": "u", "DELETE": "d"}},
     r"no update-before record"),
    ({"op": "p", "before": "p", "after": "q"}, r"op field 'p' clashes"),
    ({"format": "avro-confluent"}, r"avro-confluent needs schema_registry_url"),
    ({"format": "deletion-flag-json", "before": "b", "after": "a"}, r"deletion-flag-json writes flat records"),
    ({"starting_version": 3, "starting_timestamp": "2024-01-01T00:00:00Z"}, r"starting_version or starting_timestamp"),
    ({"compaction": "per-watermark"}, r"compaction"),
    ({"primery_key": "id"}, r"primery_key"),
])
def test_invalid_settings_are_rejected_naming_the_entry(fields, message):
    with pytest.raises(ValidationError, match=message):
        export(**fields)


def test_presets_and_defaults():
    debezium = export(preset="debezium")
    assert (debezium.format, debezium.image_fields, debezium.tombstones) == ("debezium-json", ("before", "after"), True)
    assert debezium.op_codes.combines_updates
    assert export(preset="debezium", tombstones=False).tombstones is False  # explicit fields win
    flat = export(preset="flat")
    assert flat.image_fields is None and flat.op_mapping == PRESETS["flat"]["op_mapping"]
    flag = export(preset="deletion-flag", op_mapping={"INSERT, UPDATE_AFTER": False, "DELETE": True})
    assert flag.op_mapping == {"INSERT, UPDATE_AFTER": "false", "DELETE": "true"}  # YAML booleans read as text
    default = export()
    assert (default.format, default.op, default.image_fields, default.produces_full_deletes) == (
        "flat-json", "op", None, False)
    # Combining -U/+U needs both images: they are named before/after unless configured (spec 4.2.1.3.1).
    assert export(op_mapping={"INSERT": "I", "DELETE": "D", "UPDATE_BEFORE, UPDATE_AFTER": "U"}).image_fields == (
        "before", "after")
    assert export(primary_key="id", passthrough="ts_ms", before="b", after="a").passthrough == ("ts_ms",)


def test_every_allowed_grouping_parses():
    for mapping in ({"INSERT": "a", "UPDATE_BEFORE, UPDATE_AFTER": "b", "DELETE": "c"},
                    {"INSERT, UPDATE_AFTER": "a", "DELETE": "c"},
                    {"INSERT, UPDATE_BEFORE, UPDATE_AFTER": "a", "DELETE": "c"},
                    {"INSERT": "a", "UPDATE_AFTER": "a", "DELETE": "c"}):
        assert set(parse_op_mapping(mapping).codes.values()) <= {"a", "b", "c"}


# --- round trip (spec 4.5) -----------------------------------------------------------------------


def from_changelog(records: list[OutputRecord], export_settings: ExportSettings, preset: str) -> list[ChangelogRow]:
    """FROM_CHANGELOG of the exported topic: Kafka bytes through the project's decoder."""
    decoder = FromChangelog(FromChangelogSettings(preset=preset), export_settings.primary_key)
    rows = []
    for kafka in KafkaRecordEncoder(export_settings).encode(records, processed_at_ms=0):
        rows += decoder.convert(None if kafka.value is None else loads(kafka.value), kafka.key)
    return rows


def materialize(rows: list[ChangelogRow], table: dict | None = None) -> dict:
    """The table a changelog leaves: upserts and deletes keyed by the primary key (-U is retracted by its +U)."""
    table = {} if table is None else table
    for row in rows:
        if row.kind is ChangeKind.DELETE:
            table.pop(row.key, None)
        elif row.kind in (ChangeKind.INSERT, ChangeKind.UPDATE_AFTER):
            table[row.key] = row.row
    return table


def changelog(rows: list[ChangelogRow]) -> list[tuple[str, dict]]:
    return [(row.kind.value, row.row) for row in rows]


def test_4_5_1_from_changelog_of_to_changelog():
    dynamic_table = [feed((INS, 1, {"id": 1, "name": "Alice"})),
                     feed(*update(2, {"id": 1, "name": "Alice"}, {"id": 1, "name": "Alice Updated"})),
                     feed((D, 3, {"id": 1, "name": "Alice Updated"}))]
    verbatim = export(produces_full_deletes=True)
    encoder = ToChangelog(verbatim)
    records = [record for flush in dynamic_table for record in encoder.encode_flush(flush, 0)]
    assert values(records) == [
        {"op": "INSERT", "id": 1, "name": "Alice"},
        {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
        {"op": "DELETE", "id": 1, "name": "Alice Updated"},
    ]
    rows = from_changelog(records, verbatim, preset="flat")
    assert changelog(rows) == [("+I", {"id": 1, "name": "Alice"}), ("+U", {"id": 1, "name": "Alice Updated"}),
                               ("-D", {"id": 1, "name": "Alice Updated"})]
    assert materialize(rows) == {}  # empty table
    encoder = ToChangelog(export())  # default: partial deletes round-trip as well
    partial = [record for flush in dynamic_table for record in encoder.encode_flush(flush, 0)]
    assert changelog(from_changelog(partial, export(), preset="flat"))[-1] == ("-D", {"id": 1})


def test_4_5_2_to_changelog_of_from_changelog():
    append_stream = [{"op": "INSERT", "id": 1, "name": "Alice"},
                     {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
                     {"op": "DELETE", "id": 1, "name": "Alice Updated"}]
    decoder = FromChangelog(FromChangelogSettings(), ("id",))
    rows = [row for record in append_stream for row in decoder.convert(dict(record), b'{"id":1}')]
    assert changelog(rows) == [("+I", {"id": 1, "name": "Alice"}), ("+U", {"id": 1, "name": "Alice Updated"}),
                               ("-D", {"id": 1, "name": "Alice Updated"})]
    # The dynamic table's change feed: an upsert stream, one commit per change.
    change_type = {ChangeKind.INSERT: INS, ChangeKind.UPDATE_AFTER: UA, ChangeKind.DELETE: D}
    table_feed = feed(*[(change_type[row.kind], version, row.row) for version, row in enumerate(rows, 1)])
    out = ToChangelog(export(produces_full_deletes=True, compaction="none")).encode_flush(table_feed, 0)
    assert values(out) == append_stream


ROUND_TRIPS = {
    "default": ({}, "flat"),
    "default-uncompacted": ({"compaction": "none"}, "flat"),
    "debezium": ({"preset": "debezium"}, "debezium"),
    "debezium-partial-deletes": ({"preset": "debezium", "produces_full_deletes": False, "tombstones": False},
                                 "debezium"),
    "deletion-flag": ({"preset": "deletion-flag"}, "deletion-flag"),
}


@st.composite
def histories(draw) -> tuple[list[list[tuple[str, int, dict]]], dict, list[int]]:
    """Commits of a Delta table as change-feed rows (shuffled within each commit), the table they
    leave, and where flushes end."""
    table: dict[int, dict] = {}
    commits = []
    for version in range(draw(st.integers(1, 8))):
        rows = []
        for key in draw(st.lists(st.integers(0, 5), unique=True, max_size=4)):
            name, number = draw(st.sampled_from(["a", "b", None])), draw(st.integers(-(2**63), 2**63 - 1))
            new = {"id": key, "name": name, "n": number}
            old = table.get(key)
            if draw(st.booleans()):
                rows += [(UB, version, old), (UA, version, new)] if old else [(INS, version, new)]
                table[key] = new
            elif old:
                rows.append((D, version, old))
                del table[key]
        commits.append(draw(st.permutations(rows)))
    cuts = sorted(draw(st.sets(st.integers(1, len(commits)), max_size=3)) | {len(commits)})
    return commits, table, cuts


@pytest.mark.parametrize("variant", ROUND_TRIPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_round_trip_rebuilds_the_table(variant, history):
    commits, expected, cuts = history
    fields, preset = ROUND_TRIPS[variant]
    export_settings = export(**fields)
    encoder = ToChangelog(export_settings)
    table: dict = {}
    start = 0
    schema = {"id": pa.int64(), "name": pa.string(), "n": pa.int64()}
    for end in cuts:
        rows = [row for commit in commits[start:end] for row in commit]
        start = end
        if rows:
            records = encoder.encode_flush(feed(*rows, schema=schema), 0)
            materialize(from_changelog(records, export_settings, preset), table)
    assert table == {f"[{key}]": row for key, row in expected.items()}


# --- a real delta-rs change feed -----------------------------------------------------------------

CDF = {"delta.enableChangeDataFeed": "true"}


def real_feed(uri: str, first: int, last: int) -> pa.Table:
    """The change feed of versions first..last as the change-feed source hands it over."""
    table = pa.table(DeltaTable(uri).load_cdf(starting_version=first, ending_version=last))
    schema = pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type) for f in table.schema])
    return table.cast(schema)


def _merge(uri: str, source: pa.Table) -> None:
    (DeltaTable(uri).merge(source, "t.id = s.id", source_alias="s", target_alias="t", merge_schema=True)
     .when_matched_delete(predicate="s.gone")
     .when_matched_update_all(predicate="NOT s.gone", except_cols=["gone"])
     .when_not_matched_insert_all(predicate="NOT s.gone", except_cols=["gone"])
     .execute())


def test_real_delta_change_feed_round_trips(tmp_path):
    uri = str(tmp_path / "customers")
    write_deltalake(uri, pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"]}), configuration=CDF)  # v0
    _merge(uri, pa.table({"id": [2, 3, 4], "name": ["bobby", None, "dee"], "gone": [False, True, False]}))  # v1
    DeltaTable(uri).delete("id = 1")  # v2
    write_deltalake(uri, pa.table({"id": [5], "name": ["eve"]}), mode="append")  # v3
    DeltaTable(uri).update(updates={"name": "'dora'"}, predicate="id = 4")  # v4
    export_settings = export(preset="debezium")
    encoder = ToChangelog(export_settings)
    first = encoder.encode_flush(real_feed(uri, 0, 1), now=0)
    # delta-rs lists the rows of one commit in no fixed order: compare per version, by key.
    assert sorted(((r.commit_version, r.key["id"]), r.op, r.value["after"]) for r in first) == [
        ((0, 1), "c", {"id": 1, "name": "ann"}), ((1, 2), "c", {"id": 2, "name": "bobby"}),
        ((1, 4), "c", {"id": 4, "name": "dee"}),
    ]  # id 3 came and went within the flush; id 2's insert and update are one 'c'
    second = encoder.encode_flush(real_feed(uri, 2, 4), now=0)
    assert [(r.op, r.commit_version, r.key, r.value and r.value["before"]) for r in second] == [
        ("d", 2, {"id": 1}, {"id": 1, "name": "ann"}), (None, 2, {"id": 1}, None),
        ("c", 3, {"id": 5}, None), ("u", 4, {"id": 4}, {"id": 4, "name": "dee"}),
    ]
    rebuilt = materialize(from_changelog(first + second, export_settings, "debezium"))
    stored = DeltaTable(uri).to_pyarrow_table().to_pylist()
    assert rebuilt == {f"[{row['id']}]": row for row in stored}


def test_delta_rs_delete_row_shows_the_merge_source_value_of_a_column_added_by_that_merge(tmp_path):
    """delta-rs 1.6.6 quirk, pinned: a MERGE that adds a column (merge_schema) and deletes a row
    writes the merge source's value of the new column into the change feed's delete row, where
    the deleted row had no such column (null). Partial deletes (the default) carry the key only
    and are unaffected; full deletes repeat the wrong value. When this test fails, delta-rs has
    fixed it."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1, 2], "name": ["a", "b"]}), configuration=CDF)
    _merge(uri, pa.table({"id": [1, 2], "name": ["A", "B"], "gone": [True, False], "extra": ["x1", "x2"]}))
    by_type = {row["_change_type"]: row for row in real_feed(uri, 1, 1).to_pylist()}
    assert by_type["delete"]["name"] == "a"  # the deleted row's own value, correct
    assert by_type["delete"]["extra"] == "x1"  # should be null: taken from the merge source
    assert by_type["update_preimage"]["extra"] is None  # the pre-image is right
    out = ToChangelog(export(preset="debezium", tombstones=False)).encode_flush(real_feed(uri, 1, 1), 0)
    assert [r.value["before"] for r in out if r.op == "d"] == [{"id": 1, "name": "a", "extra": "x1"}]
    partial = ToChangelog(export(preset="debezium", produces_full_deletes=False)).encode_flush(real_feed(uri, 1, 1), 0)
    assert [r.value["before"] for r in partial if r.op == "d"] == [{"id": 1}]
