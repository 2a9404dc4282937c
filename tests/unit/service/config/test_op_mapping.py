"""op_mapping validation (spec 4.3.6) and FROM_CHANGELOG settings: presets, overrides, rules."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from service.config.from_changelog import (
    DEBEZIUM_OP_MAPPING,
    PRESETS,
    FromChangelogSettings,
    validate_from_changelog,
)
from service.config.op_mapping import (
    DEFAULT_OP_MAPPING,
    Grouping,
    op_code_text,
    parse_op_mapping,
)
from vocabulary.errors import ConfigError


def test_debezium_mapping_parses_per_code():
    assert parse_op_mapping(DEBEZIUM_OP_MAPPING) == {
        "c": Grouping.INSERT, "r": Grouping.INSERT, "u": Grouping.UPDATE, "d": Grouping.DELETE,
    }


def test_default_mapping_is_the_kind_names():
    assert parse_op_mapping(DEFAULT_OP_MAPPING) == {
        "INSERT": Grouping.INSERT, "UPDATE_BEFORE": Grouping.UPDATE_BEFORE,
        "UPDATE_AFTER": Grouping.UPDATE_AFTER, "DELETE": Grouping.DELETE,
    }


@pytest.mark.parametrize(
    ("kinds", "grouping"),
    [
        ("UPDATE_BEFORE, UPDATE_AFTER", Grouping.UPDATE),
        ("UPDATE_AFTER,UPDATE_BEFORE", Grouping.UPDATE),
        ("INSERT, UPDATE_AFTER", Grouping.UPSERT),
        ("INSERT, UPDATE_BEFORE, UPDATE_AFTER", Grouping.UPSERT_RETRACT),
    ],
)
def test_valid_groupings(kinds, grouping):
    assert parse_op_mapping({"x": kinds, "y": "DELETE"}) == {"x": grouping, "y": Grouping.DELETE}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        # spec 4.3.6 example: neither side is a kind
        ({"MY_INSERT": "NEW_INSERT"},
         "op_mapping entry 'MY_INSERT': 'NEW_INSERT': 'NEW_INSERT' is not a change kind"),
        # the TO_CHANGELOG direction written by mistake
        ({"INSERT": "c"}, "op_mapping entry 'INSERT': 'c': 'c' is not a change kind (valid: INSERT, UPDATE_BEFORE, "
                          "UPDATE_AFTER, DELETE) (the keys are op codes of the input and the values are kinds"),
        ({"c": "insert"}, "op_mapping entry 'c': 'insert': 'insert' is not a change kind"),
        ({"c": "INSERT, UPSERT"}, "op_mapping entry 'c': 'INSERT, UPSERT': 'UPSERT' is not a change kind"),
        # a kind at most once across entries
        ({"c": "INSERT", "r": "INSERT"}, "op_mapping entry 'r': 'INSERT': kind INSERT is already mapped by "
                                         "op_mapping entry 'c': 'INSERT'"),
        ({"c": "INSERT", "u": "INSERT, UPDATE_AFTER"}, "op_mapping entry 'u': 'INSERT, UPDATE_AFTER': kind INSERT is "
                                                       "already mapped by op_mapping entry 'c': 'INSERT'"),
        ({"u": "UPDATE_AFTER", "x": "UPDATE_BEFORE, UPDATE_AFTER"}, "kind UPDATE_AFTER is already mapped by "
                                                                    "op_mapping entry 'u': 'UPDATE_AFTER'"),
        ({"c": "INSERT, INSERT"}, "op_mapping entry 'c': 'INSERT, INSERT': a kind is listed twice"),
        # groupings that are not semantically compatible
        ({"x": "INSERT, DELETE"}, "op_mapping entry 'x': 'INSERT, DELETE': these kinds cannot be grouped"),
        ({"x": "UPDATE_AFTER, DELETE"}, "op_mapping entry 'x': 'UPDATE_AFTER, DELETE': these kinds cannot be grouped"),
        ({"x": "INSERT, UPDATE_BEFORE"}, "these kinds cannot be grouped"),
        ({"x": "INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE"}, "these kinds cannot be grouped"),
        # a code in two entries
        ({"c, r": "INSERT", "r": "DELETE"}, "op_mapping entry 'r': 'DELETE': op code 'r' is already mapped by "
                                            "op_mapping entry 'c, r': 'INSERT'"),
        ({"c,": "INSERT"}, "op_mapping entry 'c,': 'INSERT': an op code is empty"),
        ({}, "op_mapping is empty"),
    ],
)
def test_invalid_mappings_name_the_entry_as_written(mapping, message):
    with pytest.raises(ConfigError) as raised:
        parse_op_mapping(mapping)
    text = str(raised.value)
    assert text.startswith(message) if message.startswith("op_mapping") else message in text


def test_op_codes_compare_as_text():
    assert [op_code_text(v) for v in (True, False, "true", 1, "c")] == ["true", "false", "true", "1", "c"]


# --- settings ------------------------------------------------------------------------------------


def test_presets_expand_to_their_parameters():
    debezium = FromChangelogSettings(preset="debezium")
    assert (debezium.op, debezium.before, debezium.after) == ("op", "before", "after")
    assert debezium.op_mapping == DEBEZIUM_OP_MAPPING
    assert FromChangelogSettings(preset="debezium-upsert").op_mapping["u"] == "UPDATE_AFTER"
    flag = FromChangelogSettings(preset="deletion-flag")
    assert (flag.op, flag.envelope) == ("__deleted", False)
    assert flag.op_mapping == {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"}
    upsert_kafka = FromChangelogSettings(preset="upsert-kafka")
    assert (upsert_kafka.op, upsert_kafka.kafka_key) == (None, "columns")
    assert FromChangelogSettings(preset="flat") == FromChangelogSettings(preset="flat", **PRESETS["flat"])
    assert FromChangelogSettings().op_mapping == DEFAULT_OP_MAPPING  # no preset: the spec defaults


def test_explicit_parameters_override_the_preset():
    settings = FromChangelogSettings(preset="debezium", op="__op", op_mapping={"c": "INSERT", "d": "DELETE"})
    assert settings.op == "__op" and settings.after == "after"
    assert settings.op_mapping == {"c": "INSERT", "d": "DELETE"}


def test_yaml_boolean_codes_are_read_as_text():
    raw = yaml.safe_load("op: deleted\nop_mapping: {false: 'INSERT, UPDATE_AFTER', true: DELETE}\n")
    assert validate_from_changelog(raw).op_mapping == {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"}


def test_settings_are_frozen_and_strict():
    settings = FromChangelogSettings()
    with pytest.raises(ValidationError):
        settings.op = "x"
    with pytest.raises(ValidationError):
        FromChangelogSettings(opp="x")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"op_mapping": {"c": "INSERT", "r": "INSERT"}}, "op_mapping entry 'r': 'INSERT': kind INSERT is already"),
        ({"passthrough": ["source.lsn", "source_lsn"]},
         "passthrough: 'source.lsn' and 'source_lsn' both become column 'source_lsn'"),
        ({"passthrough": ["source..lsn"]}, "passthrough: 'source..lsn' is not a field path"),
        ({"op_mapping": {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}},
         "op_mapping entry 'upsert': 'INSERT, UPDATE_BEFORE, UPDATE_AFTER' needs state_ttl_seconds"),
        ({"preset": "debezium", "typo": 1}, "typo: unknown key"),
        ({"preset": "maxwell"}, "preset: Input should be"),
        ({"invalid_op_handling": "IGNORE"}, "invalid_op_handling: Input should be"),
        ({"state_ttl_seconds": -1}, "state_ttl_seconds: Input should be greater than or equal to 0"),
        ({"op": ""}, "op: must not be empty"),
        ({"partition_by": []}, "partition_by: must name at least one column"),
    ],
)
def test_validate_reports_config_errors(raw, message):
    with pytest.raises(ConfigError) as raised:
        validate_from_changelog(raw, where="pipelines.0.from_changelog")
    text = str(raised.value)
    assert text.startswith("pipelines.0.from_changelog: invalid configuration")
    assert message in text


def test_stateful_upsert_retract_is_valid():
    settings = validate_from_changelog(
        {"state_ttl_seconds": 0, "op_mapping": {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}}
    )
    assert settings.stateful and settings.state_ttl_seconds == 0
