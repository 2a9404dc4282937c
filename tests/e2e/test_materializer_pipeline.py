"""The keyed-state materializer through the real pipeline: records produced to the broker ->
`cdc-lakehouse run` -> Delta tables read back with deltalake.

Scenarios share CLI runs (one pipeline each, with its own topics and table): phase 1 produces
and runs, phase 2 produces what moves watermarks, retracts or re-claims, and runs again; the
`error` fan-in gets a run of its own (it stops the service); sequence_by with a tombstone
retention runs as a service that keeps going while the test produces.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from service.operations.workload import create_topics
from tests.support.pipeline_harness import run_cli, table_rows, write_config
from vocabulary.redaction import fingerprint

pytestmark = pytest.mark.slow

# Epoch ms of the first source transaction: recent, as the broker's retention goes by record timestamps.
T0 = (int(time.time()) // 60 - 10) * 60_000
A1 = {"id": 1, "level": 10, "attr": "a1"}
B1 = {"id": 1, "level": 20, "attr": "b1"}
JOIN_ORDERINGS = {
    "in_order": [("INSERT", A1), ("UPDATE_BEFORE", A1), ("UPDATE_AFTER", B1)],
    "add_first": [("UPDATE_AFTER", B1), ("INSERT", A1), ("UPDATE_BEFORE", A1)],
    "retract_last": [("INSERT", A1), ("UPDATE_AFTER", B1), ("UPDATE_BEFORE", A1)],
}
MOVER = {"id": 2, "level": 1, "attr": "moves the watermark"}
FLAT = {"preset": "flat"}
Record = tuple[str, int, dict | None, dict | None, int]  # topic, partition, key, value, timestamp


def produce(bootstrap: str, records: list[Record]) -> None:
    """Produce in list order with explicit record timestamps; wait for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for topic, partition, key, value, timestamp in records:
        producer.produce(topic, key=None if key is None else json.dumps(key).encode(),
                         value=None if value is None else json.dumps(value).encode(),
                         partition=partition, timestamp=timestamp)
    assert producer.flush(60) == 0


def flat(topic: str, op: str, row: dict, timestamp: int, partition: int = 0) -> Record:
    """A flat op-coded record (preset 'flat': the row columns at top level)."""
    return (topic, partition, {"id": row["id"]}, {"op": op, **row}, timestamp)


def batches_of(log: str, pipeline: str) -> int:
    """How many micro-batches of `pipeline` reached the sink in a CLI log."""
    return len(re.findall(rf"pipeline {re.escape(pipeline)}: batch \d+ -> ", log))


def table(workdir: Path, name: str, order_by: str = "id") -> list[dict]:
    """A pipeline's Delta table read back with deltalake."""
    return table_rows(workdir / "tables" / name, order_by)


# ---- scenario definitions: (pipelines, phase-1 records, phase-2 records, checks) ----


def join_pipelines(u: str) -> list[dict]:
    """The join example, upsert key empty (the whole row). Each ordering is a case of its own: the table
    is keyed by (case, id), so every case holds its own id=1. In one micro-batch (barrier compaction)
    under `deduplicate` (a flat source is a retract source: `error`/`nothing` are refused with barrier
    compaction), and one event per micro-batch under watermark compaction with `error`."""
    common = {"from_changelog": FLAT, "primary_key": ["case", "id"], "upsert_key": []}
    return [
        {"name": "join_batch", "topics": [f"join.batch.{u}"], "table": "join_batch", "compaction": "batch",
         "on_conflict": "deduplicate", **common},
        {"name": "join_wm", "topics": [f"join.wm.{u}"], "table": "join_wm", "compaction": "watermark",
         "watermark_delay_seconds": 1, "max_offsets_per_trigger": 1, "on_conflict": "error", **common},
    ]


def join_records(u: str, phase: int) -> list[Record]:
    """Phase 1: the three events of each ordering, one source transaction (time T0), the orderings
    one after the other. Phase 2: the mover, a later event of another key."""
    if phase == 2:
        return [flat(f"join.wm.{u}", "INSERT", {"case": "mover", **MOVER}, T0 + 60_000)]
    records = []
    for case, events in JOIN_ORDERINGS.items():
        for op, row in events:
            records += [flat(f"join.{kind}.{u}", op, {"case": case, **row}, T0) for kind in ("batch", "wm")]
    return records


def join_case(rows: list[dict], case: str) -> list[dict]:
    """The rows of one ordering, without the case column."""
    return [{k: v for k, v in row.items() if k != "case"} for row in rows if row["case"] == case]


