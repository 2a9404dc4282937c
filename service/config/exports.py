"""Configuration of one export: a Delta table's change data feed -> one Kafka topic (spec 4.2).

`op_mapping` uses the spec syntax: each entry maps a comma-separated list of change-kind names
(INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE) to one output code. It is validated before the
pipeline starts (spec 4.3.6); every message names the offending entry. A preset fills the
fields a user leaves out: `preset: debezium` gives Debezium envelopes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import Field, field_validator, model_validator

from service.config.base import Name, Names, SettingsModel, TopicName
from service.config.choices import ExportCompaction, ExportFormat, ExportPreset, InputChangelog
from service.config.op_mapping import (
    DEFAULT_OP_MAPPING,
    KIND_BY_NAME,
    Grouping,
    op_code_text,
    split_list,
)
from service.config.registry import SchemaRegistrySettings
from vocabulary.changes import ChangeKind, DebeziumOp, Envelope

DEFAULT_MAX_VERSIONS_PER_TRIGGER = 100
DEFAULT_MAX_ROWS_PER_TRIGGER = 100_000
"""Feed rows per micro-batch: bounds the driver's memory; a larger commit is split at key boundaries."""
DEFAULT_IMAGE_FIELDS = (Envelope.BEFORE, Envelope.AFTER)


class ChangeFeedColumn:
    """Metadata columns of a Delta change data feed."""

    CHANGE_TYPE = "_change_type"
    COMMIT_VERSION = "_commit_version"
    COMMIT_TIMESTAMP = "_commit_timestamp"

    ALL = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
    PASSABLE = (COMMIT_VERSION, COMMIT_TIMESTAMP)


_I, _UB, _UA, _D = ChangeKind.INSERT, ChangeKind.UPDATE_BEFORE, ChangeKind.UPDATE_AFTER, ChangeKind.DELETE
ALLOWED_GROUPS = frozenset(grouping.kinds for grouping in Grouping)
"""Kinds that may share one code (spec 4.3.6): the same groupings as FROM_CHANGELOG's."""
REQUIRED_KINDS = (_I, _UA, _D)
"""Without a code for these, rows of the table would silently vanish from the topic."""
DEBEZIUM_CODES = frozenset({DebeziumOp.CREATE.value, DebeziumOp.READ.value, DebeziumOp.UPDATE.value,
                            DebeziumOp.DELETE.value})
DEBEZIUM_RESERVED = frozenset({Envelope.SOURCE, Envelope.TS_MS, "transaction"})

