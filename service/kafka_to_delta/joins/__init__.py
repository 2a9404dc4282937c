"""Join pipelines (`joins:` in the config, service/config/joins.py).

`join_pipeline` builds the pipeline of one join; each has the interface the runner supervises
(`name`, `start(until_idle) -> StreamingQuery`, `failure`, `committed_batches`, `close()`), as
`IngestPipeline` has:
- `regular_join.RegularJoinPipeline`: `type: inner | left`;
- `enrichment_join.EnrichmentJoinPipeline`: `type: enrichment` (snapshot-gated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.config.joins import JoinSettings, RegularJoinSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from service.config.settings import Settings


def join_pipeline(spark: "SparkSession", settings: "Settings", join: JoinSettings) -> Any:
    """The pipeline that runs one configured join."""
    if isinstance(join, RegularJoinSettings):
        from service.kafka_to_delta.joins.regular_join import RegularJoinPipeline

        return RegularJoinPipeline(spark, settings, join)
    from service.kafka_to_delta.joins.enrichment_join import EnrichmentJoinPipeline

    return EnrichmentJoinPipeline(spark, settings, join)
