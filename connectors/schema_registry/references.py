"""Schema references (Confluent): a schema names types that other subjects' versions define.

The codec compiles self-contained definitions, so a referenced type is inlined where the
referring schema first names it; later mentions stay names, as Avro allows.
"""

from __future__ import annotations

from typing import Any

_NESTED_KEYS = ("items", "values")


def full_name(definition: Any) -> str | None:
    """namespace.name of a named type definition (record, enum, fixed); None otherwise."""
    if not isinstance(definition, dict) or not isinstance(definition.get("name"), str):
        return None
    name, namespace = definition["name"], definition.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def inline_references(definition: Any, referenced: dict[str, Any]) -> Any:
    """`definition` with the first mention of each type of `referenced` (full name -> definition)
    replaced by that definition; mentions by short name match too."""
    pending = dict(referenced)
    short = {name.rsplit(".", 1)[-1]: name for name in referenced}
    return _inline(definition, pending, short)


def _inline(schema: Any, pending: dict[str, Any], short: dict[str, str]) -> Any:
    if isinstance(schema, str):
        name = schema if schema in pending else short.get(schema)
        if name is not None and name in pending:
            return _inline(pending.pop(name), pending, short)
        return schema
    if isinstance(schema, list):
        return [_inline(branch, pending, short) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    defined = full_name(schema)
    if defined is not None:
        pending.pop(defined, None)
    if isinstance(out.get("fields"), list):
        out["fields"] = [{**field, "type": _inline(field.get("type"), pending, short)} for field in out["fields"]]
    for key in _NESTED_KEYS:
        if key in out:
            out[key] = _inline(out[key], pending, short)
    if isinstance(out.get("type"), (dict, list)):
        out["type"] = _inline(out["type"], pending, short)
    return out
