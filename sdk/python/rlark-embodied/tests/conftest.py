"""A real `rlark embodied` (the binary `cargo test` built) with the sim robot and camera.

The binary is $RLARK_BIN, else $CARGO_TARGET_DIR/debug/rlark, else target/debug/rlark of
this repo. It serves examples/embodied/sim.yaml (robot arm-0, camera cam-0) on sockets in a
temp directory for the whole session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlark_embodied import CameraClient, FailedPreconditionError, RobotClient, RobotState

SDK = Path(__file__).resolve().parent.parent
REPO = SDK.parent.parent.parent
SIM_CONFIG = REPO / "examples" / "embodied" / "sim.yaml"
# The sim.yaml camera.
CAMERA = "cam-0"
ROBOT = "arm-0"


def rlark_binary() -> Path:
    if os.environ.get("RLARK_BIN"):
        path = Path(os.environ["RLARK_BIN"])
    elif os.environ.get("CARGO_TARGET_DIR"):
        path = Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "rlark"
    else:
        path = REPO / "target" / "debug" / "rlark"
    if not path.is_file():
        pytest.fail(
            f"rlark binary not found at {path}: run `cargo build -p rlark` or set RLARK_BIN"
        )
    return path


@dataclass
class Runtime:
    socket_dir: Path
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def robot_socket(self) -> Path:
        return self.socket_dir / "ros-ctrl.sock"

    @property
    def camera_socket(self) -> Path:
        return self.socket_dir / "camera-ctrl.sock"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _accepts(path: Path) -> bool:
    """Whether a unix socket at `path` accepts connections (bound and listening)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _wait_for_socket(runtime: Runtime, path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if runtime.process.poll() is not None:
            pytest.fail(
                f"rlark embodied exited with {runtime.process.returncode}:\n{runtime.output()}"
            )
        if path.exists() and _accepts(path):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="session")
def runtime() -> Iterator[Runtime]:
    """`rlark embodied --config examples/embodied/sim.yaml` on a temp socket directory."""
    binary = rlark_binary()
    socket_dir = Path(tempfile.mkdtemp(prefix="rlark-sdk-"))
    log = socket_dir / "embodied.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "embodied", "--config", str(SIM_CONFIG), "--socket-dir", str(socket_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    rt = Runtime(socket_dir, log, process)
    try:
        if not _wait_for_socket(rt, rt.robot_socket, 60):
            pytest.fail(
                f"rlark embodied did not serve {rt.robot_socket} within 60s:\n{rt.output()}"
            )
        # The camera socket is bound at the same start; a short grace for its listener.
        _wait_for_socket(rt, rt.camera_socket, 5)
        yield rt
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def robots(runtime: Runtime) -> Iterator[RobotClient]:
    """A RobotClient on the runtime; arm-0 is STOPPED before and after the test."""
    with RobotClient(runtime.robot_socket) as client:
        client.reset_robot(ROBOT)
        yield client
        client.reset_robot(ROBOT)
        assert client.get_robot_status(ROBOT).state == RobotState.STOPPED


@pytest.fixture
def camera_socket(runtime: Runtime) -> Path:
    """The camera socket; fails (does not skip) when the runtime does not serve it."""
    if not _accepts(runtime.camera_socket):
        pytest.fail(
            f"rlark embodied does not serve the CameraController: no {runtime.camera_socket.name} "
            f"in {runtime.socket_dir} although {SIM_CONFIG.name} configures camera {CAMERA}. "
            f"Server output:\n{runtime.output()}"
        )
    return runtime.camera_socket


@pytest.fixture
def cameras(camera_socket: Path) -> Iterator[CameraClient]:
    """A CameraClient on the runtime; cam-0 is closed after the test."""
    with CameraClient(camera_socket) as client:
        yield client
        try:
            client.close_camera(CAMERA)
        except FailedPreconditionError:
            pass  # never opened (the test failed early)
