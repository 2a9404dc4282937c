"""Builds the export pipelines of a service configuration (Delta change feed -> Kafka)."""

from __future__ import annotations

from pyspark.sql import SparkSession

from service.config.exports import ExportSettings
from service.config.settings import Settings
from service.delta_to_kafka.formats.export_encoder import ExportEncoder
from service.delta_to_kafka.pipeline import ExportPipeline


def export_pipeline(spark: SparkSession, settings: Settings, export: ExportSettings) -> ExportPipeline:
    """One configured export as a supervised streaming query."""
    uri = settings.lakehouse.table_uri(export.table)
    storage = dict(settings.lakehouse.storage_options)
    serializers: tuple = (None, None)
    if export.format == "avro-confluent":  # imported here: a JSON-only service never loads the registry client
        from service.delta_to_kafka.formats.avro_serializers import avro_serializers

        serializers = avro_serializers(export, uri, storage)
    encoder = ExportEncoder(export, *serializers)
    return ExportPipeline(
        spark, export.name, uri, export.topic, settings.kafka.client_config(), settings.checkpoint_dir(export.name),
        encoder,
        storage_options=storage,
        starting_version=export.starting_version or 0,
        starting_timestamp=export.starting_timestamp,
        max_versions_per_trigger=export.max_versions_per_trigger,
        max_rows_per_trigger=export.max_rows_per_trigger,
        key_columns=export.primary_key,
        trigger_interval_seconds=settings.trigger_interval_seconds,
        encoder_state=encoder,
    )
