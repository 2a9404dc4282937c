"""A row image as its record's schema declares it: the one spelling of a value, whatever the record's bytes.

A record that declares its columns (a Kafka Connect schema block, an Avro schema) is read as Kafka Connect's
converters read it: the image holds every declared column in the declared order (a column the payload leaves
out is null) and nothing else (a key the schema does not declare is dropped, as Kafka Connect's `JsonConverter`
drops it); a float column's integer literal (`1`, `12345678901234567890`) is the float it stands for (`1.0`,
`1.2345678901234567e+19`).

So the rows' texts (`changelog_batch`), which the materializer's state compares and digests, are the same for
the same values however the JSON spelled them, and the same as the bulk decoder writes them
(`formats.row_text`, from columns parsed by the declared types). Debezium's own records are already in this
form: for them the image is returned as it is, after one comparison of its key order.
"""

from __future__ import annotations

from typing import Any

from connectors.delta.arrow_types import TypeName

_FLOAT_TYPES = frozenset({TypeName.FLOAT64, TypeName.FLOAT32})


class DeclaredImage:
    """`image -> image` for the records declaring `types` (column -> type name, in declared order)."""

    __slots__ = ("order", "floats")

    def __init__(self, types: dict[str, str]) -> None:
        self.order = tuple(types)
        self.floats = tuple(name for name, kind in types.items() if kind in _FLOAT_TYPES)

    def __call__(self, image: dict[str, Any]) -> dict[str, Any]:
        """`image` in its declared form; the same dict when it already is (never changed in place)."""
        copied = False
        if tuple(image) != self.order:
            image = {name: image.get(name) for name in self.order}
            copied = True
        for name in self.floats:
            value = image[name]
            if type(value) is int:
                try:
                    number = float(value)
                except OverflowError:
                    continue  # beyond any float: the fit check refuses it as it is
                if not copied:
                    image, copied = dict(image), True
                image[name] = number
        return image
