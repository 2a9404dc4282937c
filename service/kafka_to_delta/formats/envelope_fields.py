"""The fields of JSON change envelopes that a bulk parse needs, cut out of each value by msgspec.

A Debezium envelope carries more than its op code and row images: `source` (15 fields, about 40 % of
a schema-less capture record), `transaction`, `ts_ms`, `ts_us`, `ts_ns`. Where the bulk decode
(`source.debezium_columns`) parses envelopes whose image columns are inferred, `pyarrow.json` must
build every other field as well. This pass keeps, of each value, only the named fields, each as
written (msgspec's `Raw`: the field's JSON text, not converted), so the parse reads
`{"op":...,"before":...,"after":...}`; figures in docs/design/ingest-data-path.md ("The envelope's
fields cut out before the parse").

msgspec reads each whole value as one JSON document (RFC 8259: no `NaN`, no content after it, valid
escapes; a field named twice counts with its last value, as Python's `json` reads it). A value it
refuses is returned as refused, for the record-by-record way to decide. It does not check UTF-8 in
the fields it skips: the caller screens that.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from service.kafka_to_delta.formats.bulk_values import json_lines

_NULL = msgspec.Raw(b"null")
_ENCODER = msgspec.json.Encoder()


@lru_cache(maxsize=16)
def _decoder(names: tuple[str, ...]) -> msgspec.json.Decoder:
    fields = [(f"f{i}", msgspec.Raw, _NULL) for i in range(len(names))]
    kept: Any = msgspec.defstruct("Kept", fields, rename={f"f{i}": name for i, name in enumerate(names)})
    return msgspec.json.Decoder(kept)


def kept_fields(values: pa.Array, names: tuple[str, ...]) -> tuple[bytes, np.ndarray]:
    """Newline-delimited JSON: each value not refused as an object holding only the fields `names`, as
    written, in that order (a field the value lacks as null, which a parse with an explicit schema reads
    alike); and the mask of the values refused (not one JSON object). `values`: binary, none null, none
    holding a line break."""
    decoder = _decoder(names)
    refused = np.zeros(len(values), np.bool_)
    try:
        kept = decoder.decode_lines(json_lines(values))  # the whole batch in one call
        if len(kept) == len(values):
            return _ENCODER.encode_lines(kept), refused
    except msgspec.DecodeError:
        pass
    kept = []  # one refused (or a line count that does not match): value by value
    for position, value in enumerate(values.to_pylist()):
        try:
            kept.append(decoder.decode(value))
        except msgspec.DecodeError:
            refused[position] = True
    return _ENCODER.encode_lines(kept), refused
