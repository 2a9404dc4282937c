"""Classifying streaming query failures into terminal and transient errors."""

from __future__ import annotations

from connectors.kafka.errors import DataLoss, KafkaUnavailable
from service.errors import DecodeError, SourceCoordinates
from service.failures import PipelineFailed, PipelineInterrupted, classify
from service.settings import RecoverySettings

TRACE = """Traceback (most recent call last):
  File "/x/source.py", line 120, in latestOffset
{name}: {message}
"""


def test_our_own_error_object_is_kept():
    error = DecodeError("envelope has no 'op' field", SourceCoordinates("t", 0, 5))
    assert classify("p", error, "anything") is error


def test_terminal_error_named_in_spark_text():
    name = f"{DataLoss.__module__}.{DataLoss.__qualname__}"
    text = TRACE.format(name=name, message="topic=t partition=0: offsets 0..9 were deleted")
    failure = classify("p", None, text)
    assert isinstance(failure, PipelineFailed)
    assert "pipeline p failed" in str(failure) and "offsets 0..9 were deleted" in str(failure)


def test_transient_error_named_in_spark_text():
    name = f"{KafkaUnavailable.__module__}.{KafkaUnavailable.__qualname__}"
    failure = classify("p", None, TRACE.format(name=name, message="cannot list topics"))
    assert isinstance(failure, PipelineInterrupted) and "cannot list topics" in str(failure)


def test_unknown_spark_trouble_counts_as_transient():
    failure = classify("p", RuntimeError("boom"), "org.apache.spark.SparkException: Python worker failed")
    assert isinstance(failure, PipelineInterrupted)


def test_backoff_doubles_and_is_capped():
    recovery = RecoverySettings(initial_backoff_seconds=1, max_backoff_seconds=5)
    assert [recovery.backoff(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
