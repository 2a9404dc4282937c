"""Names of the Delta engines: the `lakehouse.engine` setting and the adapters that implement them."""

from __future__ import annotations

from typing import Literal, get_args

Engine = Literal["delta-rs", "delta-spark"]
ENGINES: tuple[str, ...] = get_args(Engine)
