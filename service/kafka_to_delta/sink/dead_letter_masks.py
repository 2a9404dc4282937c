"""Dead letters of a pipeline with `columns.mask`: the masked columns' raw values never stored.

A dead letter keeps its record's bytes so that it can be replayed or repaired; for a pipeline that
masks columns, those bytes would carry the raw values the table never holds. Before a dead letter is
stored, its key and value are rewritten:

- a key or value that decodes as JSON (with or without the Connect wrapper) is stored as compact
  JSON with every field named like a masked column, wherever it sits (`before`, `after`, a flat
  record, the Kafka key), holding its masked form: the hex SHA-256 of the salt followed by the value
  as text, as the table holds it (`column_rules`); null stays null. Text, integers and booleans are
  the text Spark's `CAST(v AS STRING)` gives them, so a masked text or integer column matches the
  table's hash; another value (a number with a fraction, an object, a list) is hashed over its
  compact JSON text: never the raw value, not necessarily the table's hash;
- a key or value that does not decode (not JSON, Confluent Avro, not UTF-8) is dropped: the dead
  letter keeps where the record is (topic, partition, offset, timestamp), the stage and the reason,
  and its error text says the bytes were dropped, so the record can be read again from Kafka while
  the topic retains it.

The error text of every rewritten dead letter says which was done.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa

from service.kafka_to_delta.formats.debezium_json import compact_json, loads

MASKED_NOTE = "dead letter: masked columns' values replaced by their masked form"
DROPPED_NOTE = ("dead letter: {parts} dropped (not decodable JSON, so masked columns could not be masked); "
                "read the record again from Kafka at its topic, partition and offset")


def _cast_text(value: Any) -> str:
    """`value` as Spark's CAST(v AS STRING) gives text, integers and booleans; else compact JSON."""
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) in (str, int):
        return str(value)
    return compact_json(value)


class DeadLetterMasks:
    """The masked columns of one pipeline and their salt, applied to dead letters' keys and values."""

    def __init__(self, columns: tuple[str, ...] | list[str], salt: str) -> None:
        self.columns = frozenset(columns)
        self.salt = salt

    def masked(self, value: Any) -> str | None:
        """The masked form of one value (None stays None)."""
        if value is None:
            return None
        return hashlib.sha256((self.salt + _cast_text(value)).encode()).hexdigest()

    def _document(self, document: Any) -> tuple[Any, bool]:
        """`document` with every field named like a masked column masked; whether any was."""
        changed = False
        pending = [document]
        while pending:  # iterative: documents are nested at most MAX_NESTING levels, still no recursion
            node = pending.pop()
            if type(node) is dict:
                for name, value in node.items():
                    if name in self.columns and value is not None:
                        node[name] = self.masked(value)
                        changed = True
                    elif type(value) in (dict, list):
                        pending.append(value)
            elif type(node) is list:
                pending.extend(item for item in node if type(item) in (dict, list))
        return document, changed

    def _bytes(self, data: bytes | None) -> tuple[bytes | None, str]:
        """(bytes to store, what was done: "" kept, "masked" or "dropped")."""
        if data is None:
            return None, ""
        try:
            document = loads(data)
        except ValueError:  # not JSON, not UTF-8, unusable JSON
            return None, "dropped"
        document, changed = self._document(document)
        return (compact_json(document).encode(), "masked") if changed else (data, "")

    def applied(self, letters: pa.Table) -> pa.Table:
        """Dead-letter input rows (`dead_letters.INPUT_SCHEMA`) with keys and values rewritten and the
        error text saying so."""
        keys, values, errors = [], [], []
        for key, value, error in zip(*(letters.column(c).to_pylist() for c in ("raw_key", "raw_value", "error"))):
            key, key_done = self._bytes(key)
            value, value_done = self._bytes(value)
            dropped = [part for part, done in (("key", key_done), ("value", value_done)) if done == "dropped"]
            notes = [DROPPED_NOTE.format(parts=" and ".join(dropped))] if dropped else []
            if "masked" in (key_done, value_done):
                notes.insert(0, MASKED_NOTE)
            keys.append(key)
            values.append(value)
            errors.append("; ".join([error or "", *notes]) if notes else error)
        for name, column in (("raw_key", keys), ("raw_value", values), ("error", errors)):
            field = letters.schema.field(name)
            letters = letters.set_column(letters.schema.get_field_index(name), field, pa.array(column, field.type))
        return letters
