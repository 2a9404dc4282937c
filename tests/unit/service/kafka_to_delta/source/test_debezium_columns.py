"""The vectorised decode of Debezium JSON ranges (`debezium_columns`) gives exactly what the
record-by-record way gives, payload for payload, or leaves the range to it.

Random ranges of envelopes (bare, wrapped with a Connect schema block, or both), with inserts,
updates with and without their before image, deletes, tombstones and, in half of the seeds, a
sprinkling of records only the record-by-record way decides (bad JSON, unknown ops, truncates,
placeholders, misfits, ...); in half of the seeds the pipeline has `table_shape.ignore_null_updates`
(the nulls of updates become unchanged markers). Both reducers run on the same batches; their payloads
must be equal.
Seeds: `FIXED_SEEDS` plus one random seed, printed in the failure message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pyarrow as pa
import pytest

from connectors.kafka.range_reader import SOURCE_SCHEMA
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.materialize.payload import payload_table
from service.kafka_to_delta.rows.arrow import PAYLOAD_SCHEMA
from service.kafka_to_delta.rows.names import Column, Meta
from service.kafka_to_delta.source import debezium_columns
from service.kafka_to_delta.source.batch_changes import batch_changes
from service.kafka_to_delta.source.decode_stage import batch_decoder
from service.kafka_to_delta.source.partition_changes import PartitionReducer
from service.kafka_to_delta.source.range_state import _shown
from tests.support.run_seed import run_seed

FIXED_SEEDS = tuple(range(40))
RANDOM_SEED = run_seed(1_000_000)
_HEADERS = SOURCE_SCHEMA.field("headers").type
_COLUMNS = {  # column -> Connect field type (and logical name)
    "id": ("int64", None), "name": ("string", None), "amount": ("double", None), "n32": ("int32", None),
    "flag": ("boolean", None), "day": ("int32", "org.apache.kafka.connect.data.Date"),
    "at": ("int64", "io.debezium.time.MicroTimestamp"), "at_ms": ("int64", "org.apache.kafka.connect.data.Timestamp"),
    "ratio": ("float", None),
}
_TEXTS = ["plain", "with \"quotes\"", "back\\slash", "tab\there", "é ü ß", "emoji 😀", "", "line\nbreak", "\u2028"]


def _schema(key_type: str, added: bool = False) -> dict:
    fields = []
    columns = {**_COLUMNS, "note": ("string", None)} if added else _COLUMNS
    for name, (kind, logical) in columns.items():
        field = {"field": name, "type": key_type if name == "id" else kind, "optional": name != "id"}
        if logical:
            field["name"] = logical
        fields.append(field)
    image = {"type": "struct", "optional": True, "fields": fields}
    return {"type": "struct", "name": "t.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"field": "op", "type": "string"}, {"field": "ts_ms", "type": "int64", "optional": True},
    ]}


class _Range:
    """Random Debezium records of one range, and whether an odd record was put in on purpose."""

    def __init__(self, rng: random.Random, odd: bool, spelled: bool = False) -> None:
        self.rng = rng
        self.odd = odd
        self.spelled = spelled  # images spelled otherwise than Debezium writes them (`_respelled`)
        self.string_keys = rng.random() < 0.3
        self.schema = _schema("string" if self.string_keys else "int64")
        self.mode = rng.choice(["always", "never", "mixed"])
        self.layout = rng.choice(["compact", "spaced", "payload first"])
        self.added_at = rng.choice([None, rng.randrange(1, 300)])  # a column added by DDL mid-range
        self.toast = rng.random() < 0.4  # updates that leave `name` unchanged (the placeholder)
        self.changes = 0
        self.rows: dict[int, dict] = {}
        self.pairs: list[tuple[bytes | None, bytes | None]] = []
        self.odd_records = 0

    def _id(self, key: int):
        return f"k-{key}" if self.string_keys else key

    def _row(self, key: int) -> dict:
        rng = self.rng
        added = {"note": rng.choice([None, "n", "é"])} if self._added() else {}
        return added | {
            "id": self._id(key),
            "name": None if rng.random() < 0.1 else rng.choice(_TEXTS) + str(rng.randrange(100)),
            "amount": None if rng.random() < 0.1 else rng.choice([0.5, -1e-7, 1234.25, 1e20, -0.0, 3.0]),
            "n32": rng.choice([None, 0, -(2**31), 2**31 - 1, rng.randrange(-1000, 1000)]),
            "flag": rng.choice([None, True, False]),
            "day": rng.choice([None, 0, 19_000, -365]),
            "at": rng.choice([None, 1_700_000_000_123_456, -5]),
            "at_ms": rng.choice([None, 1_700_000_000_123, 0]),
            "ratio": rng.choice([None, 0.25, 1.5]),
        }

    def _added(self) -> bool:
        return self.added_at is not None and self.changes >= self.added_at

    def _value(self, document: dict) -> bytes:
        wrapped = self.mode == "always" or (self.mode == "mixed" and self.rng.random() < 0.5)
        schema = _schema("string" if self.string_keys else "int64", added=self._added())
        body = self._respelled(document) if self.spelled else document
        if wrapped:
            body = ({"payload": document, "schema": schema} if self.layout == "payload first"
                    else {"schema": schema, "payload": document})
        separators = (", ", ": ") if self.layout == "spaced" else (",", ":")
        return json.dumps(body, separators=separators, ensure_ascii=self.rng.random() < 0.5).encode()

    def _respelled(self, document: dict) -> dict:
        """The same values in other valid JSON: integer literals in the float column, the image's keys in
        another order, a declared column left out (null), an integer beyond 64 bits in the float column."""
        rng = self.rng
        document = dict(document)
        for side in ("before", "after"):
            image = document.get(side)
            if not isinstance(image, dict):
                continue
            image = dict(image)
            amount = image.get("amount")
            if isinstance(amount, float) and amount.is_integer() and rng.random() < 0.5:
                image["amount"] = int(amount)
            elif rng.random() < 0.03:
                image["amount"] = 12345678901234567890
            if rng.random() < 0.3:
                members = list(image.items())
                rng.shuffle(members)
                image = dict(members)
            if rng.random() < 0.1:
                del image[rng.choice([name for name in image if name != "id"])]
            document[side] = image
        return document

    def _key(self, key: int) -> bytes:
        return json.dumps({"id": self._id(key)}).encode()

    def add_change(self, key: int) -> None:
        rng = self.rng
        self.changes += 1
        current = self.rows.get(key)
        if current is None:
            row = self._row(key)
            self.rows[key] = row
            document = {"before": None, "after": row, "op": rng.choice("cr"), "ts_ms": 1}
        elif rng.random() < 0.25:
            del self.rows[key]
            self.pairs.append((self._key(key), self._value({"before": current, "after": None, "op": "d"})))
            if rng.random() < 0.8:
                self.pairs.append((self._key(key), None))
            return
        else:
            row = self._row(key)
            self.rows[key] = row
            before = current if rng.random() < 0.8 else None
            document = {"before": before, "after": row, "op": "u", "ts_ms": 1}
            if self.toast and rng.random() < 0.5:
                row["name"] = current["name"]
                document["after"] = {**row, "name": "__debezium_unavailable_value"}
        if self.odd and rng.random() < 0.03:
            self.odd_records += 1
            self.pairs.append((self._key(key), self._odd(document)))
            return
        self.pairs.append((self._key(key), self._value(document)))

    def _odd(self, document: dict) -> bytes:
        """A record only the record-by-record way decides."""
        rng = self.rng
        after = dict(document["after"])
        kind = rng.randrange(13)
        if kind == 0:
            return b'{"op":"c","after":{"id":1'  # not JSON
        if kind == 1:
            return self._value({**document, "op": rng.choice(["t", "m", "x"])})
        if kind == 2:
            return self._value({k: v for k, v in document.items() if k != "op"})
        if kind == 3:
            return self._value({**document, "after": {**after, "name": "__debezium_unavailable_value"}})
        if kind == 4:
            return self._value({**document, "after": {**after, "n32": 2**40}})
        if kind == 5:
            return self._value({**document, "after": {**after, "amount": 2**70}})
        if kind == 6:
            return json.dumps(document, indent=1).encode()
        if kind == 7:
            return self._value(document)[:-1] + b',"op":"c"}'  # a duplicate name
        if kind == 8:
            return self._value({**document, "after": {**after, "id": None}})
        if kind == 9:
            return self._value({**document, "after": {**after, "name": {"nested": 1}}})
        if kind == 10:
            return self._value({**document, "after": {**after, "name": 17}})
        if kind == 11:
            deep: object = 1
            for _ in range(250):
                deep = [deep]
            return self._value({**document, "after": {**after, "name": deep}})
        return self._value({**document, "op": "d", "before": None})  # a delete without its image


def _batches(pairs: list[tuple[bytes | None, bytes | None]], rng: random.Random) -> list[pa.RecordBatch]:
    n = len(pairs)
    batch = pa.RecordBatch.from_pydict({
        "key": [k for k, _ in pairs], "value": [v for _, v in pairs], "topic": ["t"] * n,
        "partition": pa.array([3] * n, pa.int32()), "offset": pa.array(range(100, 100 + n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000_000 + 1000 * i for i in range(n)], pa.timestamp("us", tz="UTC")),
        "headers": pa.nulls(n, _HEADERS), "watermark_floor": pa.nulls(n, pa.int64()),
    }, schema=SOURCE_SCHEMA)
    cuts = sorted(rng.sample(range(1, n), min(3, n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    return [batch.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]


def _payloads(reducer: PartitionReducer, batches: list[pa.RecordBatch]) -> pa.Table | str:
    """The range's payload rows, or the error that failed the range."""
    try:
        produced = list(reducer(lambda: iter(batches)))
    except ValueError as exc:  # a range that fails as a whole (a record that misfits is rejected alone instead)
        return f"{type(exc).__name__}: {exc}"
    for batch in produced:
        assert batch.schema == PAYLOAD_SCHEMA
    return pa.Table.from_batches(produced, schema=PAYLOAD_SCHEMA)


