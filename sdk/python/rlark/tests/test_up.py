"""The SDK in a task that a real `rlark up` runs: reports and events reach the control
plane, in order, flushed at exit, and `rlark.task()` matches the Task."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import rlark
from conftest import Up, wait_for

SCRIPT = textwrap.dedent(
    """
    import dataclasses, rlark
    me = rlark.task()
    assert me is not None, "not a task?"
    rlark.event("identity", **dataclasses.asdict(me))
    for step in range(1, 21):
        rlark.report(step=step, reward=step / 10, loss=1.0 / step)
    rlark.event("checkpoint", path="/ckpt/20")
    # No flush: the reporter flushes at interpreter exit.
    """
)


def job(name: str) -> str:
    sdk = str(Path(rlark.__file__).resolve().parent.parent)
    return json.dumps(
        {
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "tasks": [
                    {
                        "name": "trainer",
                        "agentType": "Raw",
                        "role": "Actor",
                        "nodeSelector": {"rlark.io/cluster-id": "cloud"},
                        "raw": {
                            "replicas": 1,
                            "entrypoint": [sys.executable, "-c", SCRIPT],
                            "environment": [{"name": "PYTHONPATH", "value": sdk}],
                        },
                    }
                ]
            },
        }
    )


def reports(up: Up, task: str) -> list[dict[str, object]]:
    result = up.rlark("reports", f"task/{task}", "-o", "json", check=False)
    if result.returncode != 0:
        return []
    return [item["spec"]["report"] for item in json.loads(result.stdout)["items"]]


def test_reports_from_a_task_reach_the_control_plane(up: Up, tmp_path: Path) -> None:
    manifest = tmp_path / "job.json"
    manifest.write_text(job("sdk"))
    up.rlark("apply", "-f", str(manifest))
    task = "sdk-trainer"

    got = wait_for("22 reports", lambda: (r := reports(up, task)) and len(r) >= 22 and r)
    identity, *steps, checkpoint = got
    assert identity["type"] == "identity"
    assert identity["name"] == task and identity["job"] == "sdk"
    assert identity["namespace"] == "rlark-cloud" and identity["cluster_id"] == "cloud"
    assert identity["replica_index"] == 0 and identity["pod_name"] == f"{task}-0"
    assert identity["role"] == "Actor"
    assert [(s["type"], s["step"], s["value"]) for s in steps] == [
        ("reward", i, i / 10) for i in range(1, 21)
    ]
    assert steps[3]["loss"] == 0.25
    assert checkpoint == {"type": "checkpoint", "path": "/ckpt/20"}

    def phase() -> object:
        result = up.rlark("get", "task", task, "-n", "rlark-cloud", "-o", "json", check=False)
        return result.returncode == 0 and json.loads(result.stdout)["status"].get("phase")

    wait_for("the task to succeed", lambda: phase() == "Succeeded")
    table = up.rlark("reports", f"task/{task}").stdout
    assert "checkpoint" in table and "reward" in table
