"""Where the embodied runtime's sockets are, and the gRPC channels to them.

A client's target comes from, first to last:

1. ``address=`` — a TCP ``host:port`` (or any gRPC target with a scheme, e.g. ``unix:...``);
2. ``socket_path=`` — a unix socket path (``unix:`` prefix optional), or ``host:port``;
3. the ``RLINF_EMBODIED_*_SOCKET_PATH`` variable the rlark device plugin injects into a
   container (RLark's names), same forms as ``socket_path``;
4. the default socket in ``/var/run/rlark``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc

from .errors import EmbodiedError, UnavailableError, from_rpc_error

__all__ = [
    "DEFAULT_CAMERA_SOCKET",
    "DEFAULT_ROS2_SOCKET",
    "DEFAULT_ROS_SOCKET",
    "DEFAULT_SOCKET_DIR",
    "DEFAULT_TIMEOUT",
    "ENV_CAMERA_SOCKET",
    "ENV_ROS2_SOCKET",
    "ENV_ROS_SOCKET",
    "LONG_TIMEOUT",
    "camera_socket_path",
    "resolve_target",
    "ros2_socket_path",
    "ros_socket_path",
]

DEFAULT_SOCKET_DIR = "/var/run/rlark"
#: RobotController for ROS 1 and simulated robots.
DEFAULT_ROS_SOCKET = f"{DEFAULT_SOCKET_DIR}/ros-ctrl.sock"
#: RobotController for ROS 2 robots.
DEFAULT_ROS2_SOCKET = f"{DEFAULT_SOCKET_DIR}/ros2-ctrl.sock"
#: CameraController.
DEFAULT_CAMERA_SOCKET = f"{DEFAULT_SOCKET_DIR}/camera-ctrl.sock"

#: Seconds a call may take unless the call or the client says otherwise.
DEFAULT_TIMEOUT = 10.0
#: Seconds for the calls that launch or stop processes (start, switch, stop, reset).
LONG_TIMEOUT = 30.0

ENV_ROS_SOCKET = "RLINF_EMBODIED_ROS_SOCKET_PATH"
ENV_ROS2_SOCKET = "RLINF_EMBODIED_ROS2_SOCKET_PATH"
ENV_CAMERA_SOCKET = "RLINF_EMBODIED_CAMERA_SOCKET_PATH"

# gRPC target schemes passed through unchanged.
_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.\-]*):[0-9]{1,5}$")

# The safety watchdog stops a robot whose owner has had no connection for a few seconds,
# so a channel must never drop its connection on its own: no idle timeout (gRPC's default
# closes an idle channel after 30 minutes), and keepalive pings so a dead TCP peer is seen.
# Frames can be large (raw 4K RGB is 25 MB), so no receive limit; the server is local.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.client_idle_timeout_ms", 2**31 - 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def _from_env(var: str, default: str) -> str:
    return os.environ.get(var) or default


def ros_socket_path() -> str:
    """The ROS 1 and sim RobotController socket: ``$RLINF_EMBODIED_ROS_SOCKET_PATH`` or the
    default."""
    return _from_env(ENV_ROS_SOCKET, DEFAULT_ROS_SOCKET)


def ros2_socket_path() -> str:
    """The ROS 2 RobotController socket: ``$RLINF_EMBODIED_ROS2_SOCKET_PATH`` or the default."""
    return _from_env(ENV_ROS2_SOCKET, DEFAULT_ROS2_SOCKET)


def camera_socket_path() -> str:
    """The CameraController socket: ``$RLINF_EMBODIED_CAMERA_SOCKET_PATH`` or the default."""
    return _from_env(ENV_CAMERA_SOCKET, DEFAULT_CAMERA_SOCKET)


def _target_of(value: str) -> str:
    """The gRPC target of a socket path, ``host:port`` or target with a scheme."""
    if value.startswith(_SCHEMES):
        return value
    if "/" not in value and _HOST_PORT.match(value) and not os.path.exists(value):
        return value
    return "unix:" + os.path.abspath(value)


def resolve_target(
    socket_path: str | os.PathLike[str] | None,
    default_socket: str,
    address: str | None = None,
) -> str:
    """The gRPC target for a client (see the module doc for the order).

    ``default_socket`` is what applies when neither argument is given: pass
    :func:`ros_socket_path` (or one of its siblings) to honour the environment.

    >>> resolve_target("/tmp/run/ros-ctrl.sock", DEFAULT_ROS_SOCKET)
    'unix:/tmp/run/ros-ctrl.sock'
    >>> resolve_target(None, DEFAULT_ROS_SOCKET, address="edge-1:50051")
    'edge-1:50051'
    """
    if address:
        if address.startswith(_SCHEMES) or _HOST_PORT.match(address):
            return address
        raise ValueError(
            f"address {address!r} is not host:port (nor a gRPC target such as unix:/path)"
        )
    if socket_path is not None and os.fspath(socket_path) != "":
        return _target_of(os.fspath(socket_path))
    if not default_socket:
        raise ValueError("no socket path: pass socket_path= or address=")
    return _target_of(default_socket)


def _socket_file(target: str) -> str | None:
    """The socket file of a ``unix:`` target."""
    if target.startswith("unix://"):
        return target[len("unix://") :]
    if target.startswith("unix:"):
        return target[len("unix:") :]
    return None


_Self = TypeVar("_Self", bound="BaseClient")


class BaseClient:
    """A lazily opened gRPC channel to one target, shared by a client's calls (thread-safe)."""

    #: The generated stub class; set by subclasses.
    _stub_class: Any = None

    def __init__(self, target: str, timeout: float | None) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, not {timeout!r}")
        self._target = target
        self._timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None

    @property
    def target(self) -> str:
        """The gRPC target, e.g. ``unix:/var/run/rlark/ros-ctrl.sock`` or ``edge-1:50051``."""
        return self._target

    @property
    def timeout(self) -> float:
        """Default seconds per call."""
        return self._timeout

    @property
    def channel(self) -> grpc.Channel:
        """The gRPC channel (opened on first use, without waiting for the server)."""
        with self._lock:
            if self._channel is None:
                options = list(_CHANNEL_OPTIONS)
                if _socket_file(self._target) is not None:
                    # grpc-core's default :authority for a unix target is the percent-
                    # encoded socket path, which rlark's HTTP/2 server (h2) refuses with a
                    # PROTOCOL_ERROR reset: send `localhost`, as grpc-go does.
                    options.append(("grpc.default_authority", "localhost"))
                self._channel = grpc.insecure_channel(self._target, options=options)
                self._stub = self._stub_class(self._channel)
            return self._channel

    @property
    def stub(self) -> Any:
        """The generated gRPC stub, for RPCs this client does not wrap."""
        _ = self.channel  # opens the channel and makes the stub
        return self._stub

    def connect(self: _Self, timeout: float | None = None) -> _Self:
        """Open the channel and wait until the server answers (``timeout`` seconds, default
        the client's). Raises :class:`UnavailableError` naming the target otherwise.
        Calls connect on their own; this only makes a missing server fail early."""
        wait = self._timeout if timeout is None else timeout
        try:
            grpc.channel_ready_future(self.channel).result(timeout=wait)
        except grpc.FutureTimeoutError:
            hint = ""
            path = _socket_file(self._target)
            if path is not None and not os.path.exists(path):
                hint = f" (socket file {path} does not exist)"
            raise UnavailableError(
                grpc.StatusCode.UNAVAILABLE,
                f"no answer within {wait:g}s{hint}",
                rpc="connect",
                target=self._target,
            ) from None
        return self

    def close(self) -> None:
        """Close the channel; a later call opens a new one. A robot this process started
        is stopped by the runtime's safety watchdog once the process has had no connection
        for the watchdog period (default 2 s), unless another client of the process holds
        one."""
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def __enter__(self: _Self) -> _Self:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target={self._target!r}, timeout={self._timeout:g})"

    def _call(
        self,
        rpc: str,
        request: Any,
        timeout: float | None,
        *,
        default_timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> Any:
        """Call the unary RPC `rpc` with `request`; failures raise :class:`EmbodiedError`."""
        if timeout is None:
            timeout = max(self._timeout, default_timeout or 0.0)
        method = getattr(self.stub, rpc)
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, rpc=rpc, target=self._target) from e

    def _error(self, e: grpc.RpcError, rpc: str) -> EmbodiedError:
        return from_rpc_error(e, rpc=rpc, target=self._target)
