#!/usr/bin/env python3
"""Lint and render the Helm charts in deploy/helm with Helm's own Go engine.

Helm is not packaged by Debian and no other download is reachable here; helm-python-sdk
(PyPI) ships Helm v4's official Go SDK as a shared library (libhelm_c) with ctypes bindings,
so `helm lint` and `helm template` run from it with the same code as the helm binary.

  python3 scripts/helm_check.py OUT_DIR

writes OUT_DIR/<case>.yaml, one multi-document manifest per case below, for
crates/rlark/tests/e2e/deploy_helm.rs to decode into k8s-openapi types with unknown fields
denied. Exits 1 on a lint finding (warnings count: strict), a render error, or a values
combination the charts should refuse but render.
"""

import json
import os
import sys

import helm_python as helm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHARTS = os.path.join(ROOT, "deploy", "helm")

AGENT_REQUIRED = {
    "server": "https://rlark.example.com:443",
    "clusterID": "gpu-a",
    "caHash": "sha256:" + "ab" * 32,
}

CASES = {
    "rlark-default": ("rlark", {}),
    "rlark-full": (
        "rlark",
        {
            "tlsSans": ["10.0.0.10"],
            "store": {"postgres": {"url": "postgres://rlark:secret@db:5432/rlark"}},
            "ca": {"existingSecret": "rlark-ca"},
            "ingress": {"enabled": True},
            "proxy": {"enabled": True, "host": "apps.example.net"},
            "gateway": {
                "enabled": True,
                "parentRefs": [{"name": "edge", "namespace": "gateways", "sectionName": "tls"}],
            },
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "podAnnotations": {"example.com/team": "rl"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
        },
    ),
    "rlark-postgres-no-volume": (
        "rlark",
        {
            "persistence": {"enabled": False},
            "ca": {"existingSecret": "rlark-ca"},
            "store": {"postgres": {"existingSecret": "db", "existingSecretKey": "dsn"}},
        },
    ),
    "rlark-replicas": (
        "rlark",
        {
            "replicaCount": 3,
            "store": {"postgres": {"existingSecret": "db"}},
            "ca": {"sealingSecret": {"existingSecret": "rlark-ca-sealing"}},
            "ingress": {"enabled": True},
        },
    ),
    "rlark-agent-default": ("rlark-agent", dict(AGENT_REQUIRED, joinToken="abcdef.0123456789abcdef")),
    "rlark-agent-full": (
        "rlark-agent",
        dict(
            AGENT_REQUIRED,
            existingJoinTokenSecret="join",
            tensorboardImage="registry.example/tensorboard:2.15",
            workloadNamespace={"name": "rl-jobs", "create": False},
            nodeRuntime={
                "enabled": True,
                "config": {
                    "types": [
                        {
                            "type": "sim-arm",
                            "backend": "sim",
                            "defaultMode": "idle",
                            "modes": {"idle": {"package": "rlark_sim", "launchFile": "arm.launch"}},
                        }
                    ],
                    "robots": [{"id": "arm-0", "type": "sim-arm"}],
                    "cameras": [],
                    "devicePlugin": {"enabled": True, "kubeletDir": "/var/lib/kubelet/device-plugins"},
                },
            },
        ),
    ),
}

# Values the charts must refuse, with a word of the message that says why.
REFUSED = {
    "replicas without PostgreSQL": (
        "rlark",
        {"replicaCount": 2, "ca": {"sealingSecret": {"existingSecret": "s"}}},
        "needs a PostgreSQL store",
    ),
    "replicas without a sealing secret": (
        "rlark",
        {"replicaCount": 2, "store": {"postgres": {"url": "postgres://db/rlark"}}},
        "ca.sealingSecret",
    ),
    "replicas sharing one claim": (
        "rlark",
        {
            "replicaCount": 2,
            "store": {"postgres": {"url": "postgres://db/rlark"}},
            "ca": {"sealingSecret": {"existingSecret": "s"}},
            "persistence": {"existingClaim": "data"},
        },
        "existingClaim",
    ),
    "no replica": ("rlark", {"replicaCount": 0}, "at least 1"),
    "task apps on the console's host": (
        "rlark",
        {"ingress": {"enabled": True, "host": "a.example"}, "proxy": {"enabled": True, "host": "a.example"}},
        "origin of their own",
    ),
    "no volume and no CA": ("rlark", {"persistence": {"enabled": False}}, "ca.sealingSecret"),
    "gateway without parent": ("rlark", {"gateway": {"enabled": True}}, "parentRefs"),
    "agent without server": ("rlark-agent", {}, "server is required"),
}


def lint(chart, values):
    report = helm.lint(os.path.join(CHARTS, chart), values, strict=True, namespace="rlark")
    findings = [m for m in report["messages"] if m["severity"] >= 2] + [
        {"severity": 3, "path": chart, "error": e} for e in report.get("errors") or []
    ]
    return findings


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: helm_check.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    failed = False
    print(f"helm SDK {helm.helm_sdk_version()} (helm-python-sdk {helm.__version__})")
    for case, (chart, values) in CASES.items():
        findings = lint(chart, values)
        for f in findings:
            print(f"{case}: lint: {f['path']}: {f['error']}", file=sys.stderr)
            failed = True
        with helm.Chart.load(os.path.join(CHARTS, chart)) as loaded:
            rendered = loaded.render(values, name=chart, namespace="rlark", is_install=True)
        docs = []
        for path in sorted(rendered):
            if path.endswith("NOTES.txt") or not rendered[path].strip():
                continue
            docs.append(f"# Source: {path}\n{rendered[path].strip()}\n")
        with open(os.path.join(out, f"{case}.yaml"), "w") as f:
            f.write("---\n".join(docs))
        print(f"{case}: lint clean, {len(docs)} templates rendered")
    for what, (chart, values, word) in REFUSED.items():
        try:
            with helm.Chart.load(os.path.join(CHARTS, chart)) as loaded:
                loaded.render(values, name=chart, namespace="rlark")
        except helm.HelmError as error:
            if word not in str(error):
                print(f"{what}: refused, but not for {word!r}: {error}", file=sys.stderr)
                failed = True
            else:
                print(f"{what}: refused ({word})")
            continue
        print(f"{what}: rendered, but the chart must refuse it", file=sys.stderr)
        failed = True
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(sorted(CASES), f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
