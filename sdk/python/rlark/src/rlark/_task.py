"""The identity of the task replica this process runs as, from the environment contract the
rlark agent gives every replica (docs/tasks.md, "Environment contract")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One replica of an rlark Task, as the agent describes it to the process.

    Optional fields are ``None`` when the agent does not set the variable: ``job`` for a bare
    Task, ``domain``/``pod_ip``/``head_address`` without a Domain, ``ray_role`` outside a Job.
    """

    #: ``RLARK_SERVER``: the control plane's URL.
    server: str
    #: ``RLARK_CLUSTER_ID``.
    cluster_id: str
    #: ``RLARK_NODE_NAME``: the Node the replica runs on.
    node_name: str
    #: ``RLARK_NAMESPACE``: the Task's namespace (``rlark-<clusterID>``).
    namespace: str
    #: ``RLARK_JOB``: the Job, ``None`` for a bare Task.
    job: str | None
    #: ``RLARK_TASK``: the Task's name.
    name: str
    #: ``RLARK_TASK_UID``: this run's uid.
    uid: str
    #: ``RLARK_TASK_ROLE``: ``Actor``, ``Rollout``, ``Env`` or ``Head``.
    role: str
    #: ``RLARK_POD_NAME``: ``<task>-<i>``.
    pod_name: str
    #: ``RLARK_REPLICA_INDEX``: ``i``, 0-based; ``None`` where replicas have no index (the
    #: Pods of a Kubernetes Deployment or DaemonSet).
    replica_index: int | None
    #: ``RLARK_NODE_RANK``: unique across all replicas of the Job; ``None`` without an index.
    node_rank: int | None
    #: ``RLARK_NODE_RANK_START``: the replicas of the Job's tasks before this one.
    node_rank_start: int
    #: ``RLARK_TOTAL_NODES``: the replicas of all the Job's tasks.
    total_nodes: int
    #: ``RLARK_DOMAIN``.
    domain: str | None
    #: ``RLARK_POD_IP``: this replica's address in its domain.
    pod_ip: str | None
    #: ``RLARK_RAY_ROLE``: ``head`` or ``worker``.
    ray_role: str | None
    #: ``RLARK_HEAD_ADDRESS``: replica 0 of the Job's head task, by its name in the domain.
    head_address: str | None

    @property
    def is_head(self) -> bool:
        """Whether this replica belongs to the Job's head task (``RLARK_RAY_ROLE=head``)."""
        return self.ray_role == "head"


class TaskEnvironmentError(RuntimeError):
    """The environment says this is a task replica but a variable of the contract is
    missing or malformed (an agent older or newer than this SDK, or a hand-made env)."""


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = _opt_int(env, name)
    return default if value is None else value


def _opt_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise TaskEnvironmentError(f"{name}={value!r} is not an integer") from None


def _str(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise TaskEnvironmentError(f"{name} is not set")
    return value


def _opt(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


def task(environ: Mapping[str, str] | None = None) -> Task | None:
    """The replica this process runs as, or ``None`` outside an rlark task (no
    ``RLARK_TASK`` in the environment).

    Raises :class:`TaskEnvironmentError` naming the variable when ``RLARK_TASK`` is set but
    another variable of the contract is missing or not a number.
    """
    env = os.environ if environ is None else environ
    if not env.get("RLARK_TASK"):
        return None
    index = _opt_int(env, "RLARK_REPLICA_INDEX")
    rank_start = _int(env, "RLARK_NODE_RANK_START", 0)
    rank = _opt_int(env, "RLARK_NODE_RANK")
    if rank is None and index is not None:
        rank = rank_start + index
    return Task(
        server=_str(env, "RLARK_SERVER"),
        cluster_id=_str(env, "RLARK_CLUSTER_ID"),
        node_name=_str(env, "RLARK_NODE_NAME"),
        namespace=_str(env, "RLARK_NAMESPACE"),
        job=_opt(env, "RLARK_JOB"),
        name=_str(env, "RLARK_TASK"),
        uid=_str(env, "RLARK_TASK_UID"),
        role=_str(env, "RLARK_TASK_ROLE"),
        pod_name=_str(env, "RLARK_POD_NAME"),
        replica_index=index,
        node_rank=rank,
        node_rank_start=rank_start,
        total_nodes=_int(env, "RLARK_TOTAL_NODES", 1),
        domain=_opt(env, "RLARK_DOMAIN"),
        pod_ip=_opt(env, "RLARK_POD_IP"),
        ray_role=_opt(env, "RLARK_RAY_ROLE"),
        head_address=_opt(env, "RLARK_HEAD_ADDRESS"),
    )
