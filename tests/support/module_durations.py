"""How long each test module took in a measured run, for the order in which the xdist scheduler
hands modules to workers (`tests/conftest.py`): longest first, so the last module a worker starts
is a short one and no worker idles while the other runs a long one.

The figures live in `tests/module_durations.json`. A stale or missing figure only costs balance,
never correctness. Refresh them from a run's JUnit report:

    .venv/bin/python -m pytest -n 2 --dist loadscope --junitxml=/tmp/run.xml -o junit_duration_report=total
    .venv/bin/python -m tests.support.module_durations /tmp/run.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Iterable

FIGURES = Path(__file__).resolve().parents[1] / "module_durations.json"

# A module without a figure: end-to-end modules start services and run the CLI; others are quick.
UNMEASURED_E2E_SECONDS = 120.0
UNMEASURED_SECONDS = 5.0


def load(path: Path = FIGURES) -> dict[str, float]:
    """Seconds per module path (e.g. `tests/e2e/test_cli.py`); empty when the file is missing."""
    try:
        return {str(module): float(seconds) for module, seconds in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def expected_seconds(module: str, figures: dict[str, float]) -> float:
    if module in figures:
        return figures[module]
    return UNMEASURED_E2E_SECONDS if module.startswith("tests/e2e/") else UNMEASURED_SECONDS


def longest_first(scopes: Iterable[str], grouped: dict[str, Iterable[str]], figures: dict[str, float] | None = None) -> list[str]:
    """The scheduler's scopes, longest expected first. A scope is a module path, or a name in
    `grouped` standing for several modules (the Spark session's), which counts them all."""
    figures = load() if figures is None else figures

    def seconds(scope: str) -> float:
        return sum(expected_seconds(module, figures) for module in grouped.get(scope, (scope,)))

    return sorted(scopes, key=lambda scope: (-seconds(scope), scope))


def from_junit(report: Path) -> dict[str, float]:
    """Seconds per module from a JUnit report written with `junit_duration_report=total` (setup,
    call and teardown of every test, so a module fixture's start-up counts for its module)."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname is the dotted module path, then the class name of a test method, if any
        while module and not module[-1].startswith("test_"):
            module.pop()
        if module:
            seconds["/".join(module) + ".py"] += float(case.get("time") or 0.0)
    return {module: round(total, 1) for module, total in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.module_durations JUNIT_REPORT.xml", file=sys.stderr)
        return 2
    figures = from_junit(Path(argv[0]))
    FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"{len(figures)} modules, {sum(figures.values()):.0f} s in all -> {FIGURES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
