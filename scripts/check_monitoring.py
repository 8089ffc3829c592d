#!/usr/bin/env python3
"""Check deploy/monitoring against promtool and real scrapes (scripts/test_ops.sh).

  check_monitoring.py SCRAPE...

- the Grafana dashboard (rlark-dashboard.json): valid JSON with unique panel ids, panels
  that do not overlap, a Prometheus query in every target; each query's PromQL is checked by
  `promtool check rules` (as a recording rule, with Grafana's variables substituted);
- every rlark_*/process_* metric the dashboard and the alert rules (rlark-alerts.yaml) use
  appears in one of the SCRAPE files (/metrics answers of a real server and agent), so no
  panel or alert watches a metric no process exports.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONITORING = os.path.join(ROOT, "deploy", "monitoring")
METRIC = re.compile(r"\b((?:rlark|process)_[a-z0-9_]+)\b")


def fail(message):
    print(f"check_monitoring: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    scrapes = sys.argv[1:]
    if not scrapes:
        fail("usage: check_monitoring.py SCRAPE...")
    exported = set()
    for path in scrapes:
        for line in open(path):
            if line and not line.startswith("#"):
                exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    dashboard = json.load(open(os.path.join(MONITORING, "rlark-dashboard.json")))
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    if len(ids) != len(set(ids)):
        fail(f"duplicate panel ids: {ids}")
    cells = {}
    exprs = []
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    fail(f"panels {cells[(x, y)]!r} and {p['title']!r} overlap")
                cells[(x, y)] = p["title"]
        if not p.get("targets"):
            fail(f"panel {p['title']!r} has no query")
        for t in p["targets"]:
            if p["datasource"]["type"] != "prometheus" or not t.get("expr"):
                fail(f"panel {p['title']!r}: a target without a Prometheus expr")
            exprs.append((p["title"], t["expr"]))
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for i, (title, expr) in enumerate(exprs):
        promql = expr.replace("$__rate_interval", "5m").replace("$instance", ".*")
        rules["groups"][0]["rules"].append({"record": f"dashboard:panel_{i}", "expr": promql})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        json.dump(rules, f)  # JSON is YAML
        f.flush()
        check = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
        if check.returncode != 0:
            fail(f"dashboard PromQL refused by promtool:\n{check.stdout}{check.stderr}")
    alerts = yaml.safe_load(open(os.path.join(MONITORING, "rlark-alerts.yaml")))
    used = {}
    for title, expr in exprs:
        for name in METRIC.findall(expr):
            used.setdefault(name, f"dashboard panel {title!r}")
    for group in alerts["groups"]:
        for rule in group["rules"]:
            for name in METRIC.findall(rule["expr"]):
                used.setdefault(name, f"alert {rule['alert']}")
    missing = sorted(f"{name} ({where})" for name, where in used.items() if name not in exported)
    if missing:
        fail("metrics used but not exported by any scraped process:\n  " + "\n  ".join(missing))
    print(f"dashboard: {len(panels)} panels, {len(exprs)} queries checked by promtool; "
          f"{len(used)} metric names used by the dashboard and the alerts, all exported")


if __name__ == "__main__":
    main()
