//! The configuration of `rlark embodied`: robot types and their launch modes, robots, the
//! packages custom launches may use, cameras, the safety watchdog, the device plugin
//! ([`device_plugin`]) and macvlans ([`macvlan`]). See `docs/embodied.md` for the
//! reference.
//!
//! These are the types every part of the runtime reads; reading a file into them and
//! validating it is [`crate::load`] ([`EmbodiedConfig::from_yaml`]). Keys are camelCase;
//! RLark's snake_case spellings (`allowed_launch_packages`, `launch_file`, `arg_from`,
//! `passthrough_robot_args`, `domain_id`) are accepted as aliases.

pub mod device_plugin;
pub mod macvlan;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// First ROS 1 master port handed out to robots without `masterPort` (roscore's default).
pub const DEFAULT_FIRST_MASTER_PORT: u16 = 11311;
/// Largest ROS 2 domain ID handed out or accepted (the highest ID whose DDS ports stay
/// below the ephemeral range on Linux; RLark's limit too).
pub const MAX_ROS_DOMAIN_ID: u32 = 101;
/// Default safety watchdog (see [`EmbodiedConfig::watchdog`]).
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(2);

/// A validated configuration. Build it with [`EmbodiedConfig::from_yaml`] (or fill the
/// fields and call [`EmbodiedConfig::validate`]); both are in [`crate::load`].
#[derive(Clone, Debug, PartialEq)]
pub struct EmbodiedConfig {
    /// Robot types by name.
    pub types: BTreeMap<String, RobotType>,
    /// Robots in file order, with their ROS master port or domain ID assigned.
    pub robots: Vec<Robot>,
    /// Packages a request may launch from outside the preset modes (`*` = any).
    pub allowed_launch_packages: Vec<String>,
    /// Cameras, validated and kept for the camera controller.
    pub cameras: Vec<Camera>,
    /// How long a robot's owner may be without a connection to the controller before the
    /// robot is stopped (`docs/embodied.md`, "Safety watchdog").
    pub watchdog: Duration,
    /// Extra environment of every launch process (and of package discovery), e.g. what a
    /// ROS `setup.bash` would export.
    pub env: BTreeMap<String, String>,
    /// Lines of output kept per robot for GetRobotLogs.
    pub log_lines: usize,
    /// How long a launch process gets between SIGINT and SIGKILL when stopped.
    pub stop_timeout: Duration,
    /// How long a ROS 1 master may take to accept connections.
    pub start_timeout: Duration,
    /// ROS 1 settings.
    pub ros: RosSettings,
    /// ROS 2 settings.
    pub ros2: Ros2Settings,
    /// The kubelet device plugin (`docs/embodied.md`, "Device plugin").
    pub device_plugin: device_plugin::DevicePluginConfig,
    /// Macvlan interfaces DeviceService.Setup creates in a caller's network namespace
    /// (`docs/embodied.md`, "DeviceService (devinit)").
    pub macvlans: Vec<macvlan::Macvlan>,
}

/// Which launch machinery runs a robot type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `roscore -p PORT` per robot, then `roslaunch PACKAGE FILE ARGS`.
    Ros1,
    /// `ros2 launch PACKAGE FILE ARGS` with the robot's `ROS_DOMAIN_ID`.
    Ros2,
    /// The built-in simulated arm (`docs/embodied.md`, "Simulated arm").
    Sim,
}

impl Backend {
    /// The name used in the configuration and in RobotInfo.backend.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Ros1 => "ros1",
            Backend::Ros2 => "ros2",
            Backend::Sim => "sim",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind of robot: its backend and its preset launch modes.
#[derive(Clone, Debug, PartialEq)]
pub struct RobotType {
    pub name: String,
    pub backend: Backend,
    /// Mode used by StartRobot when the request names none: `defaultMode`, else the only
    /// mode when there is exactly one.
    pub default_mode: Option<String>,
    pub modes: BTreeMap<String, Mode>,
}

/// A preset launch mode.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mode {
    pub package: String,
    #[serde(alias = "launch_file")]
    pub launch_file: String,
    #[serde(default, deserialize_with = "string_map")]
    pub args: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "string_map")]
    pub env: BTreeMap<String, String>,
    /// Launch argument -> robot parameter it takes its value from.
    #[serde(default, alias = "arg_from")]
    pub arg_from: BTreeMap<String, String>,
    /// Pass every robot parameter as the launch argument of the same name (ignored when
    /// `argFrom` is set).
    #[serde(default, alias = "passthrough_robot_args")]
    pub passthrough_robot_args: bool,
}

