"""CameraClient against a real `rlark embodied` with the sim camera cam-0 (640x480 jpeg, 30 fps).

Written against camera.proto's contract; the `camera_socket` fixture fails (not skips) when
the runtime does not serve camera-ctrl.sock.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

from conftest import CAMERA
from rlark_embodied import (
    CameraClient,
    CameraState,
    FailedPreconditionError,
    Frame,
    NotFoundError,
)

WIDTH, HEIGHT = 640, 480  # sim.yaml


def test_lists_and_describes_the_camera(cameras: CameraClient) -> None:
    listed = {c.camera_id: c for c in cameras.list_cameras()}
    assert CAMERA in listed
    info = cameras.get_camera_info(CAMERA)
    assert info.camera_id == CAMERA
    assert info.camera_type == "sim"
    assert (info.width, info.height, info.fps) == (WIDTH, HEIGHT, 30)
    assert info.state == CameraState.CLOSED
    with pytest.raises(NotFoundError) as caught:
        cameras.get_camera_info("cam-9")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_capture_before_open_is_failed_precondition(cameras: CameraClient) -> None:
    with pytest.raises(FailedPreconditionError) as caught:
        cameras.capture_frame(CAMERA)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_capture_jpeg_frames_and_decode(cameras: CameraClient) -> None:
    opened = cameras.open_camera(CAMERA)
    assert opened.state == CameraState.OPEN
    assert opened.encoding == "jpeg"
    assert cameras.get_camera_info(CAMERA).state == CameraState.OPEN

    timestamps = []
    for _ in range(3):
        frame = cameras.capture_frame(CAMERA, wait=5)
        assert frame.ok and frame.camera_id == CAMERA
        assert frame.encoding == "jpeg"
        assert frame.data[:2] == b"\xff\xd8", "JPEG start-of-image marker"
        assert (frame.width, frame.height) == (WIDTH, HEIGHT)
        with Image.open(io.BytesIO(frame.data)) as image:
            assert image.format == "JPEG"
            assert image.size == (WIDTH, HEIGHT)
        array = frame.to_numpy()
        assert array.shape == (HEIGHT, WIDTH, 3) and array.dtype == np.uint8
        assert array.std() > 0, "a test pattern, not a blank image"
        timestamps.append(frame.timestamp_ns)
    assert timestamps == sorted(timestamps)

    closed = cameras.close_camera(CAMERA)
    assert closed.state == CameraState.CLOSED
    with pytest.raises(FailedPreconditionError):
        cameras.capture_frame(CAMERA)


def test_raw_and_png_encodings(cameras: CameraClient) -> None:
    cameras.open_camera(CAMERA, encoding="raw")
    raw = cameras.capture_frame(CAMERA)
    assert raw.encoding == "raw"
    assert len(raw.data) == WIDTH * HEIGHT * 3
    assert raw.to_numpy().shape == (HEIGHT, WIDTH, 3)
    cameras.close_camera(CAMERA)

    cameras.open_camera(CAMERA, encoding="png")
    png = cameras.capture_frame(CAMERA)
    assert png.encoding == "png"
    assert png.data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.to_image().size == (WIDTH, HEIGHT)
    # rlark addition: a capture may ask for another encoding than the camera's.
    other = cameras.capture_frame(CAMERA, encoding="raw")
    assert other.encoding == "raw" and len(other.data) == WIDTH * HEIGHT * 3
    cameras.close_camera(CAMERA)


def test_capture_frames_reports_errors_per_camera(cameras: CameraClient) -> None:
    cameras.open_camera(CAMERA)
    frames = {f.camera_id: f for f in cameras.capture_frames([CAMERA, "cam-9"], wait=5)}
    assert set(frames) == {CAMERA, "cam-9"}
    good, bad = frames[CAMERA], frames["cam-9"]
    assert good.ok and good.to_numpy().shape == (HEIGHT, WIDTH, 3)
    assert not bad.ok and bad.error_code == grpc.StatusCode.NOT_FOUND and bad.error
    with pytest.raises(NotFoundError):
        bad.raise_for_error()
    with pytest.raises(NotFoundError):
        bad.to_numpy()


def test_watch_100_frames_in_order(cameras: CameraClient) -> None:
    # A smaller size than configured: exercises OpenCamera's overrides, and keeps the
    # suite fast on a debug build (whose JPEG encoder manages ~7 fps at 640x480).
    opened = cameras.open_camera(CAMERA, width=320, height=240)
    assert (opened.width, opened.height) == (320, 240)
    frames: list[Frame] = []
    with cameras.watch_frames(CAMERA, timeout=60) as stream:
        frames = list(itertools.islice(stream, 100))
        dropped = stream.dropped
    assert len(frames) == 100
    sequences = [f.sequence for f in frames]
    assert all(b > a for a, b in itertools.pairwise(sequences)), sequences
    assert dropped == sequences[-1] - sequences[0] - 99
    # The server's running count of skipped frames (rlark addition) never goes down.
    server_dropped = [f.dropped for f in frames]
    assert server_dropped == sorted(server_dropped)
    timestamps = [f.timestamp_ns for f in frames]
    assert timestamps == sorted(timestamps)
    for frame in (frames[0], frames[-1]):
        assert frame.keyframe and frame.encoding == "jpeg"
        assert (frame.width, frame.height) == (320, 240)
        assert frame.to_numpy().shape == (240, 320, 3)
    # The stream was cancelled: iterating again just ends.
    assert list(stream) == []


def test_watch_of_an_unknown_camera_fails(cameras: CameraClient) -> None:
    stream = cameras.watch_frames("cam-9", timeout=10)
    with pytest.raises(NotFoundError) as caught:
        next(stream)
    assert "cam-9" in caught.value.details()


def test_camera_socket_from_environment(
    camera_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLINF_EMBODIED_CAMERA_SOCKET_PATH", str(camera_socket))
    with CameraClient() as client:
        assert client.target == f"unix:{camera_socket}"
        assert CAMERA in [c.camera_id for c in client.list_cameras()]
