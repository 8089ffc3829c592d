"""`rlark.task()`: the replica's identity from the environment contract."""

from __future__ import annotations

import pytest

import rlark

CONTRACT = {
    "RLARK_SERVER": "https://127.0.0.1:8443",
    "RLARK_CLUSTER_ID": "cloud",
    "RLARK_NODE_NAME": "vm-cloud",
    "RLARK_NAMESPACE": "rlark-cloud",
    "RLARK_JOB": "ppo",
    "RLARK_TASK": "ppo-rollout",
    "RLARK_TASK_UID": "3f2a",
    "RLARK_TASK_ROLE": "Rollout",
    "RLARK_POD_NAME": "ppo-rollout-1",
    "RLARK_REPLICA_INDEX": "1",
    "RLARK_NODE_RANK_START": "1",
    "RLARK_NODE_RANK": "2",
    "RLARK_TOTAL_NODES": "3",
    "RLARK_RAY_ROLE": "worker",
}


def test_outside_a_task_there_is_no_task() -> None:
    assert rlark.task({}) is None
    assert rlark.task({"RLARK_SERVER": "https://x"}) is None


def test_the_contract_becomes_the_task() -> None:
    me = rlark.task(CONTRACT)
    assert me is not None
    assert (me.name, me.namespace, me.job, me.role) == ("ppo-rollout", "rlark-cloud", "ppo", "Rollout")
    assert (me.replica_index, me.node_rank, me.node_rank_start, me.total_nodes) == (1, 2, 1, 3)
    assert not me.is_head
    assert me.domain is None and me.pod_ip is None and me.head_address is None


def test_a_head_in_a_domain() -> None:
    env = dict(CONTRACT, RLARK_RAY_ROLE="head", RLARK_DOMAIN="net", RLARK_POD_IP="10.8.0.2",
               RLARK_HEAD_ADDRESS="ppo-actor-0.net")
    me = rlark.task(env)
    assert me is not None and me.is_head
    assert (me.domain, me.pod_ip, me.head_address) == ("net", "10.8.0.2", "ppo-actor-0.net")


def test_a_bare_task_has_no_job_and_defaults_its_ranks() -> None:
    env = {k: v for k, v in CONTRACT.items()
           if k not in ("RLARK_JOB", "RLARK_NODE_RANK", "RLARK_NODE_RANK_START",
                        "RLARK_TOTAL_NODES", "RLARK_RAY_ROLE")}
    me = rlark.task(dict(env, RLARK_JOB=""))
    assert me is not None
    assert me.job is None and me.ray_role is None
    assert (me.node_rank_start, me.node_rank, me.total_nodes) == (0, 1, 1)


def test_a_deployment_pod_has_no_index() -> None:
    env = {k: v for k, v in CONTRACT.items() if k not in ("RLARK_REPLICA_INDEX", "RLARK_NODE_RANK")}
    me = rlark.task(env)
    assert me is not None
    assert me.replica_index is None and me.node_rank is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RLARK_NAMESPACE": ""}, "RLARK_NAMESPACE is not set"),
        ({"RLARK_REPLICA_INDEX": "one"}, "RLARK_REPLICA_INDEX='one' is not an integer"),
    ],
)
def test_a_broken_contract_names_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(rlark.TaskEnvironmentError, match=message):
        rlark.task(dict(CONTRACT, **change))