def _infos(payloads: pa.Table) -> list[dict]:
    return [payload_table(payload)[1] for part, payload in
            zip(payloads.column("part").to_pylist(), payloads.column("payload").to_pylist()) if part == "changes"]


def _merged(payloads: pa.Table) -> tuple:
    """What the driver makes of a range's payloads: net changes by key (the columns each row left
    unchanged as a set: the JSON text may space its list differently), failed records by offset,
    and whether a TRUNCATE was read."""
    merged = batch_changes(payloads)
    changes = merged.changes
    if changes.num_rows:
        changes = changes.sort_by(Meta.KEY)
        unchanged = [None if t is None else sorted(json.loads(t)) for t in changes.column(Meta.UNCHANGED).to_pylist()]
        changes = changes.drop_columns([Meta.UNCHANGED])
    else:
        unchanged = []
    failed = merged.failed.sort_by(Column.OFFSET) if merged.failed.num_rows else merged.failed
    return changes, unchanged, failed, merged.truncated, merged.count


def _ignores_nulls(seed: int) -> bool:
    return seed % 4 >= 2  # both with and without odd records (odd seeds)


def both_ways(pairs: list[tuple[bytes | None, bytes | None]], rng: random.Random,
              decoder: Callable[[], ChangelogBatchDecoder] | None = None,
              ignore_null_updates: bool = False) -> dict | None:
    """Run both reducers on one range (cut into batches by `rng`) and assert that the driver makes
    the same of their payloads; the fast way's first payload metadata, None when both failed.
    `decoder`: makes the decoder (default: the JSON pipeline `p` keyed by `id`, with
    `table_shape.ignore_null_updates` as given)."""
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                                table_shape={"ignore_null_updates": ignore_null_updates})
    make = decoder or (lambda: batch_decoder(pipeline))
    batches = _batches(pairs, rng)
    fast = _payloads(PartitionReducer(make(), ("id",)), batches)
    exact = _payloads(PartitionReducer(make(), ("id",), vectorised=False), batches)
    if isinstance(exact, str) or isinstance(fast, str):
        assert fast == exact
        return None
    (changes, unchanged, failed, truncated, count) = _merged(fast)
    (exact_changes, exact_unchanged, exact_failed, exact_truncated, exact_count) = _merged(exact)
    if changes.column_names != exact_changes.column_names:  # a decided difference (`debezium_columns`)
        assert sorted(changes.column_names) == sorted(exact_changes.column_names)
        changes = changes.select(exact_changes.column_names)
    assert changes.schema == exact_changes.schema
    assert changes.equals(exact_changes), "net changes differ"
    assert unchanged == exact_unchanged
    assert failed.equals(exact_failed), "failed records differ"
    assert (truncated, count) == (exact_truncated, exact_count)
    return _infos(fast)[0]


