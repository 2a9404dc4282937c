"""Spec 4.5, both ways, through the real components (runner, exports, ingest, broker, Delta).

FROM_CHANGELOG(TO_CHANGELOG(t)) = t: a Delta table with a history of inserts, updates,
deletes and re-inserts (and the spec 4.5.1 example) is exported with the flat mapping (no
compaction, partial deletes) and with the Debezium mapping (before/after, -U/+U combined
into 'u', tombstones, compaction per flush), each topic is ingested with the matching
from_changelog preset into a second table, and the second table equals the first (rows and
column types) when read back with deltalake. The column types are those JSON carries
exactly (int64, string, float64, bool): the JSON formats send no schema.

TO_CHANGELOG(FROM_CHANGELOG(s)) = s: a flat changelog stream s (op INSERT / UPDATE_AFTER /
DELETE with full rows; the spec 4.5.2 example for id 1, then random life cycles) is ingested
and exported again with the default mapping, no compaction and full deletes. What "equals"
means, precisely:
- The ingest's micro-batch is its barrier: a Delta commit holds one net change per key, and
  the change feed reports that commit's net effect. So s comes back record for record only
  when no micro-batch holds two changes of one key. s is built in rounds (each round changes
  a key at most once) and ingested one round per micro-batch: the output is then s itself,
  each round's records as one Delta version, rounds in order, every key's records in s's
  order. Across keys within a round the order is the change feed's, not s's (keys are
  independent; a keyed changelog promises order per key only).
- Ingested two rounds per micro-batch, the output equals s folded per key and batch: a key
  absent before and present after the batch is one INSERT of its last row, present before
  and after is one UPDATE_AFTER of its last row, present before and absent after is one
  DELETE of its row before the batch, absent before and after is nothing.

The avro-confluent export (through Apicurio Registry's ccompat API, `apicurio_registry_url`)
decodes to the same documents as the debezium-json export of the same table, logical types
(decimal, timestamp, date) compared in the JSON export's text form; a column added to the table
reaches the Avro values as a new version of the value subject.
"""

from __future__ import annotations

import base64
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake

from connectors.schema_registry import ConfluentAvroDecoder, SchemaRegistryClient
from service.config.exports import ExportSettings
from service.config.settings import Settings, settings_from_mapping
from service.delta_to_kafka.formats.avro_serializers import avro_serializers
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.formats.output_formats import Header
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.export_driver import consume
from tests.support.pipeline_harness import table_rows
from vocabulary.changes import Envelope

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CDF_ON = {"delta.enableChangeDataFeed": "true"}
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("active", pa.bool_())])
MERGE_SCHEMA = pa.schema([*SCHEMA, ("deleted", pa.bool_())])
ALICE = 10_000  # the spec 4.5.1 example: inserted, updated, then deleted
ALICE_NAMES = {1: "Alice", 2: "Alice Updated", 3: "Alice Updated"}
ALICE_DELETED_AT = 3
ROUNDS, PER_ROUND, KEYS = 6, 20, 40
SPEC_EXAMPLE = [  # spec 4.5.2, input and expected output alike
    {"op": "INSERT", "id": 1, "name": "Alice"},
    {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
    {"op": "DELETE", "id": 1, "name": "Alice Updated"},
]


def _settings(bootstrap: str, workdir: Path, pipelines: Sequence[dict] = (), exports: Sequence[dict] = (),
              engine: str = "delta-rs") -> Settings:
    return settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap},
        "lakehouse": {"root": str(workdir / "tables"), "engine": engine},
        "checkpoint_root": str(workdir / "checkpoints"),
        "pipelines": list(pipelines),
        "exports": list(exports),
    })


def run_until_idle(settings: Settings) -> Runner:
    """The service's runner in this process (it reuses the test session's Spark)."""
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()
    return runner


# --- FROM_CHANGELOG(TO_CHANGELOG(t)) ---------------------------------------------------------


def _merge(uri: str, rows: list[dict], deleted: set[int]) -> None:
    source = pa.Table.from_pylist([{**row, "deleted": row["id"] in deleted} for row in rows], schema=MERGE_SCHEMA)
    columns = {c: f"s.{c}" for c in SCHEMA.names}
    (DeltaTable(uri).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_delete(predicate="s.deleted")
     .when_matched_update(updates=columns, predicate="NOT s.deleted")
     .when_not_matched_insert(updates=columns, predicate="NOT s.deleted")
     .execute())


