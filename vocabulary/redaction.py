"""Key values and row contents in logs and error messages: personal data, hidden by default.

Messages always carry where a record is (topic, partition, offset). A key value or a row's
contents appears only with the top-level setting `log_values: true` (for debugging); otherwise
`shown` gives a stable fingerprint of the value, `<redacted #1a2b3c4d5e6f>`: the same value
gives the same fingerprint in every message and every run, so an operator can tell whether two
messages concern one key, and check a suspected key with `fingerprint`.

The switch is process-wide, set once at start-up from the settings (`configure`). Code that
builds messages on Spark executors (other processes) takes the flag from its own picklable
config and passes it as `enabled`.
"""

from __future__ import annotations

import hashlib

_state = {"log_values": False}


def configure(log_values: bool) -> None:
    """Set the process-wide switch (the runner and the CLI call this from the settings)."""
    _state["log_values"] = bool(log_values)


def log_values() -> bool:
    """Whether key values and row contents may appear in logs and error messages."""
    return _state["log_values"]


def fingerprint(value: str | bytes) -> str:
    """A short stable hash of a value: the first 12 hex digits of its SHA-256 (UTF-8 for text)."""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return hashlib.sha256(data).hexdigest()[:12]


def shown(value: object, enabled: bool | None = None) -> str:
    """`value` as text when values may be logged (`enabled`, else the process switch), else its fingerprint."""
    if value is None:
        return "None"
    on = log_values() if enabled is None else enabled
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return data.decode("utf-8", errors="replace") if on else f"<redacted #{fingerprint(data)}>"
    text = str(value)
    return text if on else f"<redacted #{fingerprint(text)}>"