def fan_in_pipeline(u: str, strategy: str) -> dict:
    return {"name": f"fan_{strategy}", "topics": [f"fan.{strategy}.a.{u}", f"fan.{strategy}.b.{u}"],
            "table": f"fan_{strategy}", "from_changelog": FLAT, "primary_key": ["id"], "on_conflict": strategy,
            "watermark_delay_seconds": 0}


def fan_in_records(u: str, strategy: str, phase: int) -> list[Record]:
    a, b = f"fan.{strategy}.a.{u}", f"fan.{strategy}.b.{u}"
    if strategy == "nothing":  # b claims id 7 a run later than a
        return [flat(a, "INSERT", {"id": 7, "src": "a"}, T0)] if phase == 1 else [
            flat(b, "INSERT", {"id": 7, "src": "b"}, T0 + 1_000)]
    if phase == 1:  # both claim id 7 in one micro-batch, b later
        return [flat(a, "INSERT", {"id": 7, "src": "a"}, T0), flat(b, "INSERT", {"id": 7, "src": "b"}, T0 + 1_000)]
    return [flat(b, "DELETE", {"id": 7, "src": "b"}, T0 + 2_000)]


def swap_pipeline(u: str) -> dict:
    """Table keyed by email, fed by a Debezium topic keyed by id (2 partitions), error + watermark."""
    return {"name": "swap", "topics": [f"swap.{u}"], "table": "swap", "primary_key": ["email"],
            "upsert_key": ["id"], "on_conflict": "error", "compaction": "watermark",
            "watermark_delay_seconds": 1, "max_offsets_per_trigger": 1}


def debezium(topic: str, op: str, before: dict | None, after: dict | None, timestamp: int) -> Record:
    row = after or before
    payload = {"op": op, "before": before, "after": after, "ts_ms": timestamp}
    return (topic, row["id"] % 2, {"id": row["id"]}, payload, timestamp)


def swap_records(u: str, phase: int) -> list[Record]:
    """Ids 1 and 2 (partitions 1 and 0) swap emails in one source transaction (time T0 + 5 s)."""
    topic, one_a, two_b = f"swap.{u}", {"id": 1, "email": "a@x"}, {"id": 2, "email": "b@x"}
    if phase == 2:
        return [debezium(topic, "c", None, {"id": 3, "email": "c@x"}, T0 + 60_000)]
    one_b, two_a = {**one_a, "email": "b@x"}, {**two_b, "email": "a@x"}
    return [debezium(topic, "c", None, one_a, T0), debezium(topic, "c", None, two_b, T0),
            debezium(topic, "u", one_a, one_b, T0 + 5_000), debezium(topic, "u", two_b, two_a, T0 + 5_000)]


def pieces_pipeline(u: str) -> dict:
    """A Debezium topic of one partition whose one micro-batch is read in pieces (one per core)."""
    return {"name": "pieces", "topics": [f"pieces.{u}"], "table": "pieces", "primary_key": ["id"],
            "upsert_materialize": "force"}


PIECE_IDS, PIECE_UPDATES = 100, 24


def pieces_records(u: str, phase: int) -> list[Record]:
    """Phase 1: each id created, then updated PIECE_UPDATES times, interleaved (2,500 records in one
    partition: the pieces of the range hold early and late changes of every id)."""
    if phase == 2:
        return []
    topic, records = f"pieces.{u}", []
    rows = {i: {"id": i, "v": 0} for i in range(PIECE_IDS)}
    for i, row in rows.items():
        records.append((topic, 0, {"id": i}, {"op": "c", "before": None, "after": row}, T0 + len(records)))
    for step in range(1, PIECE_UPDATES + 1):
        for i in range(PIECE_IDS):
            before, rows[i] = rows[i], {"id": i, "v": step}
            records.append((topic, 0, {"id": i}, {"op": "u", "before": before, "after": rows[i]}, T0 + len(records)))
    return records


# ---- the property: a random workload in a random legal order equals the in-order result ----


