"""Frame decoding (no server needed): raw RGB8 with numpy, jpeg/png with Pillow."""

from __future__ import annotations

import io
import sys

import grpc
import numpy as np
import pytest
from PIL import Image

from rlark_embodied import Frame, NotFoundError
from rlark_embodied._gen import camera_pb2


def _frame(data: bytes, encoding: str, width: int = 4, height: int = 2) -> Frame:
    return Frame("cam-0", data, width, height, encoding, timestamp_ns=1)


def _pattern(width: int = 4, height: int = 2) -> np.ndarray:
    return np.arange(width * height * 3, dtype=np.uint8).reshape(height, width, 3)


def test_raw_to_numpy() -> None:
    pattern = _pattern()
    array = _frame(pattern.tobytes(), "raw").to_numpy()
    assert array.shape == (2, 4, 3) and array.dtype == np.uint8
    assert (array == pattern).all()
    assert _frame(pattern.tobytes(), "raw").to_image().size == (4, 2)


def test_raw_of_the_wrong_size_is_an_error() -> None:
    with pytest.raises(ValueError, match="needs 24 bytes, got 23"):
        _frame(bytes(23), "raw").to_numpy()


@pytest.mark.parametrize("fmt,encoding", [("PNG", "png"), ("JPEG", "jpeg")])
def test_image_encodings_decode(fmt: str, encoding: str) -> None:
    pattern = np.zeros((48, 64, 3), dtype=np.uint8)
    pattern[:, :32] = (255, 0, 0)
    buffer = io.BytesIO()
    Image.fromarray(pattern).save(buffer, format=fmt)
    array = _frame(buffer.getvalue(), encoding, 64, 48).to_numpy()
    assert array.shape == (48, 64, 3)
    if encoding == "png":
        assert (array == pattern).all()
    else:  # lossy: close to red on the left, black on the right
        assert array[24, 8, 0] > 200 and array[24, 56].max() < 40


def test_bitstreams_and_garbage_are_errors() -> None:
    with pytest.raises(ValueError, match="h264"):
        _frame(b"\x00\x00\x00\x01", "h264").to_numpy()
    with pytest.raises(ValueError, match="cannot decode jpeg"):
        _frame(b"not a jpeg", "jpeg").to_numpy()


def test_missing_numpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(ImportError, match=r"needs numpy, which is not installed: pip install numpy .*sdk/python/rlark-embodied\[numpy\]"):
        _frame(bytes(24), "raw").to_numpy()


def test_missing_pillow_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ImportError, match=r"needs Pillow, which is not installed: pip install Pillow .*sdk/python/rlark-embodied\[image\]"):
        _frame(b"\xff\xd8", "jpeg").to_numpy()
    # Raw frames need numpy only.
    assert _frame(bytes(24), "raw").to_numpy().shape == (2, 4, 3)


def test_from_messages() -> None:
    video = camera_pb2.VideoFrame(
        data=b"x", width=1, height=2, encoding="jpeg", timestamp_ns=7, sequence=9, keyframe=True
    )
    frame = Frame.from_message("cam-0", video)
    assert (frame.camera_id, frame.sequence, frame.timestamp_ns, frame.ok) == ("cam-0", 9, 7, True)
    assert "data" not in repr(frame)

    failed = camera_pb2.CapturedFrame(camera_id="cam-9", error_code=5, error="camera not found")
    frame = Frame.from_message("ignored", failed)
    assert frame.camera_id == "cam-9" and not frame.ok
    assert frame.error_code is grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFoundError, match="camera not found"):
        frame.raise_for_error()


def test_states_print_as_names() -> None:
    from rlark_embodied import CameraState, RobotState

    assert str(RobotState.RUNNING) == "RUNNING"
    assert f"{CameraState.OPEN}" == "OPEN" and f"{RobotState.ERROR:>7}" == "  ERROR"
    assert repr(RobotState.RUNNING) == "<RobotState.RUNNING: 2>"
    assert RobotState.RUNNING == 2 and RobotState(2) is RobotState.RUNNING
