//! Turning a request (a preset mode or a custom launch, plus additions) into exactly what
//! will run: package, launch file, arguments and environment.
//!
//! Arguments, later ones winning: the preset mode's `args`, then the robot parameters
//! (`argFrom` maps argument -> parameter; else, with `passthroughRobotArgs`, every parameter
//! under its own name), then the request's `mode_config.args`. Environment: the preset's
//! `env`, then the request's. Custom launches (a `mode_config.package`) are allowed only for
//! packages in `allowedLaunchPackages` (`*` = any).

use std::collections::BTreeMap;

use rlark_proto::robot::v1::{ModeConfig, ModeInfo};

use super::error::RobotError;
use super::sim_launch;
use crate::config::{Backend, EmbodiedConfig, Robot, valid_arg_name, valid_env_name};

/// A resolved launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchPlan {
    /// As reported to clients; `args` holds the effective arguments.
    pub mode: ModeInfo,
    /// Effective launch arguments (`NAME:=VALUE`, in name order).
    pub args: BTreeMap<String, String>,
    /// Environment added to the launch process.
    pub env: BTreeMap<String, String>,
}

impl LaunchPlan {
    /// `NAME:=VALUE` for every argument, in name order.
    pub fn launch_args(&self) -> Vec<String> {
        self.args.iter().map(|(k, v)| format!("{k}:={v}")).collect()
    }
}

/// Whether custom launches from `package` are allowed.
pub fn is_allowed(config: &EmbodiedConfig, package: &str) -> bool {
    config
        .allowed_launch_packages
        .iter()
        .any(|p| p == "*" || p == package)
}

/// Resolve `mode` / `request` for `robot` (see the module docs).
pub fn resolve(
    config: &EmbodiedConfig,
    robot: &Robot,
    mode: &str,
    request: Option<&ModeConfig>,
) -> Result<LaunchPlan, RobotError> {
    let Some(robot_type) = config.types.get(&robot.robot_type) else {
        return Err(RobotError::NotFound(format!(
            "robot {:?} has unknown type {:?}",
            robot.id, robot.robot_type
        )));
    };
    let empty = ModeConfig::default();
    let request = request.unwrap_or(&empty);
    for key in request.args.keys().chain(request.arg_from.keys()) {
        if !valid_arg_name(key) {
            return Err(RobotError::InvalidArgument(format!(
                "mode_config: launch argument name {key:?} must be non-empty, without spaces or ':='"
            )));
        }
    }
    if let Some(key) = request.env.keys().find(|k| !valid_env_name(k)) {
        return Err(RobotError::InvalidArgument(format!(
            "mode_config.env: {key:?} is not a valid environment variable name"
        )));
    }

    let (mut info, preset_args) = if !request.package.is_empty() {
        if !mode.is_empty() {
            return Err(RobotError::InvalidArgument(format!(
                "give a preset mode ({mode:?}) or a custom launch (mode_config.package {:?}), not both",
                request.package
            )));
        }
        custom_launch(config, robot, request)?
    } else {
        if !request.launch_file.is_empty() {
            return Err(RobotError::InvalidArgument(
                "mode_config.launch_file needs mode_config.package (a custom launch)".into(),
            ));
        }
        let name = if mode.is_empty() {
            default_mode(robot_type).ok_or_else(|| {
                RobotError::InvalidArgument(format!(
                    "no mode given and robot type {:?} has no default mode (modes: {})",
                    robot_type.name,
                    mode_list(robot_type)
                ))
            })?
        } else {
            mode
        };
        let Some(preset) = robot_type.modes.get(name) else {
            return Err(RobotError::InvalidArgument(format!(
                "unknown mode {name:?} for robot {:?} (modes: {})",
                robot.id,
                mode_list(robot_type)
            )));
        };
        let mut env = preset.env.clone();
        env.extend(request.env.clone());
        let mut arg_from = preset.arg_from.clone();
        arg_from.extend(request.arg_from.clone());
        let info = ModeInfo {
            name: name.to_string(),
            package: preset.package.clone(),
            launch_file: preset.launch_file.clone(),
            args: BTreeMap::new(),
            env,
            arg_from,
            passthrough_robot_args: preset.passthrough_robot_args || request.passthrough_robot_args,
        };
        (info, preset.args.clone())
    };

    let mut args = preset_args;
    if !info.arg_from.is_empty() {
        for (arg, param) in &info.arg_from {
            let Some(value) = robot.params.get(param) else {
                return Err(RobotError::InvalidArgument(format!(
                    "argFrom: launch argument {arg:?} takes robot parameter {param:?}, which robot {:?} does not have (params: {})",
                    robot.id,
                    robot.params.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            };
            args.insert(arg.clone(), value.clone());
        }
    } else if info.passthrough_robot_args {
        args.extend(robot.params.clone());
    }
    args.extend(request.args.clone());

    if robot.backend == Backend::Sim {
        if info.package != sim_launch::PACKAGE || info.launch_file != sim_launch::LAUNCH_FILE {
            return Err(RobotError::InvalidArgument(format!(
                "sim robot {:?} can only launch {}/{}, not {}/{}",
                robot.id,
                sim_launch::PACKAGE,
                sim_launch::LAUNCH_FILE,
                info.package,
                info.launch_file
            )));
        }
        sim_launch::SimParams::from_args(&args).map_err(RobotError::InvalidArgument)?;
    }
    info.args = args.clone();
    let env = info.env.clone();
    Ok(LaunchPlan {
        mode: info,
        args,
        env,
    })
}

fn custom_launch(
    config: &EmbodiedConfig,
    robot: &Robot,
    request: &ModeConfig,
) -> Result<(ModeInfo, BTreeMap<String, String>), RobotError> {
    let package = &request.package;
    if !super::packages::valid_package_name(package) {
        return Err(RobotError::InvalidArgument(format!(
            "mode_config.package {package:?} is not a package name"
        )));
    }
    if request.launch_file.is_empty() {
        return Err(RobotError::InvalidArgument(
            "mode_config.launch_file is required for a custom launch".into(),
        ));
    }
    if !super::packages::is_relative_clean(&request.launch_file) {
        return Err(RobotError::InvalidArgument(format!(
            "mode_config.launch_file {:?} must be a relative path inside the package",
            request.launch_file
        )));
    }
    if !is_allowed(config, package) {
        let allowed = if config.allowed_launch_packages.is_empty() {
            "none".to_string()
        } else {
            config.allowed_launch_packages.join(", ")
        };
        return Err(RobotError::PermissionDenied(format!(
            "custom launch of package {package:?} on robot {:?} is not allowed (allowed launch packages: {allowed})",
            robot.id
        )));
    }
    let info = ModeInfo {
        name: format!("{package}/{}", request.launch_file),
        package: package.clone(),
        launch_file: request.launch_file.clone(),
        args: BTreeMap::new(),
        env: request.env.clone(),
        arg_from: request.arg_from.clone(),
        passthrough_robot_args: request.passthrough_robot_args,
    };
    Ok((info, BTreeMap::new()))
}

/// The mode StartRobot uses when none is named.
pub fn default_mode(robot_type: &crate::config::RobotType) -> Option<&str> {
    match &robot_type.default_mode {
        Some(mode) => Some(mode),
        None if robot_type.modes.len() == 1 => robot_type.modes.keys().next().map(String::as_str),
        None => None,
    }
}

fn mode_list(robot_type: &crate::config::RobotType) -> String {
    if robot_type.modes.is_empty() {
        "none".into()
    } else {
        robot_type
            .modes
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    }
}
