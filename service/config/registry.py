"""The `schema_registry:` block: one shape for ingest pipelines, exports and the top level.

Set once at the top level it is shared by every pipeline and export that has no block of its
own. Secrets (password, bearer token, key password) are `SecretStr`: masked in reprs, plans and
status output; the dotted confluent names (`ssl.ca.location`, `basic.auth.user.info`, ...) are
accepted as aliases of the snake_case keys.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from connectors.schema_registry.connection import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_RETRIES_MAX_WAIT_MS,
    DEFAULT_RETRIES_WAIT_MS,
    DEFAULT_TIMEOUT_S,
    RegistryConnection,
    check_registry_url,
)
from service.config.base import SettingsModel


def _alias(name: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(name.replace(".", "_"), name))


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


class SchemaRegistrySettings(SettingsModel):
    """A Confluent-compatible Schema Registry: URL (no credentials in it), TLS, auth, retries."""

    model_config = ConfigDict(populate_by_name=True)  # frozen and strict about keys: from SettingsModel

    url: str
    username: str | None = None
    password: SecretStr | None = None
    basic_auth_user_info: SecretStr | None = _alias("basic.auth.user.info")
    bearer_auth_token: SecretStr | None = _alias("bearer.auth.token")
    bearer_auth_logical_cluster: str | None = _alias("bearer.auth.logical.cluster")
    bearer_auth_identity_pool_id: str | None = _alias("bearer.auth.identity.pool.id")
    ssl_ca_location: str | None = _alias("ssl.ca.location")
    ssl_certificate_location: str | None = _alias("ssl.certificate.location")
    ssl_key_location: str | None = _alias("ssl.key.location")
    ssl_key_password: SecretStr | None = _alias("ssl.key.password")
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    max_retries: int = Field(default=DEFAULT_MAX_RETRIES, ge=0)
    retries_wait_ms: int = Field(default=DEFAULT_RETRIES_WAIT_MS, ge=0)
    retries_max_wait_ms: int = Field(default=DEFAULT_RETRIES_MAX_WAIT_MS, ge=0)

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, url: str) -> str:
        return check_registry_url(url).rstrip("/")

    @model_validator(mode="after")
    def _one_auth(self) -> "SchemaRegistrySettings":
        basic = self.basic_auth
        if self.basic_auth_user_info is not None and ":" not in self.basic_auth_user_info.get_secret_value():
            raise ValueError("schema_registry.basic_auth_user_info must be 'user:password'")
        if self.basic_auth_user_info is not None and self.username is not None:
            raise ValueError("schema_registry: set username/password or basic_auth_user_info, not both")
        if basic is not None and self.bearer_auth_token is not None:
            raise ValueError("schema_registry: set basic auth or bearer_auth_token, not both")
        if self.ssl_key_location is not None and self.ssl_certificate_location is None:
            raise ValueError("schema_registry.ssl_key_location needs ssl_certificate_location")
        return self

    @property
    def basic_auth(self) -> tuple[str, str] | None:
        """(user, password) for HTTP basic auth, if set."""
        if self.basic_auth_user_info is not None:
            user, _, password = self.basic_auth_user_info.get_secret_value().partition(":")
            return user, password
        if self.username is not None:
            return self.username, _secret(self.password) or ""
        return None

    def connection(self) -> RegistryConnection:
        """The picklable connection the registry client is built from (on each executor)."""
        return RegistryConnection(
            self.url, basic_auth=self.basic_auth, bearer_auth_token=_secret(self.bearer_auth_token),
            bearer_auth_logical_cluster=self.bearer_auth_logical_cluster or "",
            bearer_auth_identity_pool_id=self.bearer_auth_identity_pool_id,
            ssl_ca_location=self.ssl_ca_location, ssl_certificate_location=self.ssl_certificate_location,
            ssl_key_location=self.ssl_key_location, ssl_key_password=_secret(self.ssl_key_password),
            timeout_seconds=self.timeout_seconds, max_retries=self.max_retries,
            retries_wait_ms=self.retries_wait_ms, retries_max_wait_ms=self.retries_max_wait_ms,
        )


def share_registry(data: Any, sections: tuple[str, ...] = ("pipelines", "databases", "exports")) -> Any:
    """Raw settings with the top-level `schema_registry` copied into each pipeline, database and export
    that has neither its own block nor a `schema_registry_url`."""
    if not isinstance(data, dict) or data.get("schema_registry") is None:
        return data
    shared = data["schema_registry"]
    copied = dict(data)
    for section in sections:
        items = data.get(section)
        if isinstance(items, (list, tuple)):
            copied[section] = [
                {**item, "schema_registry": shared}
                if isinstance(item, dict) and item.get("schema_registry") is None and not item.get("schema_registry_url")
                else item
                for item in items
            ]
    return copied
