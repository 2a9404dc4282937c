"""The bad-record policies through the real pipeline: Kafka (2 partitions) -> `cdc-lakehouse run` -> Delta.

Every partition holds 5 good changes, 1 bad record, 5 good changes: partition 0's bad record is
not JSON (`decode_error_handling`), partition 1's has an unknown op code (`invalid_op_handling`).
Both carry a marker standing for personal data that must never reach an error or a log line.

- FAIL stops at the earliest bad record naming topic, partition and offset; nothing of its batch
  is committed, and a second run stops at the same record.
- LOG and SKIP keep every good change; LOG warns with the coordinates (never the payload), SKIP
  says nothing.
- DEAD_LETTER keeps every good change and stores the bad records byte for byte, with their
  headers and the error metadata, in the dead-letter topic (read read_committed) and table.

The same CLI run carries a pipeline with `columns:` (issue 26: exclude, computed columns, a filter
that updates move rows out of and into, a salted SHA-256 mask) and a DEAD_LETTER policy, over a topic
whose bad records carry masked values. Its table holds the model's rows; the masked value appears
nowhere the service writes: not in the table, any file under it (`_change_data` included), the change
feed (every row the table ever held) read with deltalake and Spark's Delta reader, the dead letters
(keys, values, headers, table columns) or the CLI's output: a dead letter's value that decodes holds
the masked form where the source held the value, one that does not is dropped, its coordinates and
reason kept (docs/design/columns.md, "Masking").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.sink.dead_letter_masks import DROPPED_NOTE, MASKED_NOTE
from service.kafka_to_delta.sink.dead_letters import DlqHeader
from service.operations.workload import create_topics
from service.supervisor.runner import Runner
from tests.support.pipeline_harness import (
    read_committed,
    run_cli,
    table_rows,
    table_version,
    write_config,
)
from vocabulary.errors import DecodeError
from vocabulary.redaction import fingerprint

pytestmark = pytest.mark.slow
PII = "pii-secret-4711"
PARTITIONS = 2
GOOD_BEFORE = GOOD_AFTER = 5
BAD_OFFSET = GOOD_BEFORE
BAD_HEADERS = [("trace-id", b"t-\xff\x00"), ("source", b"crm")]
# partition -> (Kafka key, value, the reason the error names, the stage that rejects it)
BAD = {
    0: (b'{"id":900}', b'{"id": 900, "email": "' + PII.encode() + b'" not json', "is not valid JSON", "decode"),
    1: (b'{"id":901}', json.dumps({"before": None, "after": {"id": 901, "name": PII}, "op": "z"}).encode(),
        "unknown op code 'z'", "from_changelog"),
}
POLICIES = ("LOG", "SKIP", "DEAD_LETTER")

SALT_ENV, SALT = "CDC_TEST_POLICIES_SALT", "salt-policies-5"
MASKED = "masked-mail-4712"  # every email's local part: masked in the table, raw in the source
EXCLUDED = "excluded-note-4713"  # every note: an excluded column
COLUMNS = {"exclude": ["notes"], "computed": {"domain": "split(email, '@')[1]", "tag": "upper(name)"},
           "filter": "country = 'DE'", "mask": {"email": "sha256"}, "salt_env": SALT_ENV}
COLUMNS_BATCH = 6  # offsets per micro-batch: two batches, so updates move stored rows across the filter


def _person(key: int, country: str, name: str) -> dict:
    return {"id": key, "email": f"{MASKED}-{key}@example.org", "country": country, "name": name,
            "notes": f"{EXCLUDED}-{key}"}


# (op, row) or ("bad", (Kafka key, value)); one partition, COLUMNS_BATCH offsets per batch.
COLUMN_RECORDS = [
    ("c", _person(1, "DE", "ann")), ("c", _person(2, "DE", "bo")), ("c", _person(3, "FR", "cy")),
    ("c", _person(4, "DE", "di")),
    ("bad", (b'{"id":5}', b'{"id": 5, "email": "' + f"{MASKED}-5@example.org".encode() + b'" not json')),
    ("c", _person(5, "DE", "ee")),
    ("u", _person(1, "FR", "ann")),  # leaves the filter: deleted from the table
    ("u", _person(3, "DE", "cy")),  # enters it: written
    ("d", _person(2, "DE", "bo")),
    ("bad", (b'{"id":6}', json.dumps({"before": None, "after": _person(6, "DE", "fy"), "op": "z"}).encode())),
    ("u", _person(4, "DE", "di2")), ("c", _person(7, "FR", "gu")),
]


def _produce_columns(bootstrap: str, topic: str) -> tuple[list[tuple[bytes, bytes]], list[dict]]:
    """COLUMN_RECORDS into `topic`: the bad records (key, value) and the table the columns rules make."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    source: dict[int, dict] = {}
    bad = []
    for op, item in COLUMN_RECORDS:
        if op == "bad":
            key, value = item
            bad.append(item)
        else:
            key, before = json.dumps({"id": item["id"]}).encode(), source.get(item["id"])
            value = json.dumps({"before": before, "after": None if op == "d" else item, "op": op}).encode()
            if op == "d":
                del source[item["id"]]
            else:
                source[item["id"]] = item
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    table = [{"id": row["id"], "email": hashlib.sha256((SALT + row["email"]).encode()).hexdigest(), "country": row["country"], "name": row["name"],
              "domain": row["email"].split("@")[1], "tag": row["name"].upper()}
             for key, row in sorted(source.items()) if row["country"] == "DE"]
    return bad, table


