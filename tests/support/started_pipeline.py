"""A pipeline's checkpoint as the upgrade check finds it once the pipeline has started: its stored
plan and a first offsets entry."""

from __future__ import annotations

from pathlib import Path

from service.config.settings import PipelineSettings
from service.kafka_to_delta.plan.upgrades import check_and_store_pipeline


def start_pipeline(root: Path, pipeline: PipelineSettings) -> None:
    """Store `pipeline`'s plan under `root/<name>` and mark it started (offsets/0)."""
    check_and_store_pipeline(pipeline, str(root / pipeline.name))
    (root / pipeline.name / "offsets").mkdir(parents=True, exist_ok=True)
    (root / pipeline.name / "offsets" / "0").write_text("v1\n{}\n")
