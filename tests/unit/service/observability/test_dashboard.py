"""The Grafana dashboard in deploy/grafana is valid and plots only metrics the service exports.

Every PromQL expression is tokenised; each metric name it selects must be a sample name of
service/observability/metrics.py's registry (a counter `x` exposes `x_total`, a histogram `x_bucket`,
`x_sum`, `x_count`), and every label it matches, groups by or shows in a legend must be a
label of those metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from service.observability import metrics

REPO = Path(__file__).resolve().parents[4]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "cdc-lakehouse.json"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
PROVIDERS = REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "cdc-lakehouse.yaml"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile", "limitk", "limit_ratio"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "atan2"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# What the issue asks the dashboard to show: throughput, lag, stage durations, conflicts, dead letters, state.
REQUIRED = {"cdc_changes_total", "cdc_pipeline_lag_records", "cdc_export_lag_versions", "cdc_batch_stage_seconds_bucket",
            "cdc_conflicts_total", "cdc_bad_records_total", "cdc_state_rows", "cdc_state_memory_bytes"}
_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<braces>\{[^}]*\})
  | (?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<paren>[()])
  | (?P<other>\S)
""", re.X)
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.*),)?\s*(?P<label>\w+)\s*\)$")


def exposed_names() -> dict[str, str]:
    """Sample name -> metric family name, for every metric of the registry."""
    names = {}
    for family in REGISTRY.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = family.name
    return names


def labels_of(family: str) -> set[str]:
    """Label names of one of service/observability/metrics.py's metrics (empty for other collectors)."""
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase) and value._name == family:
            return set(value._labelnames)
    return set()


def parse(expression: str) -> tuple[dict[str, set[str]], set[str]]:
    """({metric name: labels it is matched on}, labels used in grouping clauses) of a PromQL expression."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expression)]
    selected: dict[str, set[str]] = {}
    grouped: set[str] = set()
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else (None, "")
        if kind == "ident" and text in GROUPING and following[1] == "(":
            close = next(i for i in range(index + 2, len(tokens)) if tokens[i][1] == ")")
            grouped |= {t for k, t in tokens[index + 2:close] if k == "ident"}
            index = close
        elif kind == "ident" and text not in AGGREGATIONS | KEYWORDS and following[1] != "(":
            matchers = set(_MATCHER.findall(following[1])) if following[0] == "braces" else set()
            selected.setdefault(text, set()).update(matchers)
        index += 1
    return selected, grouped


def queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(where, expression, legend) of every panel target, rows' panels included."""
    found = []
    panels = list(dashboard["panels"])
    for panel in panels:
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", target["expr"], target.get("legendFormat", "")))
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_promql_names_are_found_by_the_parser():
    selected, grouped = parse('histogram_quantile(0.95, sum by (le, stage) (rate(a_bucket{p=~"$x", s!="y"}[5m])))'
                              ' / on (stage) group_left sum without (q) (b_total offset 1h) > bool 2')
    assert selected == {"a_bucket": {"p", "s"}, "b_total": set()} and grouped == {"le", "stage", "q"}


def test_dashboard_is_valid_grafana_json(dashboard):
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["type"] == "row" or panel["targets"], f"panel {panel['title']!r} plots nothing"


def test_every_plotted_metric_exists_in_the_registry(dashboard):
    exposed = exposed_names()
    plotted: set[str] = set()
    for where, expression, legend in queries(dashboard):
        selected, grouped = parse(expression)
        assert selected, f"{where}: no metric in {expression!r}"
        unknown = sorted(set(selected) - set(exposed))
        assert not unknown, f"{where}: {unknown} not in service/observability/metrics.py's registry ({expression!r})"
        labels = {"le"} if any(name.endswith("_bucket") for name in selected) else set()
        for name, matched in selected.items():
            own = labels_of(exposed[name])
            assert matched <= own, f"{where}: {name} has no label {sorted(matched - own)}"
            labels |= own
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        assert grouped | shown <= labels, f"{where}: labels {sorted((grouped | shown) - labels)} not on {sorted(selected)}"
        plotted |= set(selected)
    assert REQUIRED <= plotted, f"not plotted: {sorted(REQUIRED - plotted)}"


def test_template_variables_query_existing_labels(dashboard):
    exposed = exposed_names()
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(query)
        assert match and match.group("expr"), f"variable {variable['name']}: {query!r}"
        (name,) = parse(match.group("expr"))[0]
        assert match.group("label") in labels_of(exposed[name]), query


def test_dashboard_is_provisioned_with_its_datasource(dashboard):
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel.get("targets", [])}
    uids |= {variable["datasource"]["uid"] for variable in dashboard["templating"]["list"]}
    assert uids == {source["uid"]} and source["type"] == "prometheus"
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in compose["volumes"] if volume.startswith("./"))
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert source["url"] == "http://prometheus:9090"
