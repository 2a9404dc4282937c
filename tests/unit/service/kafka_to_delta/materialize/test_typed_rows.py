"""The net rows typed in bulk (`payload._bulk_typed`, `typed_rows.bulk_rows`) against the reference
(`payload._reference_typed`: `loads` and `rows_to_table` row by row).

Generated net rows carry every column type, as Debezium writes it (never a misfit) or as any JSON
(values the reference refuses, values only it can type: misfits), keys left out or added, deletes
and images without a row, one or two declared type sets. Wherever the bulk way gives a table it
equals the reference's, with the same type evidence; where the reference refuses the batch, the
bulk way gives none. Debezium-shaped batches are always typed in bulk. Examples are derandomised.
"""

from __future__ import annotations

import json
from datetime import date, datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.delta.arrow_types import TypeName
from service.kafka_to_delta.materialize import payload, typed_rows
from service.kafka_to_delta.materialize.payload import (
    BULK_ROWS,
    RETRACTIONS,
    _bulk_typed,
    _reference_typed,
    typed_changes,
)
from service.kafka_to_delta.rows.names import Column, Meta
from tests.unit.service.kafka_to_delta.formats.test_bulk_values import (
    TEXT,
    ZONED,
    base64_noise,
    encoded,
    iso_text,
    unscaled_bytes,
)
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError

EXAMPLES = settings(max_examples=150, derandomize=True, deadline=None)
PRIMARY_KEY = ("id",)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
DEBEZIUM = {
    TypeName.INT8: st.integers(-128, 127),
    TypeName.INT16: st.integers(-(2**15), 2**15 - 1),
    TypeName.INT32: st.integers(-(2**31), 2**31 - 1),
    TypeName.INT64: st.integers(-(2**63), 2**63 - 1),
    TypeName.FLOAT32: st.floats(width=32, allow_nan=False, allow_infinity=False),
    TypeName.FLOAT64: st.floats(allow_nan=False, allow_infinity=False),
    TypeName.BOOL: st.booleans(),
    TypeName.STRING: st.one_of(TEXT, st.just("__debezium_unavailable_value")),
    "text[]": st.lists(TEXT, max_size=3),  # a Connect array, declared as text
    TypeName.BINARY: st.binary(max_size=20).map(encoded),
    "decimal(12,2)": st.integers(-(10**12) + 1, 10**12 - 1).map(lambda n: encoded(unscaled_bytes(n))),
    "decimal(40,5)": st.integers(-(10**40) + 1, 10**40 - 1).map(lambda n: encoded(unscaled_bytes(n))),
    TypeName.DATE32: st.dates(date(1, 1, 1), date(9999, 12, 31)).map(lambda d: (d - EPOCH.date()).days),
    TypeName.TIMESTAMP_MS: st.integers(-(2**40), 2**40),
    TypeName.TIMESTAMP_US: st.integers(-(2**50), 2**50),
    TypeName.TIMESTAMP_NS: st.integers(-(2**62), 2**62),
    TypeName.TIMESTAMP_US_UTC: ZONED,
}
TEXT_ARRAY = {"text[]": TypeName.STRING, "numbers[]": TypeName.STRING}
NUMBERS = st.lists(st.one_of(st.integers(-5, 5), st.floats(-5, 5)), max_size=3)
"""A text column of lists Arrow widens to floats: the integers' text is the reference's to write (misfits)."""
ANY_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                                  st.floats(allow_nan=False, allow_infinity=False), TEXT, base64_noise(),
                                  iso_text(st.sampled_from(["", "Z", "+02:00"]))),
                        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
                        max_leaves=6)


