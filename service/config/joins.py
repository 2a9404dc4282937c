"""Configuration of join pipelines (`joins:`): two inputs of change streams into one Delta table.

Two kinds, told apart by `type`:
- `inner` / `left`: a regular changelog join (spec: state-management-and-ttl, the left and right
  state of a regular join). Both inputs are changelogs; both sides are kept in state, each with
  its own TTL; the output table always equals the join of the two current input tables.
- `enrichment`: a snapshot-gated processing-time join (spec: processing-time-watermarks-snapshot-join).
  The probe input is joined with the latest row per key of the build input (a Debezium topic);
  probe records are held back until the build side's snapshot phase is complete.

Output columns: every column of the left (probe) input, then every column of the right (build)
input; a right column whose name is already taken gets the suffix `0` (as the spec's plans name
`line_order_id0`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from service.config.base import Name, Names, SettingsModel
from service.config.choices import InputFormat, JoinType, MissingPolicy, OnConflict, StartingOffsets
from service.config.from_changelog import FromChangelogSettings
from service.config.registry import SchemaRegistrySettings


class JoinInput(SettingsModel):
    """One input of a join: topics of one format, decoded as an ingest pipeline decodes them."""

    topics: Names = Field(min_length=1)
    format: InputFormat = "json"
    schema_registry: SchemaRegistrySettings | None = None
    from_changelog: FromChangelogSettings = Field(default_factory=lambda: FromChangelogSettings(preset="debezium"))
    primary_key: Names = Field(min_length=1)  # the key of this input's rows (its state key)
    join_key: Names = Field(min_length=1)  # the columns matched against the other input's
    starting_offsets: StartingOffsets | dict[str, dict[str, int]] = "earliest"


class _JoinBase(SettingsModel):
    name: Name
    table: Name
    primary_key: Names = Field(min_length=1)  # of the output table
    left: JoinInput
    right: JoinInput
    max_offsets_per_trigger: int | None = Field(default=200_000, ge=1)
    state_ttl_seconds: float = Field(default=0.0, ge=0)  # 0: kept until the data removes it

    @model_validator(mode="after")
    def _matching_keys(self) -> "_JoinBase":
        if len(self.left.join_key) != len(self.right.join_key):
            raise ValueError(f"join {self.name}: left.join_key {list(self.left.join_key)} and right.join_key "
                             f"{list(self.right.join_key)} must have as many columns")
        shared = set(self.left.topics) & set(self.right.topics)
        if shared:
            raise ValueError(f"join {self.name}: topic(s) {sorted(shared)} feed both inputs")
        return self

    @property
    def topics(self) -> tuple[str, ...]:
        return self.left.topics + self.right.topics


class RegularJoinSettings(_JoinBase):
    """A regular changelog join (inner or left outer); the output goes through the materializer rules
    with the pair of input keys as its upsert key."""

    type: JoinType
    left_state_ttl_seconds: float | None = Field(default=None, ge=0)  # unset: state_ttl_seconds
    right_state_ttl_seconds: float | None = Field(default=None, ge=0)
    on_conflict: OnConflict = "error"

    @property
    def left_ttl_seconds(self) -> float:
        return self.state_ttl_seconds if self.left_state_ttl_seconds is None else self.left_state_ttl_seconds

    @property
    def right_ttl_seconds(self) -> float:
        return self.state_ttl_seconds if self.right_state_ttl_seconds is None else self.right_state_ttl_seconds


class EnrichmentJoinSettings(_JoinBase):
    """A snapshot-gated processing-time join: `left` is the probe input, `right` the build input."""

    type: Literal["enrichment"]
    gate: bool = True  # off: probe records are joined as soon as they are read (the negative control)
    missing: MissingPolicy = "nulls"  # a probe record with no build row: emit with nulls, drop and count, dead-letter
    dead_letter_topic: str | None = None

    @model_validator(mode="after")
    def _dead_letter_target(self) -> "EnrichmentJoinSettings":
        if self.missing == "dead_letter" and not self.dead_letter_topic:
            raise ValueError(f"join {self.name}: `missing: dead_letter` needs `dead_letter_topic`")
        if set(self.right.join_key) != set(self.right.primary_key):
            raise ValueError(f"join {self.name}: the build input keeps its latest row per key: right.join_key "
                             f"{list(self.right.join_key)} must be its primary_key {list(self.right.primary_key)}")
        return self


JoinSettings = RegularJoinSettings | EnrichmentJoinSettings
