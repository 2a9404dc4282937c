"""What the vectorised decode of Debezium envelopes (`debezium_columns`) takes from a decoder's settings
(`vector_plan`: the envelope fields and, per op code, the images it emits), and the error that sends a
whole range back to the record-by-record way (`NotVectorisable`, its reason saying what).

Settings other than envelopes with an op field and plain op groupings are not this path's: `vector_plan`
gives no plan, and the ranges go the record-by-record way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.config.op_mapping import Grouping, parse_op_mapping
from service.kafka_to_delta.changelog.changelog_batch import ChangelogBatchDecoder
from service.kafka_to_delta.formats.debezium_json import JsonDocuments
from vocabulary.changes import ChangeKind

_RETRACTING = (Grouping.UPDATE_BEFORE, Grouping.DELETE)
_STATELESS = (Grouping.INSERT, Grouping.UPDATE_AFTER, Grouping.UPSERT, Grouping.UPDATE, *_RETRACTING)


class NotVectorisable(Exception):
    """The range holds something only the record-by-record way decides; the reason says what."""


@dataclass(frozen=True)
class _Side:
    """What an op code takes from one image: whether it is a retraction, whether it is optional,
    whether it is an image (a delete's is not: it never fills a later placeholder)."""

    retract: bool
    optional: bool = False
    image: bool = True
    nulls_unchanged: bool = False
    """Its nulls are unchanged markers (`ignore_null_updates`, an update's image)."""
    kind: str = ""
    """The change kind of its rows (`ChangeKind`'s text)."""


@dataclass(frozen=True)
class VectorPlan:
    """The envelope fields and, per op code, the images it emits (before side, after side)."""

    op: str
    before: str
    after: str
    codes: dict[str, tuple[_Side | None, _Side | None]]
    primary_key: tuple[str, ...]


def vector_plan(decoder: ChangelogBatchDecoder, primary_key: tuple[str, ...]) -> VectorPlan | None:
    """The plan for a decoder's records, or None when its settings are not this path's."""
    settings = decoder.settings
    if isinstance(decoder.decode_value, JsonDocuments):
        if decoder.decode_value.layout.passthrough:
            return None
    elif not is_avro(decoder.decode_value):
        return None
    if (settings.op is None or settings.before is None or settings.after is None or settings.before == settings.after
            or settings.stateful or settings.order_by is not None or settings.sequence_by or settings.passthrough
            or settings.kafka_key != "fallback"):
        return None
    stage = decoder.stage
    if stage.upsert_key != stage.primary_key or stage.partition_by != stage.primary_key:
        return None
    codes: dict[str, tuple[_Side | None, _Side | None]] = {}
    for code, grouping in parse_op_mapping(settings.op_mapping).items():
        if grouping not in _STATELESS:
            return None
        nulls = stage.ignore_null_updates and grouping not in (Grouping.INSERT, Grouping.DELETE)
        if grouping in _RETRACTING:
            kind = ChangeKind.UPDATE_BEFORE if grouping is Grouping.UPDATE_BEFORE else ChangeKind.DELETE
            codes[code] = (_Side(retract=True, image=grouping is Grouping.UPDATE_BEFORE, nulls_unchanged=nulls,
                                 kind=kind.value), None)
        elif grouping is Grouping.UPDATE:
            codes[code] = (_Side(retract=True, optional=True, nulls_unchanged=nulls,
                                 kind=ChangeKind.UPDATE_BEFORE.value),
                           _Side(retract=False, nulls_unchanged=nulls, kind=ChangeKind.UPDATE_AFTER.value))
        else:
            kind = ChangeKind.INSERT if grouping is Grouping.INSERT else ChangeKind.UPDATE_AFTER
            codes[code] = (None, _Side(retract=False, nulls_unchanged=nulls, kind=kind.value))
    return VectorPlan(settings.op, settings.before, settings.after, codes, tuple(primary_key))


def is_avro(decode_value: Any) -> bool:
    """Whether a value decoder is the Confluent Avro one (imported only where Avro is in use)."""
    return type(decode_value).__name__ == "ConfluentAvroDecoder"
