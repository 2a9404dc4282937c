"""FROM_CHANGELOG, stateless part: one decoded input record -> changelog rows (spec 4.1).

Rules, in the order they apply to a record:
- A tombstone (null value) follows a delete and yields nothing; with `op: null` (no op field)
  it is the record's op: a delete of the Kafka key.
- The op code is compared as text; a missing or NULL op is an error (spec 4.3.5). A code not
  in op_mapping: Debezium's 'm' (logical message) is skipped, 't' (truncate) follows
  `truncate_handling`, anything else `invalid_op_handling` (spec 4.3.1).
- INSERT / UPDATE_AFTER rows come from the `after` image, UPDATE_BEFORE / DELETE rows from
  `before` (either one standing in for the other when only one is set; the record minus the
  op field when neither is). A delete without its image falls back to the Kafka key (a
  partial delete) unless `consume_full_deletes`; deletes pass through as they come.
- 'UPDATE_BEFORE, UPDATE_AFTER' without a before image emits +U alone, or leaves the -U to
  the stateful stage (`Intent`); groupings that need state are marked the same way.
- An envelope's image in a record that declares its columns (a schema block, an Avro schema) is read as
  the schema declares it (`declared_image`: declared order, a column left out null, a float column's
  integer literal a float), so the same values give the same row however the record spelled them.
- Debezium's unavailable-value placeholder is removed from the row and the column listed in
  `unchanged`: the sink keeps the stored value. With `ignore_null_updates` (the pipeline's
  `table_shape`) a null in an image of an update (any op code not mapped to INSERT or DELETE) is
  such a marker too, the primary key's excepted. Passthrough paths become extra columns.
- Every row needs non-NULL primary-key, upsert-key and partition columns (spec 4.3.5).

Errors are `RecordRejected` carrying the policy that applies; reasons never quote row values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Literal, NamedTuple

from connectors.delta.arrow_types import TypeName
from service.config.from_changelog import (
    PATH_SEPARATOR,
    TOMBSTONE_CODE,
    VALUE_CODE,
    FromChangelogSettings,
    RecordHandling,
)
from service.config.op_mapping import (
    Grouping,
    op_code_text,
    parse_op_mapping,
    shown_code,
)
from service.kafka_to_delta.changelog.declared_image import DeclaredImage
from service.kafka_to_delta.formats.debezium_json import (
    UNAVAILABLE_VALUE,
    canonical_json,
    canonical_key,
    json_key,
)
from vocabulary.changes import ChangeKind, DebeziumOp, Envelope
from vocabulary.errors import ConfigError, DecodeError, SourceCoordinates

Stage = Literal["decode", "from_changelog"]
KeyDecoder = Callable[[bytes], tuple[Any, Any]]
SNAPSHOT_FIELD = "snapshot"  # in the Debezium `source` block
TRUNCATE_FAILS = (
    f"truncate event (op {DebeziumOp.TRUNCATE.value!r}) and truncate_handling is 'fail': set it to 'truncate' "
    "to empty the table, to 'ignore' to keep the rows, or exclude truncates in the connector (skipped.operations)"
)
_IN_RECORD = "the record"
_NO_COLUMNS: dict[str, Any] = {}
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)
_UNITS_PER_MS = {TypeName.TIMESTAMP_US: 1_000, TypeName.TIMESTAMP_NS: 1_000_000}
_MS_PER_DAY = 86_400_000
# Event times a datetime can hold: beyond them no timestamp column or watermark can either.
_MIN_MS = (datetime.min.replace(tzinfo=timezone.utc) - _EPOCH) // _MS
_MAX_MS = (datetime.max.replace(tzinfo=timezone.utc) - _EPOCH) // _MS


class Marker(str, Enum):
    """Rows that are not changes of one key."""

    TRUNCATE = "TRUNCATE"


class Intent(str, Enum):
    """A row whose final kind the stateful stage (`upsert_unzip`) decides from the previous image."""

    UPSERT = "upsert"  # +I when the key is unseen, else +U
    UPSERT_RETRACT = "upsert_retract"  # +I when unseen, else -U(previous) +U
    UPDATE_RETRACT = "update_retract"  # -U(previous) +U; +I when the previous image is gone (spec 4.3.3)


class RecordRejected(DecodeError):
    """A record the stage cannot turn into changes, and the policy that applies to it."""

    def __init__(
        self, reason: str, handling: RecordHandling, stage: Stage = "from_changelog",
        where: SourceCoordinates | None = None,
    ) -> None:
        super().__init__(reason, where)
        self.handling = handling
        self.stage = stage

    def at(self, where: SourceCoordinates) -> "RecordRejected":
        """The same rejection, located at `where`."""
        return RecordRejected(self.reason, self.handling, self.stage, where)


class ChangelogRow(NamedTuple):
    """One output row. Keys are canonical JSON lists of column values (the whole row as a
    canonical JSON object when the upsert key is empty); `sequence` a canonical JSON list."""

    kind: ChangeKind | Marker
    row: dict[str, Any] | None
    key: str | None
    upsert_key: str | None
    partition_key: str | None
    unchanged: tuple[str, ...] = ()
    intent: Intent | None = None
    snapshot: str | None = None
    sequence: str | None = None
    event_time: int | None = None


class _Side(Enum):
    AFTER = "after"
    BEFORE = "before"
    DELETE = "delete"


_Step = tuple[ChangeKind, _Side, "Intent | None"]
_FIXED_PLANS: dict[Grouping, tuple[_Step, ...]] = {
    Grouping.INSERT: ((ChangeKind.INSERT, _Side.AFTER, None),),
    Grouping.UPDATE_AFTER: ((ChangeKind.UPDATE_AFTER, _Side.AFTER, None),),
    Grouping.UPDATE_BEFORE: ((ChangeKind.UPDATE_BEFORE, _Side.BEFORE, None),),
    Grouping.DELETE: ((ChangeKind.DELETE, _Side.DELETE, None),),
    Grouping.UPSERT_RETRACT: ((ChangeKind.UPDATE_AFTER, _Side.AFTER, Intent.UPSERT_RETRACT),),
}
_KEEPS_NULLS = (Grouping.INSERT, Grouping.DELETE)
"""Groupings whose images store their nulls under `ignore_null_updates` (an insert has nothing to keep)."""
_RETRACT_PLAN: tuple[_Step, ...] = (
    (ChangeKind.UPDATE_BEFORE, _Side.BEFORE, None),
    (ChangeKind.UPDATE_AFTER, _Side.AFTER, None),
)


def path_value(document: dict, segments: tuple[str, ...]) -> Any:
    """The value at a field path of a document; None when any step is missing."""
    value: Any = document
    for segment in segments:
        if not isinstance(value, dict):
            return None
        value = value.get(segment)
    return value


def event_time_ms(value: Any, type_name: str | None = None) -> int:
    """Epoch milliseconds of an event-time value: a number (milliseconds, or the unit of its
    Connect type), ISO-8601 text (UTC when no offset) or a datetime. Raises `ValueError`,
    also for a time outside the years 1-9999 (or a number that is not finite)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
        except ValueError:
            raise ValueError("not ISO-8601 text") from None  # the message would quote the value
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return (moment - _EPOCH) // _MS
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("not a finite number")
        if type_name == TypeName.DATE32:
            ms = int(value) * _MS_PER_DAY
        else:
            ms = int(value) // _UNITS_PER_MS.get(type_name or "", 1)
        if not _MIN_MS <= ms <= _MAX_MS:
            raise ValueError("out of range (years 1-9999)")
        return ms
    raise ValueError(f"not a timestamp (got {type(value).__name__})")