class Workload:
    """Rows {id, pk, v}: the upsert key is id, the table key pk. Source transactions at 1 s steps
    each end with at most one live row per pk (inside one, a pk may be claimed twice: swaps)."""

    def __init__(self, seed: int, transactions: int = 150, ids: int = 12, pks: int = 8) -> None:
        self.rng = random.Random(seed)
        self.live: dict[int, dict] = {}
        self.events: list[tuple[str, dict, int]] = []  # op, row, source time
        for tx in range(transactions):
            self._transaction(T0 + tx * 1_000, ids, pks)

    def _free_pk(self, pks: int) -> int | None:
        taken = {row["pk"] for row in self.live.values()}
        free = [p for p in range(pks) if p not in taken]
        return self.rng.choice(free) if free else None

    def _transaction(self, at: int, ids: int, pks: int) -> None:
        for _ in range(self.rng.randint(1, 3)):
            id_ = self.rng.randrange(ids)
            old, roll = self.live.get(id_), self.rng.random()
            if old is None:
                pk = self._free_pk(pks)
                if pk is not None:
                    self._emit(at, None, {"id": id_, "pk": pk, "v": self.rng.randrange(5)})
            elif roll < 0.2:
                self._emit(at, old, None)
            elif roll < 0.45 and len(self.live) > 1:
                other = self.live[self.rng.choice([i for i in self.live if i != id_])]
                self._emit(at, old, {**old, "pk": other["pk"]})
                self._emit(at, other, {**other, "pk": old["pk"]})
            else:
                pk = self._free_pk(pks) if roll < 0.7 else old["pk"]
                self._emit(at, old, {**old, "pk": old["pk"] if pk is None else pk, "v": self.rng.randrange(5)})

    def _emit(self, at: int, old: dict | None, new: dict | None) -> None:
        if old is not None:
            self.events.append(("DELETE" if new is None else "UPDATE_BEFORE", old, at))
        if new is not None:
            self.events.append(("INSERT" if old is None else "UPDATE_AFTER", new, at))
            self.live[new["id"]] = new
        else:
            del self.live[old["id"]]

    def expected(self) -> list[dict]:
        return sorted(self.live.values(), key=lambda row: row["pk"])

    def records(self, topic: str, whole_row: bool, partitions: int = 4) -> list[Record]:
        """Each upsert key (id, or the whole row) on one random partition, in source order there."""
        placement: dict[str, int] = {}
        out = []
        for op, row, at in self.events:
            key = json.dumps(row, sort_keys=True) if whole_row else str(row["id"])
            partition = placement.setdefault(key, self.rng.randrange(partitions))
            out.append((topic, partition, {"id": row["id"]}, {"op": op, **row}, at))
        return out


# Seeds of the property workload: 994 (a clean-clone failure under a global watermark: partitions
# of 226/30/107/138 records over the same event time) and the most skewed placements among seeds
# 0..999 (0: 154/7/217/82, 612: 6/185/121/137; 564: 27/366/63/0, an empty partition, passes too
# and is left out to keep the run short). Each run adds one random seed, shown when a check fails.
KEY_SEEDS = (994, 0, 612)
ROW_SEEDS = (994,)


# A micro-batch admits at most this many records, so a workload of n records takes at least n / 80
# of them: the smallest workload of seeds 0..999 (398 records, seed 431) still spans five, and the
# source's event-time aligned admission leaves partitions up to the watermark delay apart in each.
PROPERTY_BATCH_RECORDS = 80


def property_pipelines(u: str, seeds: dict[str, int]) -> list[dict]:
    """One pipeline per (key mode, seed) of `seeds` (name -> seed)."""
    common = {"from_changelog": FLAT, "primary_key": ["pk"], "max_offsets_per_trigger": PROPERTY_BATCH_RECORDS}
    watermark = {"compaction": "watermark", "watermark_delay_seconds": 45, "on_conflict": "error"}
    return [
        {"name": name, "topics": [f"{name}.{u}"], "table": name, "upsert_key": [] if "row" in name else ["id"],
         **common, **watermark}
        for name in seeds
    ]


def property_seeds(extra: int) -> dict[str, int]:
    """Pipeline name -> workload seed: the fixed seeds, plus `extra` in the key mode."""
    named = {f"prop_key_{seed}": seed for seed in (*KEY_SEEDS, extra)}
    named.update({f"prop_row_{seed}": seed for seed in ROW_SEEDS})
    return named


# ---- the tests ----


