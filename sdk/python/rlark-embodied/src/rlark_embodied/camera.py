"""CameraClient: list, open and read cameras through ``camera.controller.v1.CameraController``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from ._enum import NamedIntEnum
from ._gen import camera_pb2, camera_pb2_grpc
from ._transport import BaseClient, camera_socket_path, resolve_target
from .errors import from_rpc_error
from .frame import Frame

__all__ = ["CameraClient", "CameraState", "FrameStream"]

# What the server waits for a first frame when a capture names no wait (camera.proto).
_SERVER_WAIT = 5.0
# Deadline margin over the server-side wait, for the answer to travel.
_WAIT_MARGIN = 5.0


class CameraState(NamedIntEnum):
    """A camera's state (``camera.controller.v1.CameraState``); compares equal to the
    ``state`` fields of the responses."""

    UNSPECIFIED = camera_pb2.CAMERA_STATE_UNSPECIFIED
    CLOSED = camera_pb2.CAMERA_STATE_CLOSED
    OPEN = camera_pb2.CAMERA_STATE_OPEN
    ERROR = camera_pb2.CAMERA_STATE_ERROR


class FrameStream(Iterator[Frame]):
    """The frames of one WatchFrames call, in order, as an iterator.

    Iterating blocks for the next frame. The stream ends (StopIteration) when the server
    ends it or after :meth:`cancel`; a failure raises an EmbodiedError. Frames the client
    was too slow to take are dropped by the server, never queued: ``dropped`` counts them
    from the gaps in ``sequence``. Cancel the stream (or use it as a context manager) to end
    the call early; breaking out of a ``for`` loop alone leaves it open until collected.
    """

    def __init__(self, call: Any, camera_id: str, target: str) -> None:
        self._call = call
        self._camera_id = camera_id
        self._target = target
        self._cancelled = False
        self._last_sequence = 0
        self.dropped = 0
        """Frames skipped between the frames received (sequence gaps)."""

    @property
    def camera_id(self) -> str:
        return self._camera_id

    def __iter__(self) -> FrameStream:
        return self

    def __next__(self) -> Frame:
        if self._cancelled:
            raise StopIteration
        try:
            message = next(self._call)
        except StopIteration:
            raise
        except grpc.RpcError as e:
            if self._cancelled:
                # Our own cancel() ends the call with CANCELLED: that is the end, not a failure.
                raise StopIteration from None
            raise from_rpc_error(e, rpc="WatchFrames", target=self._target) from e
        frame = Frame.from_message(self._camera_id, message)
        if self._last_sequence and frame.sequence > self._last_sequence + 1:
            self.dropped += frame.sequence - self._last_sequence - 1
        self._last_sequence = frame.sequence
        return frame

    def cancel(self) -> None:
        """End the call; iteration then stops. Idempotent."""
        self._cancelled = True
        self._call.cancel()

    close = cancel

    def __enter__(self) -> FrameStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class CameraClient(BaseClient):
    """A client of the CameraController.

    ``socket_path`` defaults to ``$RLINF_EMBODIED_CAMERA_SOCKET_PATH``, then
    ``/var/run/rlark/camera-ctrl.sock``; ``address`` (``host:port``) dials TCP instead.
    ``timeout`` is the default seconds per call. Use as a context manager::

        with CameraClient() as cameras:
            cameras.open_camera("cam-0")
            frame = cameras.capture_frame("cam-0")
            image = frame.to_numpy()          # (height, width, 3) uint8
            for frame in itertools.islice(cameras.watch_frames("cam-0"), 100):
                ...

    Failures raise :class:`~rlark_embodied.EmbodiedError` subclasses.
    """

    _stub_class = camera_pb2_grpc.CameraControllerStub

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        address: str | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(resolve_target(socket_path, camera_socket_path(), address), timeout)

    @property
    def stub(self) -> camera_pb2_grpc.CameraControllerStub:
        """The generated ``CameraControllerStub``."""
        stub: camera_pb2_grpc.CameraControllerStub = super().stub
        return stub

    def list_cameras(self, *, timeout: float | None = None) -> list[camera_pb2.CameraDescriptor]:
        """The cameras of the runtime."""
        response: camera_pb2.ListCamerasResponse = self._call(
            "ListCameras", camera_pb2.ListCamerasRequest(), timeout
        )
        return list(response.cameras)

    def get_camera_info(
        self, camera_id: str, *, timeout: float | None = None
    ) -> camera_pb2.CameraDescriptor:
        """One camera's descriptor: type, size, fps, state, supported resolutions."""
        response: camera_pb2.GetCameraInfoResponse = self._call(
            "GetCameraInfo", camera_pb2.GetCameraInfoRequest(camera_id=camera_id), timeout
        )
        return response.camera

    def open_camera(
        self,
        camera_id: str,
        width: int | None = None,
        height: int | None = None,
        fps: int | None = None,
        encoding: str | None = None,
        timeout: float | None = None,
    ) -> camera_pb2.OpenCameraResponse:
        """Start the camera's capture loop. ``width``, ``height``, ``fps`` and ``encoding``
        (``jpeg``, ``png``, ``raw``) override the configured values; None keeps them."""
        request = camera_pb2.OpenCameraRequest(camera_id=camera_id)
        if width is not None:
            request.width = width
        if height is not None:
            request.height = height
        if fps is not None:
            request.fps = fps
        if encoding is not None:
            request.encoding = encoding
        response: camera_pb2.OpenCameraResponse = self._call("OpenCamera", request, timeout)
        return response

    def close_camera(
        self, camera_id: str, timeout: float | None = None
    ) -> camera_pb2.CloseCameraResponse:
        """Stop the camera's capture loop."""
        response: camera_pb2.CloseCameraResponse = self._call(
            "CloseCamera", camera_pb2.CloseCameraRequest(camera_id=camera_id), timeout
        )
        return response

    def _deadline(self, timeout: float | None, wait: float | None) -> float:
        if timeout is not None:
            return timeout
        return max(self._timeout, (_SERVER_WAIT if wait is None else wait) + _WAIT_MARGIN)

    def capture_frame(
        self,
        camera_id: str,
        timeout: float | None = None,
        wait: float | None = None,
        *,
        encoding: str | None = None,
    ) -> Frame:
        """The latest frame of an open camera.

        ``wait``: seconds the server waits for a first frame (None: its default, 5);
        ``timeout``: the call's deadline (None: enough for ``wait``); ``encoding``
        (``jpeg``, ``png``, ``raw``; an rlark addition): the frame in this encoding instead
        of the camera's. Raises FailedPreconditionError when the camera is not open,
        UnavailableError when no frame came within ``wait``.
        """
        request = camera_pb2.CaptureFrameRequest(camera_id=camera_id)
        if wait is not None:
            request.timeout = wait
        if encoding is not None:
            request.encoding = encoding
        response: camera_pb2.CaptureFrameResponse = self._call(
            "CaptureFrame", request, self._deadline(timeout, wait)
        )
        return Frame.from_message(camera_id, response)

    def capture_frames(
        self,
        camera_ids: Iterable[str],
        timeout: float | None = None,
        wait: float | None = None,
        *,
        encoding: str | None = None,
    ) -> list[Frame]:
        """The latest frame of each camera, read concurrently by the server. A camera that
        fails gives a frame with ``ok`` false and its ``error_code`` / ``error`` instead of
        failing the call (``frame.raise_for_error()`` raises it). ``wait``, ``timeout`` and
        ``encoding`` as in :meth:`capture_frame`."""
        if isinstance(camera_ids, str):
            raise TypeError("camera_ids must be a list of camera IDs, not one string")
        request = camera_pb2.CaptureFramesRequest(camera_ids=list(camera_ids))
        if wait is not None:
            request.timeout = wait
        if encoding is not None:
            request.encoding = encoding
        response: camera_pb2.CaptureFramesResponse = self._call(
            "CaptureFrames", request, self._deadline(timeout, wait)
        )
        return [Frame.from_message(frame.camera_id, frame) for frame in response.frames]

    def watch_frames(
        self, camera_id: str, *, encoding: str | None = None, timeout: float | None = None
    ) -> FrameStream:
        """Every new frame of an open camera, in order, as an iterator of :class:`Frame`.

        ``encoding``: as in :meth:`capture_frame`; ``timeout``: deadline for the whole
        stream (None: none). A slow reader gets the latest frame next and the ``sequence``
        gap shows the frames it missed. End it with
        ``stream.cancel()`` or a ``with`` block::

            with cameras.watch_frames("cam-0") as stream:
                for frame in stream:
                    ...
        """
        request = camera_pb2.WatchFramesRequest(camera_id=camera_id)
        if encoding is not None:
            request.encoding = encoding
        try:
            call = self.stub.WatchFrames(request, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, rpc="WatchFrames", target=self.target) from e
        return FrameStream(call, camera_id, self.target)
