"""An independent reference for the regular join: the join of two final source tables, by plain Python."""

from __future__ import annotations


def reference_join(left: dict, right: dict, left_key: str, right_key: str, outer: bool,
                   right_columns: tuple[str, ...]) -> list[dict]:
    """Rows of `left` (pk -> row) joined with `right` on left[left_key] == right[right_key]; a right
    column the left row also has is renamed with suffix 0; `outer`: unmatched left rows with nulls."""
    out = []
    for lrow in left.values():
        matches = [r for r in right.values() if lrow.get(left_key) is not None and r[right_key] == lrow[left_key]]
        if not matches and outer:
            matches = [dict.fromkeys(right_columns)]
        for rrow in matches:
            out.append({**lrow, **{(c + "0" if c in lrow else c): v for c, v in rrow.items()}})
    return out


def normalized(rows: list[dict], columns: tuple[str, ...]) -> list[tuple]:
    """Rows as sorted tuples of `columns` (missing columns as None), for comparison."""
    return sorted((tuple(row.get(c) for c in columns) for row in rows), key=repr)