PRESETS: dict[str, dict[str, Any]] = {
    "debezium": {
        "format": "debezium-json", "op": Envelope.OP, "before": Envelope.BEFORE, "after": Envelope.AFTER,
        "op_mapping": {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"},
        "produces_full_deletes": True, "tombstones": True,
    },
    "flat": {"format": "flat-json", "op": Envelope.OP, "op_mapping": DEFAULT_OP_MAPPING},
    "deletion-flag": {
        "format": "deletion-flag-json", "op": "__deleted",
        "op_mapping": {"INSERT, UPDATE_AFTER": "false", "DELETE": "true"},
        "produces_full_deletes": True,
    },
}
"""Field values a preset supplies; fields given explicitly win."""


@dataclass(frozen=True)
class OpCodes:
    """A validated `op_mapping`: the code of each mapped kind."""

    codes: dict[ChangeKind, str]

    @property
    def combines_updates(self) -> bool:
        """True when -U and +U share one code: they become one record with before and after."""
        return _UB in self.codes and self.codes.get(_UB) == self.codes.get(_UA)

    def code(self, kind: ChangeKind) -> str | None:
        """The output code of `kind`; None when the kind is dropped."""
        return self.codes.get(kind)


def _entry_kinds(entry: str) -> list[ChangeKind]:
    kinds = []
    for name in split_list(entry):
        if name not in KIND_BY_NAME:
            expected = ", ".join(KIND_BY_NAME)
            raise ValueError(f"op_mapping entry {entry!r}: unknown change kind {name!r} (expected {expected})")
        kinds.append(KIND_BY_NAME[name])
    return kinds


def parse_op_mapping(mapping: dict[str, str]) -> OpCodes:
    """Validate a TO_CHANGELOG `op_mapping` (spec 4.3.6); raises ValueError naming the entry."""
    codes: dict[ChangeKind, str] = {}
    entry_of: dict[ChangeKind, str] = {}
    for entry, code in mapping.items():
        if not code:
            raise ValueError(f"op_mapping entry {entry!r}: the output code is empty")
        for kind in _entry_kinds(entry):
            if kind in codes:
                raise ValueError(
                    f"op_mapping entry {entry!r}: {kind.name} is already mapped by entry {entry_of[kind]!r}"
                )
            codes[kind], entry_of[kind] = code, entry
    for code in sorted(set(codes.values())):
        group = frozenset(kind for kind, value in codes.items() if value == code)
        if group not in ALLOWED_GROUPS:
            entries = sorted({entry_of[kind] for kind in group})
            names = ", ".join(kind.name for kind in ChangeKind if kind in group)
            raise ValueError(
                f"op_mapping entries {entries}: {names} cannot share the code {code!r}; kinds may share a code "
                "only as UPDATE_BEFORE, UPDATE_AFTER / INSERT, UPDATE_AFTER / INSERT, UPDATE_BEFORE, UPDATE_AFTER"
            )
    missing = [kind.name for kind in REQUIRED_KINDS if kind not in codes]
    if missing:
        raise ValueError(f"op_mapping has no code for {', '.join(missing)}: such rows would be dropped")
    return OpCodes(codes)


class ExportSettings(SettingsModel):
    """One export of a Delta table's change feed to one Kafka topic (spec 4.2 TO_CHANGELOG)."""

    name: Name
    table: Name
    topic: TopicName
    primary_key: Names = Field(min_length=1)
    preset: ExportPreset | None = None
    format: ExportFormat = "flat-json"
    op: str = Field(default=Envelope.OP, min_length=1)
    before: str | None = Field(default=None, min_length=1)
    after: str | None = Field(default=None, min_length=1)
    op_mapping: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_OP_MAPPING))
    produces_full_deletes: bool = False
    passthrough: Names = ()
    input_changelog: InputChangelog = "retract"
    state_ttl_seconds: float = Field(default=0, ge=0)
    compaction: ExportCompaction = "per-flush"
    tombstones: bool = False
    starting_version: int | None = Field(default=None, ge=0)
    starting_timestamp: datetime | None = None
    max_versions_per_trigger: int | None = Field(default=DEFAULT_MAX_VERSIONS_PER_TRIGGER, ge=1)
    max_rows_per_trigger: int | None = Field(default=DEFAULT_MAX_ROWS_PER_TRIGGER, ge=1)
    schema_registry: SchemaRegistrySettings | None = None
    schema_registry_url: str | None = None  # shorthand for `schema_registry: {url: ...}` without auth

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in PRESETS:
            data = {**PRESETS[data["preset"]], **data}
        if isinstance(data, dict) and data.get("schema_registry_url") and data.get("schema_registry") is None:
            data = {**data, "schema_registry": {"url": data["schema_registry_url"]}}
        return data

    @field_validator("op_mapping", mode="before")
    @classmethod
    def _codes_as_text(cls, value: Any) -> Any:
        # YAML reads an unquoted false/true/1 as bool/int; codes are compared as text.
        if not isinstance(value, dict):
            return value
        return {kinds: op_code_text(code) if isinstance(code, (bool, int)) else code for kinds, code in value.items()}

    @model_validator(mode="after")
    def _consistent(self) -> "ExportSettings":
        codes = parse_op_mapping(self.op_mapping)
        if (self.before is None) != (self.after is None):
            raise ValueError("set both before and after (the same field for one payload) or neither (flat records)")
        if self.starting_version is not None and self.starting_timestamp is not None:
            raise ValueError("set starting_version or starting_timestamp, not both")
        self._check_passthrough()
        self._check_format(codes)
        return self

    def _check_passthrough(self) -> None:
        top_level = {self.op, *(self.image_fields or ())}
        if self.op in (self.before, self.after):
            raise ValueError(f"op field {self.op!r} clashes with the before/after field of the same name")
        seen: set[str] = set()
        for name in self.passthrough:
            if name in seen:
                raise ValueError(f"passthrough {name!r} is listed twice")
            if name in top_level:
                raise ValueError(f"passthrough {name!r} clashes with the op/before/after field of the same name")
            if name in self.primary_key:
                raise ValueError(f"passthrough {name!r} is a primary key column; images must keep the key")
            if name == ChangeFeedColumn.CHANGE_TYPE:
                raise ValueError(f"passthrough {name!r} cannot be passed through")
            if self.debezium_envelope and name in DEBEZIUM_RESERVED:
                raise ValueError(f"passthrough {name!r} clashes with the Debezium envelope field of the same name")
            seen.add(name)

    def _check_format(self, codes: OpCodes) -> None:
        if self.format == "avro-confluent" and self.schema_registry is None:
            raise ValueError("format avro-confluent needs schema_registry_url or a `schema_registry: {url: ...}` block")
        if self.format == "deletion-flag-json" and self.image_fields is not None:
            raise ValueError("format deletion-flag-json writes flat records: leave before and after unset")
        if not self.debezium_envelope:
            return
        if (self.op, self.before, self.after) != (Envelope.OP, Envelope.BEFORE, Envelope.AFTER):
            raise ValueError("a Debezium envelope has the fields op, before and after: leave them at their defaults")
        bad = sorted(set(codes.codes.values()) - DEBEZIUM_CODES)
        if bad:
            raise ValueError(f"a Debezium envelope takes the op codes c, r, u, d; op_mapping gives {bad}")
        if _UB in codes.codes and not codes.combines_updates:
            raise ValueError("a Debezium envelope has no update-before record: map "
                             "'UPDATE_BEFORE, UPDATE_AFTER' to 'u' together, or leave UPDATE_BEFORE out")

    @property
    def op_codes(self) -> OpCodes:
        """The validated op mapping."""
        return parse_op_mapping(self.op_mapping)

    @property
    def image_fields(self) -> tuple[str, str] | None:
        """(before, after) output fields; None for flat records.

        Combining -U/+U into one record needs both images: with neither field set, they are
        named `before` and `after` (spec 4.2.1.3.1).
        """
        if self.before is not None and self.after is not None:
            return self.before, self.after
        return DEFAULT_IMAGE_FIELDS if parse_op_mapping(self.op_mapping).combines_updates else None

    @property
    def debezium_envelope(self) -> bool:
        """True when values are Debezium envelopes: debezium-json, or avro-confluent with the debezium preset."""
        return self.format == "debezium-json" or (self.format == "avro-confluent" and self.preset == "debezium")
