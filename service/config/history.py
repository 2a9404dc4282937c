"""`history:` of a pipeline: an SCD type 2 history table written next to its current-row table.

`history: scd2` stands for `history: {mode: scd2}`. The history table (`table`, default
`<pipeline table>_history`) keeps one row per version of a key, valid from `__START_AT` to
`__END_AT` (null: the current version), both values of `sequence_by`: one path into the record
(a row column of that name, else an envelope path such as `source.lsn`); for the Debezium
presets it defaults to `source.lsn`, the change's position in the source's log.

`track_history_column_list` / `track_history_except_column_list` (one of them) name the columns
whose changes open a new version; a change to other columns updates the current version in
place. `delete_markers: true` keeps a row with `__DELETED` true for each delete.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from service.config.base import Name, Names, SettingsModel

HistoryMode = Literal["scd2"]
START_AT = "__START_AT"
END_AT = "__END_AT"
UPDATED_AT = "__UPDATED_AT"
DELETED = "__DELETED"
VALIDITY_COLUMNS = (START_AT, END_AT, UPDATED_AT, DELETED)
DEBEZIUM_SEQUENCE = ("source.lsn",)
HISTORY_TABLE_SUFFIX = "_history"


def shorthand(value: Any) -> Any:
    """`history: scd2` as `history: {mode: scd2}`."""
    return {"mode": value} if isinstance(value, str) else value


class HistorySettings(SettingsModel):
    """One pipeline's history table (see the module's text)."""

    mode: HistoryMode = "scd2"
    table: Name | None = None
    sequence_by: Names = ()
    track_history_column_list: Names | None = None
    track_history_except_column_list: Names | None = None
    delete_markers: bool = False

    @model_validator(mode="after")
    def _one_track_list(self) -> "HistorySettings":
        if self.track_history_column_list is not None and self.track_history_except_column_list is not None:
            raise ValueError("history: give track_history_column_list or track_history_except_column_list, not both")
        if len(self.sequence_by) > 1:
            raise ValueError("history: sequence_by names one value (the versions' __START_AT / __END_AT)")
        reserved = [c for c in (*(self.track_history_column_list or ()), *(self.track_history_except_column_list or ()))
                    if c in VALIDITY_COLUMNS]
        if reserved:
            raise ValueError(f"history: {reserved} are the history table's own columns, not trackable")
        return self

    def table_for(self, current_table: str) -> str:
        """The history table's name next to the pipeline's `current_table`."""
        return self.table or f"{current_table}{HISTORY_TABLE_SUFFIX}"

    def tracked(self, columns: list[str], primary_key: tuple[str, ...]) -> list[str]:
        """Of the data `columns`, those whose changes open a new version (the key never does: it is the key)."""
        if self.track_history_column_list is not None:
            chosen = [c for c in columns if c in self.track_history_column_list]
        else:
            excluded = set(self.track_history_except_column_list or ())
            chosen = [c for c in columns if c not in excluded]
        return [c for c in chosen if c not in primary_key and c not in VALIDITY_COLUMNS]

    def plan_properties(self, current_table: str, sequence_by: tuple[str, ...]) -> dict[str, Any]:
        """What the compiled plan records of the history (the upgrade check compares it)."""
        return {"history_mode": self.mode, "history_table": self.table_for(current_table),
                "history_sequence_by": list(sequence_by),
                "track_history_column_list": None if self.track_history_column_list is None
                else list(self.track_history_column_list),
                "track_history_except_column_list": None if self.track_history_except_column_list is None
                else list(self.track_history_except_column_list),
                "delete_markers": self.delete_markers}