/// A configured robot.
#[derive(Clone, Debug, PartialEq)]
pub struct Robot {
    pub id: String,
    /// Name of its [`RobotType`].
    pub robot_type: String,
    pub backend: Backend,
    pub params: BTreeMap<String, String>,
    /// ROS 1 master port (ros1 robots only): `masterPort`, else the next free port from
    /// [`RosSettings::first_master_port`].
    pub master_port: Option<u16>,
    /// ROS 2 domain ID (ros2 robots only): `domainId`, else the next free ID from 0.
    pub domain_id: Option<u32>,
}

/// ROS 1 settings (`ros:`).
#[derive(Clone, Debug, PartialEq)]
pub struct RosSettings {
    /// Host in `ROS_MASTER_URI` (and `ROS_IP`/`ROS_HOSTNAME`) given to launches and clients.
    pub master_host: String,
    /// First port handed out to robots without `masterPort`.
    pub first_master_port: u16,
    /// Directories searched for ROS 1 packages; unset = `ROS_PACKAGE_PATH`.
    pub package_path: Option<Vec<PathBuf>>,
}

/// ROS 2 settings (`ros2:`).
#[derive(Clone, Debug, PartialEq)]
pub struct Ros2Settings {
    /// Install prefixes searched for ROS 2 packages (`PREFIX/share/PKG`); unset =
    /// `AMENT_PREFIX_PATH`.
    pub prefix_path: Option<Vec<PathBuf>>,
}

/// Camera drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CameraDriver {
    /// A synthetic moving test pattern.
    Sim,
    /// A V4L2 device (`device`, or auto-detected).
    V4l2,
    /// An RTSP stream (`url`) read with ffmpeg.
    Rtsp,
    /// A video file (`path`) read with ffmpeg.
    File,
}

/// Frame encodings a camera delivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Jpeg,
    Png,
    /// RGB8, row-major, no padding.
    Raw,
}

/// A configured camera (served by the camera controller).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Camera {
    pub id: String,
    pub driver: CameraDriver,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    pub encoding: Encoding,
    /// V4L2 device node (`/dev/video0`); unset = auto-detect.
    #[serde(default)]
    pub device: Option<PathBuf>,
    /// RTSP URL (`rtsp` driver).
    #[serde(default)]
    pub url: Option<String>,
    /// Video file (`file` driver).
    #[serde(default)]
    pub path: Option<PathBuf>,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse YAML: {0}")]
    Yaml(String),
    /// A field has the wrong type or an unknown name (the path names it).
    #[error("{path}: {message}")]
    Shape { path: String, message: String },
    /// Every semantic problem found, one per line.
    #[error("invalid configuration:\n{}", format_problems(.0))]
    Invalid(Vec<FieldError>),
}

/// One problem, at one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `robots[0].type` or `types[1].modes.teleop.argFrom.ip`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

fn format_problems(problems: &[FieldError]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A map whose values may be written as strings, numbers or booleans (YAML `port: 11311`).
pub(crate) fn string_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(s) => Ok((key, s)),
            serde_json::Value::Number(n) => Ok((key, n.to_string())),
            serde_json::Value::Bool(b) => Ok((key, b.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "value of {key:?} must be a string, number or boolean, not {other}"
            ))),
        })
        .collect()
}

/// Names of robots, types, modes, packages and cameras: what is safe in a path segment, a
/// log prefix and a command line.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name != "."
        && name != ".."
}

/// Environment variable names: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Launch argument names: non-empty, no whitespace, no `:=` (they become `NAME:=VALUE`).
pub(crate) fn valid_arg_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(":=") && !name.chars().any(char::is_whitespace)
}

impl EmbodiedConfig {
    /// The robot with this ID.
    pub fn robot(&self, id: &str) -> Option<&Robot> {
        self.robots.iter().find(|r| r.id == id)
    }
}
