"""Socket path resolution and error mapping (no server needed)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

import rlark_embodied
from rlark_embodied import (
    DEFAULT_CAMERA_SOCKET,
    DEFAULT_ROS_SOCKET,
    CameraClient,
    EmbodiedError,
    FailedPreconditionError,
    NotFoundError,
    RobotClient,
    resolve_target,
)
from rlark_embodied.errors import error_for, status_code_from_int

ENV = (
    "RLINF_EMBODIED_ROS_SOCKET_PATH",
    "RLINF_EMBODIED_ROS2_SOCKET_PATH",
    "RLINF_EMBODIED_CAMERA_SOCKET_PATH",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)


def test_defaults_are_rlarks_sockets() -> None:
    assert RobotClient().target == "unix:/var/run/rlark/ros-ctrl.sock"
    assert CameraClient().target == "unix:/var/run/rlark/camera-ctrl.sock"
    assert DEFAULT_ROS_SOCKET == "/var/run/rlark/ros-ctrl.sock"
    assert rlark_embodied.DEFAULT_ROS2_SOCKET == "/var/run/rlark/ros2-ctrl.sock"
    assert DEFAULT_CAMERA_SOCKET == "/var/run/rlark/camera-ctrl.sock"


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_EMBODIED_ROS2_SOCKET_PATH", "/run/x/ros2-ctrl.sock")
    # Only the ROS 2 controller injected: the robot client follows it.
    assert RobotClient().target == "unix:/run/x/ros2-ctrl.sock"
    monkeypatch.setenv("RLINF_EMBODIED_ROS_SOCKET_PATH", "/run/x/ros-ctrl.sock")
    assert RobotClient().target == "unix:/run/x/ros-ctrl.sock"
    monkeypatch.setenv("RLINF_EMBODIED_CAMERA_SOCKET_PATH", "/run/x/camera-ctrl.sock")
    assert CameraClient().target == "unix:/run/x/camera-ctrl.sock"
    # An explicit path or address wins over the environment.
    assert RobotClient("/other/ros.sock").target == "unix:/other/ros.sock"
    assert RobotClient(address="10.1.2.3:50051").target == "10.1.2.3:50051"
    # The variable may name a TCP endpoint too.
    monkeypatch.setenv("RLINF_EMBODIED_CAMERA_SOCKET_PATH", "edge-1:7000")
    assert CameraClient().target == "edge-1:7000"


def test_path_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_target("run/ros.sock", DEFAULT_ROS_SOCKET) == f"unix:{tmp_path}/run/ros.sock"
    assert resolve_target(tmp_path / "a.sock", DEFAULT_ROS_SOCKET) == f"unix:{tmp_path}/a.sock"
    assert resolve_target("unix:///x/y.sock", DEFAULT_ROS_SOCKET) == "unix:///x/y.sock"
    assert resolve_target("unix:/x/y.sock", DEFAULT_ROS_SOCKET) == "unix:/x/y.sock"
    assert resolve_target("localhost:50051", DEFAULT_ROS_SOCKET) == "localhost:50051"
    assert resolve_target("[::1]:50051", DEFAULT_ROS_SOCKET) == "[::1]:50051"
    # A file that happens to look like host:port is a socket path.
    (tmp_path / "odd:1").touch()
    assert resolve_target("odd:1", DEFAULT_ROS_SOCKET) == f"unix:{tmp_path}/odd:1"
    assert resolve_target(None, DEFAULT_ROS_SOCKET) == "unix:/var/run/rlark/ros-ctrl.sock"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="host:port"):
        RobotClient(address="no-port")
    with pytest.raises(ValueError, match="timeout"):
        RobotClient(timeout=0)


def test_errors_keep_the_status() -> None:
    error = error_for(
        grpc.StatusCode.NOT_FOUND, 'robot "x" not found', rpc="StartRobot", target="unix:/s"
    )
    assert type(error) is NotFoundError
    assert isinstance(error, EmbodiedError) and isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.NOT_FOUND
    assert error.details() == 'robot "x" not found'
    assert str(error) == 'StartRobot on unix:/s: NOT_FOUND: robot "x" not found'
    assert type(error_for(grpc.StatusCode.FAILED_PRECONDITION, "m")) is FailedPreconditionError
    # Codes without a subclass keep the base class and the code.
    other = error_for(grpc.StatusCode.ABORTED, "m")
    assert type(other) is EmbodiedError and other.code() is grpc.StatusCode.ABORTED


def test_status_codes_from_google_rpc_code() -> None:
    assert status_code_from_int(0) is grpc.StatusCode.OK
    assert status_code_from_int(5) is grpc.StatusCode.NOT_FOUND
    assert status_code_from_int(9) is grpc.StatusCode.FAILED_PRECONDITION
    assert status_code_from_int(14) is grpc.StatusCode.UNAVAILABLE
    assert status_code_from_int(999) is grpc.StatusCode.UNKNOWN