def _envelope(op: str, row: dict | None, before: dict | None = None) -> bytes:
    return json.dumps({"before": before, "after": row, "op": op}).encode()


def _good(partition: int, count: int, start: int, table: dict[int, dict]) -> list[tuple[bytes, bytes]]:
    """`count` good changes of partition `partition` (new keys, and updates of earlier ones), applied to `table`."""
    records = []
    for n in range(start, start + count):
        key = partition * 100 + n
        op, before = "c", None
        if n >= GOOD_BEFORE and n % 2:  # some changes after the bad record update a key from before it
            key, op = partition * 100 + n - GOOD_BEFORE, "u"
            before = table[key]
        row = {"id": key, "name": f"{op}-{partition}-{n}", "score": n * 10 + partition}
        table[key] = row
        records.append((json.dumps({"id": key}).encode(), _envelope(op, row, before)))
    return records


def _produce(bootstrap: str, topic: str) -> list[dict]:
    """5 good, 1 bad, 5 good in each partition; the table a correct pipeline ends with."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    table: dict[int, dict] = {}
    for partition in range(PARTITIONS):
        key, value, _, _ = BAD[partition]
        before = _good(partition, GOOD_BEFORE, 0, table)
        after = _good(partition, GOOD_AFTER, GOOD_BEFORE, table)
        for record_key, record_value in before:
            producer.produce(topic, key=record_key, value=record_value, partition=partition)
        producer.produce(topic, key=key, value=value, partition=partition, headers=BAD_HEADERS)
        for record_key, record_value in after:
            producer.produce(topic, key=record_key, value=record_value, partition=partition)
    assert producer.flush(30) == 0
    return [table[k] for k in sorted(table)]


def _produce_one(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=key, value=value, partition=1)
    assert producer.flush(30) == 0


def _pipeline(name: str, topic: str, policy: str, **extra) -> dict:
    return {"name": name, "topics": [topic], "table": name, "primary_key": ["id"],
            "from_changelog": {"preset": "debezium", "decode_error_handling": policy, "invalid_op_handling": policy},
            **extra}


def _run_in_process(bootstrap: str, workdir: Path, pipeline: dict) -> None:
    settings = settings_from_mapping({
        "kafka": {"bootstrap_servers": bootstrap}, "lakehouse": {"root": str(workdir / "tables")},
        "checkpoint_root": str(workdir / "checkpoints"), "pipelines": [pipeline],
    })
    runner = Runner(settings)
    runner.start(until_idle=True)
    runner.wait()


def test_fail_stops_at_the_first_bad_record_and_commits_nothing_of_its_batch(spark, kafka_bootstrap, unique, workdir):
    topic = f"policy-fail-{unique}"
    create_topics(kafka_bootstrap, [topic], PARTITIONS)
    earlier = {"id": 999, "name": "committed before", "score": 0}
    _produce_one(kafka_bootstrap, topic, b'{"id":999}', _envelope("c", earlier))
    pipeline = _pipeline("p_fail", topic, "FAIL")
    _run_in_process(kafka_bootstrap, workdir, pipeline)
    uri = workdir / "tables" / "p_fail"
    version = table_version(uri)
    assert table_rows(uri) == [earlier]

    _produce(kafka_bootstrap, topic)
    for _attempt in range(2):  # nothing of the batch was committed, so a restart meets the same record
        with pytest.raises(DecodeError) as raised:
            _run_in_process(kafka_bootstrap, workdir, pipeline)
        message = str(raised.value)
        key = f"<redacted #{fingerprint(BAD[0][0])}>"  # the key value is personal data (log_values: false)
        assert f"topic={topic} partition=0 offset={BAD_OFFSET} key={key}" in message, message
        assert BAD[0][2] in message and "1 more bad record(s) in this batch" in message, message
        assert PII not in message
        assert table_rows(uri) == [earlier] and table_version(uri) == version


def _dead_letter_config(unique: str) -> dict:
    return {"topic": f"dlq-{unique}", "table": "p_dead_letter_dlq", "positions_topic": f"dlq-positions-{unique}"}


def _assert_dead_letters(bootstrap: str, workdir: Path, topic: str, dlq: dict) -> None:
    messages = {int(dict(m.headers())[DlqHeader.PARTITION]): m for m in read_committed(bootstrap, dlq["topic"])}
    stored = {row["partition"]: row for row in DeltaTable(str(workdir / "tables" / dlq["table"])).to_pyarrow_table()
              .to_pylist()}
    assert sorted(messages) == sorted(stored) == list(BAD)
    for partition, (key, value, reason, stage) in BAD.items():
        message, row = messages[partition], stored[partition]
        assert (message.key(), message.value()) == (row["key"], row["value"]) == (key, value)
        headers = message.headers()
        assert headers[:len(BAD_HEADERS)] == BAD_HEADERS
        assert [(h["key"], h["value"]) for h in row["headers"]] == BAD_HEADERS
        metadata = dict(headers[len(BAD_HEADERS):])
        assert metadata[DlqHeader.TOPIC] == topic.encode() and metadata[DlqHeader.OFFSET] == str(BAD_OFFSET).encode()
        assert metadata[DlqHeader.STAGE] == stage.encode() and metadata[DlqHeader.PIPELINE] == b"p_dead_letter"
        assert reason in metadata[DlqHeader.ERROR].decode() and PII not in metadata[DlqHeader.ERROR].decode()
        assert (row["topic"], row["offset"], row["stage"], row["pipeline"]) == (topic, BAD_OFFSET, stage,
                                                                                "p_dead_letter")
        assert row["error"] == metadata[DlqHeader.ERROR].decode()
        assert str(row["batch_id"]).encode() == metadata[DlqHeader.BATCH]


def test_log_skip_and_dead_letter_keep_every_good_change(spark, kafka_bootstrap, unique, workdir, monkeypatch):
    monkeypatch.setenv(SALT_ENV, SALT)
    topics = {policy: f"policy-{policy.lower()}-{unique}" for policy in POLICIES}
    dlq = _dead_letter_config(unique)
    columns_topic = f"policy-columns-{unique}"
    columns_dlq = {"topic": f"dlq-columns-{unique}", "table": "p_columns_dlq"}
    create_topics(kafka_bootstrap, topics.values(), PARTITIONS)
    create_topics(kafka_bootstrap, [dlq["topic"], columns_topic, columns_dlq["topic"]], 1)
    expected = {policy: _produce(kafka_bootstrap, topic) for policy, topic in topics.items()}
    columns_bad, columns_table = _produce_columns(kafka_bootstrap, columns_topic)
    pipelines = [_pipeline(f"p_{policy.lower()}", topics[policy], policy) for policy in POLICIES]
    pipelines[-1]["dead_letters"] = dlq
    pipelines.append(_pipeline("p_columns", columns_topic, "DEAD_LETTER", columns=COLUMNS, dead_letters=columns_dlq,
                               max_offsets_per_trigger=COLUMNS_BATCH))
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines)
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]

    for policy in POLICIES:
        assert table_rows(workdir / "tables" / f"p_{policy.lower()}") == expected[policy], policy
    warnings = [line for line in result.stderr.splitlines() if "dropped a bad record" in line]
    assert len(warnings) == PARTITIONS and all("pipeline p_log:" in line for line in warnings), warnings
    for partition, (key, _, reason, stage) in BAD.items():
        shown_key = f"<redacted #{fingerprint(key)}>"  # the key value is personal data (log_values: false)
        where = f"topic={topics['LOG']} partition={partition} offset={BAD_OFFSET} key={shown_key}"
        assert any(where in line and reason in line and f"[stage {stage}]" in line for line in warnings), where
    assert PII not in result.stderr and PII not in result.stdout, "a payload reached the output"
    assert all(key.decode() not in result.stderr for key, _, _, _ in BAD.values()), "a key value reached the log"
    _assert_dead_letters(kafka_bootstrap, workdir, topics["DEAD_LETTER"], dlq)
    _assert_masked(spark, kafka_bootstrap, workdir, columns_dlq, columns_bad, columns_table)
    for marker in (MASKED, EXCLUDED, SALT):
        assert marker not in result.stderr and marker not in result.stdout, f"{marker} reached the output"


def _assert_masked(spark, bootstrap: str, workdir: Path, dlq: dict, bad: list[tuple[bytes, bytes]],
                   expected: list[dict]) -> None:
    """The columns pipeline's table, change feed and dead letters (see the module's text)."""
    uri = str(workdir / "tables" / "p_columns")
    table = DeltaTable(uri).to_pyarrow_table()
    assert table.column_names == ["id", "email", "country", "name", "domain", "tag"]
    assert sorted(table.to_pylist(), key=lambda row: row["id"]) == expected
    files = [path for path in Path(uri).rglob("*") if path.is_file()]
    assert any("_change_data" in path.parts for path in files), "an update left the filter: a change data file"
    stored = b"".join(path.read_bytes() for path in files)
    assert MASKED.encode() not in stored and EXCLUDED.encode() not in stored
    assert expected[0]["email"].encode() in stored  # the scan sees the values the files do hold
    feeds = [pa.table(DeltaTable(uri).load_cdf(starting_version=0)),
             spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(uri)
             .toArrow()]
    assert feeds[0].num_rows == feeds[1].num_rows > len(expected)
    for feed in feeds:  # every row the table ever held, each change's images (Spark reads what delta-rs wrote)
        assert "delete" in feed.column("_change_type").to_pylist(), "a row left the filter"
        assert "notes" not in feed.column_names
        assert all(len(email) == 64 for email in feed.column("email").to_pylist()), "every email is a hash"
        assert MASKED not in str(feed.to_pylist())
    messages = read_committed(bootstrap, dlq["topic"])
    rows = DeltaTable(str(workdir / "tables" / dlq["table"])).to_pyarrow_table().to_pylist()
    stored = sorted((m.key(), m.value()) for m in messages)
    assert stored == sorted((r["key"], r["value"]) for r in rows)
    (not_json_key, not_json), (op_key, op_value) = sorted(bad)  # keys {"id":5} and {"id":6}
    expected_value = json.loads(op_value)
    after = expected_value["after"]
    after["email"] = hashlib.sha256((SALT + after["email"]).encode()).hexdigest()  # the table's masked form
    assert stored[0] == (not_json_key, None), "an undecodable value is dropped"
    assert stored[1][0] == op_key and json.loads(stored[1][1]) == expected_value
    for message in messages:  # nothing of the masked value anywhere, the coordinates kept
        assert all(MASKED.encode() not in value for _, value in message.headers()), message.headers()
        assert MASKED.encode() not in (message.value() or b"") and MASKED.encode() not in message.key()
        headers = dict(message.headers())
        assert headers[DlqHeader.TOPIC] and headers[DlqHeader.OFFSET]
    errors = {r["key"]: r["error"] for r in rows}
    assert DROPPED_NOTE.format(parts="value") in errors[not_json_key] and MASKED_NOTE in errors[op_key]
    for row in rows:
        assert MASKED not in str(row), row
        assert row["topic"] and row["offset"] is not None