@st.composite
def net_rows(draw, shaped: bool) -> tuple[pa.Table, dict[str, str]]:
    """A net table (`typed_changes`'s input) and the types its upserts declare."""
    names = draw(st.lists(st.sampled_from(sorted(DEBEZIUM) if shaped else sorted(DEBEZIUM) + ["numbers[]"]),
                          min_size=1, max_size=5))
    kinds = {f"c{i}": name for i, name in enumerate(names)}
    odd_columns = set() if shaped else {column for column in kinds if not draw(st.integers(0, 3))}
    types = {"id": TypeName.INT64, **{column: TEXT_ARRAY.get(kind, kind) for column, kind in kinds.items()}}
    texts = [json.dumps(types)]
    if not shaped and not draw(st.integers(0, 3)):
        texts.append(json.dumps({**types, "extra": TypeName.STRING}))
    rows = []
    for position in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from([ChangeKind.UPDATE_AFTER.value] * 3 + [ChangeKind.INSERT.value, *RETRACTIONS]))
        image = {"id": position}
        for column, type_name in types.items():
            if column == "id":
                continue
            odd = column in odd_columns and not draw(st.integers(0, 2))
            value = draw(ANY_JSON if odd else st.one_of(st.none(), {**DEBEZIUM, "numbers[]": NUMBERS}[kinds[column]]))
            if shaped or draw(st.integers(0, 9)):
                image[column] = value
        if not shaped and not draw(st.integers(0, 29)):
            image["extra"] = draw(ANY_JSON)
        row = None if not shaped and not draw(st.integers(0, 14)) else json.dumps(image)
        declared = draw(st.sampled_from(texts)) if kind not in RETRACTIONS or draw(st.booleans()) else None
        if not shaped and not draw(st.integers(0, 39)):
            declared = None
        rows.append({Column.KEY: json.dumps([position]), Column.ROW: row, Column.KIND: kind, Column.TYPES: declared,
                     Column.TOPIC: "t", Column.PARTITION: 0, Column.OFFSET: position, Column.CHANGE_INDEX: 0,
                     Column.TIMESTAMP: 0, Column.UNCHANGED: None})
    schema = pa.schema([(Column.KEY, pa.string()), (Column.ROW, pa.string()), (Column.KIND, pa.string()),
                        (Column.TYPES, pa.string()), (Column.TOPIC, pa.string()), (Column.PARTITION, pa.int32()),
                        (Column.OFFSET, pa.int64()), (Column.CHANGE_INDEX, pa.int32()), (Column.TIMESTAMP, pa.int64()),
                        (Column.UNCHANGED, pa.string())])
    return pa.Table.from_pylist(rows, schema=schema), types


def net_of(images: list[dict], types: dict[str, str], kinds: list[str] | None = None,
           first_offset: int = 0) -> pa.Table:
    """A net table of upserts (or `kinds`) of `images`, each declaring `types`."""
    count = len(images)
    return pa.table({Column.KEY: [json.dumps([image["id"]]) for image in images],
                     Column.ROW: [json.dumps(image) for image in images],
                     Column.KIND: kinds or [ChangeKind.UPDATE_AFTER.value] * count,
                     Column.TYPES: [json.dumps(types)] * count, Column.TOPIC: ["t"] * count,
                     Column.PARTITION: [0] * count, Column.OFFSET: list(range(first_offset, first_offset + count)),
                     Column.CHANGE_INDEX: [0] * count, Column.TIMESTAMP: [0] * count,
                     Column.UNCHANGED: pa.nulls(count, pa.string())})


def deletes_of(net: pa.Table) -> list[bool]:
    return pc.is_in(net.column(Column.KIND), pa.array(RETRACTIONS)).to_pylist()


def reference_or_refused(net: pa.Table):
    try:
        return _reference_typed(net, PRIMARY_KEY, deletes_of(net))
    except (ValueError, DecodeError):
        return None


def assert_same(bulk, reference) -> None:
    table, evidence = bulk
    expected, expected_evidence = reference
    assert table.schema == expected.schema
    for name in table.column_names:
        assert table.column(name).combine_chunks().equals(expected.column(name).combine_chunks()), (
            name, table.column(name).to_pylist(), expected.column(name).to_pylist())
    assert evidence.to_json() == expected_evidence.to_json()


def assert_equal_where_typed_in_bulk(net: pa.Table) -> None:
    """Where the bulk way types `net`, the reference does too, and the two are the same."""
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes_of(net))
    reference = reference_or_refused(net)
    if bulk is not None:
        assert reference is not None, "the bulk way typed a batch the reference refuses"
        assert_same(bulk, reference)


@EXAMPLES
@given(net_rows(shaped=False))
def test_any_net_rows_typed_in_bulk_equal_the_reference_or_are_left_to_it(generated):
    net, _ = generated
    assert_equal_where_typed_in_bulk(net)


@EXAMPLES
@given(net_rows(shaped=True))
def test_debezium_shaped_net_rows_are_typed_in_bulk(generated):
    net, _ = generated
    deletes = deletes_of(net)
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes)
    if all(deletes):
        assert bulk is None  # the reference infers types from the deletes' keys then
        return
    assert bulk is not None, "a Debezium-shaped batch left to the reference"
    assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes))


