"""A restart that fails as it starts (committing a batch its previous run wrote ahead, say) is a failure of the
run like any other: retried with backoff while it is transient, raised once it is terminal or the attempts are
spent. The pipeline is a stand-in whose `start` raises: the runner's supervision is what is under test."""

from __future__ import annotations

import time

import pytest

from connectors.delta.delta_rs import DeltaWriteError
from service.config.settings import settings_from_mapping
from service.supervisor.runner import Runner, _Supervised
from vocabulary.errors import CdcLakehouseError, TerminalError


class _StartFails:
    """A pipeline whose starts raise the given errors, one per start."""

    name = "orders"
    committed_batches = 0
    failed_behind = None

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.starts = 0

    def start(self, until_idle: bool):
        self.starts += 1
        raise self.errors.pop(0)


def _runner(tmp_path, max_attempts: int = 3) -> Runner:
    return Runner(settings_from_mapping({
        "checkpoint_root": str(tmp_path / "checkpoints"),
        "recovery": {"max_attempts": max_attempts, "initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.02},
        "pipelines": [{"name": "orders", "topics": ["orders"], "table": "orders", "primary_key": ["id"]}],
    }))


def _due(entry: _Supervised) -> None:
    assert entry.restart_at is not None
    entry.restart_at = time.monotonic() - 1


def test_a_transient_failure_of_a_restart_is_retried_then_raised(tmp_path):
    runner = _runner(tmp_path, max_attempts=2)
    pipeline = _StartFails(DeltaWriteError("commit of batch 7 failed: storage hiccup"),
                           DeltaWriteError("commit of batch 7 failed again"))
    entry = _Supervised(pipeline, failures=1, restart_at=time.monotonic() - 1)  # type: ignore[arg-type]
    runner._supervise(entry)
    assert pipeline.starts == 1 and entry.failures == 2 and entry.restart_at is not None and not entry.finished
    _due(entry)
    with pytest.raises(DeltaWriteError, match="failed again"):  # the attempts are spent
        runner._supervise(entry)
    assert pipeline.starts == 2


def test_a_terminal_failure_of_a_restart_is_raised_naming_the_pipeline(tmp_path):
    runner = _runner(tmp_path)
    entry = _Supervised(_StartFails(ValueError("the written-ahead file is not Arrow")),  # type: ignore[arg-type]
                        failures=1, restart_at=time.monotonic() - 1)
    with pytest.raises(CdcLakehouseError, match="orders") as raised:
        runner._supervise(entry)
    assert isinstance(raised.value, TerminalError)
