"""Tell terminal from transient failures of a streaming query.

An error raised in our own batch code arrives as itself. One raised in the source's
planner or on an executor reaches the driver only as text inside Spark's exception: a
Python traceback quoted in the message (its error lines name the class, qualified unless
it is a builtin), or a Java exception's message. Error lines are resolved back to Python
classes; an error line followed by "During handling of the above exception" or "The above
exception was the direct cause" was handled and turned into the next one, so it does not count.

Retried (transient), and only these:
- our `TransientError` subclasses (KafkaUnavailable, DeltaWriteError, SchemaRegistryUnavailable, ...);
- network: `ConnectionError` (refused, reset, aborted, broken pipe), `TimeoutError`,
  `socket.gaierror`, the `java.net` connect/socket exceptions, librdkafka transport codes,
  and deltalake's `CommitFailedError` (another writer committed first);
- Spark worker start-up: a Python worker, daemon or streaming runner that failed to start
  or to connect back, a Python worker that crashed, a lost executor.

Terminal, never retried (a retry would run the same code on the same data):
- our `TerminalError` subclasses (bad input, bad configuration, data loss);
- programming errors: `PROGRAMMING_ERRORS` and their subclasses, including the libraries'
  (pyarrow's ArrowInvalid / ArrowTypeError, json's JSONDecodeError, PySparkTypeError, ...);
- anything not recognised above.

When a text names several, the order of precedence is: our terminal errors, programming
errors, transient errors; nothing recognised counts as terminal.
"""

from __future__ import annotations

import importlib
import re
import socket
import sys
from dataclasses import dataclass
from typing import Literal

from vocabulary.errors import CdcLakehouseError, TerminalError, TransientError

FailureKind = Literal["terminal", "programming", "transient", "unrecognised"]
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError, AttributeError, LookupError, NameError, ImportError, AssertionError,
    ValueError, ArithmeticError, NotImplementedError, RecursionError, SyntaxError,
)
NETWORK_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, socket.gaierror)
# Third-party transient errors by class name (their modules print under private names).
TRANSIENT_CLASS_NAMES = frozenset({"CommitFailedError"})
TRANSIENT_MARKERS = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
    "Python daemon failed to launch worker",
    "Python failed to launch worker",
    "Failed to open socket to Python daemon",
    "Python worker exited unexpectedly (crashed)",
    "STREAMING_PYTHON_RUNNER_INITIALIZATION_",
    "ExecutorLostFailure",
    "java.net.ConnectException",
    "java.net.SocketException",
    "java.net.SocketTimeoutException",
    "java.net.NoRouteToHostException",
    "java.net.UnknownHostException",
)
_KAFKA_TRANSIENT_CODE = re.compile(
    r"KafkaError\{code=(_TRANSPORT|_ALL_BROKERS_DOWN|_TIMED_OUT|_MSG_TIMED_OUT|_RESOLVE|NETWORK_EXCEPTION"
    r"|REQUEST_TIMED_OUT|LEADER_NOT_AVAILABLE|NOT_LEADER_(?:FOR_PARTITION|OR_FOLLOWER)"
    r"|COORDINATOR_NOT_AVAILABLE|NOT_COORDINATOR|COORDINATOR_LOAD_IN_PROGRESS),"
)
_ERROR_LINE = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::\s|:$|$)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_OUR_PACKAGES = ("vocabulary", "service", "connectors")
_PRECEDENCE: tuple[FailureKind, ...] = ("terminal", "programming", "transient")


class PipelineFailed(TerminalError):
    """A pipeline stopped for good; the message says why."""


class PipelineInterrupted(TransientError):
    """A pipeline stopped for a reason a restart may fix."""


@dataclass(frozen=True)
class Diagnosis:
    """What decided a failure's kind, and the line of the error that decided it."""

    kind: FailureKind
    line: str


def kind_of(cls: type) -> FailureKind | None:
    """The kind of failure an exception class stands for, or None when it tells nothing."""
    if issubclass(cls, TerminalError):
        return "terminal"
    if issubclass(cls, TransientError) or issubclass(cls, NETWORK_ERRORS) or cls.__name__ in TRANSIENT_CLASS_NAMES:
        return "transient"
    if issubclass(cls, PROGRAMMING_ERRORS):
        return "programming"
    return None


def _resolve(name: str) -> type | None:
    """The exception class a traceback line names, when its module is (or can be) imported."""
    module_name, _, qualname = name.rpartition(".")
    module_name = module_name or "builtins"
    module = sys.modules.get(module_name)
    if module is None and module_name.split(".")[0] in _OUR_PACKAGES:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - an unimportable name tells nothing
            return None
    found = getattr(module, qualname, None) if module is not None else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _line_kinds(text: str) -> list[tuple[FailureKind, str]]:
    """(kind, line) of every error line of `text` that was not handled into a later one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found: list[tuple[FailureKind, str]] = []
    for index, line in enumerate(lines):
        match = _ERROR_LINE.match(line)
        if match is None or (index + 1 < len(lines) and lines[index + 1].startswith(_CHAINED)):
            continue
        cls = _resolve(match.group("name"))
        kind = kind_of(cls) if cls is not None else None
        if kind is None and match.group("name").rpartition(".")[2] in TRANSIENT_CLASS_NAMES:
            kind = "transient"
        if kind is not None:
            found.append((kind, line))
    for line in lines:
        if any(marker in line for marker in TRANSIENT_MARKERS) or _KAFKA_TRANSIENT_CODE.search(line):
            found.append(("transient", line))
    return found


def diagnose(error: BaseException | None, spark_text: str) -> Diagnosis:
    """The kind of a failure from the error our batch code saw (if any) and Spark's text."""
    text = "\n".join(t for t in (str(error) if error is not None else "", spark_text) if t)
    found = _line_kinds(text)
    if error is not None:
        kind = kind_of(type(error))
        if kind is not None:
            found.append((kind, f"{type(error).__name__}: {error}"))
    for wanted in _PRECEDENCE:
        lines = [line for kind, line in found if kind == wanted]
        if lines:
            return Diagnosis(wanted, lines[-1])
    return Diagnosis("unrecognised", _last_error_line(text))


def classify(name: str, error: BaseException | None, spark_text: str) -> CdcLakehouseError:
    """The failure of pipeline `name` as one of our errors (see the module docstring).

    Our own error object is returned as it is; otherwise `PipelineInterrupted` (retried a
    bounded number of times) or `PipelineFailed`, naming the error line that decided.
    """
    if isinstance(error, CdcLakehouseError):
        return error
    diagnosis = diagnose(error, spark_text)
    if diagnosis.kind == "transient":
        return PipelineInterrupted(f"pipeline {name} interrupted: {diagnosis.line}")
    why = {
        "terminal": "",
        "programming": " on a programming error (not retried)",
        "unrecognised": " on an error that is not a broker, network or Spark worker start-up failure (not retried)",
    }[diagnosis.kind]
    return PipelineFailed(f"pipeline {name} failed{why}: {diagnosis.line}")


def _last_error_line(text: str) -> str:
    """The most specific line of a traceback-like text: the last one naming an error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Unavailable", "Loss")) and " " not in head:
            return line
    return lines[0] if lines else "unknown error"
