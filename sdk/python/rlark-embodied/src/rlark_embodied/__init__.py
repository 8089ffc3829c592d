"""Python client for rlark's embodied runtime (``rlark embodied``).

Robots and cameras on an edge host, served over gRPC on unix sockets, with the names of
RLark's ``embodied_runtime`` SDK so its users can switch::

    from rlark_embodied import RobotClient, CameraClient, RobotState

    with RobotClient() as robots:                     # $RLINF_EMBODIED_ROS_SOCKET_PATH
        robots.start_robot("arm-0", "teleop")
        assert robots.get_robot_status("arm-0").state == RobotState.RUNNING

    with CameraClient() as cameras:                   # $RLINF_EMBODIED_CAMERA_SOCKET_PATH
        cameras.open_camera("cam-0")
        image = cameras.capture_frame("cam-0").to_numpy()

See sdk/python/rlark-embodied/README.md and docs/embodied.md ("Python SDK").
"""

from ._gen import camera_pb2, robot_pb2
from ._transport import (
    DEFAULT_CAMERA_SOCKET,
    DEFAULT_ROS2_SOCKET,
    DEFAULT_ROS_SOCKET,
    DEFAULT_SOCKET_DIR,
    DEFAULT_TIMEOUT,
    ENV_CAMERA_SOCKET,
    ENV_ROS2_SOCKET,
    ENV_ROS_SOCKET,
    LONG_TIMEOUT,
    camera_socket_path,
    resolve_target,
    ros2_socket_path,
    ros_socket_path,
)
from .camera import CameraClient, CameraState, FrameStream
from .errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    EmbodiedError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)
from .frame import Frame
from .robot import ModeConfig, RobotClient, RobotState

__version__ = "0.1.0"

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
    "AlreadyExistsError",
    "CameraClient",
    "CameraState",
    "CancelledError",
    "DeadlineExceededError",
    "EmbodiedError",
    "FailedPreconditionError",
    "Frame",
    "FrameStream",
    "InternalError",
    "InvalidArgumentError",
    "ModeConfig",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RobotClient",
    "RobotState",
    "UnavailableError",
    "UnimplementedError",
    "camera_pb2",
    "camera_socket_path",
    "resolve_target",
    "robot_pb2",
    "ros2_socket_path",
    "ros_socket_path",
]