def _compare(seed: int) -> dict:
    rng = random.Random(seed)
    source = _Range(rng, odd=seed % 2 == 1)
    for _ in range(rng.randrange(1, 300)):
        source.add_change(rng.randrange(60))
    info = both_ways(source.pairs, rng, ignore_null_updates=_ignores_nulls(seed))
    if info is None:
        return {"vectorised": False}
    schema_less = source.mode != "always"  # nulls in its updates: the range goes record by record
    if not source.odd_records and not (_ignores_nulls(seed) and schema_less):
        assert info["vectorised"], f"a clean range was decoded record by record: {info.get('fallback')}"
    return info


@pytest.mark.parametrize("seed", [*FIXED_SEEDS, RANDOM_SEED])
def test_vectorised_ranges_equal_the_record_by_record_decode(seed: int) -> None:
    try:
        _compare(seed)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc


@pytest.mark.parametrize("seed", [*FIXED_SEEDS[:20], RANDOM_SEED])
def test_respelled_ranges_equal_the_record_by_record_decode(seed: int) -> None:
    # The same values in other valid JSON (`_Range._respelled`): the reference reads them as their schema
    # declares them (`changelog.declared_image`), and the bulk way must give the same net changes.
    rng = random.Random(seed)
    source = _Range(rng, odd=seed % 2 == 1, spelled=True)
    for _ in range(rng.randrange(1, 300)):
        source.add_change(rng.randrange(60))
    try:
        both_ways(source.pairs, rng, ignore_null_updates=_ignores_nulls(seed))
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc


@pytest.mark.parametrize("reduce_rows", [1, 7])
@pytest.mark.parametrize("seed", [*FIXED_SEEDS[:6], RANDOM_SEED])
def test_reducing_the_chunks_in_steps_gives_the_same_ranges(seed: int, reduce_rows: int, monkeypatch) -> None:
    # A range's chunks wait to be reduced together (`RangeColumns.reduced`); with a small threshold they
    # are reduced in many steps, net rows and placeholder holders alike, and must give the same result.
    monkeypatch.setattr(debezium_columns, "_REDUCE_ROWS", reduce_rows)
    try:
        _compare(seed)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}, reduced every {reduce_rows} rows: {exc}") from exc


def test_a_placeholder_first_met_after_a_reduction_is_filled_from_the_rows_reduced_before(monkeypatch) -> None:
    # Chunks reduced as soon as they can be: key 1's value is among the reduced rows when its placeholder
    # (the first of the range) arrives, and still fills it, as the record-by-record way does, once key 3's
    # later value has joined the holders.
    monkeypatch.setattr(debezium_columns, "_REDUCE_ROWS", 1)

    def record(op: str, key: int, notes: str) -> tuple[bytes, bytes]:
        after = {"id": key, "notes": notes}
        return json.dumps({"id": key}).encode(), json.dumps({"before": None, "after": after, "op": op}).encode()

    pairs = [record("c", 1, "A"), record("c", 2, "B"), record("u", 2, "C"),
             record("u", 1, "__debezium_unavailable_value"), record("c", 3, "D")]
    info = both_ways(pairs, random.Random(0))  # cut into 4 chunks, the first record alone in its chunk
    assert info is not None and info["vectorised"]