class _Record:
    """One input record while it is converted: lazily derived views of it."""

    __slots__ = ("document", "kafka_key", "key_image", "flat", "declared")

    def __init__(self, document: dict | None, kafka_key: bytes | None, declared: DeclaredImage | None = None) -> None:
        self.document = document
        self.kafka_key = kafka_key
        self.declared = declared  # the envelope's images as the record's schema declares them
        self.key_image: dict | None = None
        self.flat: dict | None = None


class FromChangelog:
    """Converts decoded input records to changelog rows under one `FromChangelogSettings`.

    `primary_key` is the sink's; `upsert_key` relates the input's upserts (None: the primary
    key; empty: the whole row); `partition_by` defaults to the upsert key (the primary key when
    that is the whole row). Raises `ConfigError` when keys and settings do not fit together.
    """

    def __init__(
        self, settings: FromChangelogSettings, primary_key: tuple[str, ...],
        upsert_key: tuple[str, ...] | None = None, key_decoder: KeyDecoder = json_key,
        ignore_null_updates: bool = False,
    ) -> None:
        if not primary_key:
            raise ConfigError("primary_key: at least one column is needed")
        self.settings = settings
        self.primary_key = tuple(primary_key)
        self.upsert_key = self.primary_key if upsert_key is None else tuple(upsert_key)
        self.partition_by = settings.partition_by or self.upsert_key or self.primary_key
        if settings.stateful and (not self.upsert_key or not set(self.upsert_key) <= set(self.partition_by)):
            raise ConfigError(
                "state_ttl_seconds keeps the previous image per key: it needs an upsert key "
                "and partition_by must hold every upsert key column"
            )
        self._upsert_is_primary = self.upsert_key == self.primary_key
        self._partition_is_primary = self.partition_by == self.primary_key
        self._key_decoder = key_decoder
        self.ignore_null_updates = ignore_null_updates
        self._groupings = parse_op_mapping(settings.op_mapping)
        self._after = settings.after or settings.before
        self._before = settings.before or settings.after
        self._separate_before = settings.before is not None and settings.after not in (None, settings.before)
        self._passthrough = tuple(
            (tuple(path.split(PATH_SEPARATOR)), column)
            for path, column in settings.passthrough_columns.items()
            if settings.envelope or PATH_SEPARATOR in path  # flat: top-level fields are row columns already
        )
        self._declared: tuple[dict | None, DeclaredImage | None] = (None, None)
        self._where = {field: f"the {field!r} image" for field in (settings.before, settings.after) if field}
        self._sequence = tuple(tuple(path.split(PATH_SEPARATOR)) for path in settings.sequence_by)
        self._per_record = bool(settings.sequence_by or settings.order_by or self._passthrough)
        self._order_by = None if settings.order_by is None else tuple(settings.order_by.split(PATH_SEPARATOR))
        # Without state an upsert is a +U, and an update without its before image a +U alone.
        upsert, update = (Intent.UPSERT, Intent.UPDATE_RETRACT) if settings.stateful else (None, None)
        self._plans = {
            **_FIXED_PLANS,
            Grouping.UPSERT: ((ChangeKind.UPDATE_AFTER, _Side.AFTER, upsert),),
            Grouping.UPDATE: ((ChangeKind.UPDATE_AFTER, _Side.AFTER, update),),
        }

    def convert(
        self, document: Any, kafka_key: bytes | None = None, column_types: dict[str, str] | None = None
    ) -> list[ChangelogRow]:
        """Changelog rows of one decoded record (`document` None: a tombstone).

        Raises `RecordRejected` with the policy for the record (decode_error_handling,
        invalid_op_handling, or FAIL for truncates and passthrough clashes).
        """
        if document is None:
            if self.settings.op is not None:
                return []  # the tombstone after a delete: the delete said it all
            code = TOMBSTONE_CODE
        elif not isinstance(document, dict):
            raise self._invalid(f"record is not an object (got {type(document).__name__})")
        else:
            code = self._code(document)
        grouping = self._groupings.get(code)
        if grouping is None:
            return self._unmapped(code, document, column_types)
        record = _Record(document, kafka_key, self._declared_image(column_types))
        plan = self._plans[grouping]
        if grouping is Grouping.UPDATE and self._has_before_image(document):
            plan = _RETRACT_PLAN
        images = [(kind, *self._image(side, record, code), intent) for kind, side, intent in plan]
        meta = self._meta(record.document, images[-1][1], column_types, required=True)
        nulls = self.ignore_null_updates and grouping not in _KEEPS_NULLS
        return [self._row(kind, image, where, intent, meta, nulls) for kind, image, where, intent in images]

    def _declared_image(self, column_types: dict[str, str] | None) -> DeclaredImage | None:
        if column_types is None:
            return None
        if column_types is not self._declared[0]:
            self._declared = (column_types, DeclaredImage(column_types))
        return self._declared[1]

    def _has_before_image(self, document: dict | None) -> bool:
        return self._separate_before and document is not None and isinstance(document.get(self._before), dict)

    def _invalid(self, reason: str) -> RecordRejected:
        return RecordRejected(reason, self.settings.decode_error_handling)

    def _code(self, document: dict) -> str:
        op = self.settings.op
        if op is None:
            return VALUE_CODE
        if op not in document:
            raise self._invalid(f"record has no {op!r} field")
        value = document[op]
        if value is None:
            raise self._invalid(f"record has a null {op!r} field")
        return value if type(value) is str else op_code_text(value)

    def _unmapped(self, code: str, document: dict | None, column_types: dict[str, str] | None) -> list[ChangelogRow]:
        if code == DebeziumOp.MESSAGE.value:
            return []
        if code != DebeziumOp.TRUNCATE.value or document is None:
            raise RecordRejected(f"unknown op code {shown_code(code)}", self.settings.invalid_op_handling)
        if self.settings.truncate_handling == "ignore":
            return []
        if self.settings.truncate_handling == "fail":
            raise RecordRejected(TRUNCATE_FAILS, "FAIL")
        snapshot, sequence, event_time, _ = self._meta(document, None, column_types, required=False)
        return [ChangelogRow(Marker.TRUNCATE, None, None, None, None, (), None, snapshot, sequence, event_time)]

    def _image(self, side: _Side, record: _Record, code: str) -> tuple[dict, str]:
        """(row image, where it came from) for one side of a record."""
        if side is _Side.DELETE:
            image, where = self._delete_image(record)
        elif record.document is None:
            raise self._invalid(f"op {shown_code(code)} is mapped to a kind that needs a row, and the value is null")
        else:
            field = self._after if side is _Side.AFTER else self._before
            image, where = self._side_image(record, field)
            if image is None:
                raise self._invalid(f"op {shown_code(code)} event has no {field!r} object")
        if self.settings.kafka_key == "columns":
            return {**self._key_image(record, "kafka_key is 'columns'"), **image}, _IN_RECORD
        return image, where

    def _side_image(self, record: _Record, field: str | None) -> tuple[dict | None, str]:
        if field is None:
            if record.flat is None:
                record.flat = dict(record.document)
                record.flat.pop(self.settings.op, None)
            return record.flat, _IN_RECORD
        image = record.document.get(field)
        if not isinstance(image, dict):
            return None, self._where[field]
        return (image if record.declared is None else record.declared(image)), self._where[field]

    def _delete_image(self, record: _Record) -> tuple[dict, str]:
        if record.document is not None:
            image, where = self._side_image(record, self._before)
            if image is not None:
                return image, where
        missing = f"delete event has no {self._before or 'row'!r} object"
        if self.settings.consume_full_deletes:
            raise self._invalid(f"{missing} and consume_full_deletes is set (a full delete needs the row image)")
        if self.settings.kafka_key == "columns":
            return {}, "the Kafka key"  # the key columns are added by the caller
        return self._key_image(record, missing), "the Kafka key"

    def _key_image(self, record: _Record, why: str) -> dict:
        if record.key_image is not None:
            return record.key_image
        no_key = f"{why} and no usable key" if why.startswith("delete") else f"{why}: it needs a usable key"
        if record.kafka_key is None:
            raise self._invalid(f"{no_key} (the Kafka key is null)")
        try:
            image, _ = self._key_decoder(record.kafka_key)
        except DecodeError as exc:
            raise self._invalid(f"{no_key} ({exc.reason})") from None
        if not isinstance(image, dict):
            raise self._invalid(f"{no_key} (the Kafka key is not an object)")
        record.key_image = image
        return image

    def _meta(
        self, document: dict | None, image: dict | None, types: dict[str, str] | None, required: bool
    ) -> tuple[str | None, str | None, int | None, dict[str, Any]]:
        """(snapshot marker, sequence, event time, passthrough columns) of one record."""
        if document is None:
            document = {}
        source = document.get(Envelope.SOURCE)
        snapshot = source.get(SNAPSHOT_FIELD) if type(source) is dict else None
        if snapshot is not None:
            snapshot = op_code_text(snapshot)
        if not self._per_record:
            return snapshot, None, None, _NO_COLUMNS
        sequence = None
        if self._sequence:
            sequence = canonical_json([self._lookup(document, image, path) for path in self._sequence])
        event_time = None
        if self._order_by is not None:
            event_time = self._event_time(document, image, types, required)
        passthrough = {column: path_value(document, path) for path, column in self._passthrough}
        return snapshot, sequence, event_time, passthrough

    @staticmethod
    def _lookup(document: dict, image: dict | None, path: tuple[str, ...]) -> Any:
        """A row column of that name when the image has one, else the envelope path."""
        if len(path) == 1 and image is not None and path[0] in image:
            return image[path[0]]
        return path_value(document, path)

    def _event_time(
        self, document: dict, image: dict | None, types: dict[str, str] | None, required: bool
    ) -> int | None:
        order_by = self.settings.order_by
        value = self._lookup(document, image, self._order_by)
        if value is None:
            if required:
                raise self._invalid(f"order_by {order_by!r} is missing or null")
            return None
        try:
            return event_time_ms(value, (types or {}).get(order_by))
        except ValueError as exc:
            raise self._invalid(f"order_by {order_by!r} is {exc}") from None

    def _row(
        self, kind: ChangeKind, image: dict, where: str, intent: Intent | None,
        meta: tuple[str | None, str | None, int | None, dict[str, Any]], nulls_unchanged: bool = False,
    ) -> ChangelogRow:
        snapshot, sequence, event_time, passthrough = meta
        row, unchanged = image, ()
        marks_nulls = nulls_unchanged and None in row.values()
        if marks_nulls or UNAVAILABLE_VALUE in row.values():
            unchanged = tuple(column for column, value in row.items() if value == UNAVAILABLE_VALUE or (
                marks_nulls and value is None and column not in self.primary_key))
            row = {column: value for column, value in row.items() if column not in unchanged}
        if passthrough:
            for column in passthrough:
                if column in row:
                    raise RecordRejected(
                        f"passthrough column {column!r} clashes with a row column of the same name", "FAIL"
                    )
            row = {**row, **passthrough}
        key = self._key_text(row, self.primary_key, "primary key", where)
        upsert_key = key if self._upsert_is_primary else self._related_key(row, self.upsert_key, "upsert key", where)
        partition_key = (
            key if self._partition_is_primary else self._related_key(row, self.partition_by, "partition_by", where)
        )
        return ChangelogRow(
            kind, row, key, upsert_key, partition_key, unchanged, intent, snapshot, sequence, event_time
        )

    def _related_key(self, row: dict, columns: tuple[str, ...], label: str, where: str) -> str:
        return self._key_text(row, columns, label, where) if columns else canonical_json(row)

    def _key_text(self, row: dict, columns: tuple[str, ...], label: str, where: str) -> str:
        if len(columns) == 1:
            values = [row.get(columns[0])]
        else:
            values = [row.get(column) for column in columns]
        if None in values:
            column = columns[values.index(None)]
            raise self._invalid(f"{label} column {column!r} is missing or null in {where}")
        return canonical_key(values)
