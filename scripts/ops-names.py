#!/usr/bin/env python3
"""The metric names of ops/ are the crate's. Reads `tower_redlock::metrics::NAMES` from
src/metrics.rs (each constant it lists, resolved to its string; the count must be the array's
declared length) and each name's type from the module's doc table, then checks:

- every metric name in every alert expression (alerts.yml) and every dashboard query and
  variable query (tower-redlock.json) is in NAMES, or a histogram's name with `_bucket`,
  `_count` or `_sum` (a name that is not: "dangling", exit 1);
- every name in NAMES is used by some dashboard query (a metric added to the crate gets a
  panel);
- every dashboard query selects `job=~"$job", instance=~"$instance"` on each metric, every
  panel and query uses the `datasource` variable, and the JSON states its schemaVersion;
- every alert of the rules has a unit test in alerts.test.yml where it fires and one where
  it is expected silent.

usage: scripts/ops-names.py [--rules FILE] [--dashboard FILE] [--tests FILE]
       (defaults: ops/prometheus/alerts.yml, ops/grafana/tower-redlock.json,
       ops/prometheus/alerts.test.yml; `--tests -` skips the unit-test coverage check)
Needs PyYAML. Exits 1 with what is wrong."""
import argparse
import json
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
# PromQL words that are not metric names.
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}


def crate_names(path):
    """NAMES (in order) and {name: type} from src/metrics.rs."""
    text = open(path, encoding="utf-8").read()
    consts = dict(re.findall(r'pub const ([A-Z_0-9]+): &str = "([^"]+)";', text))
    m = re.search(r"pub const NAMES: &\[&str\] = &\[(.*?)\];", text, re.S)
    if not m:
        sys.exit(f"{path}: no `pub const NAMES: &[&str] = &[...]`")
    idents = re.findall(r"[A-Z_0-9]+", m.group(1))
    unknown = [i for i in idents if i not in consts]
    if unknown:
        sys.exit(f"{path}: NAMES lists {unknown}, not a `pub const NAME: &str` of the file")
    names = [consts[i] for i in idents]
    # The doc table: `//! | [`name`](CONST) | type | labels | … |`.
    types = dict(re.findall(r"^//! \| \[`(redlock_[a-z_0-9]+)`\]\([A-Z_0-9]+\) \| (\w+) \|", text, re.M))
    missing = [n for n in names if n not in types]
    if missing:
        sys.exit(f"{path}: the doc table has no row for {missing}")
    return names, types


def strip_promql(expr):
    """The expression without strings, label matchers, label lists and ranges."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return expr


def metric_names(expr):
    """The metric names an expression reads (Grafana's label_values(metric, label) too)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.S)
    if m:
        expr = m.group(1)
    expr = strip_promql(expr)
    found = []
    for word in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", expr):
        w = word.group(1)
        if w.lower() not in KEYWORDS:
            found.append(w)
    return found


def known(name, names, types):
    if name in names:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) == "histogram":
            return True
    return False


def base_name(name, types):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
            return name[: -len(suffix)]
    return name


def rule_exprs(path):
    doc = yaml.safe_load(open(path, encoding="utf-8"))
    out = []
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            what = rule.get("alert") or rule.get("record")
            out.append((f"{os.path.basename(path)}: {what}", rule["expr"], rule))
    return out


def dashboard_exprs(dash, problems):
    out = []
    if not isinstance(dash.get("schemaVersion"), int):
        problems.append("dashboard: no schemaVersion")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    for want in ("datasource", "job", "instance"):
        if want not in variables:
            problems.append(f"dashboard: no `{want}` variable")
    for name, v in variables.items():
        query = v.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if v.get("type") == "query" and query:
            out.append((f"dashboard variable {name}", query, None))

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        title = p.get("title", "?")
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append(f"dashboard panel {title!r}: its datasource is not ${{datasource}}")
        if not p.get("targets"):
            problems.append(f"dashboard panel {title!r}: no query")
        for t in p.get("targets", []):
            if (t.get("datasource") or {}).get("uid") != "${datasource}":
                problems.append(f"dashboard panel {title!r} {t.get('refId')}: datasource is not ${{datasource}}")
            expr = t.get("expr", "")
            out.append((f"dashboard panel {title!r} {t.get('refId')}", expr, p))
            # Each metric selector is narrowed to the chosen jobs and instances.
            for sel in re.finditer(r"\b(redlock_[a-z_0-9]+)(\{[^}]*\})?", expr):
                labels = sel.group(2) or ""
                if 'job=~"$job"' not in labels or 'instance=~"$instance"' not in labels:
                    problems.append(
                        f"dashboard panel {title!r} {t.get('refId')}: {sel.group(1)} without "
                        'job=~"$job", instance=~"$instance"'
                    )
    return out


def test_coverage(rules_path, tests_path, problems):
    alerts = [r["alert"] for g in yaml.safe_load(open(rules_path))["groups"] for r in g["rules"] if "alert" in r]
    tests = yaml.safe_load(open(tests_path, encoding="utf-8")).get("tests", [])
    fires, silent = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    for a in alerts:
        if a not in fires:
            problems.append(f"{tests_path}: no test where {a} fires")
        if a not in silent:
            problems.append(f"{tests_path}: no test where {a} stays silent")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default=os.path.join(ROOT, "ops/prometheus/alerts.yml"))
    ap.add_argument("--dashboard", default=os.path.join(ROOT, "ops/grafana/tower-redlock.json"))
    ap.add_argument("--tests", default=os.path.join(ROOT, "ops/prometheus/alerts.test.yml"))
    ap.add_argument("--metrics-rs", default=os.path.join(ROOT, "src/metrics.rs"))
    args = ap.parse_args()

    names, types = crate_names(args.metrics_rs)
    problems = []
    exprs = rule_exprs(args.rules)
    dash = json.load(open(args.dashboard, encoding="utf-8"))
    dash_exprs = dashboard_exprs(dash, problems)
    used_by_dashboard = set()
    for where, expr, panel in exprs + dash_exprs:
        found = metric_names(expr)
        if not found:
            problems.append(f"{where}: reads no metric")
        for n in found:
            if not known(n, names, types):
                problems.append(f"{where}: dangling metric name {n} (not in tower_redlock::metrics::NAMES)")
            elif where.startswith("dashboard"):
                used_by_dashboard.add(base_name(n, types))
    for n in names:
        if n not in used_by_dashboard:
            problems.append(f"dashboard: {n} (in NAMES) is used by no panel")
    if args.tests != "-":
        test_coverage(args.rules, args.tests, problems)

    for p in problems:
        print(f"ops-names: {p}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"ops-names: {len(exprs)} alert expressions and {len(dash_exprs)} dashboard queries read "
        f"only the crate's {len(names)} metric names; every name has a panel; every alert has "
        "a firing and a silent test"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
