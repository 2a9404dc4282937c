"""The local Spark JVM's flags, chosen from the stateful operators the compiled plan lists.

A local session's JVM collects with the serial collector (the cores are the Python workers'). What
else it gets depends on what its queries hold in Spark's state store:

- `LIGHT`: no stateful operator at all (the plain path: the JVM only plans, tracks offsets and
  moves Arrow batches): a small heap that gives back what a collection freed, and C1 compilation.
- `PACKED_STATE`: every stateful operator is one that the JVM sees packed, one value per key
  bucket rather than a row per change (`PACKED_KINDS`: the bucket materializer): a fixed young
  generation, and C1 compilation.
- `STATEFUL`: anything else, including an operator kind this module does not know: a fixed young
  generation and the C2 compiler, as rows go through shuffles and the state store.

The choice reads the plan document (`cdc-lakehouse plan`, `compiled_plan.compile_plan`): a new
stateful operator appears there, so it gets the stateful profile without a change here. The
figures behind each flag are in docs/design/runtime-tuning.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

C1_ONLY = "-XX:TieredStopAtLevel=1"
_SERIAL_GC = "-XX:+UseSerialGC"
_GIVE_BACK = "-XX:MinHeapFreeRatio=5 -XX:MaxHeapFreeRatio=20"
PACKED_KINDS = frozenset({"materializer"})
"""Operator kinds (`compiled_plan.Kind`) whose state the JVM moves packed per key bucket."""
SETTING_KINDS = frozenset({"table_shape", "columns"})
"""Plan nodes (`compiled_plan.Kind`) that record a pipeline's setting for the upgrade check: no query state."""


@dataclass(frozen=True)
class JvmProfile:
    """A named set of flags for a local driver's JVM."""

    name: str
    options: str


LIGHT = JvmProfile("light", f"{_SERIAL_GC} -Xms64m {_GIVE_BACK} {C1_ONLY}")
PACKED_STATE = JvmProfile("packed-state", f"{_SERIAL_GC} -Xmn64m {_GIVE_BACK} {C1_ONLY}")
STATEFUL = JvmProfile("stateful", f"{_SERIAL_GC} -Xmn64m {_GIVE_BACK}")


def operator_kinds(plan: Mapping[str, Any]) -> frozenset[str]:
    """The kinds of the stateful operators a plan document lists (its setting nodes left out)."""
    return frozenset(str(node.get("kind")) for node in plan.get("nodes", ())) - SETTING_KINDS


def jvm_profile(plan: Mapping[str, Any]) -> JvmProfile:
    """The profile for the queries of `plan`: light without state, packed when only packed kinds
    keep state, stateful otherwise (an unknown kind included)."""
    kinds = operator_kinds(plan)
    if not kinds:
        return LIGHT
    if kinds <= PACKED_KINDS:
        return PACKED_STATE
    return STATEFUL
