"""Config loading: typed, frozen, strict about keys, secrets from the environment only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.config.settings import load_settings, settings_from_mapping
from vocabulary.errors import ConfigError

PIPELINE = {"name": "customers", "topics": ["db.customers"], "table": "customers", "primary_key": ["id"]}


def _write(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_valid_file_loads_with_defaults(tmp_path):
    path = _write(tmp_path, """
kafka: {bootstrap_servers: "b:9092", options: {security.protocol: SASL_SSL}}
pipelines:
  - {name: c, topics: t1, table: c, primary_key: id, max_offsets_per_trigger: 10}
""")
    settings = load_settings(path)
    assert settings.kafka.client_config() == {"security.protocol": "SASL_SSL", "bootstrap.servers": "b:9092"}
    (pipeline,) = settings.pipelines
    assert pipeline.topics == ("t1",) and pipeline.primary_key == ("id",)
    assert pipeline.format == "json" and pipeline.starting_offsets == "earliest"
    assert pipeline.from_changelog.preset == "debezium" and not pipeline.materialized
    assert settings.checkpoint_dir("c").endswith("/c")
    with pytest.raises(ValidationError):
        settings.checkpoint_root = "elsewhere"  # frozen


def test_misspelt_key_is_rejected_naming_file_and_key(tmp_path):
    path = _write(tmp_path, "pipelines:\n  - {name: c, topics: t, table: c, primary_key: id, primery_key: x}\n")
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    assert str(path) in str(raised.value)
    assert "pipelines.0.primery_key: unknown key" in str(raised.value)


def test_unknown_top_level_key_and_missing_required_field(tmp_path):
    with pytest.raises(ConfigError, match=r"lakehose: unknown key"):
        settings_from_mapping({"lakehose": {}})
    with pytest.raises(ConfigError, match=r"pipelines.0.primary_key"):
        settings_from_mapping({"pipelines": [{"name": "a", "topics": ["t"], "table": "a"}]})


def test_duplicate_pipeline_names_rejected():
    with pytest.raises(ConfigError, match="repeated: customers"):
        settings_from_mapping({"pipelines": [PIPELINE, PIPELINE]})


def test_secrets_come_from_environment_and_are_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", "hunter2")
    path = _write(tmp_path, 'kafka: {options: {sasl.password: "${KAFKA_PASSWORD}", sasl.username: svc}}\n')
    settings = load_settings(path)
    assert settings.kafka.client_config()["sasl.password"] == "hunter2"
    redacted = settings.kafka.redacted()
    assert redacted["sasl.password"] == "***" and redacted["sasl.username"] == "svc"
    assert "hunter2" not in repr(redacted)


def test_missing_environment_variable_is_named(tmp_path):
    path = _write(tmp_path, 'kafka: {options: {sasl.password: "${NOT_SET_ANYWHERE_42}"}}\n')
    with pytest.raises(ConfigError, match=r"NOT_SET_ANYWHERE_42"):
        load_settings(path)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(_write(tmp_path, "pipelines: [\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(_write(tmp_path, "- a\n- b\n"))


def _pipeline(**fields) -> dict:
    return {"pipelines": [{"name": "p", "topics": ["t"], "table": "t", "primary_key": ["id"], **fields}]}


@pytest.mark.parametrize("fields, why", [
    ({"upsert_key": ["email"]}, "the upsert key (email) differs from the primary key (id)"),
    ({"upsert_key": []}, "the upsert key ((none: the whole row))"),
    ({"topics": ["a", "b"]}, "2 topics feed one table"),
])
def test_keys_that_differ_without_on_conflict_refuse_to_start_listing_the_choices(fields, why):
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping(_pipeline(**fields))
    message = str(raised.value)
    assert why in message
    assert all(f"`{choice}`" in message for choice in ("error", "nothing", "deduplicate"))


def test_materializer_runs_when_keys_differ_or_forced_and_not_when_disabled():
    assert settings_from_mapping(_pipeline(upsert_key="email", on_conflict="error")).pipelines[0].materialized
    assert settings_from_mapping(_pipeline(upsert_materialize="force", on_conflict="nothing")).pipelines[0].materialized
    assert not settings_from_mapping(_pipeline(upsert_key="email", upsert_materialize="none")).pipelines[0].materialized


def test_invalid_op_mapping_is_rejected_naming_the_entry():
    with pytest.raises(ConfigError, match="op_mapping entry 'x, y': 'INSERT, DELETE'"):
        settings_from_mapping(_pipeline(from_changelog={"op_mapping": {"x, y": "INSERT, DELETE"}}))


@pytest.mark.parametrize("fields, needle", [
    ({"from_changelog": {"preset": "debezium", "invalid_op_handling": "DEAD_LETTER"}}, "dead_letters"),
    ({"format": "avro-confluent"}, "schema_registry"),
    ({"compaction": "watermark"}, "needs the materializer"),
])
def test_policies_need_their_stores(fields, needle):
    with pytest.raises(ConfigError, match=needle):
        settings_from_mapping(_pipeline(**fields))


def test_sequence_by_runs_the_materializer_even_when_the_keys_agree():
    assert settings_from_mapping(_pipeline(sequence_by="ts_ms", on_conflict="error")).pipelines[0].materialized


# Retract sources (spec on-conflict: no DO ERROR / DO NOTHING under a barrier between -U and +U).
SEATS = {"primary_key": ["passenger"], "upsert_key": ["passenger", "seat"], "from_changelog": {"preset": "flat"}}


@pytest.mark.parametrize("from_changelog, retract", [
    ({"preset": "flat"}, True),
    ({"op_mapping": {"+I": "INSERT", "-U": "UPDATE_BEFORE", "+U": "UPDATE_AFTER", "-D": "DELETE"}}, True),
    ({"preset": "debezium"}, False),  # 'u' gives -U and +U from one record
    ({"preset": "debezium-upsert"}, False),
    ({"preset": "deletion-flag"}, False),
    ({"preset": "upsert-kafka"}, False),
    ({"op_mapping": {"u": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"}, "state_ttl_seconds": 0}, False),
])
def test_a_retract_source_is_one_whose_op_mapping_emits_update_before_alone(from_changelog, retract):
    pipeline = settings_from_mapping(_pipeline(**{**SEATS, "from_changelog": from_changelog},
                                               on_conflict="deduplicate")).pipelines[0]
    assert pipeline.retract_source is retract
    assert pipeline.effective_compaction == ("watermark" if retract else "batch")


@pytest.mark.parametrize("on_conflict, harm", [
    ("nothing", "leaving no row although the source holds one"),
    ("error", "stop on a conflict that never existed"),
])
def test_batch_compaction_with_nothing_or_error_on_a_retract_source_is_refused_saying_what_to_do(on_conflict, harm):
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping(_pipeline(**SEATS, on_conflict=on_conflict, compaction="batch"))
    message = str(raised.value)
    assert f"`compaction: batch` with `on_conflict: {on_conflict}` is refused for a retract source" in message
    assert "'UPDATE_BEFORE' to UPDATE_BEFORE alone" in message and harm in message
    assert "Remove `compaction` (the default for this source is `watermark`" in message
    assert "`on_conflict: deduplicate`" in message


def test_retract_sources_default_to_watermark_compaction_only_where_the_materializer_runs():
    seats = settings_from_mapping(_pipeline(**SEATS, on_conflict="nothing")).pipelines[0]
    assert seats.compaction is None and seats.effective_compaction == "watermark"
    deduplicate = settings_from_mapping(_pipeline(**SEATS, on_conflict="deduplicate", compaction="batch"))
    assert deduplicate.pipelines[0].effective_compaction == "batch"
    plain = settings_from_mapping(_pipeline(from_changelog={"preset": "flat"}, on_conflict="error")).pipelines[0]
    assert plain.retract_source and not plain.materialized and plain.effective_compaction == "batch"
    debezium = settings_from_mapping(_pipeline(upsert_key="email", on_conflict="error", compaction="batch"))
    assert debezium.pipelines[0].effective_compaction == "batch"