def without_declared_types(net: pa.Table) -> pa.Table:
    """The same net rows as JSON without schema blocks gives them: no row declares column types."""
    return net.set_column(net.schema.get_field_index(Column.TYPES), Column.TYPES,
                          pa.nulls(net.num_rows, pa.string()))


@EXAMPLES
@given(net_rows(shaped=False))
def test_any_undeclared_net_rows_typed_in_bulk_equal_the_reference_or_are_left_to_it(generated):
    """Nothing declares the types: the reference infers them from the upserts' values (`inferred_kinds`),
    the bulk way from one `pyarrow.json` parse (`bulk_kinds`). Kinds, types and values are the same."""
    net = without_declared_types(generated[0])
    assert_equal_where_typed_in_bulk(net)


@st.composite
def partly_declared(draw, shaped: bool) -> pa.Table:
    """Net rows of which some (never all) declare no column types: a topic where some records carry schema
    blocks and some do not (Kafka Connect's JSON converter switched, or two producers)."""
    net, _ = draw(net_rows(shaped=shaped))
    declared = net.column(Column.TYPES).to_pylist()
    dropped = draw(st.lists(st.booleans(), min_size=len(declared), max_size=len(declared)))
    texts = [None if drop else text for text, drop in zip(declared, dropped)]
    return net.set_column(net.schema.get_field_index(Column.TYPES), Column.TYPES, pa.array(texts, pa.string()))


@EXAMPLES
@given(partly_declared(shaped=False))
def test_partly_declared_net_rows_typed_in_bulk_equal_the_reference_or_are_left_to_it(net):
    """The declared types win; the kinds the undeclared upserts' values suggest are the evidence's `seen`."""
    assert_equal_where_typed_in_bulk(net)


@EXAMPLES
@given(partly_declared(shaped=True))
def test_partly_declared_debezium_shaped_net_rows_are_typed_in_bulk_where_arrow_tells_their_kinds(net):
    deletes = deletes_of(net)
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes)
    undeclared = net.filter(pc.and_(pc.invert(pa.array(deletes, pa.bool_())), pc.is_null(net.column(Column.TYPES))))
    if all(deletes) or not net.column(Column.TYPES).drop_null():
        return  # all deletes, or no row declares: the tests above
    if bulk is None:  # left to the reference only where Arrow cannot tell the undeclared rows' kinds
        assert typed_rows.bulk_kinds(pc.fill_null(undeclared.column(Column.ROW), '{"id": 0}').combine_chunks()) is None
    else:
        assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes))


def test_a_column_only_the_data_names_leaves_partly_declared_rows_to_the_reference():
    """A declaring row with a key its types lack counts as undeclared to the reference, so its value is
    evidence too (here `extra` becomes a boolean); the bulk way cannot tell such rows apart and gives none."""
    types = {"id": TypeName.INT64, "n": TypeName.INT8}
    net = net_of([{"id": 0, "n": 1, "extra": True}, {"id": 1, "n": 2, "extra": None}], types)
    net = net.set_column(net.schema.get_field_index(Column.TYPES), Column.TYPES, pa.array([json.dumps(types), None]))
    assert _bulk_typed(net, PRIMARY_KEY, deletes_of(net)) is None
    assert _reference_typed(net, PRIMARY_KEY, deletes_of(net))[0].column("extra").to_pylist() == [True, None]


@EXAMPLES
@given(net_rows(shaped=True))
def test_debezium_shaped_net_rows_without_schema_blocks_are_typed_in_bulk(generated):
    net = without_declared_types(generated[0])
    deletes = deletes_of(net)
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes)
    if all(deletes):
        assert bulk is None
        return
    assert bulk is not None, "a Debezium-shaped batch without schema blocks left to the reference"
    assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes))


