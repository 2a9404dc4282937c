"""`columns:` of a pipeline: which columns its table keeps, computed columns, a row filter, masking.

- `include` / `exclude` (one of them; Databricks' column_list / except_column_list): the source
  columns the table keeps. The primary key is always kept: `include` need not name it, `exclude`
  may not.
- `computed`: column name -> Spark SQL expression over the row image's columns, appended after the
  source columns in the order given.
- `filter`: a Spark SQL condition over the row image. A change stream's filter applies to each row
  image: an upsert whose image fails it (false or null) deletes the key from the table, so an update
  that moves a row out of the filter removes it and one that moves it back in writes it again.
  Deletes always apply.
- `mask`: column name -> `sha256`: the value is replaced by the hex SHA-256 of the salt followed by
  the value as text (null stays null), so the table never holds it. The salt is the value of the
  environment variable `salt_env` names (never the config file).

Expressions see the row image as decoded (before masking); masking applies to source and computed
columns alike; `include` / `exclude` apply to source columns. The columns named here are checked
against the primary key here; the expressions are compiled with Spark's parser by `cdc-lakehouse validate`
and `plan` (`service/runtime/sql_parser.py`) and again when the pipeline starts.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field, model_validator

from service.config.base import Identifier, Names, SettingsModel
from service.config.choices import MaskMethod

SALT_FINGERPRINT_PREFIX = b"cdc-lakehouse salt fingerprint:"
FILTER = "filter"
"""How errors name the row filter (a computed column is named by its name)."""


def salt_fingerprint(salt: str | None) -> str | None:
    """A short digest naming a salt in the compiled plan (so a changed salt is seen), never the salt."""
    if salt is None:
        return None
    return hashlib.sha256(SALT_FINGERPRINT_PREFIX + salt.encode()).hexdigest()[:16]


class ColumnSettings(SettingsModel):
    """One pipeline's column selection, computed columns, row filter and masking (see the module's text)."""

    include: Names | None = None
    exclude: Names | None = None
    computed: dict[Identifier, str] = Field(default_factory=dict)
    filter: str | None = None
    mask: dict[str, MaskMethod] = Field(default_factory=dict)
    salt_env: Identifier | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "ColumnSettings":
        if self.include is not None and self.exclude is not None:
            raise ValueError("give include or exclude, not both")
        if self.mask and self.salt_env is None:
            raise ValueError("mask needs salt_env: the environment variable holding the salt")
        for name, text in self.computed.items():
            if not text.strip():
                raise ValueError(f"computed column {name!r}: empty expression")
        if self.filter is not None and not self.filter.strip():
            raise ValueError("filter: empty expression")
        return self

    def check(self, where: str, primary_key: tuple[str, ...]) -> None:
        """Refuse what contradicts the pipeline's `primary_key` (`where` names the pipeline)."""
        excluded = [c for c in self.exclude or () if c in primary_key]
        if excluded:
            raise ValueError(f"{where}: exclude names primary key column(s) {excluded}: the key is always kept")
        clash = [c for c in self.computed if c in primary_key]
        if clash:
            raise ValueError(f"{where}: computed column(s) {clash} are primary key columns")
        if self.include is not None:
            clash = [c for c in self.computed if c in self.include]
            if clash:
                raise ValueError(f"{where}: computed column(s) {clash} are also in include")

    def expressions(self) -> dict[str, str]:
        """Every Spark SQL expression by the name errors give it: the computed columns, then `filter`."""
        return {**self.computed, **({FILTER: self.filter} if self.filter is not None else {})}

    def keeps(self, column: str, primary_key: tuple[str, ...]) -> bool:
        """Whether the table keeps source `column`."""
        if column in primary_key:
            return True
        if self.include is not None:
            return column in self.include
        return column not in (self.exclude or ())

    def plan_properties(self, salt: str | None) -> dict[str, Any]:
        """What the compiled plan records (the upgrade check compares it); `salt`: the salt as read, or None."""
        return {"include": None if self.include is None else list(self.include),
                "exclude": None if self.exclude is None else list(self.exclude),
                **{f"computed.{name}": text for name, text in self.computed.items()},
                "filter": self.filter, "mask": dict(self.mask) or None,
                "salt": salt_fingerprint(salt) if self.mask else None}
