"""Spark's idle planning daemons are stopped once a query entered its first micro-batch, unless
another query is being started (no Spark here: the stop itself is tests/integration/service/runtime/
test_planner_workers.py)."""

from __future__ import annotations

import pytest

from service.config.settings import settings_from_mapping
from service.supervisor import runner as runner_module
from service.supervisor.batch_pipeline import BatchPipeline
from service.supervisor.runner import Runner, _Supervised

PLAIN = {"name": "plain", "topics": ["p"], "table": "plain", "primary_key": ["id"]}


class _Pipeline(BatchPipeline):
    name = "plain"

    def _process_batch(self, batch: object, batch_id: int) -> None:
        """Nothing to do."""


def test_the_hook_runs_on_the_first_batch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.runtime.memory_release.release_memory", lambda: None)
    calls: list[int] = []
    pipeline = _Pipeline()
    pipeline.on_first_batch = lambda: calls.append(1)
    for batch_id in range(3):
        pipeline.process_batch(None, batch_id)
    assert calls == [1]


def test_the_runner_stops_the_daemons_unless_another_query_is_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[object] = []
    monkeypatch.setattr(runner_module, "stop_idle_planner_workers", stopped.append)
    runner = Runner(settings_from_mapping({"pipelines": [PLAIN]}))
    runner._spark = spark = object()  # type: ignore[assignment]
    first, other = _Supervised(_Pipeline()), _Supervised(_Pipeline())  # type: ignore[arg-type]
    runner._starting = other
    runner._sources_planned(first)
    assert stopped == [], "a query being started still plans its sources"
    runner._sources_planned(other)
    runner._starting = None
    runner._sources_planned(first)
    runner._sources_planned(None)
    assert stopped == [spark] * 3


def test_while_every_query_is_being_started_no_first_batch_stops_the_daemons(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The next query's start needs them: stopping them after each query's first batch made every
    # start pay three new planning daemons.
    stopped: list[object] = []
    monkeypatch.setattr(runner_module, "stop_idle_planner_workers", stopped.append)
    runner = Runner(settings_from_mapping({"pipelines": [PLAIN]}))
    runner._spark = spark = object()  # type: ignore[assignment]
    first = _Supervised(_Pipeline())  # type: ignore[arg-type]
    runner._starting_all = True
    runner._sources_planned(first)
    assert stopped == []
    runner._starting_all = False
    runner._sources_planned(None)
    assert stopped == [spark]


class _Status:
    """A query whose status message walks through `messages`, one per read."""

    isActive = True

    def __init__(self, messages: list[str]) -> None:
        self.messages, self.reads = messages, 0

    @property
    def status(self) -> dict:
        self.reads += 1
        return {"message": self.messages[min(self.reads, len(self.messages)) - 1]}


def test_the_next_query_starts_once_this_one_created_its_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not after its first micro-batch: that batch runs beside the next query's start.
    monkeypatch.setattr(runner_module.time, "sleep", lambda _: None)
    query = _Status(["Initializing StreamExecution", "Initializing sources", "Initializing sources",
                     "Getting offsets from x", "Processing new data"])
    runner_module._wait_initialized(query, runner_module.threading.Event())  # type: ignore[arg-type]
    assert query.reads == 4


class _FinishedQuery:
    isActive = False


def test_every_started_query_gets_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[object] = []
    monkeypatch.setattr(runner_module, "stop_idle_planner_workers", stopped.append)
    runner = Runner(settings_from_mapping({"pipelines": [PLAIN]}))
    runner._spark = object()  # type: ignore[assignment]
    pipeline = _Pipeline()
    pipeline.start = lambda until_idle: _FinishedQuery()  # type: ignore[attr-defined]
    entry = _Supervised(pipeline)  # type: ignore[arg-type]
    runner._start(entry)
    assert pipeline.on_first_batch is not None and not pipeline.entered_batch
    pipeline.on_first_batch()
    assert len(stopped) == 1