@pytest.mark.parametrize("texts, kinds", [
    (['{"id": 1, "n": 2.5}', '{"id": 2, "n": 3}'], {"id": {"int64"}, "n": {"float64", "int64"}}),  # the text tells
    (['{"id": 1, "n": 2.5}', '{"id": 2, "n": 3.0}'], {"id": {"int64"}, "n": {"float64"}}),
    (['{"id": 1, "n": 2.0}', '{"id": 2, "n": 3e0}'], {"id": {"int64"}, "n": {"float64"}}),
    (['{"id": 1, "n": 2.5}', '{"id": 2, "n": null}'], {"id": {"int64"}, "n": {"float64"}}),
    (['{"id": 1, "flag": true}', '{"id": 2, "flag": 1}'], None),  # one column, two kinds: the reference says text
    (['{"b": 1}', '{"a": "2024-01-01", "b": 2, "c": null}'], {"b": {"int64"}, "a": {"string"}, "c": set()}),
    (['{"id": 1, "tags": ["x"]}', '{"id": 2, "tags": {"k": 1}}'], None),
    (['{"id": 1, "tags": ["x"], "doc": {"k": 1}}'], {"id": {"int64"}, "tags": {"string"}, "doc": {"string"}}),
    (['{"id": 99999999999999999999}'], {"id": {"int64"}}),  # beyond 64 bits: a float to Arrow, an integer to the reference
])
def test_kinds_inferred_in_bulk_are_the_reference_kinds_or_left_to_it(texts, kinds):
    inferred = typed_rows.bulk_kinds(pa.array(texts))
    assert (inferred and inferred.kinds) == kinds


def test_undeclared_rows_in_pieces_join_their_kinds_and_parse_once_where_they_can(monkeypatch):
    """Pieces of 3 rows: one reads `n` as integers, the next as floats, the last holds it null only; the
    types are the whole batch's (`n` a float everywhere), as the reference infers them. A piece whose
    inferred parse has the batch's types is not parsed again; one whose `n` Arrow read as integers, or
    whose `at` it read as a time, is."""
    monkeypatch.setattr(typed_rows, "PIECE_ROWS", 3)
    images = ([{"id": i, "n": i, "at": "x"} for i in range(3)] + [{"id": i, "n": i + 0.5, "at": "y"} for i in range(3, 6)]
              + [{"id": i, "n": None, "at": "2024-01-01"} for i in range(6, 9)])
    net = without_declared_types(net_of(images, {}))
    parses = []
    reference_parse = typed_rows._parsed
    monkeypatch.setattr(typed_rows, "_parsed", lambda *args: parses.append(args[1]) or reference_parse(*args))
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes_of(net))
    assert bulk is not None and parses == [3, 3]  # the first piece (n as integers) and the last (at as a time)
    assert bulk[0].schema.field("n").type == pa.float64()
    assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes_of(net)))


def test_undeclared_upserts_are_parsed_once_and_deletes_keep_their_place(monkeypatch):
    images = [{"id": i, "name": f"n{i}", "tags": ["a"] if i % 2 else []} for i in range(6)]
    kinds = [ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value, ChangeKind.INSERT.value,
             ChangeKind.UPDATE_BEFORE.value, ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value]
    net = without_declared_types(net_of(images, {}, kinds))
    parses = []
    reference_parse = typed_rows._parsed
    monkeypatch.setattr(typed_rows, "_parsed", lambda *args: parses.append(args[1]) or reference_parse(*args))
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes_of(net))
    assert bulk is not None and parses == [3]  # the three deletes' keys only
    assert bulk[0].column("id").to_pylist() == list(range(6))
    assert bulk[0].column("name").to_pylist() == ["n0", None, "n2", None, "n4", None]
    assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes_of(net)))


def test_a_text_column_holding_arrays_is_learnt_once_per_set_of_types(monkeypatch):
    """A Connect array declared as text (a PostgreSQL text[]): Arrow refuses the first parse and names the
    column, which is then inferred alone; the next call with the same types parses once."""
    monkeypatch.setattr(typed_rows, "_NESTED", {})
    parses = []
    read_json = typed_rows.pj.read_json

    class Counted:
        @staticmethod
        def read_json(*args, **kwargs):
            parses.append(kwargs["parse_options"].explicit_schema.names)
            return read_json(*args, **kwargs)

        ReadOptions, ParseOptions = typed_rows.pj.ReadOptions, typed_rows.pj.ParseOptions

    monkeypatch.setattr(typed_rows, "pj", Counted)
    types = {"id": TypeName.INT64, "name": TypeName.STRING, "tags": TypeName.STRING}
    texts = pa.array([json.dumps({"id": i, "name": "2024-01-01", "tags": ["a", str(i)]}) for i in range(3)])
    for _ in range(2):
        table = typed_rows.bulk_rows(texts, types)
        assert table is not None and table.column("tags").to_pylist() == ['["a","0"]', '["a","1"]', '["a","2"]']
        assert table.column("name").to_pylist() == ["2024-01-01"] * 3
    assert parses == [["id", "name", "tags"], ["id", "name"], ["id", "name"]]