@pytest.fixture(scope="module")
def phases(kafka_bootstrap, tmp_path_factory):
    """Phase 1 and phase 2 of every shared scenario; returns (workdir, run logs, tables after phase 1)."""
    workdir, u = tmp_path_factory.mktemp("materializer"), f"{random.getrandbits(40):010x}"
    extra = int(u, 16) % 1000  # the random seed of this run, shown by the property test when it fails
    seeds = property_seeds(extra)
    workloads = {name: Workload(seed) for name, seed in seeds.items()}
    pipelines = [*join_pipelines(u), fan_in_pipeline(u, "nothing"), fan_in_pipeline(u, "deduplicate"),
                 swap_pipeline(u), pieces_pipeline(u), *property_pipelines(u, seeds)]
    create_topics(kafka_bootstrap, [t for p in pipelines if p["name"].startswith(("join", "fan", "pieces"))
                                    for t in p["topics"]], 1)
    create_topics(kafka_bootstrap, [f"swap.{u}"], 2)
    create_topics(kafka_bootstrap, [f"{name}.{u}" for name in seeds], 4)
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, pipelines)
    logs, after_first = [], {}
    for phase in (1, 2):
        records = [*join_records(u, phase), *fan_in_records(u, "nothing", phase),
                   *fan_in_records(u, "deduplicate", phase), *swap_records(u, phase), *pieces_records(u, phase)]
        if phase == 1:
            for name, workload in workloads.items():
                records += workload.records(f"{name}.{u}", whole_row="row" in name)
        else:  # one record far ahead in each property topic moves the watermark past every transaction
            mover = {"id": 99, "pk": 99, "v": 0}
            records += [(f"{name}.{u}", 0, {"id": 99}, {"op": "INSERT", **mover}, T0 + 10**6) for name in seeds]
        produce(kafka_bootstrap, records)
        started = time.monotonic()
        result = run_cli(config, "--until-idle", timeout=1500)
        assert result.returncode == 0, result.stderr[-4000:]
        logs.append((result.stderr, time.monotonic() - started))
        if phase == 1:
            after_first = {p["table"]: _rows_or_none(workdir, p["table"]) for p in pipelines}
    return {"workdir": workdir, "logs": logs, "after_first": after_first, "workloads": workloads, "seeds": seeds}


def _rows_or_none(workdir: Path, name: str) -> list[dict] | None:
    try:
        return table(workdir, name, "id" if not name.startswith("prop") else "pk")
    except Exception:  # noqa: BLE001 - no commit yet: the table does not exist
        return None


@pytest.mark.parametrize("ordering", sorted(JOIN_ORDERINGS))
def test_join_example_in_one_micro_batch_ends_in_b1(phases, ordering):
    first_log, _ = phases["logs"][0]
    assert batches_of(first_log, "join_batch") == 1
    assert join_case(table(phases["workdir"], "join_batch"), ordering) == [B1]


@pytest.mark.parametrize("ordering", sorted(JOIN_ORDERINGS))
def test_join_example_over_separate_micro_batches_ends_in_b1_once_the_watermark_passes(phases, ordering):
    first_log, _ = phases["logs"][0]
    assert batches_of(first_log, "join_wm") >= 9, "each event was to be a micro-batch of its own"
    assert not phases["after_first"]["join_wm"], "compacted before the watermark passed the events"
    assert join_case(table(phases["workdir"], "join_wm"), ordering) == [B1]


def test_fan_in_nothing_keeps_the_first_claim(phases):
    assert phases["after_first"]["fan_nothing"] == [{"id": 7, "src": "a"}]
    assert table(phases["workdir"], "fan_nothing") == [{"id": 7, "src": "a"}]


def test_fan_in_deduplicate_shows_the_latest_and_rolls_back_when_it_is_deleted(phases):
    assert phases["after_first"]["fan_deduplicate"] == [{"id": 7, "src": "b"}]
    assert table(phases["workdir"], "fan_deduplicate") == [{"id": 7, "src": "a"}]


def test_email_swap_across_partitions_and_micro_batches_no_false_conflict(phases):
    first_log, _ = phases["logs"][0]
    assert batches_of(first_log, "swap") >= 4, "each record was to be a micro-batch of its own"
    # Before the watermark passes the swap, the table shows the state before it.
    assert phases["after_first"]["swap"] == [{"id": 1, "email": "a@x"}, {"id": 2, "email": "b@x"}]
    rows = [r for r in table(phases["workdir"], "swap", "email") if r["id"] in (1, 2)]
    assert rows == [{"id": 2, "email": "a@x"}, {"id": 1, "email": "b@x"}]


def test_a_range_read_in_pieces_applies_every_change_in_order(phases):
    """One micro-batch of one partition, read by one task per core: a key's changes are in both pieces,
    and its last update wins (a retraction applied before its image would leave the wrong row or none)."""
    first_log, _ = phases["logs"][0]
    assert batches_of(first_log, "pieces") == 1
    assert phases["after_first"]["pieces"] == [{"id": i, "v": PIECE_UPDATES} for i in range(PIECE_IDS)]
    retracted_nothing = [line for line in first_log.splitlines() if "no live row to retract" in line and "pieces" in line]
    assert not retracted_nothing, retracted_nothing[:5]


