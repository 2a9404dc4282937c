"""Row logic of the enrichment join (service/kafka_to_delta/joins/enrichment_rows.py) on decoded changelog rows."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa

from connectors.kafka.range_reader import RAW_SCHEMA
from service.config.joins import JoinInput
from service.kafka_to_delta.joins.enrichment_rows import build_changes, enrich, probe_keys
from service.kafka_to_delta.joins.join_inputs import decode_records, input_decoder

BUILD = JoinInput(topics=["customers"], format="json", primary_key=["id"], join_key=["id"])
PROBE = JoinInput(topics=["orders"], format="json", from_changelog={"preset": "upsert-kafka"},
                  primary_key=["order_id"], join_key=["customer_id"])


def _records(topic: str, pairs: list[tuple[dict | None, dict | None]]) -> pa.Table:
    now = datetime.now(timezone.utc)
    encode = lambda d: None if d is None else json.dumps(d).encode()  # noqa: E731
    return pa.table({
        "key": [encode(k) for k, _ in pairs], "value": [encode(v) for _, v in pairs], "topic": [topic] * len(pairs),
        "partition": [0] * len(pairs), "offset": list(range(len(pairs))), "timestamp": [now] * len(pairs),
        "headers": [[] for _ in pairs],
    }, schema=RAW_SCHEMA)


def _build(*changes: dict) -> pa.Table:
    return decode_records(_records("customers", [({"id": c.get("id")}, c) for c in changes]), input_decoder(BUILD))


def _probes(*orders: tuple[int, dict | None]) -> pa.Table:
    return decode_records(_records("orders", [({"order_id": k}, v) for k, v in orders]), input_decoder(PROBE))


def test_build_changes_keep_the_last_change_per_key():
    changes = build_changes(_build(
        {"op": "r", "after": {"id": 1, "name": "a"}, "source": {"snapshot": "first"}},
        {"op": "r", "after": {"id": 2, "name": "b"}, "source": {"snapshot": "last"}},
        {"op": "u", "before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "A"}},
        {"op": "d", "before": {"id": 2, "name": "b"}},
    ), BUILD.join_key)
    columns = (changes.column(c).to_pylist() for c in ("key", "row", "deleted"))
    got = {k: (json.loads(r), d) for k, r, d in zip(*columns)}
    assert got == {"[1]": ({"id": 1, "name": "A"}, False), "[2]": ({"id": 2, "name": "b"}, True)}


def test_probes_join_the_build_row_and_follow_the_missing_policy():
    probes = _probes((10, {"order_id": 10, "customer_id": 1, "name": "pen"}),
                     (11, {"order_id": 11, "customer_id": 9}),
                     (10, {"order_id": 10, "customer_id": 1, "name": "ink"}),
                     (12, None))
    assert probe_keys(probes, PROBE.join_key) == ["[1]", "[9]"]
    build = {"[1]": (json.dumps({"id": 1, "name": "Ann"}), None)}
    with_nulls = enrich(probes, build, PROBE.join_key, ("order_id",), emit_missing=True)
    rows = {k: (kind, json.loads(r)) for k, kind, r in zip(*(with_nulls.net.column(c).to_pylist()
                                                             for c in ("key", "kind", "row")))}
    assert rows == {
        "[10]": ("+U", {"order_id": 10, "customer_id": 1, "name": "ink", "id": 1, "name0": "Ann"}),  # the last one
        "[11]": ("+U", {"order_id": 11, "customer_id": 9}),
        "[12]": ("-D", {"order_id": 12}),
    }
    assert with_nulls.joined == 2 and with_nulls.missing.column("offset").to_pylist() == [1]
    dropped = enrich(probes, build, PROBE.join_key, ("order_id",), emit_missing=False)
    assert sorted(dropped.net.column("key").to_pylist()) == ["[10]", "[12]"] and dropped.missing.num_rows == 1