def test_the_fixed_seeds_exercise_both_ways() -> None:
    ways = [_compare(seed)["vectorised"] for seed in FIXED_SEEDS]
    assert any(ways) and not all(ways)
    assert any(way for seed, way in zip(FIXED_SEEDS, ways) if _ignores_nulls(seed))


def test_only_envelope_settings_take_the_vectorised_way() -> None:
    plain = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    assert PartitionReducer(batch_decoder(plain), ("id",)).plan is not None
    flat = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"], from_changelog={"preset": "flat"})
    assert PartitionReducer(batch_decoder(flat), ("id",)).plan is None
    passthrough = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                                   from_changelog={"preset": "debezium", "passthrough": ["source.lsn"]})
    assert PartitionReducer(batch_decoder(passthrough), ("id",)).plan is None


def test_an_envelopes_ts_ns_keeps_a_schema_less_float_column_in_bulk() -> None:
    """Debezium 2.5+ writes `ts_ns` (19 digits) in every envelope: only a 19-digit value of the float
    column itself may send the range record by record (Arrow and the reference could type it apart);
    either way both decode it alike (`both_ways`)."""
    def pair(key: int, ratio: object, ts_ns: int) -> tuple[bytes, bytes]:
        document = {"before": None, "after": {"id": key, "ratio": ratio}, "op": "c", "ts_ms": 1,
                    "ts_ns": ts_ns, "source": {"ts_ns": ts_ns}}
        return json.dumps({"id": key}).encode(), json.dumps(document).encode()

    ts_ns = 1_732_000_000_123_456_789
    clean = both_ways([pair(1, 0.25, ts_ns), pair(2, 3, ts_ns + 1)], random.Random(0))
    assert clean is not None and clean["vectorised"], clean
    assert both_ways([pair(1, 0.25, ts_ns), pair(2, 1234567890123456789, ts_ns)], random.Random(0)) is not None


def _with_a_map(schema: dict) -> dict:
    """`schema` with a declared map column `attrs` in both images (a type `pyarrow.json` must infer)."""
    mapped = json.loads(json.dumps(schema))
    for side in mapped["fields"][:2]:
        side["fields"].append({"field": "attrs", "type": "map", "keys": {"type": "string"},
                               "values": {"type": "string"}, "optional": True})
    return mapped


def test_a_range_decoded_record_by_record_says_why_without_quoting_values() -> None:
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    schema = _schema("int64")
    row = {name: None for name in _COLUMNS} | {"id": 1}
    secret = 987654321987654321987  # beyond int64: pyarrow refuses it, quoting it in its message

    def value(document: dict) -> bytes:
        return json.dumps({"schema": schema, "payload": {"before": None, "after": document, "op": "c"}},
                          separators=(",", ":")).encode()

    def merged(values: list[bytes], settings: PipelineSettings = pipeline):
        batches = _batches([(b'{"id":%d}' % i, v) for i, v in enumerate(values)], random.Random(0))
        return batch_changes(pa.Table.from_batches(
            list(PartitionReducer(batch_decoder(settings), ("id",))(lambda: iter(batches))), schema=PAYLOAD_SCHEMA))

    one_odd = merged([value({**row, "id": i}) for i in range(5)] + [value({**row, "id": 9, "at": secret})])
    assert one_odd.fallbacks == [] and (one_odd.vectorised, one_odd.record_by_record) == (1, 0)
    assert one_odd.odd_records == 1  # that record alone was decoded record by record
    undeclared = value({**row, "id": 2, "extra": "text"})  # dropped, as the reference and Kafka Connect drop it
    dropped = merged([value(row), undeclared])
    assert dropped.fallbacks == [] and (dropped.vectorised, dropped.record_by_record) == (1, 0)
    assert "extra" not in dropped.changes.column_names
    schema = _with_a_map(schema)  # a declared map: its type is inferred, so are the fields no schema declares
    fell_back = merged([value(row), value({**row, "id": 2, "extra": "text", "attrs": {"k": "v"}})])
    assert (fell_back.vectorised, fell_back.record_by_record) == (0, 1)
    assert fell_back.fallbacks == ["a row column no schema declares next to declared ones"]
    assert all(str(secret) not in reason and "987654" not in reason for reason in fell_back.fallbacks)
    clean = merged([value(row)])
    assert clean.fallbacks == [] and (clean.vectorised, clean.record_by_record) == (1, 0)
    assert clean.changes.num_rows == 1
    flat = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"], from_changelog={"preset": "flat"})
    settings_not_taken = merged([value(row)], flat)
    assert settings_not_taken.fallbacks == [] and (settings_not_taken.vectorised, settings_not_taken.record_by_record) == (0, 1)


