"""Config loading: typed, frozen, strict about keys, secrets from the environment only."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.errors import ConfigError
from service.settings import load_settings, settings_from_mapping

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
