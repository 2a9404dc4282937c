"""The retention rules of table maintenance, and its settings and schedule."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from service.config.settings import settings_from_mapping
from service.operations.maintenance import TableMaintenance
from service.operations.vacuum_retention import (
    RetentionRefused,
    UnreadFeed,
    check_retention,
    first_unread,
)
from vocabulary.errors import ConfigError

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc)
PIPELINE = {"name": "orders-in", "topics": ["orders"], "table": "orders", "primary_key": ["id"]}


def _feed(hours_behind: float | None, export: str = "orders-out", error: str | None = None) -> UnreadFeed:
    since = None if hours_behind is None else NOW - timedelta(hours=hours_behind)
    return UnreadFeed(export, "/tables/orders", 41, since, error)


def test_a_retention_shorter_than_the_unread_change_feed_is_refused_naming_table_and_export():
    with pytest.raises(RetentionRefused) as refused:
        check_retention("VACUUM", timedelta(hours=24), [_feed(1.0), _feed(30.0, "audit-out")], NOW)
    message = str(refused.value)
    assert message.startswith("VACUUM of table /tables/orders refused: export audit-out")
    assert "from version 41" in message and "30.00 h old" in message and "retention of 24.00 h" in message


def test_a_retention_equal_to_the_unread_change_feed_is_refused_too():
    with pytest.raises(RetentionRefused, match="export orders-out"):
        check_retention("log cleanup", timedelta(hours=2), [_feed(2.0)], NOW)


def test_a_retention_longer_than_every_export_lag_is_allowed():
    check_retention("VACUUM", timedelta(hours=168), [_feed(1.0), _feed(167.9, "audit-out")], NOW)


def test_an_export_with_nothing_unread_allows_any_retention():
    check_retention("VACUUM", timedelta(0), [_feed(None)], NOW)
    check_retention("VACUUM", timedelta(0), [], NOW)


def test_an_export_whose_position_cannot_be_read_refuses():
    with pytest.raises(RetentionRefused, match="position of export orders-out cannot be read .broker down."):
        check_retention("VACUUM", timedelta(hours=168), [_feed(None, error="broker down")], NOW)


def test_the_first_unread_version_follows_the_older_of_checkpoint_and_position():
    assert first_unread(checkpoint_version=9, published_version=10, starting_version=0) == 10
    assert first_unread(checkpoint_version=None, published_version=10, starting_version=0) == 11
    assert first_unread(checkpoint_version=None, published_version=None, starting_version=5) == 5


def test_maintenance_is_on_by_default_with_a_week_of_retention():
    settings = settings_from_mapping({"pipelines": [PIPELINE]})
    config = settings.maintenance_of(settings.pipelines[0])
    assert config.enabled and config.compact and config.checkpoint and config.log_cleanup and config.vacuum
    assert config.vacuum_retention_hours == 168 and not config.z_order


def test_a_pipeline_block_replaces_the_top_level_one():
    settings = settings_from_mapping({
        "maintenance": {"every_batches": 10},
        "pipelines": [PIPELINE, {**PIPELINE, "name": "b", "maintenance": {"z_order": True, "vacuum": False}}],
    })
    shared, own = (settings.maintenance_of(p) for p in settings.pipelines)
    assert shared.every_batches == 10 and own.every_batches == 100 and own.z_order and not own.vacuum


def test_maintenance_needs_a_schedule_and_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="every_batches` or `every_seconds"):
        settings_from_mapping({"maintenance": {"every_batches": None, "every_seconds": None}})
    with pytest.raises(ConfigError, match="maintenance.vacuum_hours: unknown key"):
        settings_from_mapping({"maintenance": {"vacuum_hours": 1}})


def test_maintenance_is_due_after_enough_batches_or_processing_time():
    now = [0.0]
    settings = settings_from_mapping({"maintenance": {"every_batches": 3, "every_seconds": 60}, "pipelines": [PIPELINE]})
    maintenance = TableMaintenance(settings, settings.pipelines[0], clock=lambda: now[0])
    maintenance._batches = 2
    assert not maintenance.due()
    maintenance._batches = 3
    assert maintenance.due()
    maintenance._batches, now[0] = 0, 60.0
    assert maintenance.due()


def test_maintenance_is_off_when_disabled_and_on_for_both_engines():
    settings = settings_from_mapping({"maintenance": {"enabled": False}, "pipelines": [PIPELINE]})
    assert TableMaintenance(settings, settings.pipelines[0]).after_batch() == []
    for engine in ("delta-rs", "delta-spark"):
        settings = settings_from_mapping({"lakehouse": {"engine": engine}, "pipelines": [PIPELINE]})
        assert TableMaintenance(settings, settings.pipelines[0]).active
