"""Classifying streaming query failures into terminal and transient errors.

The Spark texts in spark_failure_texts.json are real (see its `_about`); the worker start-up
texts below are assembled from Spark 4.2's own messages (the start-up failures cannot be
provoked cheaply here).
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.kafka.errors import DataLoss, KafkaUnavailable
from service.config.settings import RecoverySettings
from service.supervisor.failures import PipelineFailed, PipelineInterrupted, classify, diagnose
from vocabulary.errors import DecodeError, SourceCoordinates

CAPTURED = json.loads((Path(__file__).with_name("spark_failure_texts.json")).read_text())
TRACE = """Traceback (most recent call last):
  File "/x/source.py", line 120, in latestOffset
{name}: {message}
"""

# case -> (kind, text of the deciding line)
EXPECTED = {
    "driver_type_error": ("programming", "TypeError: object of type 'int' has no len()"),
    "driver_arrow_not_implemented": ("programming", "has no kernel matching input types (int32, string)"),
    "executor_udf_index_error": ("programming", "IndexError: list index out of range"),
    "planner_kafka_unavailable": ("transient", "KafkaUnavailable: topics t: metadata not answered"),
    "planner_type_error": ("programming", "TypeError: unsupported operand type(s) for +"),
    "planner_data_loss": ("terminal", "DataLoss: topic=orders partition=1: offsets 0..41 were deleted"),
    "reader_key_error": ("programming", "KeyError: 'missing'"),
    "reader_connection_refused": ("transient", "ConnectionRefusedError: [Errno 111] Connection refused"),
    "reader_kafka_unavailable_after_key_error": ("transient", "KafkaUnavailable: topic=orders partition=0"),
    "reader_type_error_from_connection_reset": ("programming", "TypeError: can only concatenate str"),
    "reader_raw_kafka_transport_error": ("transient", "KafkaError{code=_TRANSPORT"),
    "reader_worker_crashed": ("transient", "Python worker exited unexpectedly (crashed)"),
}
# Objects of these types are rebuilt; the others (PythonException, Py4JJavaError) need a JVM,
# so their text goes in with Spark's, which is what classify() reads of them anyway.
REBUILT = {"builtins.TypeError": TypeError, "pyarrow.lib.ArrowNotImplementedError": pa.ArrowNotImplementedError}


def _inputs(case: str) -> tuple[BaseException | None, str]:
    captured = CAPTURED[case]
    rebuild = REBUILT.get(captured["failure_type"])
    if rebuild is not None:
        return rebuild(captured["failure_str"]), captured["query_exception"]
    return None, "\n".join(filter(None, [captured["failure_str"], captured["query_exception"]]))


def test_every_captured_text_has_an_expectation():
    assert set(EXPECTED) == set(CAPTURED) - {"_about"}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_captured_spark_failures_are_classified(case):
    kind, deciding = EXPECTED[case]
    diagnosis = diagnose(*_inputs(case))
    assert diagnosis.kind == kind and deciding in diagnosis.line
    failure = classify("p", *_inputs(case))
    if kind == "transient":
        assert isinstance(failure, PipelineInterrupted) and str(failure).startswith("pipeline p interrupted: ")
    else:
        assert isinstance(failure, PipelineFailed) and str(failure).startswith("pipeline p failed")
    assert deciding in str(failure)


def test_a_programming_error_says_it_is_not_retried():
    failure = classify("p", *_inputs("reader_key_error"))
    assert str(failure).startswith("pipeline p failed on a programming error (not retried): KeyError: 'missing'")


WORKER_CONNECT_BACK = (
    "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, most recent failure: Lost task 0.0 "
    "in stage 3.0 (TID 3) (localhost executor driver): org.apache.spark.SparkException: "
    "Python worker failed to connect back.\n"
    "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker(PythonWorkerFactory.scala:252)\n"
    "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python worker to connect back\n"
)
RUNNER_START_UP = (
    "[STREAMING_PYTHON_RUNNER_INITIALIZATION_TIMEOUT_FAILURE] Streaming Runner initialization failed. "
    "Socket connection timeout. Cause: Accept timed out SQLSTATE: XXKST"
)
EXECUTOR_LOST = (
    "Job aborted due to stage failure: Task 1 in stage 7.0 failed 4 times, most recent failure: Lost task 1.3 in "
    "stage 7.0 (TID 31) (10.0.0.7 executor 2): ExecutorLostFailure (executor 2 exited caused by one of the "
    "running tasks) Reason: Container killed"
)


@pytest.mark.parametrize("text", [WORKER_CONNECT_BACK, RUNNER_START_UP, EXECUTOR_LOST])
def test_spark_worker_start_up_trouble_is_transient(text):
    assert isinstance(classify("p", None, text), PipelineInterrupted)


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(32, "Broken pipe"), TimeoutError("slow"),
     KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))],
    ids=lambda e: type(e).__name__,
)
def test_network_and_broker_errors_raised_in_batch_code_are_transient(error):
    assert isinstance(classify("p", error, "An exception was raised by the Python Proxy."), PipelineInterrupted)


@pytest.mark.parametrize(
    "error",
    [TypeError("x"), AttributeError("'NoneType' object has no attribute 'schema'"), KeyError("pk"),
     NameError("name 'rows' is not defined"), ImportError("cannot import name 'x'"), AssertionError(),
     IndexError("list index out of range"), ValueError("invalid literal for int()"), ZeroDivisionError("division"),
     NotImplementedError(), pa.ArrowInvalid("Column 'id' has type int32, expected int64")],
    ids=lambda e: type(e).__name__,
)
def test_programming_errors_raised_in_batch_code_are_terminal(error):
    failure = classify("p", error, "An exception was raised by the Python Proxy.")
    assert isinstance(failure, PipelineFailed) and "programming error" in str(failure)


def test_an_unrecognised_failure_is_terminal_and_says_what_is_retried():
    error = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized"))
    failure = classify("p", error, "")
    assert isinstance(failure, PipelineFailed)
    assert "not a broker, network or Spark worker start-up failure (not retried)" in str(failure)


def _formatted(make) -> str:
    try:
        make()
    except Exception as error:  # noqa: BLE001 - the point is to format whatever was raised
        return "".join(traceback.format_exception(error))
    raise AssertionError("nothing raised")


def test_an_error_handled_into_another_does_not_count():
    def wrapped():
        try:
            {}["leader"]
        except KeyError:
            raise KafkaUnavailable("topic=t partition=0: no leader")

    text = _formatted(wrapped)
    assert "KeyError: 'leader'" in text and "During handling of the above exception" in text
    assert isinstance(classify("p", None, text), PipelineInterrupted)


def test_a_bug_in_an_error_handler_is_a_programming_error():
    def handler_bug():
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as error:
            raise AttributeError("'NoneType' object has no attribute 'close'") from error

    assert diagnose(None, _formatted(handler_bug)).kind == "programming"


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


def test_backoff_doubles_and_is_capped():
    recovery = RecoverySettings(initial_backoff_seconds=1, max_backoff_seconds=5)
    assert [recovery.backoff(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
