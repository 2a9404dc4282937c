"""The scheduler's module figures (tests/support/module_durations.py): the order they give and the
file they come from."""

from __future__ import annotations

from pathlib import Path

from tests.support import module_durations

ROOT = Path(__file__).resolve().parents[2]


def test_longest_first_counts_a_group_as_the_sum_of_its_modules() -> None:
    figures = {"tests/e2e/test_a.py": 300.0, "tests/unit/test_b.py": 200.0, "tests/unit/test_c.py": 150.0}
    grouped = {"spark": ["tests/unit/test_b.py", "tests/unit/test_c.py"]}
    assert module_durations.longest_first(["tests/e2e/test_a.py", "spark"], grouped, figures) == [
        "spark",
        "tests/e2e/test_a.py",
    ]
    assert module_durations.longest_first(["tests/unit/test_b.py", "tests/e2e/test_a.py"], {}, figures) == [
        "tests/e2e/test_a.py",
        "tests/unit/test_b.py",
    ]


def test_an_unmeasured_e2e_module_goes_before_unmeasured_others() -> None:
    scopes = ["tests/unit/test_new.py", "tests/e2e/test_new.py"]
    assert module_durations.longest_first(scopes, {}, {}) == ["tests/e2e/test_new.py", "tests/unit/test_new.py"]


def test_figures_are_summed_per_module_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.e2e.test_cli" name="test_one" time="10.5"/>'
        '<testcase classname="tests.e2e.test_cli" name="test_two[seed-3]" time="2.0"/>'
        '<testcase classname="tests.unit.service.test_x.TestShape" name="test_three" time="0.3"/>'
        "</testsuite></testsuites>"
    )
    assert module_durations.from_junit(report) == {
        "tests/e2e/test_cli.py": 12.5,
        "tests/unit/service/test_x.py": 0.3,
    }


def test_every_module_with_a_figure_exists() -> None:
    figures = module_durations.load()  # none at all: every module counts as unmeasured
    missing = sorted(module for module in figures if not (ROOT / module).is_file())
    assert not missing, f"figures for modules that no longer exist (refresh them, see {module_durations.__file__}): {missing}"
