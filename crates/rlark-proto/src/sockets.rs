//! Where the embodied runtime listens and the names its clients send: the socket directory
//! and file names, the gRPC metadata keys of StartRobot and StopRobot, and the environment
//! variable rlark's agent gives replicas holding devices (`docs/embodied.md`).

/// Default directory of the sockets (RLark's).
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/rlark";
/// RobotController for ROS 1 and simulated robots.
pub const ROS_SOCKET: &str = "ros-ctrl.sock";
/// RobotController for ROS 2 robots.
pub const ROS2_SOCKET: &str = "ros2-ctrl.sock";
/// CameraController.
pub const CAMERA_SOCKET: &str = "camera-ctrl.sock";
/// DeviceService (devinit).
pub const DEVINIT_SOCKET: &str = "devinit.sock";

/// Metadata key a StartRobot caller sets to `true` to start a robot without owning it.
pub const DETACH_METADATA: &str = "rlark-detach";

/// Metadata key a StartRobot caller sets to a label (rlark's agent gives each replica one
/// in [`OWNER_ENV`]) to make its replica — its session — the robot's owner instead of the
/// calling process (the runtime's safety watchdog). `rlark-detach: true` wins over it.
pub const OWNER_METADATA: &str = "rlark-owner";

/// The environment variable holding the label a replica's clients send as
/// [`OWNER_METADATA`] (`<namespace>/<pod>`, set by rlark's agent for replicas that hold
/// devices).
pub const OWNER_ENV: &str = "RLINF_EMBODIED_OWNER";

/// Longest [`OWNER_METADATA`] value accepted.
pub const MAX_OWNER_LABEL: usize = 253;

/// Metadata key a StopRobot caller may set to say why (e.g. rlark's agent: `replica X,
/// which held it, ended`); added to the robot's message and log. Printable ASCII, cut at
/// [`MAX_REASON`] characters; anything else is ignored.
pub const REASON_METADATA: &str = "rlark-reason";

/// Longest [`REASON_METADATA`] text kept.
pub const MAX_REASON: usize = 256;