def build_history(uri: str, seed: int, versions: int = 12) -> None:
    """Inserts, updates, deletes and re-inserts over `versions` MERGEs, plus the spec 4.5.1 example."""
    rng = random.Random(seed)
    DeltaTable.create(uri, SCHEMA, configuration=CDF_ON)
    live: set[int] = set()
    gone: set[int] = set()
    next_id = 0
    for version in range(1, versions + 1):
        updated = set(rng.sample(sorted(live), min(len(live), 25)))
        deleted = set(rng.sample(sorted(live - updated), min(len(live - updated), 8)))
        revived = set(rng.sample(sorted(gone), min(len(gone), 4)))
        new = set(range(next_id, next_id + 30))
        next_id += 30
        rows = [_row(rng, key, version) for key in sorted(updated | deleted | revived | new)]
        if version in ALICE_NAMES:
            rows.append({"id": ALICE, "name": ALICE_NAMES[version], "score": 1.5, "active": True})
        if version == ALICE_DELETED_AT:
            deleted.add(ALICE)
        _merge(uri, rows, deleted)
        live = (live | new | revived) - deleted
        gone = (gone | deleted) - revived - {ALICE}  # Alice stays deleted
    DeltaTable(uri).update(updates={"score": "score * 2"}, predicate="id % 5 = 0")
    DeltaTable(uri).delete("id % 7 = 3")


def _row(rng: random.Random, key: int, version: int) -> dict:
    return {
        "id": key,
        "name": None if rng.random() < 0.1 else f"n{version}-{key}",
        "score": rng.randrange(-10**6, 10**6) / 8,
        "active": rng.random() < 0.5,
    }


def _columns(uri: Path) -> list[tuple[str, str]]:
    return [(field.name, str(field.type)) for field in DeltaTable(str(uri)).to_pyarrow_table().schema]


def test_from_changelog_of_to_changelog_reproduces_the_table(spark, kafka_bootstrap, unique, workdir):
    source = workdir / "tables" / "source"
    build_history(str(source), seed=3)
    topics = {"flat": f"rt.flat.{unique}", "debezium": f"rt.dbz.{unique}"}
    create_topics(kafka_bootstrap, list(topics.values()), 1)
    exports = [
        {"name": f"rt-flat-{unique}", "table": "source", "topic": topics["flat"], "primary_key": "id",
         "preset": "flat", "compaction": "none", "max_versions_per_trigger": 3},
        {"name": f"rt-dbz-{unique}", "table": "source", "topic": topics["debezium"], "primary_key": "id",
         "preset": "debezium", "max_versions_per_trigger": 4},
    ]
    run_until_idle(_settings(kafka_bootstrap, workdir, exports=exports))
    pipelines = [
        {"name": f"in-flat-{unique}", "topics": [topics["flat"]], "table": "copy_flat", "primary_key": "id",
         "format": "json", "from_changelog": {"preset": "flat"}, "max_offsets_per_trigger": 300},
        {"name": f"in-dbz-{unique}", "topics": [topics["debezium"]], "table": "copy_debezium",
         "primary_key": "id", "format": "debezium-json", "max_offsets_per_trigger": 300},
    ]
    run_until_idle(_settings(kafka_bootstrap, workdir, pipelines=pipelines))

    expected = table_rows(source)
    assert len(expected) > 100 and ALICE not in {row["id"] for row in expected}
    for mapping, topic in topics.items():
        values = [json.loads(value) for _, value, _ in consume(kafka_bootstrap, topic) if value is not None]
        assert {value["op"] for value in values} in ({"INSERT", "UPDATE_AFTER", "DELETE"}, {"c", "u", "d"})
        if mapping == "flat":  # spec 4.5.1's append stream; no compaction, deletes carry the key only
            assert [value for value in values if value["id"] == ALICE] == [
                {"op": "INSERT", "id": ALICE, "name": "Alice", "score": 1.5, "active": True},
                {"op": "UPDATE_AFTER", "id": ALICE, "name": "Alice Updated", "score": 1.5, "active": True},
                {"op": "DELETE", "id": ALICE},
            ]
        copy = workdir / "tables" / f"copy_{mapping}"
        assert table_rows(copy) == expected, mapping
        assert _columns(copy) == _columns(source), mapping


# --- TO_CHANGELOG(FROM_CHANGELOG(s)) ---------------------------------------------------------


def apply(record: dict, live: dict[int, dict]) -> None:
    """Replay one flat changelog record onto `live` (key -> row)."""
    if record["op"] == "DELETE":
        del live[record["id"]]
    else:
        live[record["id"]] = {k: v for k, v in record.items() if k != "op"}


