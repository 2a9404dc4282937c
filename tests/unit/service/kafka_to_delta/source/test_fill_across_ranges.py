"""A partition read in pieces gives the driver what the whole range gives (`batch_changes`,
`fill_across_ranges`): unchanged (TOAST) columns are filled from an earlier piece's image.

The generated ranges are `test_debezium_columns`' (placeholders, schema versions, deletes,
tombstones, odd records; in half of the seeds `ignore_null_updates`, whose null markers are filled
the same way); each is reduced whole and in pieces cut at random offsets, and the
driver's merge of both must be equal. Seeds: `FIXED_SEEDS` plus one random seed, printed on failure.
"""

from __future__ import annotations

import datetime
import json
import random

import numpy as np
import pyarrow as pa
import pytest

from service.config.settings import PipelineSettings
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.names import Meta
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.piece_reducer import PieceReducer
from tests.unit.service.kafka_to_delta.source.test_debezium_columns import (
    FIXED_SEEDS,
    RANDOM_SEED,
    _batches,
    _merged,
    _payloads,
    _Range,
    _schema,
)

_PLACEHOLDER = "__debezium_unavailable_value"
_PER_RANGE_RULE = "other records of its Kafka range declare"


def _reducer(vectorised: bool = True, truncating: bool = False, ignore_nulls: bool = False) -> PieceReducer:
    changelog = {"from_changelog": {"preset": "debezium", "truncate_handling": "truncate"}} if truncating else {}
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"], **changelog,
                                table_shape={"ignore_null_updates": ignore_nulls})
    return PieceReducer(batch_decoder(pipeline), ("id",), vectorised)


def _in_pieces(pairs: list, cuts: list[int], rng: random.Random, vectorised: bool = True,
               truncating: bool = False, ignore_nulls: bool = False) -> pa.Table | str:
    """The payloads of the range of `pairs` read as the pieces `cuts` make (offsets as in one range);
    `ignore_nulls`: the pipeline has `table_shape.ignore_null_updates`."""
    whole = pa.Table.from_batches(_batches(pairs, rng)).combine_chunks()
    bounds = [0, *cuts, whole.num_rows]
    pieces = [_payloads(_reducer(vectorised, truncating, ignore_nulls), whole.slice(a, b - a).to_batches())
              for a, b in zip(bounds, bounds[1:])]
    errors = [piece for piece in pieces if isinstance(piece, str)]
    if errors:
        return errors[0]
    return pa.concat_tables(pieces) if pieces else PAYLOAD_SCHEMA.empty_table()


def _record(op: str, key: int, after: dict | None, before: dict | None = None) -> tuple[bytes, bytes]:
    document = {"before": before, "after": after, "op": op, "ts_ms": 1}
    return json.dumps({"id": key}).encode(), json.dumps(document).encode()


def _rows(pairs: list, cuts: list[int], vectorised: bool = True) -> dict:
    """key -> (name, unchanged columns) of the merged pieces."""
    payloads = _in_pieces(pairs, cuts, random.Random(0), vectorised)
    assert not isinstance(payloads, str), payloads
    changes = batch_changes(payloads).changes
    return {row["id"]: (row.get("name"), row[Meta.KIND], row[Meta.UNCHANGED]) for row in changes.to_pylist()}


@pytest.mark.parametrize("vectorised", [True, False])
def test_a_placeholder_is_filled_from_an_earlier_pieces_image(vectorised: bool) -> None:
    pairs = [
        _record("c", 1, {"id": 1, "name": "big", "n": 1}),
        _record("c", 2, {"id": 2, "name": "other", "n": 1}),
        _record("u", 1, {"id": 1, "name": _PLACEHOLDER, "n": 2}),
        _record("u", 3, {"id": 3, "name": _PLACEHOLDER, "n": 2}),  # no image of key 3 in the batch
    ]
    rows = _rows(pairs, [2], vectorised)
    assert rows[1] == ("big", "+U", None)
    assert rows[2] == ("other", "+U", None)
    assert rows[3][0] is None and json.loads(rows[3][2]) == ["name"]  # left to the sink: the stored value


