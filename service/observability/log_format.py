"""Log output: plain text lines (default) or JSON lines for log shippers (`log_format: json`).

A JSON line has `ts` (UTC, ISO 8601), `level`, `logger`, `message`, `error` (the traceback,
when there is one), and one field per item it is about, where known: `pipeline`, `batch`,
`topic`, `partition`, `offset`. An item comes from the record's `extra={...}` when the call
gives it, else from the message, which follows the service's conventions: it starts with
`pipeline NAME` or `export NAME`, says `batch N`, and places a record as
`topic=T partition=P offset=O` (vocabulary.errors.SourceCoordinates).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

from service.config.choices import LogFormat

FIELDS = ("pipeline", "batch", "topic", "partition", "offset")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_FROM_MESSAGE = {
    "pipeline": re.compile(r"^(?:pipeline|export) (?P<value>[A-Za-z0-9_][A-Za-z0-9_.\-]*?)(?=[:;,]|\s|$)"),
    "batch": re.compile(r"\bbatch (?P<value>\d+)\b"),
    "topic": re.compile(r"\btopic=(?P<value>[A-Za-z0-9._\-]+)"),
    "partition": re.compile(r"\bpartition=(?P<value>\d+)\b"),
    "offset": re.compile(r"\boffset=(?P<value>\d+)\b"),
}
_NUMERIC = frozenset({"batch", "partition", "offset"})
_QUIET_LOGGERS = ("py4j", "pyspark")


def message_fields(message: str) -> dict[str, str | int]:
    """The items a message names by the service's conventions (see the module docstring)."""
    found: dict[str, str | int] = {}
    for name, pattern in _FROM_MESSAGE.items():
        match = pattern.search(message)
        if match is not None:
            value = match.group("value")
            found[name] = int(value) if name in _NUMERIC else value
    return found


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        message = record.getMessage()
        document: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        document.update(message_fields(message))
        document.update({name: getattr(record, name) for name in FIELDS if getattr(record, name, None) is not None})
        if record.exc_info:
            document["error"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure_logging(verbose: bool, log_format: LogFormat = "text") -> None:
    """Log to stderr at INFO (DEBUG when verbose) as text or JSON lines; Spark's Python loggers quieter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    for noisy in _QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
