//! The `devicePlugin` section of the configuration: the kubelet device plugin
//! ([`crate::deviceplugin`]). Its checks are in `crate::deviceplugin::config`, which knows the
//! plugin's resource and device names.

use std::path::PathBuf;

use serde::Deserialize;

/// Default device-plugin directory of the kubelet (where `kubelet.sock` is).
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Default host directory mounted at [`crate::deviceplugin::CONTAINER_BIN_DIR`] in allocated
/// containers.
pub const DEFAULT_BIN_DIR: &str = "/opt/rlinf/bin";
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
