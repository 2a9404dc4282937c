"""Tell terminal from transient failures of a streaming query.

An error raised in our own batch code arrives as itself. One raised in the source's
planner or on an executor reaches the driver only as text inside Spark's exception; the
qualified names of our error classes in that text tell what it was.
"""

from __future__ import annotations

from service.errors import CdcLakehouseError, TerminalError, TransientError


class PipelineFailed(TerminalError):
    """A pipeline stopped for good; the message says why."""


class PipelineInterrupted(TransientError):
    """A pipeline stopped for a reason a restart may fix."""


def _error_classes(root: type) -> list[type]:
    found = [root]
    for sub in root.__subclasses__():
        found.extend(_error_classes(sub))
    return found


def _named_in(text: str, root: type) -> bool:
    return any(f"{cls.__module__}.{cls.__qualname__}" in text for cls in _error_classes(root))


def classify(name: str, error: BaseException | None, spark_text: str) -> CdcLakehouseError:
    """The failure of pipeline `name` as one of our errors.

    Our own error object is returned as it is. Otherwise our error class names in the text
    decide; an error that names none of them (Spark or Python worker trouble) counts as
    transient, so it is retried a bounded number of times before the service gives up.
    """
    if isinstance(error, CdcLakehouseError):
        return error
    text = "\n".join(t for t in (str(error) if error else "", spark_text) if t)
    summary = _last_error_line(text)
    if _named_in(text, TerminalError):
        return PipelineFailed(f"pipeline {name} failed: {summary}")
    return PipelineInterrupted(f"pipeline {name} interrupted: {summary}")


def _last_error_line(text: str) -> str:
    """The most specific line of a traceback-like text: the last one naming an error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Unavailable", "Loss")) and " " not in head:
            return line
    return lines[0] if lines else "unknown error"