@pytest.mark.parametrize("mode", ["key", "row"])
def test_random_workload_in_random_legal_order_equals_the_in_order_result(phases, mode):
    """Every seed of the key mode (fixed ones, then this run's random one): the final table equals the
    in-order result, whatever the skew between partitions."""
    first_log, _ = phases["logs"][0]
    for name, seed in phases["seeds"].items():
        if not name.startswith(f"prop_{mode}_"):
            continue
        assert batches_of(first_log, name) >= 5, f"Workload(seed={seed}) was to span several micro-batches"
        rows = [r for r in table(phases["workdir"], name, "pk") if r["id"] != 99]
        assert rows == phases["workloads"][name].expected(), f"Workload(seed={seed}) in pipeline {name}"


def test_fan_in_error_stops_naming_the_key_and_both_topics(kafka_bootstrap, unique, workdir):
    pipeline = fan_in_pipeline(unique, "error")
    create_topics(kafka_bootstrap, pipeline["topics"], 1)
    produce(kafka_bootstrap, fan_in_records(unique, "error", 1))
    # By default the key value is personal data: a stable fingerprint names it; log_values: true shows it.
    for log_values, named in ((False, f"= <redacted #{fingerprint('[7]')}>"), (True, "= [7]")):
        config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline], log_values=log_values)
        result = run_cli(config, "--until-idle")
        assert result.returncode != 0
        message = [line for line in result.stderr.splitlines() if line.startswith("error: ")][-1]
        assert "ConflictError" in message and named in message, message[-2000:]
        assert ("= [7]" in result.stderr) is log_values, result.stderr[-2000:]
        assert all(topic in message for topic in pipeline["topics"]), message[-2000:]


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_sequence_by_a_late_older_upsert_does_not_resurrect_inside_tombstone_retention(
    kafka_bootstrap, unique, workdir, engine
):
    """Retention counts in data time (the records' event time), so the outcome does not depend on how
    fast the service runs, and a replay decides the same. One record per micro-batch, written by
    either Delta engine."""
    retention_s = 30
    topic = f"seq.{unique}"
    create_topics(kafka_bootstrap, [topic], 1)
    pipeline = {"name": "seq", "topics": [topic], "table": "seq", "from_changelog": FLAT, "primary_key": ["id"],
                "sequence_by": ["version"], "upsert_materialize": "force", "max_offsets_per_trigger": 1,
                "compaction": "batch",  # each record a barrier of its own (a flat source defaults to watermark)
                "tombstone_retention_seconds": retention_s}
    config = write_config(workdir / "config.yaml", kafka_bootstrap, workdir, [pipeline], engine)
    uri = workdir / "tables" / "seq"
    produce(kafka_bootstrap, [
        flat(topic, "INSERT", {"id": 1, "version": 1, "v": "first"}, T0),
        flat(topic, "DELETE", {"id": 1, "version": 3, "v": "first"}, T0 + 1_000),
        # 1 s after the delete, inside the retention: older than the delete, dropped.
        flat(topic, "UPDATE_AFTER", {"id": 1, "version": 2, "v": "late"}, T0 + 2_000),
        flat(topic, "INSERT", {"id": 101, "version": 0, "v": "sentinel"}, T0 + 3_000),
        # Past the retention: the tombstone is gone, the late older upsert is applied (documented).
        flat(topic, "UPDATE_AFTER", {"id": 1, "version": 2, "v": "later"}, T0 + 1_000 + retention_s * 1000 + 1),
    ])
    result = run_cli(config, "--until-idle")
    assert result.returncode == 0, result.stderr[-3000:]
    assert batches_of(result.stderr, "seq") >= 5, "each record was to be a micro-batch of its own"
    history = [{r["id"]: r["v"] for r in DeltaTable(str(uri), version=v).to_pyarrow_table().to_pylist()}
               for v in range(DeltaTable(str(uri)).version() + 1)]
    first = next(i for i, rows in enumerate(history) if 1 in rows)
    assert any(1 not in rows for rows in history[first:]), "the delete was never applied"
    assert all(rows.get(1) != "late" for rows in history), "a late older upsert resurrected a deleted row"
    assert table_rows(uri) == [{"id": 1, "version": 2, "v": "later"}, {"id": 101, "version": 0, "v": "sentinel"}]