@pytest.mark.parametrize("vectorised", [True, False])
def test_deletes_and_re_inserts_between_the_image_and_the_placeholder(vectorised: bool) -> None:
    pairs = [
        _record("c", 1, {"id": 1, "name": "first", "n": 1}),
        _record("d", 1, None, {"id": 1, "name": "first", "n": 1}),
        _record("c", 1, {"id": 1, "name": "second", "n": 2}),
        _record("u", 1, {"id": 1, "name": _PLACEHOLDER, "n": 3}),
        _record("c", 2, {"id": 2, "name": "kept", "n": 1}),
        _record("d", 2, None, {"id": 2, "name": "kept", "n": 1}),
    ]
    for cuts in ([1], [2], [3], [1, 2, 3], [1, 3, 5]):
        rows = _rows(pairs, cuts, vectorised)
        assert rows[1] == ("second", "+U", None), cuts
        assert rows[2][1] == "-D", cuts


@pytest.mark.parametrize("vectorised", [True, False])
def test_a_placeholder_after_a_delete_is_null_wherever_the_range_is_cut(vectorised: bool) -> None:
    """A delete ends the key's images: what a later placeholder stands for is gone, as it is from
    the table across batches (found by seed 870581: the whole range filled it from the image before
    the delete, which a piece after the delete cannot see)."""
    pairs = [
        _record("c", 1, {"id": 1, "name": "before the delete", "n": 1}),
        _record("d", 1, None, {"id": 1, "name": "before the delete", "n": 1}),
        _record("c", 1, {"id": 1, "name": _PLACEHOLDER, "n": 2}),
        _record("c", 2, {"id": 2, "name": "kept", "n": 1}),
        _record("u", 2, {"id": 2, "name": _PLACEHOLDER, "n": 2}),
    ]
    for cuts in ([], [1], [2], [1, 2], [2, 4]):
        rows = _rows(pairs, cuts, vectorised)
        assert rows[1] == (None, "+U", None), cuts
        assert rows[2] == ("kept", "+U", None), cuts


def _wrapped(op: str, key: int, after: dict, added: bool) -> tuple[bytes, bytes]:
    document = {"before": None, "after": after, "op": op, "ts_ms": 1}
    value = {"schema": _schema("int64", added=added), "payload": document}
    return json.dumps({"id": key}).encode(), json.dumps(value).encode()


_ROW = {"name": "a", "amount": 1.0, "n32": 1, "flag": True, "day": 1, "at": 1, "at_ms": 1, "ratio": 0.5}


@pytest.mark.parametrize("vectorised", [True, False])
def test_an_image_whose_schema_lacks_the_column_holds_null(vectorised: bool) -> None:
    """Under `ignore_null_updates` a null is an unchanged marker; the key's earlier image was written
    before the column was added (its schema version lacks it): it holds null, in the same piece or in
    another one whose other rows carry the column."""
    pairs = [
        _wrapped("c", 1, {"id": 1, **_ROW}, added=False),
        _wrapped("c", 2, {"id": 2, **_ROW, "note": "x"}, added=True),
        _wrapped("u", 1, {"id": 1, **_ROW, "name": "b", "note": None}, added=True),
    ]
    for cuts in ([], [1], [2]):
        payloads = _in_pieces(pairs, cuts, random.Random(0), vectorised, ignore_nulls=True)
        assert not isinstance(payloads, str), payloads
        rows = {row["id"]: row for row in batch_changes(payloads).changes.to_pylist()}
        assert (rows[1]["name"], rows[1]["note"], rows[1][Meta.UNCHANGED]) == ("b", None, None), cuts
        assert rows[2]["note"] == "x", cuts


@pytest.mark.parametrize("vectorised", [True, False])
def test_epoch_integers_of_an_untyped_piece_take_the_unit_another_piece_declares(vectorised: bool) -> None:
    """A piece whose records carry no schema block infers an epoch column as integers; the driver
    converts them in the unit the declaring piece names (milliseconds here), not Arrow's cast."""
    at_ms = 1_700_000_000_123
    pairs = [
        _wrapped("c", 1, {"id": 1, **_ROW, "at_ms": at_ms}, added=False),
        _record("c", 2, {"id": 2, **_ROW, "at_ms": at_ms}),
    ]
    payloads = _in_pieces(pairs, [1], random.Random(0), vectorised)
    assert not isinstance(payloads, str), payloads
    values = {row["id"]: row["at_ms"] for row in batch_changes(payloads).changes.to_pylist()}
    assert values[1] == values[2] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000)


