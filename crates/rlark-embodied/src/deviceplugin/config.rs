//! The `devicePlugin` section of the configuration.

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::{EmbodiedConfig, FieldError};

/// Default device-plugin directory of the kubelet (where `kubelet.sock` is).
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Default host directory mounted at [`super::CONTAINER_BIN_DIR`] in allocated containers.
pub const DEFAULT_BIN_DIR: &str = "/opt/rlinf/bin";
/// Longest device ID the kubelet takes (the API's limit).
pub const MAX_DEVICE_ID_LEN: usize = 63;

/// `devicePlugin:` — advertise this host's robots and cameras to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicePluginConfig {
    /// Run the device plugin (default false).
    #[serde(default)]
    pub enabled: bool,
    /// Device model: the resource is `rlinf.io/device-<model>` (unset: `rlinf.io/device`).
    #[serde(default)]
    pub model: Option<String>,
    /// The kubelet's device-plugin directory: `kubelet.sock` is there, and the plugin's
    /// socket is made there.
    #[serde(default = "default_kubelet_dir", alias = "kubelet_dir")]
    pub kubelet_dir: PathBuf,
    /// Host directory mounted read-only at `/opt/rlinf/bin` in allocated containers (when it
    /// exists), for client tools such as `rlark`.
    #[serde(default = "default_bin_dir", alias = "bin_dir")]
    pub bin_dir: PathBuf,
}

fn default_kubelet_dir() -> PathBuf {
    DEFAULT_KUBELET_DIR.into()
}

fn default_bin_dir() -> PathBuf {
    DEFAULT_BIN_DIR.into()
}

impl Default for DevicePluginConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            model: None,
            kubelet_dir: default_kubelet_dir(),
            bin_dir: default_bin_dir(),
        }
    }
}

impl DevicePluginConfig {
    /// The extended resource advertised: `rlinf.io/device` or `rlinf.io/device-<model>`.
    pub fn resource_name(&self) -> String {
        match &self.model {
            Some(model) => format!("rlinf.io/device-{model}"),
            None => "rlinf.io/device".into(),
        }
    }

    /// File name of the plugin's socket in the kubelet directory (RLark's names).
    pub fn socket_name(&self) -> String {
        match &self.model {
            Some(model) => format!("rlinf-device-{model}.sock"),
            None => "rlinf-device.sock".into(),
        }
    }
}

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
