"""FROM_CHANGELOG configuration (spec 4.1.2): typed, frozen, with presets for common inputs.

A preset expands to parameters; parameters given next to it override the preset's. Every
rule that can be checked without data is checked here, so `validate` and `run` refuse a
bad configuration before a pipeline starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from service.config.base import Names, SettingsModel
from service.config.choices import (
    ChangelogPreset,
    KafkaKeyUse,
    LateHandling,
    RecordHandling,
    TruncateHandling,
)
from service.config.op_mapping import (
    DEFAULT_OP_MAPPING,
    Grouping,
    op_code_text,
    parse_op_mapping,
)
from vocabulary.errors import ConfigError

PATH_SEPARATOR = "."
COLUMN_SEPARATOR = "_"
_PATH = re.compile(r"^[^.]+(\.[^.]+)*$")

DEBEZIUM_OP_MAPPING = {"c, r": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"}
DEBEZIUM_UPSERT_OP_MAPPING = {"c, r": "INSERT", "u": "UPDATE_AFTER", "d": "DELETE"}
DELETION_FLAG_FIELD = "__deleted"  # as Debezium's ExtractNewRecordState writes it
DELETION_FLAG_OP_MAPPING = {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"}
VALUE_CODE = "upsert"
"""Op code of a record with a value when records carry no op field (`op: null`)."""
TOMBSTONE_CODE = "delete"
"""Op code of a tombstone (null value) when records carry no op field (`op: null`)."""
UPSERT_KAFKA_OP_MAPPING = {VALUE_CODE: "INSERT, UPDATE_AFTER", TOMBSTONE_CODE: "DELETE"}

PRESETS: dict[str, dict[str, Any]] = {
    "debezium": {"op": "op", "before": "before", "after": "after", "op_mapping": DEBEZIUM_OP_MAPPING},
    "debezium-upsert": {"op": "op", "before": "before", "after": "after", "op_mapping": DEBEZIUM_UPSERT_OP_MAPPING},
    "flat": {"op": "op", "before": None, "after": None, "op_mapping": DEFAULT_OP_MAPPING},
    "deletion-flag": {"op": DELETION_FLAG_FIELD, "before": None, "after": None, "op_mapping": DELETION_FLAG_OP_MAPPING},
    "upsert-kafka": {
        "op": None, "before": None, "after": None, "kafka_key": "columns", "op_mapping": UPSERT_KAFKA_OP_MAPPING,
    },
}
"""Parameters each preset stands for."""


def passthrough_column(path: str) -> str:
    """Output column of a passthrough path: 'source.lsn' -> 'source_lsn'."""
    return path.replace(PATH_SEPARATOR, COLUMN_SEPARATOR)


class FromChangelogSettings(SettingsModel):
    """How a pipeline turns input records into changelog rows (spec 4.1.2; README documents each)."""

    preset: ChangelogPreset | None = None
    op: str | None = "op"
    before: str | None = None
    after: str | None = None
    op_mapping: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_OP_MAPPING))
    invalid_op_handling: RecordHandling = "FAIL"
    decode_error_handling: RecordHandling = "FAIL"
    consume_full_deletes: bool = False
    kafka_key: KafkaKeyUse = "fallback"
    passthrough: Names = ()
    state_ttl_seconds: float | None = Field(default=None, ge=0)
    partition_by: Names | None = None
    order_by: str | None = None
    watermark_delay_seconds: float = Field(default=0.0, ge=0)
    late_handling: LateHandling = "drop"
    truncate_handling: TruncateHandling = "fail"
    sequence_by: Names = ()

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("preset"), str):
            return {**PRESETS.get(data["preset"], {}), **data}
        return data

    @field_validator("op_mapping", mode="before")
    @classmethod
    def _codes_as_text(cls, value: Any) -> Any:
        # YAML reads `true: DELETE` with a boolean key; codes are compared as text.
        if isinstance(value, Mapping):
            return {op_code_text(code): kinds for code, kinds in value.items()}
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "FromChangelogSettings":
        try:
            check_settings(self)
        except ConfigError as error:
            raise ValueError(str(error)) from None
        return self

    @property
    def stateful(self) -> bool:
        """Whether the previous image per key is kept (state_ttl_seconds given)."""
        return self.state_ttl_seconds is not None

    @property
    def passthrough_columns(self) -> dict[str, str]:
        """Passthrough path -> output column."""
        return {path: passthrough_column(path) for path in self.passthrough}

    @property
    def envelope(self) -> bool:
        """True when row images are nested fields (before and/or after), False for flat records."""
        return self.before is not None or self.after is not None


def _check_paths(name: str, paths: tuple[str, ...]) -> None:
    for path in paths:
        if not _PATH.match(path):
            raise ConfigError(f"{name}: {path!r} is not a field path (names separated by single dots)")


def check_settings(settings: FromChangelogSettings) -> None:
    """Rules across parameters; raises `ConfigError` (the model runs it on construction)."""
    groupings = parse_op_mapping(settings.op_mapping)
    for field in ("op", "before", "after", "order_by"):
        value = getattr(settings, field)
        if value is not None and not value:
            raise ConfigError(f"{field}: must not be empty (omit it instead)")
    _check_paths("passthrough", settings.passthrough)
    _check_paths("sequence_by", settings.sequence_by)
    if settings.order_by is not None:
        _check_paths("order_by", (settings.order_by,))
    columns: dict[str, str] = {}
    for path, column in settings.passthrough_columns.items():
        if column in columns:
            raise ConfigError(f"passthrough: {columns[column]!r} and {path!r} both become column {column!r}")
        columns[column] = path
    if settings.partition_by is not None and not settings.partition_by:
        raise ConfigError("partition_by: must name at least one column (omit it to partition by the upsert key)")
    if not settings.stateful:
        for codes, kinds in settings.op_mapping.items():
            if groupings[codes.split(",")[0].strip()] is Grouping.UPSERT_RETRACT:
                raise ConfigError(
                    f"op_mapping entry {codes!r}: {kinds!r} needs state_ttl_seconds: UPDATE_BEFORE is "
                    "the previous image of the key, kept in state (0 keeps it forever)"
                )


def validate_from_changelog(raw: Mapping[str, Any] | None, where: str = "from_changelog") -> FromChangelogSettings:
    """Build settings from a parsed config mapping; errors are `ConfigError` naming `where` and the key."""
    try:
        return FromChangelogSettings.model_validate(dict(raw or {}))
    except ValidationError as error:
        lines = [f"{where}: invalid configuration"]
        for item in error.errors():
            path = ".".join(str(p) for p in item["loc"]) or "(top level)"
            reason = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
            lines.append(f"  {path}: {reason.removeprefix('Value error, ')}")
        raise ConfigError("\n".join(lines)) from None
