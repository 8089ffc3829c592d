from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RobotState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROBOT_STATE_UNSPECIFIED: _ClassVar[RobotState]
    ROBOT_STATE_STARTING: _ClassVar[RobotState]
    ROBOT_STATE_RUNNING: _ClassVar[RobotState]
    ROBOT_STATE_STOPPING: _ClassVar[RobotState]
    ROBOT_STATE_STOPPED: _ClassVar[RobotState]
    ROBOT_STATE_ERROR: _ClassVar[RobotState]
ROBOT_STATE_UNSPECIFIED: RobotState
ROBOT_STATE_STARTING: RobotState
ROBOT_STATE_RUNNING: RobotState
ROBOT_STATE_STOPPING: RobotState
ROBOT_STATE_STOPPED: RobotState
ROBOT_STATE_ERROR: RobotState

class ModeInfo(_message.Message):
    __slots__ = ("name", "package", "launch_file", "args", "env", "arg_from", "passthrough_robot_args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ArgFromEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FILE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ARG_FROM_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_ROBOT_ARGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    package: str
    launch_file: str
    args: _containers.ScalarMap[str, str]
    env: _containers.ScalarMap[str, str]
    arg_from: _containers.ScalarMap[str, str]
    passthrough_robot_args: bool
    def __init__(self, name: _Optional[str] = ..., package: _Optional[str] = ..., launch_file: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ..., env: _Optional[_Mapping[str, str]] = ..., arg_from: _Optional[_Mapping[str, str]] = ..., passthrough_robot_args: _Optional[bool] = ...) -> None: ...

class ModeConfig(_message.Message):
    __slots__ = ("package", "launch_file", "args", "passthrough_robot_args", "arg_from", "env")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ArgFromEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FILE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_ROBOT_ARGS_FIELD_NUMBER: _ClassVar[int]
    ARG_FROM_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    package: str
    launch_file: str
    args: _containers.ScalarMap[str, str]
    passthrough_robot_args: bool
    arg_from: _containers.ScalarMap[str, str]
    env: _containers.ScalarMap[str, str]
    def __init__(self, package: _Optional[str] = ..., launch_file: _Optional[str] = ..., args: _Optional[_Mapping[str, str]] = ..., passthrough_robot_args: _Optional[bool] = ..., arg_from: _Optional[_Mapping[str, str]] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SimArmState(_message.Message):
    __slots__ = ("positions", "targets", "speed", "moving")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[float]
    targets: _containers.RepeatedScalarFieldContainer[float]
    speed: float
    moving: bool
    def __init__(self, positions: _Optional[_Iterable[float]] = ..., targets: _Optional[_Iterable[float]] = ..., speed: _Optional[float] = ..., moving: _Optional[bool] = ...) -> None: ...

class StartRobotRequest(_message.Message):
    __slots__ = ("robot_id", "mode", "mode_config")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    mode: str
    mode_config: ModeConfig
    def __init__(self, robot_id: _Optional[str] = ..., mode: _Optional[str] = ..., mode_config: _Optional[_Union[ModeConfig, _Mapping]] = ...) -> None: ...

class StartRobotResponse(_message.Message):
    __slots__ = ("robot_id", "state", "current_mode", "ros_master_uri", "params", "ros_domain_id", "message", "backend", "robot_type", "owner_pid", "sim")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MODE_FIELD_NUMBER: _ClassVar[int]
    ROS_MASTER_URI_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ROS_DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ROBOT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_PID_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    state: RobotState
    current_mode: ModeInfo
    ros_master_uri: str
    params: _containers.ScalarMap[str, str]
    ros_domain_id: int
    message: str
    backend: str
    robot_type: str
    owner_pid: int
    sim: SimArmState
    def __init__(self, robot_id: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ..., current_mode: _Optional[_Union[ModeInfo, _Mapping]] = ..., ros_master_uri: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., ros_domain_id: _Optional[int] = ..., message: _Optional[str] = ..., backend: _Optional[str] = ..., robot_type: _Optional[str] = ..., owner_pid: _Optional[int] = ..., sim: _Optional[_Union[SimArmState, _Mapping]] = ...) -> None: ...

class StopRobotRequest(_message.Message):
    __slots__ = ("robot_id",)
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    def __init__(self, robot_id: _Optional[str] = ...) -> None: ...

class StopRobotResponse(_message.Message):
    __slots__ = ("robot_id", "state")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    state: RobotState
    def __init__(self, robot_id: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ...) -> None: ...

class GetRobotStatusRequest(_message.Message):
    __slots__ = ("robot_id",)
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    def __init__(self, robot_id: _Optional[str] = ...) -> None: ...

class GetRobotStatusResponse(_message.Message):
    __slots__ = ("robot_id", "mode", "state", "current_mode", "ros_master_uri", "params", "ros_domain_id", "message", "backend", "robot_type", "owner_pid", "sim")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MODE_FIELD_NUMBER: _ClassVar[int]
    ROS_MASTER_URI_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ROS_DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ROBOT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_PID_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    mode: str
    state: RobotState
    current_mode: ModeInfo
    ros_master_uri: str
    params: _containers.ScalarMap[str, str]
    ros_domain_id: int
    message: str
    backend: str
    robot_type: str
    owner_pid: int
    sim: SimArmState
    def __init__(self, robot_id: _Optional[str] = ..., mode: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ..., current_mode: _Optional[_Union[ModeInfo, _Mapping]] = ..., ros_master_uri: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., ros_domain_id: _Optional[int] = ..., message: _Optional[str] = ..., backend: _Optional[str] = ..., robot_type: _Optional[str] = ..., owner_pid: _Optional[int] = ..., sim: _Optional[_Union[SimArmState, _Mapping]] = ...) -> None: ...

class SwitchModeRequest(_message.Message):
    __slots__ = ("robot_id", "mode", "mode_config")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    mode: str
    mode_config: ModeConfig
    def __init__(self, robot_id: _Optional[str] = ..., mode: _Optional[str] = ..., mode_config: _Optional[_Union[ModeConfig, _Mapping]] = ...) -> None: ...

class SwitchModeResponse(_message.Message):
    __slots__ = ("robot_id", "mode", "state", "current_mode", "ros_master_uri", "params", "ros_domain_id", "message", "backend", "robot_type", "owner_pid", "sim")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MODE_FIELD_NUMBER: _ClassVar[int]
    ROS_MASTER_URI_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ROS_DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ROBOT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_PID_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    mode: str
    state: RobotState
    current_mode: ModeInfo
    ros_master_uri: str
    params: _containers.ScalarMap[str, str]
    ros_domain_id: int
    message: str
    backend: str
    robot_type: str
    owner_pid: int
    sim: SimArmState
    def __init__(self, robot_id: _Optional[str] = ..., mode: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ..., current_mode: _Optional[_Union[ModeInfo, _Mapping]] = ..., ros_master_uri: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., ros_domain_id: _Optional[int] = ..., message: _Optional[str] = ..., backend: _Optional[str] = ..., robot_type: _Optional[str] = ..., owner_pid: _Optional[int] = ..., sim: _Optional[_Union[SimArmState, _Mapping]] = ...) -> None: ...

class RobotInfo(_message.Message):
    __slots__ = ("robot_id", "mode", "state", "current_mode", "ros_master_uri", "params", "ros_domain_id", "message", "backend", "robot_type", "owner_pid", "sim")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_MODE_FIELD_NUMBER: _ClassVar[int]
    ROS_MASTER_URI_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ROS_DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ROBOT_TYPE_FIELD_NUMBER: _ClassVar[int]
    OWNER_PID_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    mode: str
    state: RobotState
    current_mode: ModeInfo
    ros_master_uri: str
    params: _containers.ScalarMap[str, str]
    ros_domain_id: int
    message: str
    backend: str
    robot_type: str
    owner_pid: int
    sim: SimArmState
    def __init__(self, robot_id: _Optional[str] = ..., mode: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ..., current_mode: _Optional[_Union[ModeInfo, _Mapping]] = ..., ros_master_uri: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., ros_domain_id: _Optional[int] = ..., message: _Optional[str] = ..., backend: _Optional[str] = ..., robot_type: _Optional[str] = ..., owner_pid: _Optional[int] = ..., sim: _Optional[_Union[SimArmState, _Mapping]] = ...) -> None: ...

class ListRobotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchRobotsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRobotsResponse(_message.Message):
    __slots__ = ("robots",)
    ROBOTS_FIELD_NUMBER: _ClassVar[int]
    robots: _containers.RepeatedCompositeFieldContainer[RobotInfo]
    def __init__(self, robots: _Optional[_Iterable[_Union[RobotInfo, _Mapping]]] = ...) -> None: ...

class ListModesRequest(_message.Message):
    __slots__ = ("robot_id",)
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    def __init__(self, robot_id: _Optional[str] = ...) -> None: ...

class ListModesResponse(_message.Message):
    __slots__ = ("robot_id", "modes")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODES_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    modes: _containers.RepeatedCompositeFieldContainer[ModeInfo]
    def __init__(self, robot_id: _Optional[str] = ..., modes: _Optional[_Iterable[_Union[ModeInfo, _Mapping]]] = ...) -> None: ...

class GetRobotLogsRequest(_message.Message):
    __slots__ = ("robot_id", "tail")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    tail: int
    def __init__(self, robot_id: _Optional[str] = ..., tail: _Optional[int] = ...) -> None: ...

class GetRobotLogsResponse(_message.Message):
    __slots__ = ("robot_id", "lines")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, robot_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class PackageInfo(_message.Message):
    __slots__ = ("name", "version", "description", "maintainer", "allowed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MAINTAINER_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    maintainer: str
    allowed: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., maintainer: _Optional[str] = ..., allowed: _Optional[bool] = ...) -> None: ...

class ListPackagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPackagesResponse(_message.Message):
    __slots__ = ("packages",)
    PACKAGES_FIELD_NUMBER: _ClassVar[int]
    packages: _containers.RepeatedCompositeFieldContainer[PackageInfo]
    def __init__(self, packages: _Optional[_Iterable[_Union[PackageInfo, _Mapping]]] = ...) -> None: ...

class GetPackageInfoRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPackageInfoResponse(_message.Message):
    __slots__ = ("package",)
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    package: PackageInfo
    def __init__(self, package: _Optional[_Union[PackageInfo, _Mapping]] = ...) -> None: ...

class GetPackageLaunchFilesRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPackageLaunchFilesResponse(_message.Message):
    __slots__ = ("name", "launch_files")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FILES_FIELD_NUMBER: _ClassVar[int]
    name: str
    launch_files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., launch_files: _Optional[_Iterable[str]] = ...) -> None: ...

class GetLaunchFileArgsRequest(_message.Message):
    __slots__ = ("package", "launch_file")
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FILE_FIELD_NUMBER: _ClassVar[int]
    package: str
    launch_file: str
    def __init__(self, package: _Optional[str] = ..., launch_file: _Optional[str] = ...) -> None: ...

class LaunchArg(_message.Message):
    __slots__ = ("name", "required", "default", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    required: bool
    default: str
    description: str
    def __init__(self, name: _Optional[str] = ..., required: _Optional[bool] = ..., default: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class GetLaunchFileArgsResponse(_message.Message):
    __slots__ = ("package", "launch_file", "args")
    PACKAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FILE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    package: str
    launch_file: str
    args: _containers.RepeatedCompositeFieldContainer[LaunchArg]
    def __init__(self, package: _Optional[str] = ..., launch_file: _Optional[str] = ..., args: _Optional[_Iterable[_Union[LaunchArg, _Mapping]]] = ...) -> None: ...

class ResetRobotRequest(_message.Message):
    __slots__ = ("robot_id",)
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    def __init__(self, robot_id: _Optional[str] = ...) -> None: ...

class ResetRobotResponse(_message.Message):
    __slots__ = ("robot_id", "state", "ros_master_uri", "ros_domain_id")
    ROBOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROS_MASTER_URI_FIELD_NUMBER: _ClassVar[int]
    ROS_DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    robot_id: str
    state: RobotState
    ros_master_uri: str
    ros_domain_id: int
    def __init__(self, robot_id: _Optional[str] = ..., state: _Optional[_Union[RobotState, str]] = ..., ros_master_uri: _Optional[str] = ..., ros_domain_id: _Optional[int] = ...) -> None: ...
