"""Key values and row contents stay out of logs and errors unless `log_values: true`."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pytest

from service.config.settings import settings_from_mapping
from service.kafka_to_delta.materialize.rules import (
    Change,
    ConflictError,
    Materializer,
    MaterializerConfig,
)
from service.kafka_to_delta.sink.bad_records import handle_bad_records
from vocabulary import redaction
from vocabulary.changes import ChangeKind
from vocabulary.errors import DecodeError, SourceCoordinates
from vocabulary.redaction import fingerprint, shown

EMAIL = "alice@example.com"


@pytest.fixture(autouse=True)
def _default_switch() -> Iterator[None]:
    redaction.configure(False)
    yield
    redaction.configure(False)


def test_shown_is_a_stable_fingerprint_by_default_and_the_value_when_enabled() -> None:
    assert shown(EMAIL) == f"<redacted #{fingerprint(EMAIL)}>" == shown(EMAIL.encode())
    assert len(fingerprint(EMAIL)) == 12 and EMAIL not in shown(EMAIL)
    assert shown(EMAIL, enabled=True) == EMAIL == shown(EMAIL.encode(), enabled=True)
    redaction.configure(True)
    assert shown(EMAIL) == EMAIL and shown(EMAIL, enabled=False) != EMAIL


def test_log_values_setting_defaults_to_false() -> None:
    assert settings_from_mapping({}).log_values is False
    assert settings_from_mapping({"log_values": True}).log_values is True


def test_source_coordinates_keep_topic_partition_offset_and_hide_the_key() -> None:
    where = SourceCoordinates("users", 2, 40, EMAIL)
    text = str(DecodeError("not valid JSON", where))
    assert "topic=users partition=2 offset=40" in text and EMAIL not in text and fingerprint(EMAIL) in text
    redaction.configure(True)
    assert f"key={EMAIL}" in str(DecodeError("not valid JSON", where))


def _conflict(log_values: bool) -> str:
    materializer = Materializer(MaterializerConfig("users", ("email",), "error", log_values=log_values))
    pk = f'["{EMAIL}"]'
    first = Change(ChangeKind.INSERT, '["a",1]', '{"id":1,"name":"Alice"}', ("a", 0, 5))
    second = Change(ChangeKind.INSERT, '["b",1]', '{"id":1,"name":"Alice B"}', ("b", 1, 9))
    state = materializer.apply(pk, None, [first], 0).new_state
    with pytest.raises(ConflictError) as caught:
        materializer.apply(pk, state, [second], 0)
    return str(caught.value)


def test_conflict_error_names_a_fingerprint_and_coordinates_by_default() -> None:
    message = _conflict(False)
    assert EMAIL not in message and "Alice" not in message and '["a",1]' not in message
    assert fingerprint(f'["{EMAIL}"]') in message
    assert "topic=a partition=0 offset=5" in message and "topic=b partition=1 offset=9" in message
    shown_message = _conflict(True)
    assert f'(email) = ["{EMAIL}"]' in shown_message and '["a",1]' in shown_message
    assert "Alice" not in shown_message  # row contents never appear in a conflict


def test_state_cleared_warning_hides_the_key_unless_enabled(caplog: pytest.LogCaptureFixture) -> None:
    pk = f'["{EMAIL}"]'
    delete = Change(ChangeKind.DELETE, pk, '{"id":1}', ("users", 2, 40))
    for log_values in (False, True):
        materializer = Materializer(MaterializerConfig("users", ("email",), "nothing", log_values=log_values))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="service.kafka_to_delta.materialize.rules"):
            materializer.apply(pk, None, [delete], 0)
        assert "offset=40" in caplog.text and (EMAIL in caplog.text) is log_values


def _bad_rows(handling: str) -> pa.Table:
    return pa.Table.from_pylist([{
        "topic": "users", "partition": 1, "offset": 17, "raw_key": f'{{"email":"{EMAIL}"}}'.encode(),
        "error": "value is not valid JSON", "handling": handling, "stage": "decode",
    }])


def test_log_policy_warning_hides_the_key_unless_enabled(caplog: pytest.LogCaptureFixture) -> None:
    for log_values in (False, True):
        redaction.configure(log_values)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="service.kafka_to_delta.sink.bad_records"):
            handle_bad_records("p", _bad_rows("LOG"), 0, None)
        assert "topic=users partition=1 offset=17" in caplog.text and (EMAIL in caplog.text) is log_values


def test_fail_policy_error_hides_the_key() -> None:
    with pytest.raises(DecodeError) as caught:
        handle_bad_records("p", _bad_rows("FAIL"), 0, None)
    assert "topic=users partition=1 offset=17" in str(caught.value) and EMAIL not in str(caught.value)
