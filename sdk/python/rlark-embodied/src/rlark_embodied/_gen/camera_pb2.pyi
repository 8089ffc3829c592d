from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CameraState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAMERA_STATE_UNSPECIFIED: _ClassVar[CameraState]
    CAMERA_STATE_CLOSED: _ClassVar[CameraState]
    CAMERA_STATE_OPEN: _ClassVar[CameraState]
    CAMERA_STATE_ERROR: _ClassVar[CameraState]
CAMERA_STATE_UNSPECIFIED: CameraState
CAMERA_STATE_CLOSED: CameraState
CAMERA_STATE_OPEN: CameraState
CAMERA_STATE_ERROR: CameraState

class Resolution(_message.Message):
    __slots__ = ("width", "height")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class CameraDescriptor(_message.Message):
    __slots__ = ("camera_id", "name", "camera_type", "serial_number", "width", "height", "fps", "enable_depth", "state", "supported_resolutions", "supported_fps", "pixel_format", "encoding", "message", "last_sequence")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAMERA_TYPE_FIELD_NUMBER: _ClassVar[int]
    SERIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_RESOLUTIONS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FPS_FIELD_NUMBER: _ClassVar[int]
    PIXEL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    name: str
    camera_type: str
    serial_number: str
    width: int
    height: int
    fps: int
    enable_depth: bool
    state: CameraState
    supported_resolutions: _containers.RepeatedCompositeFieldContainer[Resolution]
    supported_fps: _containers.RepeatedScalarFieldContainer[int]
    pixel_format: str
    encoding: str
    message: str
    last_sequence: int
    def __init__(self, camera_id: _Optional[str] = ..., name: _Optional[str] = ..., camera_type: _Optional[str] = ..., serial_number: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fps: _Optional[int] = ..., enable_depth: _Optional[bool] = ..., state: _Optional[_Union[CameraState, str]] = ..., supported_resolutions: _Optional[_Iterable[_Union[Resolution, _Mapping]]] = ..., supported_fps: _Optional[_Iterable[int]] = ..., pixel_format: _Optional[str] = ..., encoding: _Optional[str] = ..., message: _Optional[str] = ..., last_sequence: _Optional[int] = ...) -> None: ...

class ListCamerasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchCamerasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCamerasResponse(_message.Message):
    __slots__ = ("cameras",)
    CAMERAS_FIELD_NUMBER: _ClassVar[int]
    cameras: _containers.RepeatedCompositeFieldContainer[CameraDescriptor]
    def __init__(self, cameras: _Optional[_Iterable[_Union[CameraDescriptor, _Mapping]]] = ...) -> None: ...

class GetCameraInfoRequest(_message.Message):
    __slots__ = ("camera_id",)
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    def __init__(self, camera_id: _Optional[str] = ...) -> None: ...

class GetCameraInfoResponse(_message.Message):
    __slots__ = ("camera",)
    CAMERA_FIELD_NUMBER: _ClassVar[int]
    camera: CameraDescriptor
    def __init__(self, camera: _Optional[_Union[CameraDescriptor, _Mapping]] = ...) -> None: ...

class OpenCameraRequest(_message.Message):
    __slots__ = ("camera_id", "width", "height", "fps", "encoding")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    width: int
    height: int
    fps: int
    encoding: str
    def __init__(self, camera_id: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fps: _Optional[int] = ..., encoding: _Optional[str] = ...) -> None: ...

class OpenCameraResponse(_message.Message):
    __slots__ = ("camera_id", "state", "encoding", "width", "height", "fps")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    state: CameraState
    encoding: str
    width: int
    height: int
    fps: int
    def __init__(self, camera_id: _Optional[str] = ..., state: _Optional[_Union[CameraState, str]] = ..., encoding: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., fps: _Optional[int] = ...) -> None: ...

class CloseCameraRequest(_message.Message):
    __slots__ = ("camera_id",)
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    def __init__(self, camera_id: _Optional[str] = ...) -> None: ...

class CloseCameraResponse(_message.Message):
    __slots__ = ("camera_id", "state")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    state: CameraState
    def __init__(self, camera_id: _Optional[str] = ..., state: _Optional[_Union[CameraState, str]] = ...) -> None: ...

class CaptureFrameRequest(_message.Message):
    __slots__ = ("camera_id", "timeout", "encoding")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    timeout: float
    encoding: str
    def __init__(self, camera_id: _Optional[str] = ..., timeout: _Optional[float] = ..., encoding: _Optional[str] = ...) -> None: ...

class CaptureFrameResponse(_message.Message):
    __slots__ = ("camera_id", "data", "width", "height", "encoding", "timestamp_ns", "sequence")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    data: bytes
    width: int
    height: int
    encoding: str
    timestamp_ns: int
    sequence: int
    def __init__(self, camera_id: _Optional[str] = ..., data: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., encoding: _Optional[str] = ..., timestamp_ns: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class CaptureFramesRequest(_message.Message):
    __slots__ = ("camera_ids", "timeout", "encoding")
    CAMERA_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    camera_ids: _containers.RepeatedScalarFieldContainer[str]
    timeout: float
    encoding: str
    def __init__(self, camera_ids: _Optional[_Iterable[str]] = ..., timeout: _Optional[float] = ..., encoding: _Optional[str] = ...) -> None: ...

class CapturedFrame(_message.Message):
    __slots__ = ("camera_id", "data", "width", "height", "encoding", "timestamp_ns", "error_code", "error", "sequence")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    data: bytes
    width: int
    height: int
    encoding: str
    timestamp_ns: int
    error_code: int
    error: str
    sequence: int
    def __init__(self, camera_id: _Optional[str] = ..., data: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., encoding: _Optional[str] = ..., timestamp_ns: _Optional[int] = ..., error_code: _Optional[int] = ..., error: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class CaptureFramesResponse(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[CapturedFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[CapturedFrame, _Mapping]]] = ...) -> None: ...

class WatchFramesRequest(_message.Message):
    __slots__ = ("camera_id", "encoding")
    CAMERA_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    camera_id: str
    encoding: str
    def __init__(self, camera_id: _Optional[str] = ..., encoding: _Optional[str] = ...) -> None: ...

class VideoFrame(_message.Message):
    __slots__ = ("data", "width", "height", "encoding", "timestamp_ns", "sequence", "keyframe", "dropped")
    DATA_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KEYFRAME_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    width: int
    height: int
    encoding: str
    timestamp_ns: int
    sequence: int
    keyframe: bool
    dropped: int
    def __init__(self, data: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., encoding: _Optional[str] = ..., timestamp_ns: _Optional[int] = ..., sequence: _Optional[int] = ..., keyframe: _Optional[bool] = ..., dropped: _Optional[int] = ...) -> None: ...