def test_a_refused_value_is_named_without_its_text() -> None:
    error = pa.ArrowInvalid("JSON parse error: Column(/after/at) changed from number to 987654321987654321987 in row 3")
    assert _shown(error) == "ArrowInvalid at /after/at"


def test_a_key_no_schema_declares_is_dropped_by_both_ways() -> None:
    """Connect's reading: a declaring record's undeclared image key is not a column (the bulk way does not
    even build it, nor the envelope's other fields); with a declared map, whose type is inferred, the range goes
    record by record and the key is dropped all the same."""
    schema = _schema("int64")
    row = {name: None for name in _COLUMNS}

    def pair(document: dict, declared: dict = schema) -> tuple[bytes, bytes]:
        envelope = {"schema": declared, "payload": {"before": None, "after": document, "op": "c",
                                                     "source": {"lsn": document["id"], "extra": [1]}}}
        return json.dumps({"id": document["id"]}).encode(), json.dumps(envelope).encode()

    pairs = [pair({**row, "id": 1, "extra": "x"}), pair({**row, "id": 2}), pair({"extra": 3, **row, "id": 3})]
    info = both_ways(pairs, random.Random(0))
    assert info is not None and info["vectorised"]
    mapped = _with_a_map(schema)
    info = both_ways([pair({**row, "id": 1, "extra": "x", "attrs": {"k": "v"}}, mapped)], random.Random(0))
    assert info is not None and not info["vectorised"]
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    exact = _payloads(PartitionReducer(batch_decoder(pipeline), ("id",), vectorised=False), _batches(pairs, random.Random(0)))
    assert "extra" not in _merged(exact)[0].column_names


def test_a_schema_less_envelopes_other_fields_decide_alike_by_both_ways() -> None:
    """A schema-less envelope's fields besides op and images are cut out before the bulk parse
    (`envelope_fields`): what they hold still decides each record as the reference decides it. Bytes that
    are not UTF-8 in `source` fail the record as the reference fails it, JSON that Python reads but RFC 8259
    does not (NaN, a lone surrogate) sends that record alone record by record, a field named twice counts with
    its last value and an escaped name is the name it spells."""
    def pair(key: int, source: bytes = b'{"lsn":1}', op: bytes = b'"c"') -> tuple[bytes, bytes]:
        value = b'{"before":null,"after":{"id":%d,"name":"n%d"},"source":%s,"op":%s}' % (key, key, source, op)
        return b'{"id":%d}' % key, value

    odd_ones = {3: pair(3, b'{"db":"\xff"}'), 4: pair(4, b'{"lag":NaN}'), 5: pair(5, b'{"db":"\\ud800"}'),
                6: (b'{"id":6}', b'{"op":"u","before":null,"after":{"id":6,"name":"x"},"op":"c"}'),
                7: (b'{"id":7}', b'{"\\u006fp":"c","after":{"id":7,"name":"n7"}, "source" : {"a": [1, {"b": 2}]}}')}
    for seed in range(4):
        pairs = [odd_ones.get(key) or pair(key) for key in range(10)]
        info = both_ways(pairs, random.Random(seed))
        assert info is not None and info["vectorised"], info
        assert info["odd_records"] == 3, info  # the bytes that are not UTF-8, NaN, the lone surrogate
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
    exact = _merged(_payloads(PartitionReducer(batch_decoder(pipeline), ("id",), vectorised=False),
                              _batches([odd_ones.get(key) or pair(key) for key in range(10)], random.Random(0))))
    assert exact[2].num_rows == 2  # the reference fails the bytes that are not UTF-8 and the lone surrogate