def test_only_the_misfit_rows_take_the_reference(monkeypatch):
    """Arrow widens a list column of integers and floats to floats: the text of a list of integers is then
    only the reference's to write (a misfit for `bulk_column`), those rows alone are typed by it."""
    images = [{"id": 0, "doc": [1, 2]}, {"id": 1, "doc": [1.5]}, {"id": 2, "doc": [3]}]
    net = net_of(images, {"id": TypeName.INT64, "doc": TypeName.STRING})
    typed_by_reference = []
    reference = typed_rows.rows_to_table

    def counted(rows, types):
        typed_by_reference.append(len(rows))
        return reference(rows, types)

    monkeypatch.setattr(typed_rows, "rows_to_table", counted)
    bulk = _bulk_typed(net, PRIMARY_KEY, deletes_of(net))
    assert bulk is not None and typed_by_reference == [2]
    assert bulk[0].column("doc").to_pylist() == ["[1,2]", "[1.5]", "[3]"]
    assert_same(bulk, _reference_typed(net, PRIMARY_KEY, deletes_of(net)))


def test_a_batch_wider_than_a_piece_is_parsed_in_pieces(monkeypatch):
    monkeypatch.setattr(typed_rows, "PIECE_ROWS", 7)
    images = [{"id": i, "amount": encoded(unscaled_bytes(i * 101)), "at": "2024-03-01T10:15:30Z"} for i in range(30)]
    types = {"id": TypeName.INT64, "amount": "decimal(12,2)", "at": TypeName.TIMESTAMP_US_UTC}
    table = typed_rows.bulk_rows(pa.array([json.dumps(i) for i in images]), types)
    assert table is not None and table.num_rows == 30
    assert [str(v) for v in table.column("amount").to_pylist()] == [f"{i * 101 / 100:.2f}" for i in range(30)]


@pytest.mark.parametrize("texts", [['{"id": 1}', '{"id": 2, "other": 3}'],  # a key outside the types
                                   ['{"id": 1}\n', '{"id": 2}'],  # a raw line break
                                   ['{"id": 1}', '{"id": 1e400}'],  # pyarrow.json refuses
                                   ['{"id": 1}', '{"id": "x"}']])
def test_what_only_the_reference_decides_is_left_to_it(texts):
    assert typed_rows.bulk_rows(pa.array(texts), {"id": TypeName.INT64}) is None


def test_a_refused_value_leaves_the_batch_to_the_reference_which_names_the_record():
    net = net_of([{"id": 0, "n": 1}, {"id": 1, "n": 99999}], {"id": TypeName.INT64, "n": TypeName.INT8},
                 first_offset=5)
    assert _bulk_typed(net, PRIMARY_KEY, deletes_of(net)) is None
    with pytest.raises(DecodeError, match="column 'n'") as raised:
        typed_changes(net, PRIMARY_KEY)
    assert raised.value.where is not None and raised.value.where.offset == 6


def test_deletes_keep_their_primary_key_only():
    net = net_of([{"id": 0, "n": 1}, {"id": 1, "n": 2}], {"id": TypeName.INT64, "n": TypeName.INT8},
                 [ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value])
    typed, _ = typed_changes(net, PRIMARY_KEY)
    assert typed.select(["id", "n"]).to_pylist() == [{"id": 0, "n": 1}, {"id": 1, "n": None}]
    assert typed.column(Meta.KIND).to_pylist() == [ChangeKind.UPDATE_AFTER.value, ChangeKind.DELETE.value]


@pytest.mark.parametrize("rows, bulk", [(BULK_ROWS - 1, False), (BULK_ROWS, True)])
def test_only_calls_of_enough_rows_are_typed_in_bulk(monkeypatch, rows, bulk):
    """Below `BULK_ROWS` the bulk way's fixed cost per call is more than the reference's rows cost."""
    images = [{"id": i, "n": i % 100} for i in range(rows)]
    net = net_of(images, {"id": TypeName.INT64, "n": TypeName.INT8})
    taken = []
    monkeypatch.setattr(payload, "bulk_rows", lambda *args: taken.append(True) or typed_rows.bulk_rows(*args))
    typed, _ = typed_changes(net, PRIMARY_KEY)
    assert bool(taken) is bulk
    assert typed.select(["id", "n"]).to_pylist() == images
