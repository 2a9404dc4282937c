"""FROM_CHANGELOG `op_mapping`: input op codes -> change kinds (spec 4.1.2.1), validated per 4.3.6.

An entry maps a comma-separated list of op codes to a comma-separated list of kind names,
exactly as the spec writes it: `{'c, r': 'INSERT', 'u': 'UPDATE_BEFORE, UPDATE_AFTER'}`.
Op codes are compared as text (`op_code_text`), so a boolean deletion flag maps through
`'true'` / `'false'`. Validation happens before a pipeline starts; every error names the
offending entry exactly as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from vocabulary.changes import ChangeKind
from vocabulary.errors import ConfigError

KIND_BY_NAME: dict[str, ChangeKind] = {kind.name: kind for kind in ChangeKind}
"""Kind names of the spec (RowKind): INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE."""

LIST_SEPARATOR = ","
MAX_CODE_CHARS = 20


class Grouping(str, Enum):
    """The kinds one op code stands for; only these groupings are valid (spec 4.3.6)."""

    INSERT = "INSERT"
    UPDATE_BEFORE = "UPDATE_BEFORE"
    UPDATE_AFTER = "UPDATE_AFTER"
    DELETE = "DELETE"
    UPDATE = "UPDATE_BEFORE, UPDATE_AFTER"
    UPSERT = "INSERT, UPDATE_AFTER"
    UPSERT_RETRACT = "INSERT, UPDATE_BEFORE, UPDATE_AFTER"

    @property
    def kinds(self) -> frozenset[ChangeKind]:
        """The change kinds of this grouping."""
        return frozenset(KIND_BY_NAME[name.strip()] for name in self.value.split(LIST_SEPARATOR))

    @property
    def needs_state(self) -> bool:
        """True when the kind of the output depends on what was seen before for the key."""
        return self in (Grouping.UPSERT, Grouping.UPSERT_RETRACT)


_GROUPING_BY_KINDS: dict[frozenset[ChangeKind], Grouping] = {grouping.kinds: grouping for grouping in Grouping}

DEFAULT_OP_MAPPING: dict[str, str] = {kind.name: kind.name for kind in ChangeKind}
"""Spec default: the op column holds the kind names themselves."""


def op_code_text(value: Any) -> str:
    """An op value as the text op_mapping codes are compared with (booleans as 'true'/'false')."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def split_list(text: str) -> list[str]:
    """Items of a comma-separated list, stripped."""
    return [item.strip() for item in text.split(LIST_SEPARATOR)]


def _entry(codes: str, kinds: str) -> str:
    return f"op_mapping entry {codes!r}: {kinds!r}"


def _grouping(codes: str, kinds: str) -> Grouping:
    names = split_list(kinds)
    unknown = [name for name in names if name not in KIND_BY_NAME]
    if unknown:
        hint = ""
        if all(code in KIND_BY_NAME for code in split_list(codes)):
            hint = " (the keys are op codes of the input and the values are kinds, not the other way round)"
        valid = ", ".join(KIND_BY_NAME)
        raise ConfigError(f"{_entry(codes, kinds)}: {unknown[0]!r} is not a change kind (valid: {valid}){hint}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{_entry(codes, kinds)}: a kind is listed twice")
    grouping = _GROUPING_BY_KINDS.get(frozenset(KIND_BY_NAME[name] for name in names))
    if grouping is None:
        valid = "; ".join(repr(g.value) for g in Grouping if len(g.kinds) > 1)
        raise ConfigError(
            f"{_entry(codes, kinds)}: these kinds cannot be grouped (valid groupings: a single kind; {valid})"
        )
    return grouping


def parse_op_mapping(mapping: Mapping[str, str]) -> dict[str, Grouping]:
    """Validate an op_mapping (spec 4.3.6) and return op code -> grouping.

    Rules: kind names are INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE; a kind appears at most
    once across all entries; multi-kind entries are one of the `Grouping` values; a code appears
    in one entry only and is not empty. Raises `ConfigError` naming the entry as written.
    """
    if not mapping:
        raise ConfigError("op_mapping is empty: map at least one op code to a kind")
    by_code: dict[str, Grouping] = {}
    entry_of_code: dict[str, str] = {}
    entry_of_kind: dict[ChangeKind, str] = {}
    for codes, kinds in mapping.items():
        entry = _entry(codes, kinds)
        grouping = _grouping(codes, kinds)
        for kind in sorted(grouping.kinds, key=lambda k: k.name):
            if kind in entry_of_kind:
                raise ConfigError(f"{entry}: kind {kind.name} is already mapped by {entry_of_kind[kind]}")
            entry_of_kind[kind] = entry
        for code in split_list(codes):
            if not code:
                raise ConfigError(f"{entry}: an op code is empty")
            if code in entry_of_code:
                raise ConfigError(f"{entry}: op code {code!r} is already mapped by {entry_of_code[code]}")
            entry_of_code[code] = entry
            by_code[code] = grouping
    return by_code


def shown_code(code: str) -> str:
    """An op code for an error message: quoted and cut short (it may be arbitrary input)."""
    return repr(code[:MAX_CODE_CHARS])
