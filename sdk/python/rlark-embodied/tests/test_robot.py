"""RobotClient against a real `rlark embodied` with the sim arm arm-0 (modes idle, teleop)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from conftest import ROBOT, Runtime
from rlark_embodied import (
    EmbodiedError,
    FailedPreconditionError,
    InvalidArgumentError,
    ModeConfig,
    NotFoundError,
    PermissionDeniedError,
    RobotClient,
    RobotState,
)


def test_lists_the_robot_and_its_modes(robots: RobotClient) -> None:
    listed = robots.list_robots()
    assert [r.robot_id for r in listed] == [ROBOT]
    assert listed[0].state == RobotState.STOPPED
    assert listed[0].backend == "sim"
    assert listed[0].robot_type == "sim-arm"
    assert dict(listed[0].params) == {"dof": "6"}

    modes = {m.name: m for m in robots.list_modes(ROBOT)}
    assert sorted(modes) == ["idle", "teleop"]
    assert modes["teleop"].package == "rlark_sim"
    assert modes["teleop"].launch_file == "arm.launch"
    assert modes["teleop"].args["target"] == "0.3,-0.2,0.5,0,0.1,0"


def test_start_switch_stop(robots: RobotClient) -> None:
    started = robots.start_robot(ROBOT, "idle")
    assert started.state == RobotState.RUNNING
    assert started.current_mode.name == "idle"
    # The SDK does not detach: this process owns the robot (safety watchdog).
    assert started.owner_pid == os.getpid()

    status = robots.get_robot_status(ROBOT)
    assert status.state == RobotState.RUNNING
    assert status.mode == "idle"
    assert status.current_mode.args["joints"] == "6"
    assert list(status.sim.positions) == [0.0] * 6

    switched = robots.switch_mode(ROBOT, "teleop", args={"target": "0.5,0,0,0,0,0"})
    assert switched.state == RobotState.RUNNING
    assert switched.mode == "teleop"
    # Request args override the preset's.
    assert switched.current_mode.args["target"] == "0.5,0,0,0,0,0"
    status = robots.get_robot_status(ROBOT)
    assert status.mode == "teleop"
    assert list(status.sim.targets) == [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert status.owner_pid == os.getpid()

    logs = robots.get_robot_logs(ROBOT)
    assert logs, "a started robot has log lines"
    assert len(robots.get_robot_logs(ROBOT, tail=1)) == 1

    stopped = robots.stop_robot(ROBOT)
    assert stopped.state == RobotState.STOPPED
    status = robots.get_robot_status(ROBOT)
    assert status.state == RobotState.STOPPED
    assert status.owner_pid == 0

    reset = robots.reset_robot(ROBOT)
    assert reset.state == RobotState.STOPPED


def test_start_with_default_mode_and_mode_config_mapping(robots: RobotClient) -> None:
    started = robots.start_robot(ROBOT, mode_config={"args": {"speed": "2.0"}}, env={"ARM_NOTE": 1})
    assert started.state == RobotState.RUNNING
    assert started.current_mode.name == "idle"  # sim.yaml's defaultMode
    assert started.current_mode.args["speed"] == "2.0"
    assert started.current_mode.env["ARM_NOTE"] == "1"


def test_detach_starts_without_owner(robots: RobotClient) -> None:
    started = robots.start_robot(ROBOT, "idle", detach=True)
    assert started.state == RobotState.RUNNING
    assert started.owner_pid == 0


def test_unknown_robot_is_not_found(robots: RobotClient) -> None:
    for call in (
        lambda: robots.get_robot_status("arm-9"),
        lambda: robots.start_robot("arm-9", "idle"),
        lambda: robots.stop_robot("arm-9"),
        lambda: robots.list_modes("arm-9"),
    ):
        with pytest.raises(NotFoundError) as caught:
            call()
        error = caught.value
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.status_code == grpc.StatusCode.NOT_FOUND
        assert "arm-9" in error.details()
        assert isinstance(error, EmbodiedError)
        # RLark's SDK let grpc.RpcError through: code catching that keeps working.
        assert isinstance(error, grpc.RpcError)
        assert error.target == robots.target


def test_errors_keep_status_and_message(robots: RobotClient) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        robots.start_robot(ROBOT, "dance")
    assert "dance" in caught.value.message
    assert robots.get_robot_status(ROBOT).state == RobotState.STOPPED

    with pytest.raises(FailedPreconditionError):
        robots.switch_mode(ROBOT, "teleop")

    robots.start_robot(ROBOT, "idle")
    with pytest.raises(FailedPreconditionError) as again:
        robots.start_robot(ROBOT, "teleop")
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert robots.get_robot_status(ROBOT).mode == "idle"
    robots.stop_robot(ROBOT)

    # sim.yaml allows no custom launches.
    custom = ModeConfig(package="rlark_sim", launch_file="arm.launch")
    with pytest.raises(PermissionDeniedError) as denied:
        robots.start_robot(ROBOT, mode_config=custom)
    assert "rlark_sim" in denied.value.message

    with pytest.raises(InvalidArgumentError):
        robots.get_robot_logs(ROBOT, tail=-1)

    with pytest.raises(TypeError):
        robots.start_robot(ROBOT, mode_config=["not", "a", "config"])  # type: ignore[arg-type]


def test_packages(robots: RobotClient) -> None:
    packages = {p.name: p for p in robots.list_packages()}
    assert "rlark_sim" in packages
    assert packages["rlark_sim"].allowed is False
    assert robots.get_package_info("rlark_sim").name == "rlark_sim"
    assert robots.get_package_launch_files("rlark_sim") == ["arm.launch"]
    args = {a.name: a for a in robots.get_launch_file_args("rlark_sim", "arm.launch")}
    assert {"joints", "target", "speed", "rate", "fault"} <= set(args)
    assert args["joints"].default == "6"
    with pytest.raises(NotFoundError):
        robots.get_package_info("no_such_package")


def test_socket_from_environment(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_EMBODIED_ROS_SOCKET_PATH", str(runtime.robot_socket))
    with RobotClient() as client:
        assert client.target == f"unix:{runtime.robot_socket}"
        assert [r.robot_id for r in client.list_robots()] == [ROBOT]


def test_missing_socket_fails_early_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "ros-ctrl.sock"
    client = RobotClient(missing, timeout=1)
    with pytest.raises(EmbodiedError) as caught:
        client.connect(timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert str(missing) in str(caught.value)
    with pytest.raises(EmbodiedError) as call:
        client.list_robots()
    assert call.value.code() == grpc.StatusCode.UNAVAILABLE
    client.close()


def _relay(listener: socket.socket, target: Path, stop: threading.Event) -> None:
    """Forward every TCP connection of `listener` to the unix socket `target`."""

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(str(target))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


@pytest.fixture
def tcp_address(runtime: Runtime) -> Iterator[str]:
    """127.0.0.1:PORT relayed to the runtime's robot socket (rlark serves unix sockets only;
    the SDK's TCP path is what is under test)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()
    thread = threading.Thread(
        target=_relay, args=(listener, runtime.robot_socket, stop), daemon=True
    )
    thread.start()
    host, port = listener.getsockname()
    yield f"{host}:{port}"
    stop.set()
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
    listener.close()
    thread.join(timeout=5)


def test_tcp_address(tcp_address: str) -> None:
    with RobotClient(address=tcp_address) as client:
        assert client.target == tcp_address
        assert [r.robot_id for r in client.list_robots()] == [ROBOT]
        with pytest.raises(NotFoundError):
            client.get_robot_status("arm-9")