def test_a_placeholder_in_another_partition_is_not_filled_across() -> None:
    first = _in_pieces([_record("c", 1, {"id": 1, "name": "big", "n": 1})], [], random.Random(0))
    second = _in_pieces([_record("u", 1, {"id": 1, "name": _PLACEHOLDER, "n": 2})], [], random.Random(0))
    assert not isinstance(first, str) and not isinstance(second, str)
    moved = second.to_pylist()
    from service.kafka_to_delta.materialize.payload import payload_batch, payload_table

    table, info = payload_table(moved[0]["payload"])
    table = table.set_column(table.schema.get_field_index(Meta.PARTITION), Meta.PARTITION,
                             pa.array([4] * table.num_rows, pa.int32()))
    other = pa.Table.from_batches([payload_batch(table, [], info)])
    changes = batch_changes(pa.concat_tables([first, other])).changes.to_pylist()
    assert [(row["name"], json.loads(row[Meta.UNCHANGED])) for row in changes] == [(None, ["name"])]


def _by_name(changes: pa.Table) -> pa.Table:
    """The columns in name order: the batch's column order follows the order ranges first name them
    in, which a cut may change (the sink matches columns by name)."""
    return changes.select(sorted(changes.column_names))


def _compare(seed: int, vectorised: bool = True) -> bool:
    """Whether the seed's range was compared: a range where a record was rejected, whole or in
    pieces, for not fitting the types other records of its range declare is not (that rule is judged
    per range, on each key's last change, by design, so a cut may judge the record otherwise,
    `partition_changes`)."""
    rng = random.Random(seed)
    source = _Range(rng, odd=seed % 2 == 1)
    source.toast = seed % 4 != 0
    for _ in range(rng.randrange(1, 300)):
        source.add_change(rng.randrange(40))
    n = len(source.pairs)
    cuts = sorted(rng.sample(range(1, n), min(rng.randrange(1, 5), n - 1))) if n > 1 else []
    nulls = seed % 8 >= 4  # the nulls of updates are unchanged markers, filled across pieces as well
    whole = _in_pieces(source.pairs, [], random.Random(seed), vectorised, ignore_nulls=nulls)
    pieces = _in_pieces(source.pairs, cuts, random.Random(seed), vectorised, ignore_nulls=nulls)
    if isinstance(whole, str) or isinstance(pieces, str):
        assert pieces == whole
        return True
    (changes, unchanged, failed, truncated, count) = _merged(pieces)
    (whole_changes, whole_unchanged, whole_failed, whole_truncated, whole_count) = _merged(whole)
    errors = whole_failed.column("error").to_pylist() + failed.column("error").to_pylist()
    if any(_PER_RANGE_RULE in (error or "") for error in errors):
        return False
    changes, whole_changes = _by_name(changes), _by_name(whole_changes)
    assert changes.schema == whole_changes.schema
    assert changes.equals(whole_changes), "net changes differ"
    assert unchanged == whole_unchanged
    assert failed.equals(whole_failed), "failed records differ"
    assert (truncated, count) == (whole_truncated, whole_count)
    # the driver takes the pieces' payloads in the order their tasks ended
    handed = pieces.take(pa.array(random.Random(seed).sample(range(pieces.num_rows), pieces.num_rows), pa.int64()))
    assert _by_name(_merged(handed)[0]).equals(changes), "net changes differ with the pieces handed in another order"
    # the join left to the commit (a pipeline committing behind its micro-batches) gives the same batch
    joined, deferred = batch_changes(handed), batch_changes(handed, join=False)
    assert deferred.truncates is not None and joined.truncates is None
    assert deferred.joined().changes.equals(joined.changes), "the join left to the commit differs"
    assert deferred.failed.equals(joined.failed) and deferred.count == joined.count
    return True


@pytest.mark.parametrize("seed", [*FIXED_SEEDS, RANDOM_SEED])
def test_a_range_in_pieces_merges_as_the_whole_range(seed: int) -> None:
    try:
        _compare(seed)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc


@pytest.mark.parametrize("seed", [*FIXED_SEEDS[:12], RANDOM_SEED])
def test_record_by_record_pieces_merge_as_the_whole_range(seed: int) -> None:
    try:
        _compare(seed, vectorised=False)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc


