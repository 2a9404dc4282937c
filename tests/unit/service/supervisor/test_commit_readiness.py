"""/readyz names a pipeline whose batch commit failed behind its running query at once, not when the query's next
batch raises it. The pipeline and its query are stand-ins: what is under test is what the runner reports."""

from __future__ import annotations

from service.config.settings import settings_from_mapping
from service.supervisor.runner import Runner, _Supervised
from tests.unit.service.observability.test_health import FakeQuery


class _Pipeline:
    name = "orders"
    failed_behind: BaseException | None = None


def test_readiness_names_a_commit_failed_behind_the_query(tmp_path):
    runner = Runner(settings_from_mapping({
        "checkpoint_root": str(tmp_path / "checkpoints"),
        "pipelines": [{"name": "orders", "topics": ["orders"], "table": "orders", "primary_key": ["id"]}],
    }))
    pipeline = _Pipeline()
    runner.supervised.append(_Supervised(pipeline, query=FakeQuery()))  # type: ignore[arg-type]
    assert runner.readiness().as_dict()["pipelines"]["orders"]["ready"] is True
    pipeline.failed_behind = OSError("disk full")
    body = runner.readiness().as_dict()
    assert body["ready"] is False
    assert body["pipelines"]["orders"]["reason"].endswith("OSError: disk full")
