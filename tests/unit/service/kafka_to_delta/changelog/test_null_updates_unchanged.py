"""`ignore_null_updates` in FROM_CHANGELOG: a null in an update's image (either image of an update,
an upsert) is an unchanged marker like Debezium's unavailable-value placeholder; an insert's and a
delete's nulls stay values, and the primary key is never marked."""

from __future__ import annotations

from service.config.from_changelog import FromChangelogSettings
from service.kafka_to_delta.changelog.from_changelog import FromChangelog
from vocabulary.changes import ChangeKind

PLACEHOLDER = "__debezium_unavailable_value"


def _stage(ignore: bool, preset: str = "debezium") -> FromChangelog:
    return FromChangelog(FromChangelogSettings(preset=preset), ("id",), ignore_null_updates=ignore)


def _rows(stage: FromChangelog, document: dict) -> list[tuple]:
    return [(row.kind, row.row, row.unchanged) for row in stage.convert(document)]


def test_the_nulls_of_both_images_of_an_update_are_markers() -> None:
    document = {"op": "u", "before": {"id": 1, "a": None, "b": 2, "c": "x"},
                "after": {"id": 1, "a": None, "b": None, "c": PLACEHOLDER}}
    assert _rows(_stage(True), document) == [
        (ChangeKind.UPDATE_BEFORE, {"id": 1, "b": 2, "c": "x"}, ("a",)),
        (ChangeKind.UPDATE_AFTER, {"id": 1}, ("a", "b", "c")),
    ]
    assert _rows(_stage(False), document)[1] == (ChangeKind.UPDATE_AFTER, {"id": 1, "a": None, "b": None}, ("c",))


def test_inserts_and_deletes_keep_their_nulls() -> None:
    stage = _stage(True)
    for op in ("c", "r"):
        assert _rows(stage, {"op": op, "before": None, "after": {"id": 1, "a": None}}) == [
            (ChangeKind.INSERT, {"id": 1, "a": None}, ())]
    assert _rows(stage, {"op": "d", "before": {"id": 1, "a": None}, "after": None}) == [
        (ChangeKind.DELETE, {"id": 1, "a": None}, ())]


def test_upserts_of_flat_and_deletion_flag_records_are_updates() -> None:
    flat = _stage(True, "flat")
    assert _rows(flat, {"op": "UPDATE_AFTER", "id": 1, "a": None}) == [(ChangeKind.UPDATE_AFTER, {"id": 1}, ("a",))]
    assert _rows(flat, {"op": "INSERT", "id": 1, "a": None}) == [(ChangeKind.INSERT, {"id": 1, "a": None}, ())]
    flagged = _stage(True, "deletion-flag")
    assert _rows(flagged, {"__deleted": "false", "id": 1, "a": None}) == [
        (ChangeKind.UPDATE_AFTER, {"id": 1}, ("a",))]
