//! Checks of the `devicePlugin` section of the configuration (its type is
//! [`DevicePluginConfig`](crate::config::device_plugin::DevicePluginConfig)): the ones that
//! need the plugin's resource and device names.

use crate::config::{EmbodiedConfig, FieldError};

/// Longest device ID the kubelet takes (the API's limit).
pub const MAX_DEVICE_ID_LEN: usize = 63;

/// The name part of an extended resource (`device-<model>`): a Kubernetes qualified name,
/// 1-63 characters of letters, digits, `-`, `_`, `.`, starting and ending alphanumeric.
fn valid_resource_name(name: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !name.is_empty()
        && name.len() <= 63
        && alnum(name.chars().next())
        && alnum(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Every problem of the `devicePlugin` section, with field paths.
pub(crate) fn check(config: &EmbodiedConfig, problems: &mut Vec<FieldError>) {
    let plugin = &config.device_plugin;
    let problem = |path: &str, message: String| FieldError {
        path: path.into(),
        message,
    };
    if let Some(model) = &plugin.model
        && !valid_resource_name(&format!("device-{model}"))
    {
        problems.push(problem(
            "devicePlugin.model",
            format!(
                "{model:?} does not make a resource name rlinf.io/device-{model}: at most 56 letters, digits, '-', '_' and '.', ending in a letter or digit"
            ),
        ));
    }
    if !plugin.kubelet_dir.is_absolute() {
        problems.push(problem(
            "devicePlugin.kubeletDir",
            format!("{} must be an absolute path", plugin.kubelet_dir.display()),
        ));
    }
    if !plugin.bin_dir.is_absolute() {
        problems.push(problem(
            "devicePlugin.binDir",
            format!("{} must be an absolute path", plugin.bin_dir.display()),
        ));
    }
    if !plugin.enabled {
        return;
    }
    if config.robots.is_empty() && config.cameras.is_empty() {
        problems.push(problem(
            "devicePlugin.enabled",
            "the device plugin advertises robots and cameras, and none are configured".into(),
        ));
    }
    // Device IDs are `robot-<id>` and `camera-<id>`; the kubelet takes at most 63 characters.
    let ids = config
        .robots
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("robots[{i}].id"), super::robot_device_id(&r.id)))
        .chain(
            config
                .cameras
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("cameras[{i}].id"), super::camera_device_id(&c.id))),
        );
    for (path, id) in ids {
        if id.len() > MAX_DEVICE_ID_LEN {
            problems.push(problem(
                &path,
                format!(
                    "device ID {id:?} is longer than the kubelet's {MAX_DEVICE_ID_LEN} characters: shorten the ID"
                ),
            ));
        }
    }
}
