//! Loading the configuration of `rlark embodied`: parsing the YAML file into an
//! [`EmbodiedConfig`] and validating it ([`EmbodiedConfig::from_yaml`],
//! [`EmbodiedConfig::from_file`], [`EmbodiedConfig::validate`]).
//!
//! Everything is validated up front: every problem is reported at once, each naming its
//! field path (`robots[1].masterPort`), and every preset mode of every robot is resolved as
//! it would be launched ([`crate::robot::plan::resolve`]), so a missing robot parameter or a
//! bad simulator argument is found before anything runs. This module sits above the
//! runtime's modules (it asks the robot, device plugin and macvlan code what they accept),
//! which only read the types of [`crate::config`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use rlark_observe::parse_duration;
use serde::{Deserialize, Deserializer};

use crate::config::device_plugin::DevicePluginConfig;
use crate::config::macvlan::Macvlan;
use crate::config::{
    Backend, Camera, CameraDriver, ConfigError, DEFAULT_FIRST_MASTER_PORT, DEFAULT_WATCHDOG,
    EmbodiedConfig, FieldError, MAX_ROS_DOMAIN_ID, Mode, Robot, RobotType, Ros2Settings,
    RosSettings, string_map, valid_arg_name, valid_env_name, valid_name,
};

// ---- the file as written ----

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    types: Vec<RawType>,
    #[serde(default)]
    robots: Vec<RawRobot>,
    #[serde(default, alias = "allowed_launch_packages")]
    allowed_launch_packages: Vec<String>,
    #[serde(default)]
    cameras: Vec<Camera>,
    #[serde(default, deserialize_with = "opt_duration")]
    watchdog: Option<Duration>,
    #[serde(default, deserialize_with = "string_map")]
    env: BTreeMap<String, String>,
    #[serde(default, alias = "log_lines")]
    log_lines: Option<usize>,
    #[serde(default, alias = "stop_timeout", deserialize_with = "opt_duration")]
    stop_timeout: Option<Duration>,
    #[serde(default, alias = "start_timeout", deserialize_with = "opt_duration")]
    start_timeout: Option<Duration>,
    #[serde(default)]
    ros: RawRos,
    #[serde(default)]
    ros2: RawRos2,
    #[serde(default, alias = "device_plugin")]
    device_plugin: DevicePluginConfig,
    #[serde(default, alias = "host_macvlans")]
    macvlans: Vec<Macvlan>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawType {
    #[serde(rename = "type")]
    name: String,
    backend: Backend,
    #[serde(default, alias = "default_mode")]
    default_mode: Option<String>,
    #[serde(default)]
    modes: BTreeMap<String, Mode>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRobot {
    id: String,
    #[serde(rename = "type")]
    robot_type: String,
    #[serde(default, deserialize_with = "string_map")]
    params: BTreeMap<String, String>,
    #[serde(default, alias = "master_port")]
    master_port: Option<u16>,
    #[serde(default, alias = "domain_id")]
    domain_id: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRos {
    #[serde(default, alias = "master_host")]
    master_host: Option<String>,
    #[serde(default, alias = "first_master_port")]
    first_master_port: Option<u16>,
    #[serde(default, alias = "package_path")]
    package_path: Option<Vec<PathBuf>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRos2 {
    #[serde(default, alias = "prefix_path")]
    prefix_path: Option<Vec<PathBuf>>,
}
fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom),
        Some(serde_json::Value::Number(n)) => match n.as_f64() {
            Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
            _ => Err(serde::de::Error::custom(format!(
                "duration {n} must be a positive number of seconds"
            ))),
        },
        Some(other) => Err(serde::de::Error::custom(format!(
            "expected a duration such as 2s or 500ms, got {other}"
        ))),
    }
}

