"""The bucket stage's changes decoded in bulk (`changelog_columns`) equal the record-by-record reference
(`ChangelogBatchDecoder`), batch by batch, in every column the bucket stage reads.

Hypothesis draws Avro ranges as `test_avro_ranges` does (every logical type `test_avro_columns` covers,
two schema ids, deletes and tombstones, one damaged record, `ignore_null_updates` on or off) and cuts them
into batches; `derandomize=True`. Fixed cases: a schema of the kinds a Debezium capture of PostgreSQL
holds goes the bulk way in every batch, TOAST placeholders included; a schema whose document form needs a
conversion goes record by record, saying why. Debezium JSON ranges drawn as `test_debezium_columns` draws them,
spelled as Debezium writes them and otherwise; schema-less JSON goes record by record.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.schema_registry.avro_codec import ConfluentAvroDecoder
from connectors.schema_registry.wire_format import frame
from service.config.settings import PipelineSettings
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import UNAVAILABLE_VALUE
from service.kafka_to_delta.materialize.payload import _carried, typed_changes
from service.kafka_to_delta.rows.names import TYPED_IMAGE, Column, typed_names
from service.kafka_to_delta.source.changelog_columns import BulkChangelog
from service.kafka_to_delta.source.decode_report import DecodeWays
from service.kafka_to_delta.source.decode_stage import batch_decoder
from tests.support.value_chunks import chunk_of
from tests.unit.connectors.schema_registry.test_avro_columns import (  # noqa: F401
    DECIMAL,
    _body,
    _unscaled_bytes,
    client,
)
from tests.unit.service.kafka_to_delta.source.test_avro_ranges import AVRO_RANGES, avro_range
from tests.unit.service.kafka_to_delta.source.test_debezium_columns import (
    FIXED_SEEDS,
    RANDOM_SEED,
    _batches,
    _ignores_nulls,
    _Range,
    _schema,
)
from vocabulary.errors import DecodeError

_PIPELINE = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"])
_COMPARED = [name for name in (Column.TOPIC, Column.PARTITION, Column.OFFSET, Column.CHANGE_INDEX, Column.TIMESTAMP,
                               Column.KIND, Column.KEY, Column.UPSERT_KEY, Column.PARTITION_KEY, Column.ROW,
                               Column.TYPES, Column.UNCHANGED, Column.INTENT, Column.SEQUENCE, Column.EVENT_TIME,
                               Column.ERROR, Column.HANDLING, Column.STAGE, Column.RAW_KEY, Column.RAW_VALUE,
                               Column.HEADERS)]
"""Every `CHANGELOG_SCHEMA` column but `snapshot`, which the bulk way leaves null."""


def _decoder(client, ignore_nulls: bool = False) -> ChangelogBatchDecoder:  # noqa: F811
    return ChangelogBatchDecoder(_PIPELINE.changelog_settings, _PIPELINE.primary_key, _PIPELINE.effective_upsert_key,
                                 value_decoder=ConfluentAvroDecoder(client), ignore_null_updates=ignore_nulls)


def _both_ways(decoder: ChangelogBatchDecoder, batches: list[pa.RecordBatch], typed: bool = False,
               seed: int = 0):
    """Assert the two ways give the same rows for each batch; the bulk way's range decoder. `typed`: the
    bulk way carries typed images, and the rows typed from them equal the rows typed from their texts."""
    decode = BulkChangelog(decoder, ("id",), typed).range_decoder()
    from_chunks = BulkChangelog(decoder, ("id",), typed).range_decoder()
    rng = random.Random(seed)
    decode.carried = 0  # batches whose rows took their carried typed images
    for batch in batches:
        exact = decoder(batch).select(_COMPARED)
        decoded = decode(batch)
        assert from_chunks.chunk(chunk_of(batch)).equals(decoded)  # read as values, the records kept
        fast = decoded.select(_COMPARED)
        assert fast.schema == exact.schema
        for name in _COMPARED:
            assert fast.column(name).equals(exact.column(name)), (name, fast.column(name), exact.column(name))
        if typed:
            decode.carried += _typed_as_from_texts(pa.Table.from_batches([decoded]), rng)
    return decode


def _typed_as_from_texts(rows: pa.Table, rng: random.Random) -> bool:
    """`typed_changes` of changelog rows carrying typed images equals it of the same rows without them, with
    some rows' images dropped (typed from their texts among the others); whether the rows with every image
    kept took them (`payload._carried`), not the texts."""
    changes = rows.filter(pc.and_(pc.is_in(rows.column(Column.KIND), pa.array(["+I", "+U", "-U", "-D"])),
                                  pc.is_null(rows.column(Column.ERROR))))
    if not changes.num_rows or TYPED_IMAGE not in changes.column_names:
        return False

    def typed(table: pa.Table):
        try:
            result, evidence = typed_changes(table, ("id",))
        except DecodeError as error:
            return str(error)
        return result, evidence.to_json()

    reference = typed(changes.drop_columns(typed_names(changes.column_names)))
    holds = changes.column(TYPED_IMAGE).to_pylist()
    for dropped in (0.0, 0.3):
        kept = [bool(held) and rng.random() >= dropped for held in holds]
        carried = typed(changes.set_column(changes.schema.get_field_index(TYPED_IMAGE), TYPED_IMAGE,
                                           pa.array(kept, pa.bool_())))
        assert carried == reference or (carried[0].equals(reference[0]) and carried[1] == reference[1])
    deletes = pc.is_in(changes.column(Column.KIND), pa.array(["-U", "-D"])).to_pylist()
    return _carried(changes, ("id",), deletes) is not None


@AVRO_RANGES
@given(data=st.data())
def test_avro_changes_decode_in_bulk_as_record_by_record(client, data) -> None:  # noqa: F811
    pairs = avro_range(client, data)
    ignore_nulls = data.draw(st.booleans(), label="ignore_null_updates")
    batches = _batches(pairs, random.Random(data.draw(st.integers(0, 2**16))))
    decode = _both_ways(_decoder(client, ignore_nulls), batches, typed=True, seed=data.draw(st.integers(0, 99)))
    # Every batch goes the bulk way, unless a column's document form needs a conversion (timestamp-millis and
    # -nanos are read as microseconds, records holding bytes): then from that batch on record by record.
    assert decode.bulk == len(batches) or "document form needs a conversion" in (decode.fallback or ""), \
        decode.fallback


_CAPTURE_ROW = {"type": "record", "name": "Value", "fields": [
    {"name": "id", "type": "long"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "balance", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2,
                                          "connect.name": DECIMAL,
                                          "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"}}],
     "default": None},
    {"name": "updated_at", "type": ["null", {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}],
     "default": None},
    {"name": "seen_at", "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
     "default": None},
    {"name": "birthday", "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}], "default": None},
    {"name": "profile", "type": ["null", {"type": "string", "connect.name": "io.debezium.data.Json"}],
     "default": None},
    {"name": "external_id", "type": ["null", {"type": "string", "connect.name": "io.debezium.data.Uuid"}],
     "default": None},
    {"name": "status", "type": ["null", {"type": "string", "connect.name": "io.debezium.data.Enum"}],
     "default": None},
    {"name": "score", "type": ["null", "double"], "default": None},
    {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "string"]}], "default": None},
    {"name": "notes", "type": ["null", "string"], "default": None},
]}


def _envelope(row: dict) -> dict:
    return {"type": "record", "name": "Envelope", "namespace": "cap.public.accounts", "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "snapshot", "type": ["null", "string"], "default": None}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def _capture(client, count: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:  # noqa: F811
    """A capture's changes: a snapshot of `count` rows, then updates (half leaving `notes` to a TOAST
    placeholder), deletes with their tombstones, a truncate and a message."""
    rng = random.Random(seed)
    schema = _envelope(_CAPTURE_ROW)
    schema_id = client.register("cap-value", schema)
    pairs: list[tuple[bytes | None, bytes | None]] = []

    def row(key: int) -> dict:
        return {"id": key, "email": f"u{key}.{rng.randrange(9)}@example.com",
                "balance": _unscaled_bytes(rng.randrange(-10**9, 10**9)),
                "updated_at": f"2026-11-{1 + key % 28:02d}T10:00:0{key % 10}.{rng.randrange(10**6):06d}Z",
                "seen_at": rng.randrange(-10**15, 10**15), "birthday": rng.randrange(-20_000, 20_000),
                "profile": '{"city": "São Paulo", "n": %d}' % key, "external_id": f"{key:08d}-0000-4000-8000-0000",
                "status": rng.choice(["new", "active", None]), "score": rng.choice([None, 0.5, 2.0, -1e300]),
                "tags": rng.choice([None, [], ["a", None, "é\"x"]]), "notes": "n\n\t\\ " * rng.randrange(40)}

    def put(key: int, record: dict | None) -> None:
        pairs.append((b'{"id":%d}' % key, None if record is None else frame(schema_id, _body(schema, record))))

    live: dict[int, dict] = {}
    for key in range(count):
        live[key] = row(key)
        put(key, {"before": None, "after": live[key], "op": "r", "source": {"snapshot": "true"}})
    for _ in range(2 * count):
        key = rng.randrange(count + 5)
        if key in live and rng.random() < 0.1:
            put(key, {"before": live.pop(key), "after": None, "op": "d", "source": {"snapshot": None}})
            put(key, None)
            continue
        after, op = row(key), "u" if key in live else "c"
        if op == "u" and rng.random() < 0.5:
            after["notes"] = UNAVAILABLE_VALUE
        live[key] = after
        put(key, {"before": None, "after": after, "op": op, "source": {"snapshot": None}})
        if rng.random() < 0.01:
            put(key, {"before": None, "after": None, "op": rng.choice("tm"), "source": {"snapshot": None}})
    return pairs


def test_a_capture_goes_the_bulk_way_in_every_batch(client) -> None:  # noqa: F811
    for seed in (1, 2, 3, random.randrange(2**16)):
        pairs = _capture(client, 300, seed)
        batches = _batches(pairs, random.Random(seed))
        decode = _both_ways(_decoder(client), batches, typed=True, seed=seed)
        assert (decode.bulk, decode.fallback) == (len(batches), None), f"seed {seed}"
        assert decode.carried == len(batches), f"seed {seed}: the typed images were not taken"


def test_a_document_form_needing_a_conversion_goes_record_by_record(client) -> None:  # noqa: F811
    row = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}  # read as microseconds
    schema = _envelope(row)
    schema_id = client.register("millis-value", schema)
    pairs = [(b'{"id":%d}' % key, frame(schema_id, _body(schema, {
        "before": None, "after": {"id": key, "at": 1_700_000_000_123 + key}, "op": "c", "source": {"snapshot": None}})))
        for key in range(20)]
    decode = _both_ways(_decoder(client), _batches(pairs, random.Random(4)))
    assert decode.bulk == 0 and "conversion" in (decode.fallback or "")


@pytest.mark.parametrize("seed", [*FIXED_SEEDS[:24], RANDOM_SEED])
def test_json_changes_decode_in_bulk_as_record_by_record(seed: int) -> None:
    # Debezium JSON ranges as `test_debezium_columns` draws them (with or without schema blocks or both, a
    # column added mid-range, TOAST placeholders, odd records), in two of three seeds spelled otherwise
    # (integer literals in the float column, keys in another order, a column left out): the same rows, and
    # the typed images carried equal to the rows typed from their texts.
    rng = random.Random(seed)
    source = _Range(rng, odd=seed % 2 == 1, spelled=seed % 3 != 0)
    for _ in range(rng.randrange(1, 300)):
        source.add_change(rng.randrange(60))
    pipeline = PipelineSettings(name="p", topics=["t"], table="t", primary_key=["id"],
                                table_shape={"ignore_null_updates": _ignores_nulls(seed)})
    batches = _batches(source.pairs, rng)
    try:
        decode = _both_ways(batch_decoder(pipeline), batches, typed=True, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc
    if source.mode == "never":  # schema-less: a text is the record's own spelling
        assert decode.bulk == 0 and "schema-less" in (decode.fallback or ""), (seed, decode.fallback)
    elif source.mode == "always":
        assert (decode.bulk, decode.fallback) == (len(batches), None), (seed, decode.fallback)
        if not source.odd_records:
            assert decode.odd == 0 and decode.carried == len(batches), seed


def test_a_schema_less_json_record_goes_record_by_record_among_schema_blocks() -> None:
    def record(key: int, wrapped: bool) -> tuple[bytes, bytes]:
        document = {"before": None, "after": {"id": key, "name": "n", "amount": 1.5, "n32": 1, "flag": True,
                                              "day": 1, "at": 5, "at_ms": 5, "ratio": 0.5}, "op": "c"}
        body = {"schema": _schema("int64"), "payload": document} if wrapped else document
        return b'{"id":%d}' % key, json.dumps(body).encode()

    pairs = [record(key, wrapped=key != 3) for key in range(6)]
    batches = _batches(pairs, random.Random(0))
    decode = _both_ways(batch_decoder(_PIPELINE), batches, typed=True)
    assert (decode.bulk, decode.odd, decode.fallback) == (len(batches), 1, None)


def test_the_driver_learns_how_each_range_was_decoded(spark, client) -> None:  # noqa: F811
    ways = DecodeWays(spark.sparkContext)
    clean = _capture(client, 40, 5)
    damaged = list(clean)
    damaged[7] = (damaged[7][0], b"\x00\x00\x00\x00\x01")  # a schema id the registry does not know
    millis = _envelope({"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "long"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]})
    schema_id = client.register("ways-value", millis)
    converted = [(b'{"id":1}', frame(schema_id, _body(millis, {
        "before": None, "after": {"id": 1, "at": 5}, "op": "c", "source": {"snapshot": None}})))]
    decoded = [_both_ways(_decoder(client), _batches(pairs, random.Random(6))) for pairs in (clean, damaged, converted)]
    assert decoded[1].odd == decoded[0].odd + 1  # the damaged record alone went record by record
    for one in decoded:
        ways.report(one)
    ways.report(BulkChangelog(batch_decoder(_PIPELINE), None).range_decoder())  # not the bulk way's: not counted
    reported = ways.take()
    assert {name: reported[name] for name in ("vectorised", "record_by_record", "odd_records")} == {
        "vectorised": 2, "record_by_record": 1, "odd_records": sum(one.odd for one in decoded)}
    assert len(reported["fallbacks"]) == 1 and "conversion" in reported["fallbacks"][0]
    assert ways.take() == {}
