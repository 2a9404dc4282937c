"""Errors of the Kafka adapter; third-party errors are wrapped here."""

from __future__ import annotations

from vocabulary.errors import TerminalError, TransientError


class KafkaUnavailable(TransientError):
    """The brokers did not answer in time."""


class DataLoss(TerminalError):
    """Offsets the checkpoint still needs were deleted from the topic (retention)."""
