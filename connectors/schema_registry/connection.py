"""How to reach a Schema Registry: URL, TLS files, basic or bearer auth, timeout and retries.

A `RegistryConnection` is plain, picklable data; `client_config()` turns it into the
configuration of `confluent_kafka.schema_registry.SchemaRegistryClient`. Credentials inside
the URL (`https://user:pass@host`) are refused when the connection is made, with a message
that says where they belong, instead of surfacing later as a failed request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from connectors.schema_registry.errors import redacted_url

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRIES_WAIT_MS = 250
DEFAULT_RETRIES_MAX_WAIT_MS = 5_000


def check_registry_url(url: str) -> str:
    """`url` if it is an http(s) URL without credentials; else a `ValueError` saying why."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"schema registry url {redacted_url(url)!r} is not an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"schema registry url {redacted_url(url)!r} carries credentials: remove them from "
                         "the URL and set schema_registry.username and password (or bearer_auth_token)")
    return url


@dataclass(frozen=True)
class RegistryConnection:
    """Where and how to reach one registry; `basic_auth` is (user, password)."""

    url: str
    basic_auth: tuple[str, str] | None = None
    bearer_auth_token: str | None = None
    bearer_auth_logical_cluster: str = ""
    bearer_auth_identity_pool_id: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    retries_wait_ms: int = DEFAULT_RETRIES_WAIT_MS
    retries_max_wait_ms: int = DEFAULT_RETRIES_MAX_WAIT_MS

    def __post_init__(self) -> None:
        check_registry_url(self.url)
        if self.basic_auth is not None and self.bearer_auth_token is not None:
            raise ValueError("schema registry: set basic auth or a bearer token, not both")

    @classmethod
    def basic(cls, url: str, auth: tuple[str, str] | None = None, timeout: float | None = None) -> "RegistryConnection":
        """A connection with optional basic auth and the default retries."""
        return cls(url.rstrip("/"), basic_auth=auth, timeout_seconds=DEFAULT_TIMEOUT_S if timeout is None else timeout)

    def __repr__(self) -> str:
        return f"RegistryConnection(url={self.url!r}, auth={self.auth_kind!r})"

    @property
    def auth_kind(self) -> str:
        """'basic', 'bearer' or 'none' (for logs: never the secret)."""
        return "basic" if self.basic_auth else "bearer" if self.bearer_auth_token else "none"

    def client_config(self) -> dict[str, Any]:
        """The confluent client's configuration (holds secrets: never log it)."""
        config: dict[str, Any] = {
            "url": self.url, "timeout": self.timeout_seconds, "max.retries": self.max_retries,
            "retries.wait.ms": self.retries_wait_ms, "retries.max.wait.ms": self.retries_max_wait_ms,
        }
        tls = {"ssl.ca.location": self.ssl_ca_location, "ssl.certificate.location": self.ssl_certificate_location,
               "ssl.key.location": self.ssl_key_location, "ssl.key.password": self.ssl_key_password}
        config.update({key: value for key, value in tls.items() if value is not None})
        if self.basic_auth is not None:
            config["basic.auth.user.info"] = f"{self.basic_auth[0]}:{self.basic_auth[1]}"
        if self.bearer_auth_token is not None:
            config.update({"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": self.bearer_auth_token,
                           "bearer.auth.logical.cluster": self.bearer_auth_logical_cluster})
            if self.bearer_auth_identity_pool_id:
                config["bearer.auth.identity.pool.id"] = self.bearer_auth_identity_pool_id
        return config
