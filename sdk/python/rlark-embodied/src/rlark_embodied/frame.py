"""Frame: one camera image as the CameraController sends it, with numpy / Pillow decoding."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from .errors import error_for, status_code_from_int

if TYPE_CHECKING:
    import numpy
    import numpy.typing
    from PIL import Image

__all__ = ["IMAGE_ENCODINGS", "RAW_ENCODINGS", "Frame"]

#: Encodings whose ``data`` is packed 8-bit RGB, row by row (``height * width * 3`` bytes).
RAW_ENCODINGS = frozenset({"raw", "rgb8", "rgb24"})
#: Encodings whose ``data`` is one image file, decoded with Pillow.
IMAGE_ENCODINGS = frozenset({"jpeg", "jpg", "png", "bmp", "tiff"})


def _import_numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError(
            "Frame.to_numpy() needs numpy, which is not installed: pip install numpy "
            "(or install the SDK with its extra: pip install './sdk/python/rlark-embodied[numpy]' "
            "from an rlark checkout; the extra [image] adds Pillow for jpeg/png frames)"
        ) from None
    return numpy


def _import_pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "decoding jpeg/png frames needs Pillow, which is not installed: pip install Pillow "
            "(or install the SDK with its extra: pip install './sdk/python/rlark-embodied[image]' "
            "from an rlark checkout; or open the camera with encoding='raw', which needs numpy "
            "only)"
        ) from None
    return Image


@dataclass(frozen=True)
class Frame:
    """A camera frame: the fields of ``VideoFrame`` / ``CaptureFrameResponse`` /
    ``CapturedFrame``, plus the camera it came from.

    ``sequence`` counts the camera's frames from 1 since it was opened (0 when the server
    does not say). ``dropped`` (WatchFrames) is how many frames the stream skipped so far
    because the client read more slowly than the camera captured. A frame from
    :meth:`CameraClient.capture_frames` may carry a per-camera failure instead of data:
    ``ok`` is false, ``error_code`` and ``error`` say why, and :meth:`raise_for_error`
    raises it.
    """

    camera_id: str
    data: bytes = field(repr=False)
    width: int
    height: int
    encoding: str
    #: Capture time, nanoseconds since the Unix epoch.
    timestamp_ns: int
    sequence: int = 0
    keyframe: bool = True
    dropped: int = 0
    error_code: grpc.StatusCode = grpc.StatusCode.OK
    error: str = ""

    @classmethod
    def from_message(cls, camera_id: str, message: Any) -> Frame:
        """A frame from a ``VideoFrame``, ``CaptureFrameResponse`` or ``CapturedFrame``."""
        return cls(
            camera_id=getattr(message, "camera_id", "") or camera_id,
            data=bytes(message.data),
            width=int(message.width),
            height=int(message.height),
            encoding=str(message.encoding),
            timestamp_ns=int(message.timestamp_ns),
            sequence=int(getattr(message, "sequence", 0)),
            keyframe=bool(getattr(message, "keyframe", True)),
            dropped=int(getattr(message, "dropped", 0)),
            error_code=status_code_from_int(int(getattr(message, "error_code", 0))),
            error=str(getattr(message, "error", "")),
        )

    @property
    def ok(self) -> bool:
        """Whether the frame holds data (not a per-camera failure)."""
        return self.error_code == grpc.StatusCode.OK

    def raise_for_error(self) -> None:
        """Raise the frame's per-camera failure as an EmbodiedError; nothing when ``ok``."""
        if not self.ok:
            raise error_for(self.error_code, self.error, rpc="CaptureFrames", target=self.camera_id)

    def to_numpy(self) -> numpy.typing.NDArray[numpy.uint8]:
        """The image as a ``(height, width, 3)`` uint8 RGB array.

        ``raw`` frames need numpy only; ``jpeg``, ``png`` (and ``bmp``, ``tiff``) frames are
        decoded with Pillow. Raises ImportError naming the missing package, ValueError for a
        bitstream encoding or data that does not match the frame's size, and the frame's
        error for a failed capture.
        """
        self.raise_for_error()
        np = _import_numpy()
        encoding = self.encoding.lower()
        if encoding in RAW_ENCODINGS:
            expected = self.width * self.height * 3
            if len(self.data) != expected:
                raise ValueError(
                    f"{self.camera_id}: raw RGB8 frame of {self.width}x{self.height} needs "
                    f"{expected} bytes, got {len(self.data)}"
                )
            array: numpy.typing.NDArray[numpy.uint8] = np.frombuffer(
                self.data, dtype=np.uint8
            ).reshape(self.height, self.width, 3)
            return array
        image = self.to_image()
        decoded: numpy.typing.NDArray[numpy.uint8] = np.asarray(image, dtype=np.uint8)
        return decoded

    def to_image(self) -> Image.Image:
        """The image as an RGB ``PIL.Image.Image`` (needs Pillow).

        Raises ImportError when Pillow is missing, ValueError for a bitstream encoding or
        data Pillow cannot decode, and the frame's error for a failed capture.
        """
        self.raise_for_error()
        image_module = _import_pillow()
        encoding = self.encoding.lower()
        if encoding in RAW_ENCODINGS:
            expected = self.width * self.height * 3
            if len(self.data) != expected:
                raise ValueError(
                    f"{self.camera_id}: raw RGB8 frame of {self.width}x{self.height} needs "
                    f"{expected} bytes, got {len(self.data)}"
                )
            raw: Image.Image = image_module.frombytes("RGB", (self.width, self.height), self.data)
            return raw
        if encoding not in IMAGE_ENCODINGS:
            raise ValueError(
                f"{self.camera_id}: frames in encoding {self.encoding!r} are not single images "
                f"(decodable: {', '.join(sorted(RAW_ENCODINGS | IMAGE_ENCODINGS))})"
            )
        try:
            with image_module.open(io.BytesIO(self.data)) as opened:
                image: Image.Image = opened.convert("RGB")
        except Exception as e:  # Pillow raises several types for corrupt data
            raise ValueError(f"{self.camera_id}: cannot decode {self.encoding} frame: {e}") from e
        return image
