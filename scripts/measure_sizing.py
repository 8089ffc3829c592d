#!/usr/bin/env python3
"""Measure what one rlark server costs per stored object and per connected agent (the
"Sizing" figures of docs/operations.md). Loopback only; bounded in count and time.

  python3 scripts/measure_sizing.py RLARK_BINARY [--objects 20000] [--agents 20]

1. `rlark server --controllers=false` on a temporary data directory (the objects stay
   inert); its RSS, open descriptors and threads (/proc/PID) and the database's size.
2. OBJECTS Jobs of ~1 KiB JSON (the shape of `rlark bench api`'s), created over HTTPS with
   the admin certificate by 8 threads; the same readings again.
3. AGENTS real `rlark agent` processes (raw, each its own cluster ID and data directory,
   joined with one bootstrap token), each holding a tunnel and heartbeating its Node and
   Lease; once all are connected, the readings again and the server's CPU over 30 s.
Prints the readings as JSON.
"""

import argparse
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time


def proc(pid):
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": round(rss / 2**20, 1), "fds": fds, "threads": threads}


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def db_bytes(data_dir):
    return sum(
        os.path.getsize(os.path.join(data_dir, f))
        for f in os.listdir(data_dir)
        if f.startswith("rlark.db")
    )


def job(name):
    body = {
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "rlark-sizing"}},
        "spec": {
            "tasks": [
                {
                    "name": "rollout",
                    "agentType": "Raw",
                    "role": "Rollout",
                    "raw": {
                        "entrypoint": ["python3", "-m", "rollout"],
                        "replicas": 2,
                        "env": [{"name": "PAD", "value": ""}],
                    },
                }
            ]
        },
    }
    pad = 1024 - len(json.dumps(body, separators=(",", ":")))
    body["spec"]["tasks"][0]["raw"]["env"][0]["value"] = ("0123456789abcdef" * 64)[: max(pad, 0)]
    return json.dumps(body, separators=(",", ":")).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rlark")
    ap.add_argument("--objects", type=int, default=20000)
    ap.add_argument("--agents", type=int, default=20)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rlark-sizing.")
    data = os.path.join(work, "server")
    children = []
    try:
        log = open(os.path.join(work, "server.log"), "w")
        server = subprocess.Popen(
            [args.rlark, "server", "--data-dir", data, "--listen", "127.0.0.1:0", "--controllers=false"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, RUST_LOG="warn,rlark_server=info"),
        )
        children.append(server)
        port = None
        for _ in range(200):
            m = re.search(r"listening addr=127\.0\.0\.1:(\d+)", open(log.name).read())
            if m:
                port = int(m.group(1))
                break
            time.sleep(0.1)
        if port is None:
            sys.exit("the server did not start:\n" + open(log.name).read())
        time.sleep(1)
        report = {"binary": args.rlark, "start": {**proc(server.pid), "db_mib": round(db_bytes(data) / 2**20, 1)}}

        ctx = ssl.create_default_context(cafile=os.path.join(data, "pki", "ca.crt"))
        ctx.load_cert_chain(os.path.join(data, "pki", "admin.crt"), os.path.join(data, "pki", "admin.key"))
        errors = []
        counter = iter(range(args.objects))
        lock = threading.Lock()

        def create():
            conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30)
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                conn.request("POST", "/apis/rlinf.io/v1alpha1/jobs", job(f"sizing-{i:06d}"),
                             {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                if response.status != 201:
                    errors.append(response.status)
                    return

        started = time.monotonic()
        threads = [threading.Thread(target=create) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            sys.exit(f"creates failed: {errors[:5]}")
        elapsed = time.monotonic() - started
        time.sleep(2)
        report["objects"] = {
            "count": args.objects,
            "create_seconds": round(elapsed, 1),
            **proc(server.pid),
            "db_mib": round(db_bytes(data) / 2**20, 1),
        }

        kubeconfig = os.path.join(data, "admin.kubeconfig")
        token = json.loads(subprocess.check_output(
            [args.rlark, "token", "create", "--ttl", "10m", "-o", "json", "--kubeconfig", kubeconfig]))
        def sessions_now():
            conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
            conn.request("GET", "/metrics")
            m = re.search(r"^rlark_tunnel_sessions (\d+)", conn.getresponse().read().decode(), re.M)
            return int(m.group(1)) if m else 0

        # One at a time: a bootstrap token is refused while another join uses it.
        for i in range(args.agents):
            agent_log = open(os.path.join(work, f"agent-{i}.log"), "w")
            children.append(subprocess.Popen(
                [args.rlark, "agent", "--server", f"https://127.0.0.1:{port}", "--cluster-id", f"sizing-{i}",
                 "--data-dir", os.path.join(work, f"agent-{i}"), "--node-name", f"node-{i}",
                 "--token", token["token"], "--ca-hash", token["caHash"]],
                stdout=agent_log, stderr=subprocess.STDOUT, env=dict(os.environ, RUST_LOG="warn"),
            ))
            deadline = time.monotonic() + 60
            while sessions_now() < i + 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            sessions = sessions_now()
            if sessions < i + 1:
                tail = open(os.path.join(work, f"agent-{i}.log")).read()[-600:]
                sys.exit(f"agent {i} did not connect ({sessions} sessions); its log:\n{tail}")
        time.sleep(5)
        before = cpu_seconds(server.pid)
        time.sleep(30)
        cpu = cpu_seconds(server.pid) - before
        report["agents"] = {
            "count": args.agents,
            "tunnel_sessions": sessions,
            **proc(server.pid),
            "server_cpu_percent_idle": round(cpu / 30 * 100, 2),
            "agent_rss_mib_each": round(sum(proc(c.pid)["rss_mib"] for c in children[1:]) / args.agents, 1),
        }
        print(json.dumps(report, indent=2))
    finally:
        for child in reversed(children):
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
