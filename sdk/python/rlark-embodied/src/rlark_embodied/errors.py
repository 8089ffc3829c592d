"""Errors of the embodied runtime's RPCs, as Python exceptions that keep the gRPC status.

Every failed call raises an :class:`EmbodiedError` (or the subclass for its status code,
e.g. :class:`NotFoundError`). It is also a :class:`grpc.RpcError` with ``code()`` and
``details()``, so code written for RLark's SDK, which let ``grpc.RpcError`` through, keeps
working::

    try:
        client.start_robot("arm-9")
    except NotFoundError as e:
        print(e.code(), e.details())      # StatusCode.NOT_FOUND  robot "arm-9" not found
"""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "DeadlineExceededError",
    "EmbodiedError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
    "UnimplementedError",
    "error_for",
    "status_code_from_int",
]


class EmbodiedError(grpc.RpcError):
    """An RPC to the embodied runtime failed.

    Attributes:
        status_code: the gRPC status code (also ``code()``).
        message: the server's message (also ``details()``).
        rpc: the RPC that failed, e.g. ``"StartRobot"`` (empty when not from an RPC).
        target: the gRPC target it was sent to, e.g. ``"unix:/var/run/rlark/ros-ctrl.sock"``.
    """

    def __init__(
        self, status_code: grpc.StatusCode, message: str, *, rpc: str = "", target: str = ""
    ) -> None:
        self.status_code = status_code
        self.message = message
        self.rpc = rpc
        self.target = target
        super().__init__(status_code, message)

    def code(self) -> grpc.StatusCode:
        """The gRPC status code, as :meth:`grpc.Call.code`."""
        return self.status_code

    def details(self) -> str:
        """The server's message, as :meth:`grpc.Call.details`."""
        return self.message

    def __str__(self) -> str:
        where = ""
        if self.rpc and self.target:
            where = f"{self.rpc} on {self.target}: "
        elif self.rpc or self.target:
            where = f"{self.rpc or self.target}: "
        return f"{where}{self.status_code.name}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.status_code!r}, {self.message!r}, "
            f"rpc={self.rpc!r}, target={self.target!r})"
        )


class CancelledError(EmbodiedError):
    """CANCELLED: the call was cancelled."""


class InvalidArgumentError(EmbodiedError):
    """INVALID_ARGUMENT: e.g. an unknown mode or a bad launch argument."""


class DeadlineExceededError(EmbodiedError):
    """DEADLINE_EXCEEDED: no answer within the call's timeout."""


class NotFoundError(EmbodiedError):
    """NOT_FOUND: an unknown robot, camera, package or launch file."""


class AlreadyExistsError(EmbodiedError):
    """ALREADY_EXISTS."""


class PermissionDeniedError(EmbodiedError):
    """PERMISSION_DENIED: e.g. a custom launch of a package that is not allowed."""


class ResourceExhaustedError(EmbodiedError):
    """RESOURCE_EXHAUSTED: e.g. a message larger than a configured limit."""


class FailedPreconditionError(EmbodiedError):
    """FAILED_PRECONDITION: e.g. starting a robot that is not STOPPED, reading a closed camera."""


class UnimplementedError(EmbodiedError):
    """UNIMPLEMENTED: the server does not offer this RPC (or not for this encoding)."""


class InternalError(EmbodiedError):
    """INTERNAL: e.g. a launch that failed to start (the robot is left in ERROR)."""


class UnavailableError(EmbodiedError):
    """UNAVAILABLE: the runtime cannot be reached, or a camera has no frame yet."""


_BY_CODE: dict[grpc.StatusCode, type[EmbodiedError]] = {
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
}

_BY_INT: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def status_code_from_int(value: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` of a numeric ``google.rpc.Code`` (UNKNOWN if not one)."""
    return _BY_INT.get(value, grpc.StatusCode.UNKNOWN)


def error_for(
    status_code: grpc.StatusCode, message: str, *, rpc: str = "", target: str = ""
) -> EmbodiedError:
    """The exception for a status: the subclass for its code, else :class:`EmbodiedError`."""
    cls = _BY_CODE.get(status_code, EmbodiedError)
    return cls(status_code, message, rpc=rpc, target=target)


def from_rpc_error(error: grpc.RpcError, *, rpc: str, target: str) -> EmbodiedError:
    """The exception for a failed gRPC call (a :class:`grpc.Call` raised as an error)."""
    if isinstance(error, EmbodiedError):
        return error
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    status_code = code() if callable(code) else None
    message = details() if callable(details) else None
    if not isinstance(status_code, grpc.StatusCode):
        status_code = grpc.StatusCode.UNKNOWN
    return error_for(status_code, message or str(error), rpc=rpc, target=target)
