"""The safety stop: a robot started through the SDK stops when the starting process is gone.

The child is a separate `python -c` process (the SDK sends no `rlark-detach`, so the child
owns the robot); the runtime's watchdog (sim.yaml: 2 s, checked every 0.5 s) must stop the
robot after the child exits or is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROBOT, SDK, Runtime
from rlark_embodied import RobotClient, RobotState

# sim.yaml's watchdog, and how long past it the stop may take (check period, slow machine).
WATCHDOG = 2.0
GRACE = 15.0

CHILD = """
import sys, time
from rlark_embodied import RobotClient
socket_path, robot, then = sys.argv[1:4]
client = RobotClient(socket_path)
started = client.start_robot(robot, "teleop")
print(started.owner_pid, flush=True)
if then == "hold":
    time.sleep(120)  # until killed; the test kills it well before
"""


def _start_child(runtime: Runtime, then: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ)
    # The process rule: no replica owner, whatever environment the tests run in.
    env.pop("RLINF_EMBODIED_OWNER", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(SDK / "src"), env.get("PYTHONPATH", "")] if p
    )
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(runtime.robot_socket), ROBOT, then],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(timeout=30)
        pytest.fail(
            f"child did not start the robot (exit {child.returncode}): {child.stderr.read()}"
        )
    return child, int(line)


def _wait_stopped(robots: RobotClient, deadline_s: float) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        status = robots.get_robot_status(ROBOT)
        if status.state == RobotState.STOPPED:
            return status.message
        time.sleep(0.1)
    status = robots.get_robot_status(ROBOT)
    pytest.fail(
        f"robot still {RobotState(status.state).name} {deadline_s}s after its owner went away "
        f"(message {status.message!r}, owner {status.owner_pid})"
    )


def test_safety_stop_when_owner_exits(runtime: Runtime, robots: RobotClient) -> None:
    child, owner = _start_child(runtime, "exit")
    assert owner == child.pid, "the child, not the runtime or this process, owns the robot"
    assert child.wait(timeout=30) == 0, child.stderr.read() if child.stderr else ""
    message = _wait_stopped(robots, WATCHDOG + GRACE)
    assert message.startswith(f"safety stop: owner process {child.pid}"), message
    assert robots.get_robot_status(ROBOT).owner_pid == 0
    assert any("safety stop" in line for line in robots.get_robot_logs(ROBOT))


def test_safety_stop_when_owner_is_killed(runtime: Runtime, robots: RobotClient) -> None:
    child, owner = _start_child(runtime, "hold")
    try:
        assert owner == child.pid
        # A live owner holding its (idle) connection keeps the robot past the watchdog.
        time.sleep(WATCHDOG + 1.0)
        status = robots.get_robot_status(ROBOT)
        assert status.state == RobotState.RUNNING, status.message
        assert status.owner_pid == child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    message = _wait_stopped(robots, WATCHDOG + GRACE)
    assert message.startswith(f"safety stop: owner process {child.pid}"), message


def test_a_replica_owns_what_its_short_lived_child_started(
    runtime: Runtime, robots: RobotClient
) -> None:
    """With RLINF_EMBODIED_OWNER (set by rlark's agent in a replica) the caller's session
    owns the robot: a helper that starts it and exits leaves it running while the session
    leader lives; the leader's end stops it."""
    env = dict(os.environ)
    env["RLINF_EMBODIED_OWNER"] = "rlark-test/replica-0"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(SDK / "src"), env.get("PYTHONPATH", "")] if p
    )
    # The leader of a new session (as rlark's supervisor is): runs the helper, says so,
    # and lives on.
    script = '"$0" -c "$1" "$2" "$3" exit && echo helper-done && exec sleep 120'
    leader = subprocess.Popen(
        ["sh", "-c", script, sys.executable, CHILD, str(runtime.robot_socket), ROBOT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert leader.stdout is not None
        owner = leader.stdout.readline().strip()
        done = leader.stdout.readline().strip()
        if done != "helper-done":
            leader.kill()
            pytest.fail(f"helper failed ({owner!r}, {done!r}): {leader.stderr.read()}")
        assert int(owner) == leader.pid, "the session leader, not the helper, owns it"
        # The helper is gone; well past the watchdog the robot still runs.
        time.sleep(WATCHDOG + 1.0)
        status = robots.get_robot_status(ROBOT)
        assert status.state == RobotState.RUNNING, status.message
        assert status.owner_pid == leader.pid
    finally:
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=30)
    message = _wait_stopped(robots, WATCHDOG + GRACE)
    assert message.startswith("safety stop: owner replica rlark-test/replica-0 ended"), message
