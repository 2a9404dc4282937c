"""Memory goes back to the system after every micro-batch of every supervised pipeline."""

from __future__ import annotations

import pytest

from service.delta_to_kafka.pipeline import ExportPipeline
from service.kafka_to_delta.joins.enrichment_join import EnrichmentJoinPipeline
from service.kafka_to_delta.joins.regular_join import RegularJoinPipeline
from service.kafka_to_delta.pipeline import IngestPipeline
from service.runtime import memory_release
from service.supervisor.batch_pipeline import BatchPipeline


class _Pipeline(BatchPipeline):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.done: list[int] = []

    def _process_batch(self, batch: object, batch_id: int) -> None:
        if batch_id == self.fail_at:
            raise RuntimeError("failed batch")
        self.done.append(batch_id)


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(memory_release, "release_memory", lambda: calls.append(1))
    return calls


def test_memory_is_released_after_each_batch(releases: list[int]) -> None:
    pipeline = _Pipeline()
    for batch_id in range(3):
        pipeline.process_batch(None, batch_id)
    assert pipeline.done == [0, 1, 2] and len(releases) == 3


def test_memory_is_released_after_a_failed_batch_too(releases: list[int]) -> None:
    pipeline = _Pipeline(fail_at=0)
    with pytest.raises(RuntimeError):
        pipeline.process_batch(None, 0)
    assert len(releases) == 1 and isinstance(pipeline.failure, RuntimeError)


@pytest.mark.parametrize("pipeline", [IngestPipeline, ExportPipeline, RegularJoinPipeline, EnrichmentJoinPipeline])
def test_every_pipeline_takes_the_batch_entry_point_that_releases(pipeline: type) -> None:
    assert issubclass(pipeline, BatchPipeline)
    assert pipeline.process_batch is BatchPipeline.process_batch, f"{pipeline.__name__} overrides process_batch"


def test_release_memory_runs_here() -> None:
    memory_release.release_memory()  # Arrow's pool and the C heap: no error on this platform
