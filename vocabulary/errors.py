"""Root errors of the service. Terminal errors stop a pipeline; transient ones may be retried."""

from __future__ import annotations

from dataclasses import dataclass

from vocabulary.redaction import shown


class CdcLakehouseError(Exception):
    """Root of every error the service raises on purpose."""


class TerminalError(CdcLakehouseError):
    """Retrying cannot help: bad input, bad configuration, a broken invariant."""


class TransientError(CdcLakehouseError):
    """The same action may succeed later: broker unreachable, commit conflict."""


class ConfigError(TerminalError):
    """The configuration is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class SourceCoordinates:
    """Where a record came from: enough to find it again in Kafka. The key is shown per `log_values`."""

    topic: str
    partition: int
    offset: int
    key: str | None = None

    def __str__(self) -> str:
        where = f"topic={self.topic} partition={self.partition} offset={self.offset}"
        return f"{where} key={shown(self.key)}" if self.key is not None else where


class DecodeError(TerminalError):
    """A record could not be decoded into a change. Carries no payload, only where it was."""

    def __init__(self, reason: str, where: SourceCoordinates | None = None) -> None:
        self.reason = reason
        self.where = where
        super().__init__(f"{reason} ({where})" if where else reason)

    def at(self, where: SourceCoordinates) -> "DecodeError":
        """The same error, located at `where`."""
        return DecodeError(self.reason, where)
