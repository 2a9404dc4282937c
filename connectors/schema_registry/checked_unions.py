"""Union branch indices checked in a bulk Avro read, as the record-by-record reader checks them.

Arrow's Rust Avro reader decodes a nullable union (`["null", T]` or `[T, "null"]`) by asking only
whether the branch index is the null one: any other index reads `T`. fastavro (the reference)
refuses an index outside the union, so a value whose index byte was damaged would be read in bulk
and refused one by one. The general unions of the Rust reader check the index, so the bulk
container declares each nullable union with a third branch (a primitive other than `T`) that no
writer of the registered schema uses:

    with_checked_unions(definition)     every 2-branch union with null gains the extra branch
    without_checked_unions(array)       the dense unions read back to nullable arrays, and the mask
                                        of the rows that used the extra branch somewhere

An index beyond the third branch (or a negative one) makes the reader raise, which the caller
bisects to the record. Rows in the mask, and records the reader refuses, are decoded the
reference way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NULL = "null"
EXTRA_BRANCH = "boolean"
EXTRA_BRANCH_FOR_BOOLEANS = "int"
NAME_PREFIX = "CdcLakehouseNamed"


def _is(branch: Any, kind: str) -> bool:
    return branch == kind or (isinstance(branch, dict) and branch.get("type") == kind and len(branch) == 1)


class RecursiveSchema(ValueError):
    """A named type that holds itself: it cannot be written out in full."""


def with_checked_unions(definition: Any) -> Any:
    """The schema definition (without logical types) written out in full for the bulk reader: every
    2-branch union with null carries a third, unused branch, and every named type is defined where
    it is used, under a name of its own (the Rust reader resolves the branches of a union that
    refers to a named type by name wrongly). Raises `RecursiveSchema` for a recursive type."""
    import fastavro

    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(definition, named)
    return _expanded(parsed, named, frozenset(), [0])


def _expanded(schema: Any, named: dict[str, Any], visiting: frozenset[str], counter: list[int]) -> Any:
    if isinstance(schema, list):
        branches = [_expanded(branch, named, visiting, counter) for branch in schema]
        values = [branch for branch in branches if not _is(branch, NULL)]
        if len(branches) == 2 and len(values) == 1:
            branches.append(EXTRA_BRANCH_FOR_BOOLEANS if _is(values[0], EXTRA_BRANCH) else EXTRA_BRANCH)
        return branches
    if isinstance(schema, str):
        if schema not in named:
            return schema
        if schema in visiting:
            raise RecursiveSchema(f"{schema} holds itself")
        return _expanded(named[schema], named, visiting | {schema}, counter)
    kind = schema["type"]
    if kind == "array":
        return {"type": "array", "items": _expanded(schema["items"], named, visiting, counter)}
    if kind == "map":
        return {"type": "map", "values": _expanded(schema["values"], named, visiting, counter)}
    if kind not in ("record", "error", "enum", "fixed"):
        return kind if isinstance(kind, str) else _expanded(kind, named, visiting, counter)
    counter[0] += 1
    name = f"{NAME_PREFIX}{counter[0]}"
    if kind == "enum":
        return {"type": "enum", "name": name, "symbols": list(schema["symbols"])}
    if kind == "fixed":
        return {"type": "fixed", "name": name, "size": schema["size"]}
    inner = visiting | {schema["name"]}
    return {"type": "record", "name": name, "fields": [
        {"name": item["name"], "type": _expanded(item["type"], named, inner, counter)} for item in schema["fields"]]}


def without_checked_unions(array: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(`array` with each checked union read back to a nullable array of its value branch, the
    mask of the rows where the extra branch was taken at any depth)."""
    kind = array.type
    if isinstance(kind, pa.UnionType):
        return _union(array)
    if pa.types.is_struct(kind):
        children, bad = [], np.zeros(len(array), bool)
        for child in array.flatten():
            converted, misread = without_checked_unions(child)
            children.append(converted)
            bad |= misread
        mask = array.is_null() if array.null_count else None
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, names=names, mask=mask), bad
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values, misread = without_checked_unions(array.values)
        bad = np.zeros(len(array), bool)
        if misread.any():
            parents = pc.list_parent_indices(array).to_numpy()
            first = array.offsets[0].as_py()
            bad[parents[np.flatnonzero(misread[first:first + len(parents)])]] = True
        build = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        mask = array.is_null() if array.null_count else None
        return build.from_arrays(array.offsets, values, mask=mask), bad
    return array, np.zeros(len(array), bool)


def _union(array: pa.UnionArray) -> tuple[pa.Array, np.ndarray]:
    kind = array.type
    if kind.mode != "dense" or kind.num_fields != 3:
        raise ValueError(f"a union the bulk container does not declare: {kind}")
    codes = kind.type_codes
    null_branch = next(i for i in range(2) if pa.types.is_null(kind.field(i).type))
    value_branch = 1 - null_branch
    type_ids = array.type_codes.to_numpy()
    offsets = array.offsets.to_numpy()
    bad = type_ids == codes[2]
    value, misread = without_checked_unions(array.field(value_branch))
    is_value = type_ids == codes[value_branch]
    if misread.any():
        bad |= is_value & misread[np.where(is_value, offsets, 0)]
    return value.take(pa.array(offsets, pa.int32(), mask=~is_value)), bad
