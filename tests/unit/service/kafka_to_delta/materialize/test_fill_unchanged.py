"""Unchanged (TOAST) columns filled from an earlier image of the same key in the same batch."""

from __future__ import annotations

import json

from service.kafka_to_delta.materialize.fill_unchanged import fill_unchanged


def test_unchanged_column_is_taken_from_the_latest_earlier_image_holding_it():
    images = [{"row": json.dumps({"id": 1, "body": "v1", "rev": 1}), "unchanged": None},
              {"row": json.dumps({"id": 1, "rev": 2}), "unchanged": json.dumps(["body"])}]
    row, left = fill_unchanged({"id": 1, "rev": 3}, ["body"], images)
    assert row == {"id": 1, "body": "v1", "rev": 3} and left == []
    assert list(row) == ["id", "body", "rev"]  # the complete image's column order


def test_a_column_no_earlier_image_holds_stays_unchanged_for_the_merge():
    images = [{"row": json.dumps({"id": 1, "rev": 2}), "unchanged": json.dumps(["body"])}]
    row, left = fill_unchanged({"id": 1, "rev": 3}, ["body"], images)
    assert row == {"id": 1, "rev": 3} and left == ["body"]
