//! rlark's embodied runtime for edge hosts (DESIGN §9, `docs/embodied.md`): robots and
//! cameras as the gRPC `RobotController` and `CameraController` services of RLark's
//! contract, on unix sockets.
//!
//! - [`config`]: the configuration (robot types and modes, robots, allowed launch
//!   packages, cameras, watchdog, device plugin, macvlans); [`load`]: reading it from YAML,
//!   validated up front with field paths.
//! - [`robot`]: the controller (state machine per robot), its backends (ROS 1, ROS 2 and
//!   a simulated arm), launch processes and logs, package discovery, the safety watchdog,
//!   and the gRPC service.
//! - [`camera`]: the camera controller (sim, V4L2, RTSP and file drivers, a capture loop
//!   per open camera keeping its latest frame) and its gRPC service.
//! - [`deviceplugin`]: the kubelet device plugin (robots and cameras as `rlinf.io/device`);
//!   [`devinit`]: DeviceService.Setup, macvlan interfaces in a calling pod's namespace.
//! - [`server`]: serving on unix sockets, bound by [`socket`]; [`peer`]: who is connected
//!   (SO_PEERCRED); [`access`]: who may call a device (the holders rlark's agent
//!   publishes); [`metrics`]: Prometheus metrics (`--metrics-listen`).
//!
//! The client-side contract (the gRPC services, the socket names, the metadata keys, the
//! holders file, [`client`]: dialing a socket) is `rlark-proto`'s; the paths it had here
//! are kept as re-exports.
//!
//! [`run`] is `rlark embodied`: serve until the shutdown token is cancelled, then stop
//! every robot and close every camera. [`server::serve`] returns a handle instead (tests).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod access;
pub mod camera;
pub mod config;
pub mod deviceplugin;
pub mod devinit;
pub mod load;
pub mod metrics;
pub mod peer;
pub mod robot;
pub mod server;
pub mod socket;

use std::path::Path;

use tokio_util::sync::CancellationToken;

pub use config::{ConfigError, EmbodiedConfig};
pub use rlark_proto::client;
pub use rlark_proto::sockets::{
    CAMERA_SOCKET, DEFAULT_SOCKET_DIR, DEVINIT_SOCKET, ROS_SOCKET, ROS2_SOCKET,
};
pub use server::{Running, ServeError, ServeOptions, serve, serve_with};

/// Serve `config` on the sockets in `socket_dir` until `shutdown` is cancelled; then stop
/// every robot and remove the sockets.
pub async fn run(
    config: EmbodiedConfig,
    socket_dir: &Path,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve(config, socket_dir, shutdown).await?.wait().await
}
