"""RobotClient: start, stop and switch robots through ``ros.controller.v1.RobotController``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._enum import NamedIntEnum
from ._gen import robot_pb2, robot_pb2_grpc
from ._transport import (
    DEFAULT_ROS_SOCKET,
    ENV_ROS2_SOCKET,
    ENV_ROS_SOCKET,
    LONG_TIMEOUT,
    BaseClient,
    resolve_target,
)

__all__ = ["ModeConfig", "RobotClient", "RobotState"]

#: A launch given in a request: a custom launch (``package`` and ``launch_file``) or, with
#: ``package`` empty, additions to a preset mode (``args``, ``env``, ``arg_from``,
#: ``passthrough_robot_args``). The generated message class: ``ModeConfig(package=...,
#: launch_file=..., args={...})``.
ModeConfig = robot_pb2.ModeConfig

# The metadata with which a StartRobot caller declines to own the robot (docs/embodied.md,
# "Safety watchdog"). Sent only when start_robot(detach=True) asks for it.
_DETACH = (("rlark-detach", "true"),)

#: The variable rlark's agent sets in a replica holding devices (``<namespace>/<pod>``).
#: When set, start_robot sends it as the metadata ``rlark-owner``: the replica (the calling
#: process's session), not the calling process, owns the robot.
ENV_OWNER = "RLINF_EMBODIED_OWNER"
_OWNER_KEY = "rlark-owner"


def _start_metadata(detach: bool) -> tuple[tuple[str, str], ...] | None:
    """The ownership metadata of a StartRobot call (docs/embodied.md, "Safety watchdog")."""
    if detach:
        return _DETACH
    owner = os.environ.get(ENV_OWNER, "").strip()
    if owner:
        return ((_OWNER_KEY, owner),)
    return None


class RobotState(NamedIntEnum):
    """A robot's state (``ros.controller.v1.RobotState``); compares equal to the ``state``
    fields of the responses: ``status.state == RobotState.RUNNING``."""

    UNSPECIFIED = robot_pb2.ROBOT_STATE_UNSPECIFIED
    STARTING = robot_pb2.ROBOT_STATE_STARTING
    RUNNING = robot_pb2.ROBOT_STATE_RUNNING
    STOPPING = robot_pb2.ROBOT_STATE_STOPPING
    STOPPED = robot_pb2.ROBOT_STATE_STOPPED
    ERROR = robot_pb2.ROBOT_STATE_ERROR


def _default_robot_socket() -> str:
    # A container given only the ROS 2 controller has only its variable.
    return os.environ.get(ENV_ROS_SOCKET) or os.environ.get(ENV_ROS2_SOCKET) or DEFAULT_ROS_SOCKET


def _mode_config(
    mode_config: robot_pb2.ModeConfig | Mapping[str, Any] | None,
    args: Mapping[str, Any] | None,
    env: Mapping[str, Any] | None,
) -> robot_pb2.ModeConfig | None:
    """`mode_config` (a message or a mapping of its fields) with `args` and `env` added
    (values converted to text); None when there is nothing to send."""
    if mode_config is None:
        config = robot_pb2.ModeConfig()
    elif isinstance(mode_config, robot_pb2.ModeConfig):
        config = robot_pb2.ModeConfig()
        config.CopyFrom(mode_config)
    elif isinstance(mode_config, Mapping):
        config = robot_pb2.ModeConfig(**mode_config)
    else:
        raise TypeError(
            f"mode_config must be a ModeConfig or a mapping, not {type(mode_config).__name__}"
        )
    for name, value in (args or {}).items():
        config.args[str(name)] = str(value)
    for name, value in (env or {}).items():
        config.env[str(name)] = str(value)
    if config.ByteSize() == 0:
        return None
    return config


class RobotClient(BaseClient):
    """A client of the RobotController on one socket.

    ``socket_path`` defaults to ``$RLINF_EMBODIED_ROS_SOCKET_PATH``, then
    ``$RLINF_EMBODIED_ROS2_SOCKET_PATH``, then ``/var/run/rlark/ros-ctrl.sock``; ``address``
    (``host:port``) dials TCP instead. ``timeout`` is the default seconds per call (calls
    that launch or stop processes allow at least 30 s). Use as a context manager, or call
    :meth:`close`::

        with RobotClient() as robots:
            robots.start_robot("arm-0", "teleop")
            print(robots.get_robot_status("arm-0").state == RobotState.RUNNING)

    Safety: the process that starts a robot owns it, and the runtime stops the robot when
    that process exits or has had no connection to the runtime for its watchdog period
    (default 2 s). Keep a client open while the robot should run, or start it with
    ``detach=True``. Inside an rlark replica holding devices (``$RLINF_EMBODIED_OWNER``
    set) the replica owns it instead: the robot stops when the replica ends, whichever of
    its processes started it.

    Methods return the generated response messages (``_gen/robot_pb2.pyi`` types them);
    failures raise :class:`~rlark_embodied.EmbodiedError` subclasses.
    """

    _stub_class = robot_pb2_grpc.RobotControllerStub

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        address: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(resolve_target(socket_path, _default_robot_socket(), address), timeout)

    @property
    def stub(self) -> robot_pb2_grpc.RobotControllerStub:
        """The generated ``RobotControllerStub``."""
        stub: robot_pb2_grpc.RobotControllerStub = super().stub
        return stub

    def start_robot(
        self,
        robot_id: str,
        mode: str = "",
        *,
        mode_config: robot_pb2.ModeConfig | Mapping[str, Any] | None = None,
        args: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        detach: bool = False,
    ) -> robot_pb2.StartRobotResponse:
        """Start ``robot_id`` in preset ``mode`` (empty: its type's default mode) or in the
        custom launch ``mode_config`` (package and launch file; the package must be allowed).
        ``args`` and ``env`` are added to the launch (``mode_config.args`` / ``.env``).
        Returns once the robot is RUNNING.

        This process becomes the robot's owner (safety watchdog) unless ``detach`` is true;
        with ``$RLINF_EMBODIED_OWNER`` set (an rlark replica) its replica does.
        Raises NotFoundError, InvalidArgumentError (unknown mode, bad arguments),
        PermissionDeniedError (package not allowed), FailedPreconditionError (not STOPPED),
        InternalError (the launch failed; the robot is in ERROR).
        """
        request = robot_pb2.StartRobotRequest(robot_id=robot_id, mode=mode)
        config = _mode_config(mode_config, args, env)
        if config is not None:
            request.mode_config.CopyFrom(config)
        response: robot_pb2.StartRobotResponse = self._call(
            "StartRobot",
            request,
            timeout,
            default_timeout=LONG_TIMEOUT,
            metadata=_start_metadata(detach),
        )
        return response

    def stop_robot(
        self, robot_id: str, *, timeout: float | None = None
    ) -> robot_pb2.StopRobotResponse:
        """Stop the robot's launch (and ROS master); it ends STOPPED. A no-op when stopped."""
        response: robot_pb2.StopRobotResponse = self._call(
            "StopRobot",
            robot_pb2.StopRobotRequest(robot_id=robot_id),
            timeout,
            default_timeout=LONG_TIMEOUT,
        )
        return response

    def get_robot_status(
        self, robot_id: str, *, timeout: float | None = None
    ) -> robot_pb2.GetRobotStatusResponse:
        """State, mode, effective launch, ROS endpoints, and rlark's additions: ``message``,
        ``backend``, ``robot_type``, ``owner_pid``, ``sim`` (joints of a simulated arm)."""
        response: robot_pb2.GetRobotStatusResponse = self._call(
            "GetRobotStatus", robot_pb2.GetRobotStatusRequest(robot_id=robot_id), timeout
        )
        return response

    def switch_mode(
        self,
        robot_id: str,
        mode: str = "",
        *,
        mode_config: robot_pb2.ModeConfig | Mapping[str, Any] | None = None,
        args: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> robot_pb2.SwitchModeResponse:
        """Replace the launch of a RUNNING robot by ``mode`` / ``mode_config`` (as
        :meth:`start_robot`); the ROS master and the owner stay. FailedPreconditionError
        unless RUNNING."""
        request = robot_pb2.SwitchModeRequest(robot_id=robot_id, mode=mode)
        config = _mode_config(mode_config, args, env)
        if config is not None:
            request.mode_config.CopyFrom(config)
        response: robot_pb2.SwitchModeResponse = self._call(
            "SwitchMode", request, timeout, default_timeout=LONG_TIMEOUT
        )
        return response

    def reset_robot(
        self, robot_id: str, *, timeout: float | None = None
    ) -> robot_pb2.ResetRobotResponse:
        """From any state: stop everything, clear an error, fresh ROS master (ROS 1) or
        zeroed arm (sim); the robot ends STOPPED."""
        response: robot_pb2.ResetRobotResponse = self._call(
            "ResetRobot",
            robot_pb2.ResetRobotRequest(robot_id=robot_id),
            timeout,
            default_timeout=LONG_TIMEOUT,
        )
        return response

    def list_robots(self, *, timeout: float | None = None) -> list[robot_pb2.RobotInfo]:
        """The robots of this socket, in configuration order."""
        response: robot_pb2.ListRobotsResponse = self._call(
            "ListRobots", robot_pb2.ListRobotsRequest(), timeout
        )
        return list(response.robots)

    def list_modes(
        self, robot_id: str, *, timeout: float | None = None
    ) -> list[robot_pb2.ModeInfo]:
        """The preset modes of the robot's type."""
        response: robot_pb2.ListModesResponse = self._call(
            "ListModes", robot_pb2.ListModesRequest(robot_id=robot_id), timeout
        )
        return list(response.modes)

    def get_robot_logs(
        self, robot_id: str, tail: int = 0, *, timeout: float | None = None
    ) -> list[str]:
        """The robot's last ``tail`` output lines (0: all that are kept), oldest first."""
        response: robot_pb2.GetRobotLogsResponse = self._call(
            "GetRobotLogs", robot_pb2.GetRobotLogsRequest(robot_id=robot_id, tail=tail), timeout
        )
        return list(response.lines)

    def list_packages(self, *, timeout: float | None = None) -> list[robot_pb2.PackageInfo]:
        """The launch packages the controller knows, with ``allowed`` (custom launches)."""
        response: robot_pb2.ListPackagesResponse = self._call(
            "ListPackages", robot_pb2.ListPackagesRequest(), timeout
        )
        return list(response.packages)

    def get_package_info(self, name: str, *, timeout: float | None = None) -> robot_pb2.PackageInfo:
        """Name, version, description, maintainer and ``allowed`` of a package."""
        response: robot_pb2.GetPackageInfoResponse = self._call(
            "GetPackageInfo", robot_pb2.GetPackageInfoRequest(name=name), timeout
        )
        return response.package

    def get_package_launch_files(self, name: str, *, timeout: float | None = None) -> list[str]:
        """The launch files of a package, relative to its launch directory."""
        response: robot_pb2.GetPackageLaunchFilesResponse = self._call(
            "GetPackageLaunchFiles", robot_pb2.GetPackageLaunchFilesRequest(name=name), timeout
        )
        return list(response.launch_files)

    def get_launch_file_args(
        self, package: str, launch_file: str, *, timeout: float | None = None
    ) -> list[robot_pb2.LaunchArg]:
        """The arguments a launch file declares: name, required, default, description."""
        response: robot_pb2.GetLaunchFileArgsResponse = self._call(
            "GetLaunchFileArgs",
            robot_pb2.GetLaunchFileArgsRequest(package=package, launch_file=launch_file),
            timeout,
        )
        return list(response.args)
