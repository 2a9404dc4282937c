"""/readyz names each quarantined table of a database source, with the batch and the error that set it aside."""

from __future__ import annotations

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.database.query import DatabaseQuery
from service.runtime import quarantine
from service.supervisor.runner import Runner, _Supervised


def test_readiness_names_a_quarantined_table(tmp_path):
    settings = settings_from_mapping({
        "checkpoint_root": str(tmp_path / "checkpoints"),
        "databases": [{"name": "inv", "topic_pattern": r"db\.(?P<table>\w+)"}],
    })
    runner = Runner(settings)
    query = DatabaseQuery.__new__(DatabaseQuery)  # no Spark: readiness reads the quarantine file only
    query.settings, query.database = settings, settings.databases[0]
    runner.supervised.append(_Supervised(query))
    assert "inv.orders" not in runner.readiness().as_dict()["pipelines"]
    quarantine.write(query.quarantine_file, {
        "orders": {"state": quarantine.QUARANTINED, "batch_id": 3, "reason": "DecodeError: bad record"},
        "items": {"state": quarantine.RESUMING, "batch_id": 1, "reason": "fixed since"},
    })
    body = runner.readiness().as_dict()
    assert body["pipelines"]["inv.orders"] == {"ready": False, "reason": "quarantined at batch 3: DecodeError: bad record"}
    assert "inv.items" not in body["pipelines"] and body["ready"] is False