const NAME_RULE: &str = "must be 1-128 characters of letters, digits, '-', '_' and '.'";
impl EmbodiedConfig {
    /// Read and validate a configuration file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parse and validate YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        // YAML -> JSON value -> typed, so type errors carry the field path.
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Yaml(e.to_string()))?;
        let value = match value {
            // An empty file is an empty configuration.
            serde_json::Value::Null => serde_json::Value::Object(Default::default()),
            other => other,
        };
        let raw: RawConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Shape {
                path: if path == "." {
                    "(top level)".into()
                } else {
                    path
                },
                message: e.into_inner().to_string(),
            }
        })?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        let mut types = BTreeMap::new();
        // Field paths of the types, by position in the file.
        let mut type_paths = BTreeMap::new();
        for (i, t) in raw.types.into_iter().enumerate() {
            let path = format!("types[{i}]");
            if !valid_name(&t.name) {
                problems.push(err(
                    format!("{path}.type"),
                    format!("{:?} {NAME_RULE}", t.name),
                ));
                continue;
            }
            if types.contains_key(&t.name) {
                problems.push(err(
                    format!("{path}.type"),
                    format!("type {:?} is defined twice", t.name),
                ));
                continue;
            }
            type_paths.insert(t.name.clone(), path);
            types.insert(
                t.name.clone(),
                RobotType {
                    name: t.name,
                    backend: t.backend,
                    default_mode: t.default_mode,
                    modes: t.modes,
                },
            );
        }

        let robots = raw
            .robots
            .into_iter()
            .map(|r| Robot {
                // A robot of an unknown type is reported by `check`; the backend is moot.
                backend: types.get(&r.robot_type).map_or(Backend::Sim, |t| t.backend),
                id: r.id,
                robot_type: r.robot_type,
                params: r.params,
                master_port: r.master_port,
                domain_id: r.domain_id,
            })
            .collect();

        let mut config = EmbodiedConfig {
            types,
            robots,
            allowed_launch_packages: raw.allowed_launch_packages,
            cameras: raw.cameras,
            watchdog: raw.watchdog.unwrap_or(DEFAULT_WATCHDOG),
            env: raw.env,
            log_lines: raw.log_lines.unwrap_or(2000),
            stop_timeout: raw.stop_timeout.unwrap_or(Duration::from_secs(10)),
            start_timeout: raw.start_timeout.unwrap_or(Duration::from_secs(30)),
            ros: RosSettings {
                master_host: raw.ros.master_host.unwrap_or_else(|| "127.0.0.1".into()),
                first_master_port: raw
                    .ros
                    .first_master_port
                    .unwrap_or(DEFAULT_FIRST_MASTER_PORT),
                package_path: raw.ros.package_path,
            },
            ros2: Ros2Settings {
                prefix_path: raw.ros2.prefix_path,
            },
            device_plugin: raw.device_plugin,
            macvlans: raw.macvlans,
        };
        problems.extend(config.check(&type_paths));
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Check a configuration built in code (what [`Self::from_yaml`] runs), assigning ROS 1
    /// master ports and ROS 2 domain IDs to robots that have none.
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        let type_paths = self
            .types
            .keys()
            .map(|name| (name.clone(), format!("types.{name}")))
            .collect();
        let problems = self.check(&type_paths);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Every problem of the configuration; assigns ports and domain IDs as a side effect.
    fn check(&mut self, type_paths: &BTreeMap<String, String>) -> Vec<FieldError> {
        let mut problems = Vec::new();
        for (name, t) in &self.types {
            let path = type_paths
                .get(name)
                .cloned()
                .unwrap_or_else(|| format!("types.{name}"));
            check_type(&path, t, &mut problems);
        }
        for (i, package) in self.allowed_launch_packages.iter().enumerate() {
            if package != "*" && !valid_name(package) {
                problems.push(err(
                    format!("allowedLaunchPackages[{i}]"),
                    format!("{package:?} {NAME_RULE} (or \"*\" for any package)"),
                ));
            }
        }
        for (key, _) in self.env.iter().filter(|(k, _)| !valid_env_name(k)) {
            problems.push(err(
                format!("env.{key}"),
                "is not a valid environment variable name".into(),
            ));
        }
        if self.watchdog > Duration::from_secs(3600) {
            problems.push(err(
                "watchdog".into(),
                "must be at most 1h (it bounds how long a robot runs without its owner)".into(),
            ));
        }
        if self.log_lines == 0 {
            problems.push(err("logLines".into(), "must be at least 1".into()));
        }
        if self.ros.master_host.trim().is_empty() || self.ros.master_host.contains('/') {
            problems.push(err(
                "ros.masterHost".into(),
                format!(
                    "{:?} is not a host name or IP address",
                    self.ros.master_host
                ),
            ));
        }
        if self.ros.first_master_port == 0 {
            problems.push(err("ros.firstMasterPort".into(), "must be 1-65535".into()));
        }

        self.check_robots(&mut problems);
        self.assign_masters(&mut problems);
        self.check_cameras(&mut problems);
        crate::deviceplugin::config::check(self, &mut problems);
        crate::config::macvlan::check(&self.macvlans, &mut problems);
        if problems.is_empty() {
            // Resolve every preset mode of every robot as StartRobot would, so missing
            // parameters and bad simulator arguments are found now.
            for (i, robot) in self.robots.iter().enumerate() {
                let Some(t) = self.types.get(&robot.robot_type) else {
                    continue;
                };
                for name in t.modes.keys() {
                    if let Err(e) = crate::robot::plan::resolve(self, robot, name, None) {
                        problems.push(err(
                            format!("robots[{i}]"),
                            format!("mode {name:?} of type {:?}: {}", t.name, e.message()),
                        ));
                    }
                }
            }
        }
        problems
    }

    fn check_robots(&self, problems: &mut Vec<FieldError>) {
        let mut ids = BTreeSet::new();
        for (i, robot) in self.robots.iter().enumerate() {
            let path = format!("robots[{i}]");
            if !valid_name(&robot.id) {
                problems.push(err(
                    format!("{path}.id"),
                    format!("{:?} {NAME_RULE}", robot.id),
                ));
            } else if !ids.insert(robot.id.as_str()) {
                problems.push(err(
                    format!("{path}.id"),
                    format!("robot {:?} is defined twice", robot.id),
                ));
            }
            if !self.types.contains_key(&robot.robot_type) {
                let known: Vec<&str> = self.types.keys().map(String::as_str).collect();
                problems.push(err(
                    format!("{path}.type"),
                    format!(
                        "unknown robot type {:?} (types: {})",
                        robot.robot_type,
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
                continue;
            }
            if robot.master_port.is_some() && robot.backend != Backend::Ros1 {
                problems.push(err(
                    format!("{path}.masterPort"),
                    format!(
                        "only ros1 robots have a master port; this is a {} robot",
                        robot.backend
                    ),
                ));
            }
            if robot.master_port == Some(0) {
                problems.push(err(format!("{path}.masterPort"), "must be 1-65535".into()));
            }
            if robot.domain_id.is_some() && robot.backend != Backend::Ros2 {
                problems.push(err(
                    format!("{path}.domainId"),
                    format!(
                        "only ros2 robots have a domain ID; this is a {} robot",
                        robot.backend
                    ),
                ));
            }
            if let Some(id) = robot.domain_id
                && id > MAX_ROS_DOMAIN_ID
            {
                problems.push(err(
                    format!("{path}.domainId"),
                    format!("{id} is above the largest ROS 2 domain ID, {MAX_ROS_DOMAIN_ID}"),
                ));
            }
            for key in robot.params.keys().filter(|k| k.is_empty()) {
                problems.push(err(
                    format!("{path}.params.{key}"),
                    "empty parameter name".into(),
                ));
            }
        }
    }

    /// Check explicit ports and domain IDs for clashes, then hand out free ones.
    fn assign_masters(&mut self, problems: &mut Vec<FieldError>) {
        let mut ports: BTreeMap<u16, usize> = BTreeMap::new();
        let mut domains: BTreeMap<u32, usize> = BTreeMap::new();
        for (i, robot) in self.robots.iter().enumerate() {
            if let Some(port) = robot.master_port.filter(|_| robot.backend == Backend::Ros1)
                && let Some(first) = ports.insert(port, i)
            {
                problems.push(err(
                    format!("robots[{i}].masterPort"),
                    format!("port {port} is also the master port of robots[{first}]"),
                ));
            }
            if let Some(id) = robot.domain_id.filter(|_| robot.backend == Backend::Ros2)
                && let Some(first) = domains.insert(id, i)
            {
                problems.push(err(
                    format!("robots[{i}].domainId"),
                    format!("domain ID {id} is also the domain of robots[{first}]"),
                ));
            }
        }
        let mut next_port = u32::from(self.ros.first_master_port);
        let mut next_domain = 0u32;
        for (i, robot) in self.robots.iter_mut().enumerate() {
            match robot.backend {
                Backend::Ros1 if robot.master_port.is_none() => {
                    while u16::try_from(next_port).is_ok_and(|p| ports.contains_key(&p)) {
                        next_port += 1;
                    }
                    match u16::try_from(next_port) {
                        Ok(port) => {
                            robot.master_port = Some(port);
                            ports.insert(port, i);
                        }
                        Err(_) => problems.push(err(
                            format!("robots[{i}].masterPort"),
                            "no free master port left above ros.firstMasterPort".into(),
                        )),
                    }
                }
                Backend::Ros2 if robot.domain_id.is_none() => {
                    while domains.contains_key(&next_domain) {
                        next_domain += 1;
                    }
                    if next_domain > MAX_ROS_DOMAIN_ID {
                        problems.push(err(
                            format!("robots[{i}].domainId"),
                            format!("no free ROS 2 domain ID left (0-{MAX_ROS_DOMAIN_ID})"),
                        ));
                    } else {
                        robot.domain_id = Some(next_domain);
                        domains.insert(next_domain, i);
                    }
                }
                _ => {}
            }
        }
    }

    fn check_cameras(&self, problems: &mut Vec<FieldError>) {
        let mut ids = BTreeSet::new();
        for (i, camera) in self.cameras.iter().enumerate() {
            let path = format!("cameras[{i}]");
            if !valid_name(&camera.id) {
                problems.push(err(
                    format!("{path}.id"),
                    format!("{:?} {NAME_RULE}", camera.id),
                ));
            } else if !ids.insert(camera.id.as_str()) {
                problems.push(err(
                    format!("{path}.id"),
                    format!("camera {:?} is defined twice", camera.id),
                ));
            }
            if !(1..=8192).contains(&camera.width) {
                problems.push(err(format!("{path}.width"), "must be 1-8192".into()));
            }
            if !(1..=8192).contains(&camera.height) {
                problems.push(err(format!("{path}.height"), "must be 1-8192".into()));
            }
            if !(1..=240).contains(&camera.fps) {
                problems.push(err(format!("{path}.fps"), "must be 1-240".into()));
            }
            match camera.driver {
                CameraDriver::Rtsp if camera.url.as_deref().is_none_or(str::is_empty) => problems
                    .push(err(
                        format!("{path}.url"),
                        "the rtsp driver needs a url".into(),
                    )),
                CameraDriver::File if camera.path.is_none() => problems.push(err(
                    format!("{path}.path"),
                    "the file driver needs a path".into(),
                )),
                _ => {}
            }
            let stray = [
                (
                    "device",
                    camera.device.is_some() && camera.driver != CameraDriver::V4l2,
                ),
                (
                    "url",
                    camera.url.is_some() && camera.driver != CameraDriver::Rtsp,
                ),
                (
                    "path",
                    camera.path.is_some() && camera.driver != CameraDriver::File,
                ),
            ];
            for (field, is_stray) in stray {
                if is_stray {
                    problems.push(err(
                        format!("{path}.{field}"),
                        format!("does not apply to the {:?} driver", camera.driver),
                    ));
                }
            }
        }
    }
}

fn check_type(path: &str, t: &RobotType, problems: &mut Vec<FieldError>) {
    if let Some(default) = &t.default_mode
        && !t.modes.contains_key(default)
    {
        problems.push(err(
            format!("{path}.defaultMode"),
            format!("{default:?} is not one of the type's modes"),
        ));
    }
    for (name, mode) in &t.modes {
        let mode_path = format!("{path}.modes.{name}");
        if !valid_name(name) {
            problems.push(err(
                mode_path.clone(),
                format!("mode name {name:?} {NAME_RULE}"),
            ));
        }
        if !valid_name(&mode.package) {
            problems.push(err(
                format!("{mode_path}.package"),
                format!("{:?} {NAME_RULE}", mode.package),
            ));
        }
        if mode.launch_file.is_empty()
            || !crate::robot::packages::is_relative_clean(&mode.launch_file)
        {
            problems.push(err(
                format!("{mode_path}.launchFile"),
                format!(
                    "{:?} must be a file name relative to the package's launch directory",
                    mode.launch_file
                ),
            ));
        }
        for key in mode.args.keys().chain(mode.arg_from.keys()) {
            if !valid_arg_name(key) {
                problems.push(err(
                    format!("{mode_path}.args.{key}"),
                    "launch argument names must be non-empty, without spaces or ':='".into(),
                ));
            }
        }
        for key in mode.env.keys().filter(|k| !valid_env_name(k)) {
            problems.push(err(
                format!("{mode_path}.env.{key}"),
                "is not a valid environment variable name".into(),
            ));
        }
        if t.backend == Backend::Sim
            && (mode.package != crate::robot::sim_launch::PACKAGE
                || mode.launch_file != crate::robot::sim_launch::LAUNCH_FILE)
        {
            problems.push(err(
                mode_path.clone(),
                format!(
                    "sim robots launch {}/{} (the built-in arm), not {}/{}",
                    crate::robot::sim_launch::PACKAGE,
                    crate::robot::sim_launch::LAUNCH_FILE,
                    mode.package,
                    mode.launch_file
                ),
            ));
        }
    }
}

fn err(path: String, message: String) -> FieldError {
    FieldError { path, message }
}

#[cfg(test)]
mod tests;