def changelog_rounds(seed: int) -> list[list[dict]]:
    """s in rounds of PER_ROUND records, each round changing a key at most once; rounds 0-2
    start with the spec 4.5.2 example (id 1), then random keys: insert when absent, else an
    update (70 %) or a full delete."""
    rng = random.Random(seed)
    live: dict[int, dict] = {}
    rounds = []
    for number in range(ROUNDS):
        records = [SPEC_EXAMPLE[number]] if number < len(SPEC_EXAMPLE) else []
        busy = {1} if number < len(SPEC_EXAMPLE) else set()
        for key in rng.sample([k for k in range(1, KEYS + 1) if k not in busy], PER_ROUND - len(records)):
            if key not in live:
                records.append({"op": "INSERT", "id": key, "name": f"k{key}-r{number}"})
            elif rng.random() < 0.7:
                records.append({"op": "UPDATE_AFTER", "id": key, "name": f"k{key}-r{number}"})
            else:
                records.append({"op": "DELETE", **live[key]})
        for record in records:
            apply(record, live)
        rounds.append(records)
    return rounds


def fold(batch: list[dict], live: dict[int, dict]) -> list[dict]:
    """The net change per key of one ingest micro-batch (see the module docstring); updates `live`."""
    before = {record["id"]: live.get(record["id"]) for record in batch}
    for record in batch:
        apply(record, live)
    net = []
    for key, old in before.items():
        new = live.get(key)
        if old is None and new is not None:
            net.append({"op": "INSERT", **new})
        elif old is not None and new is not None:
            net.append({"op": "UPDATE_AFTER", **new})
        elif old is not None:
            net.append({"op": "DELETE", **old})
    return net


def _produce(bootstrap: str, topic: str, records: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for record in records:
        producer.produce(topic, key=json.dumps({"id": record["id"]}).encode(), value=json.dumps(record).encode())
    assert producer.flush(30) == 0


def versions_of(bootstrap: str, topic: str) -> list[list[dict]]:
    """The topic's records grouped by the Delta version they come from, versions in order."""
    grouped: dict[int, list[dict]] = defaultdict(list)
    order = []
    for _, value, headers in consume(bootstrap, topic):
        version = int(dict(headers)[Header.COMMIT_VERSION])
        assert not order or version >= order[-1], "records out of version order"
        order.append(version)
        grouped[version].append(json.loads(value))
    return [grouped[version] for version in sorted(grouped)]


def _by_key(records: list[dict]) -> dict[int, list[dict]]:
    keyed: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        keyed[record["id"]].append(record)
    return dict(keyed)


def _sorted(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (r["id"], r["op"]))


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_to_changelog_of_from_changelog_reproduces_the_stream(spark, kafka_bootstrap, unique, workdir, engine):
    rounds = changelog_rounds(seed=8)
    stream = [record for records in rounds for record in records]
    source, out = f"s.{unique}", {"a": f"s.out.a.{unique}", "b": f"s.out.b.{unique}"}
    create_topics(kafka_bootstrap, [source, *out.values()], 1)
    _produce(kafka_bootstrap, source, stream)
    ingest = {"topics": [source], "primary_key": "id", "format": "json", "from_changelog": {"preset": "flat"}}
    pipelines = [
        {**ingest, "name": f"s-a-{unique}", "table": "s_a", "max_offsets_per_trigger": PER_ROUND},
        {**ingest, "name": f"s-b-{unique}", "table": "s_b", "max_offsets_per_trigger": 2 * PER_ROUND},
    ]
    run_until_idle(_settings(kafka_bootstrap, workdir, pipelines=pipelines, engine=engine))
    export = {"primary_key": "id", "preset": "flat", "compaction": "none", "produces_full_deletes": True}
    exports = [{**export, "name": f"s-out-{part}-{unique}", "table": f"s_{part}", "topic": topic}
               for part, topic in out.items()]
    run_until_idle(_settings(kafka_bootstrap, workdir, exports=exports, engine=engine))

    one_round_each = versions_of(kafka_bootstrap, out["a"])
    assert [_sorted(records) for records in one_round_each] == [_sorted(records) for records in rounds]
    output = [record for records in one_round_each for record in records]
    assert _by_key(output) == _by_key(stream)
    assert _by_key(output)[1][:3] == SPEC_EXAMPLE

    live: dict[int, dict] = {}
    folded = [fold(rounds[i] + rounds[i + 1], live) for i in range(0, ROUNDS, 2)]
    assert [_sorted(records) for records in versions_of(kafka_bootstrap, out["b"])] == [
        _sorted(records) for records in folded if records
    ]
    assert sum(map(len, folded)) < len(stream), "two rounds per batch must fold some changes"


# --- avro-confluent export ---------------------------------------------------------------------

TYPED = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(12, 2)),
                   ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32()), ("score", pa.float64()),
                   ("ok", pa.bool_())])
