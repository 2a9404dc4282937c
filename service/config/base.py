"""The base every settings model derives from, and the rules the models share.

`SettingsModel` is frozen (a loaded configuration never changes) and rejects unknown keys (a
misspelt key is an error naming it, never a silent default). `Name` is the one rule for the
names of pipelines, joins, exports and tables; `TopicName` is Kafka's rule for topic names;
`Names` accepts one name where a list is expected.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StringConstraints

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"
"""Names of pipelines, joins, exports and tables: they name checkpoint directories, table
directories, Spark queries and Kafka transactional ids, so no path separators or spaces."""
TOPIC_PATTERN = r"^[A-Za-z0-9._\-]{1,249}$"
"""Kafka's own rule for a topic name."""
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""Names of computed columns and of environment variables: letters, digits and underscores."""


def one_or_many(value: Any) -> Any:
    """A lone string as a one-item list (`primary_key: id` means `primary_key: [id]`)."""
    return [value] if isinstance(value, str) else value


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
"""A pipeline, join, export or table name (`NAME_PATTERN`)."""
TopicName = Annotated[str, StringConstraints(pattern=TOPIC_PATTERN)]
Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
"""A computed column's or an environment variable's name (`IDENTIFIER_PATTERN`)."""
"""A Kafka topic name (`TOPIC_PATTERN`)."""
Names = Annotated[tuple[str, ...], BeforeValidator(one_or_many)]
"""Column or topic names: a list, or one name standing for a list of one."""


class SettingsModel(BaseModel):
    """Base of every settings model: frozen, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")