@pytest.mark.parametrize("vectorised", [True, False])
def test_a_truncate_in_a_later_piece_wipes_the_earlier_pieces(vectorised: bool) -> None:
    pairs = [
        _record("c", 1, {"id": 1, "name": "a", "n": 1}),
        _record("c", 2, {"id": 2, "name": "b", "n": 1}),
        (None, json.dumps({"before": None, "after": None, "op": "t", "ts_ms": 1}).encode()),
        _record("c", 3, {"id": 3, "name": "c", "n": 1}),
        _record("u", 3, {"id": 3, "name": _PLACEHOLDER, "n": 2}),
    ]
    for cuts in ([], [1], [2], [3], [4], [1, 3]):
        payloads = _in_pieces(pairs, cuts, random.Random(0), vectorised, truncating=True)
        assert not isinstance(payloads, str), payloads
        for merged in (batch_changes(payloads), batch_changes(payloads, join=False).joined()):
            assert merged.truncated, cuts
            rows = [(row["id"], row["name"], row[Meta.UNCHANGED]) for row in merged.changes.to_pylist()]
            assert rows == [(3, "c", None)], cuts


def test_nearly_every_fixed_seed_is_compared() -> None:
    assert sum(_compare(seed) for seed in FIXED_SEEDS) >= len(FIXED_SEEDS) - 4


@pytest.mark.parametrize("vectorised", [True, False])
def test_pieces_of_different_keys_are_their_own_last_changes(vectorised: bool) -> None:
    """No key in two pieces (as the bucket stage's net rows): the rows are merged as they are (no sort, no
    fill across pieces), the rows of the whole range, placeholders left to the sink."""
    pairs = [
        _record("c", 1, {"id": 1, "name": "big", "n": 1}),
        _record("u", 2, {"id": 2, "name": _PLACEHOLDER, "n": 2}),
        _record("u", 3, {"id": 3, "name": _PLACEHOLDER, "n": 2}),
        _record("d", 4, None, {"id": 4, "name": "x", "n": 1}),
    ]
    payloads = _in_pieces(pairs, [1, 3], random.Random(0), vectorised)
    assert not isinstance(payloads, str), payloads
    changes = batch_changes(payloads).changes
    whole = _in_pieces(pairs, [], random.Random(0), vectorised)
    assert not isinstance(whole, str), whole
    by_key = sorted(changes.to_pylist(), key=lambda row: row["id"])
    assert by_key == sorted(batch_changes(whole).changes.to_pylist(), key=lambda row: row["id"])
    assert [(row["id"], row[Meta.KIND]) for row in by_key] == [(1, "+U"), (2, "+U"), (3, "+U"), (4, "-D")]
    assert [json.loads(row[Meta.UNCHANGED] or "[]") for row in by_key] == [[], ["name"], ["name"], []]


@pytest.mark.parametrize("seed", [*FIXED_SEEDS[:8], RANDOM_SEED])
def test_the_unchanged_lists_left_per_row(seed: int) -> None:
    """`_still_unchanged` gives each row its list without the columns filled for it, null where none is left,
    whatever the number of columns filled (up to 70 here)."""
    from service.kafka_to_delta.source.fill_across_ranges import _still_unchanged

    rng = random.Random(seed)
    columns = [f"c{i}" for i in range(rng.choice([rng.randrange(1, 6), rng.randrange(40, 71)]))]
    lists = [json.dumps(rng.sample(columns, rng.randrange(1, len(columns) + 1)), separators=(",", ":"))
             for _ in range(4)]
    rows = rng.randrange(0, 60)
    unchanged = pa.chunked_array([pa.array([rng.choice([*lists, None]) for _ in range(rows)], pa.string())])
    filled = {name: np.array([rng.random() < 0.5 for _ in range(rows)], np.bool_)
              for name in rng.sample(columns, rng.randrange(1, len(columns) + 1))}
    left = _still_unchanged(unchanged, filled).to_pylist()
    assert len(left) == rows
    for text, kept, flags in zip(unchanged.to_pylist(), left, zip(*filled.values())):
        gone = {name for name, flag in zip(filled, flags) if flag}
        expected = [c for c in json.loads(text) if c not in gone] if text else []
        assert kept == (json.dumps(expected, separators=(",", ":")) if expected else None), (seed, text, gone)