EPOCH_DAY = date(1970, 1, 1)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _typed_rows(ids: range, version: int) -> pa.Table:
    return pa.Table.from_pylist([{
        "id": i, "name": None if i % 9 == 0 else f"n{version}-{i}",
        "amount": Decimal(f"{i * 37 + version}.{i % 100:02d}"),
        "at": datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i * 61, microseconds=version),
        "day": date(2026, 1, 1) + timedelta(days=i + version), "score": i / 4 - version, "ok": i % 2 == 0,
    } for i in ids], schema=TYPED)


def build_typed(uri: str) -> None:
    """Inserts, an UPDATE, a DELETE and a MERGE with decimal, timestamp and date columns."""
    DeltaTable.create(uri, TYPED, configuration=CDF_ON)
    write_deltalake(uri, _typed_rows(range(60), 1), mode="append")
    DeltaTable(uri).update(updates={"name": "'renamed'", "amount": "amount + 1"}, predicate="id % 4 = 1")
    DeltaTable(uri).delete("id % 6 = 0")
    changed = _typed_rows(range(40, 90), 4)
    (DeltaTable(uri).merge(changed, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def _text_form(image: dict | None, scale: int) -> dict | None:
    """An Avro-decoded row image with its logical types in the JSON export's text form."""
    if image is None:
        return None
    shown = dict(image)
    if shown.get("amount") is not None:
        unscaled = int.from_bytes(base64.b64decode(shown["amount"]), "big", signed=True)
        shown["amount"] = format(Decimal(unscaled).scaleb(-scale), "f")
    if shown.get("at") is not None:
        shown["at"] = (EPOCH + timedelta(microseconds=shown["at"])).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if shown.get("day") is not None:
        shown["day"] = (EPOCH_DAY + timedelta(days=shown["day"])).isoformat()
    return shown


def _comparable(envelope: dict | None, decoded_avro: bool) -> dict | None:
    """The envelope without the fields that differ by design (export name, processing time)."""
    if envelope is None:
        return None
    shown = {k: v for k, v in envelope.items() if k != Envelope.TS_MS}
    shown[Envelope.SOURCE] = {k: v for k, v in shown[Envelope.SOURCE].items() if k != "name"}
    if decoded_avro:
        shown[Envelope.BEFORE] = _text_form(shown[Envelope.BEFORE], 2)
        shown[Envelope.AFTER] = _text_form(shown[Envelope.AFTER], 2)
        stamp = shown["_commit_timestamp"]
        shown["_commit_timestamp"] = (EPOCH + timedelta(microseconds=stamp)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return shown


def _exported(bootstrap: str, topics: dict[str, str], decoder: ConfluentAvroDecoder) -> dict[str, list]:
    json_records = [(json.loads(key), _comparable(value and json.loads(value), False))
                    for key, value, _ in consume(bootstrap, topics["json"])]
    avro_records = [(decoder.decode(key)[0], _comparable(decoder.decode(value)[0], True))
                    for key, value, _ in consume(bootstrap, topics["avro"])]
    return {"json": json_records, "avro": avro_records}


def test_avro_export_decodes_to_the_debezium_json_documents(spark, kafka_bootstrap, apicurio_registry_url, unique,
                                                           workdir):
    uri = workdir / "tables" / "typed"
    build_typed(str(uri))
    topics = {"json": f"typed.json.{unique}", "avro": f"typed.avro.{unique}"}
    create_topics(kafka_bootstrap, list(topics.values()), 1)
    common = {"table": "typed", "primary_key": "id", "preset": "debezium", "max_versions_per_trigger": 2,
              "passthrough": ["_commit_version", "_commit_timestamp"]}
    exports = [
        {**common, "name": f"typed-json-{unique}", "topic": topics["json"]},
        {**common, "name": f"typed-avro-{unique}", "topic": topics["avro"], "format": "avro-confluent",
         "schema_registry_url": apicurio_registry_url},
    ]
    settings = _settings(kafka_bootstrap, workdir, exports=exports)
    run_until_idle(settings)
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    first = _exported(kafka_bootstrap, topics, decoder)
    assert first["avro"] == first["json"]
    assert {value[Envelope.OP] for _, value in first["json"] if value} == {"c", "u", "d"}
    assert any(value is None for _, value in first["json"]), "tombstones after deletes"

    # A column added to the table: the next run derives the new value schema and registers it.
    evolved = _typed_rows(range(200, 205), 5).append_column("note", pa.array(["x"] * 5, pa.string()))
    write_deltalake(str(uri), evolved, mode="append", schema_mode="merge")
    run_until_idle(settings)
    second = _exported(kafka_bootstrap, topics, decoder)
    assert second["avro"] == second["json"]
    new = second["json"][len(first["json"]):]
    assert [value[Envelope.AFTER]["note"] for _, value in new] == ["x"] * 5
    registry = SchemaRegistryClient(apicurio_registry_url)
    assert registry.latest(f"{topics['avro']}-value").version == 2


def test_avro_value_schema_follows_a_column_added_while_running(apicurio_registry_url, unique, workdir):
    uri = str(workdir / "evolving")
    write_deltalake(uri, pa.table({"id": [1], "name": ["a"]}), configuration=CDF_ON)
    export = ExportSettings(name="e", table="evolving", topic=f"evolving.{unique}", primary_key=("id",),
                            preset="debezium", format="avro-confluent", schema_registry_url=apicurio_registry_url)
    _, values = avro_serializers(export, uri, {})
    envelope = {Envelope.BEFORE: None, Envelope.SOURCE: {"connector": "c", "name": "e", "table": "evolving",
                                                         "version": 1, "ts_ms": 0}, Envelope.OP: "c"}
    old = values.encode({**envelope, Envelope.AFTER: {"id": 1, "name": "a"}})
    write_deltalake(uri, pa.table({"id": [2], "name": ["b"], "rank": [7]}), mode="append", schema_mode="merge")
    new = values.encode({**envelope, Envelope.AFTER: {"id": 2, "name": "b", "rank": 7}})
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    assert decoder.decode(old)[0][Envelope.AFTER] == {"id": 1, "name": "a"}
    assert decoder.decode(new)[0][Envelope.AFTER] == {"id": 2, "name": "b", "rank": 7}
    assert SchemaRegistryClient(apicurio_registry_url).latest(f"evolving.{unique}-value").version == 2


LAYOUT_COLUMNS = ("id", "name", "score")
LAYOUTS = {
    "flat": {"preset": "flat"},
    "one-payload-field": {"before": "payload", "after": "payload", "passthrough": ["_commit_version"],
                          "op_mapping": {"INSERT": "c", "UPDATE_AFTER": "u", "DELETE": "d"}},
    "updates-combined": {"op_mapping": {"INSERT": "I", "UPDATE_BEFORE, UPDATE_AFTER": "U", "DELETE": "D"},
                         "produces_full_deletes": True},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_avro_layouts_decode_to_the_json_documents(apicurio_registry_url, unique, workdir, layout):
    uri = str(workdir / "layout")
    rows = {"id": [1, 2, 3], "name": ["a", "b", None], "score": [0.5, 1.5, 2.5]}
    write_deltalake(uri, pa.table({column: rows[column] for column in LAYOUT_COLUMNS}), configuration=CDF_ON)
    DeltaTable(uri).update(updates={"name": "'z'"}, predicate="id = 1")
    DeltaTable(uri).delete("id = 2")
    feed = pa.table(DeltaTable(uri).load_cdf(starting_version=0))
    common = {"name": "e", "table": "layout", "topic": f"layout.{layout}.{unique}", "primary_key": ["id"],
              "compaction": "none", **LAYOUTS[layout]}
    as_json = ExportEncoder(ExportSettings(**common, format="flat-json"))(feed)
    avro = ExportSettings(**common, format="avro-confluent", schema_registry_url=apicurio_registry_url)
    as_avro = ExportEncoder(avro, *avro_serializers(avro, uri, {}))(feed)
    decoder = ConfluentAvroDecoder(SchemaRegistryClient(apicurio_registry_url))
    assert len(as_json) == 5  # three inserts, an update, a delete
    images = avro.image_fields or ()
    assert [(decoder.decode(key)[0], decoder.decode(value)[0]) for key, value, _ in as_avro] == [
        (json.loads(key), _with_nulls(json.loads(value), images, LAYOUT_COLUMNS)) for key, value, _ in as_json
    ]


def _with_nulls(document: dict, images: tuple[str, ...], columns: tuple[str, ...]) -> dict:
    """A JSON document with the columns a partial delete leaves out set to null, as Avro decodes
    them (an Avro record has no absent fields; every column is nullable with default null)."""
    if not images:
        return {**dict.fromkeys(columns), **document}
    return {k: ({**dict.fromkeys(columns), **v} if k in images and v is not None else v) for k, v in document.items()}
