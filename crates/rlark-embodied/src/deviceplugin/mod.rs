//! The kubelet device plugin (API `v1beta1`): advertises this host's robots and cameras as
//! the extended resource `rlinf.io/device` (or `rlinf.io/device-<model>`), so a pod that
//! requests it is scheduled here and gets the embodied runtime's sockets.
//!
//! - **Devices**: one per configured robot (`robot-<id>`) and camera (`camera-<id>`)
//!   ([`inventory`]). Health follows the controllers: a robot in ERROR, a camera in ERROR
//!   (its capture failed) or a V4L2 camera whose device node is gone is `Unhealthy`, and
//!   ListAndWatch sends the new list at once (the controllers' change signals, plus a
//!   recheck every [`HEALTH_RECHECK`] for device nodes).
//! - **Allocate** ([`inventory::Inventory::allocate`]): RLark's `RLINF_EMBODIED_*` variables
//!   (the socket paths), `ROS_MASTER_URI` / `ROS_DOMAIN_ID` when the allocation holds
//!   exactly one robot, the socket directory mounted read-only at the same path, the
//!   configured bin directory at `/opt/rlinf/bin`, and the annotation `rlinf.io/devices`.
//! - **Registration**: the plugin serves `DevicePlugin` on its own socket in the kubelet's
//!   device-plugin directory (`rlinf-device.sock`, `rlinf-device-<model>.sock`), then calls
//!   `Registration.Register` on `kubelet.sock` there. It watches the directory (inotify,
//!   and a poll every [`WATCH_INTERVAL`]): when the kubelet restarts it deletes the
//!   plugin's socket and makes a new `kubelet.sock`, and the plugin serves again and
//!   registers again. A kubelet that is not there yet, or refuses, is retried every
//!   [`REGISTER_RETRY`].

pub mod config;
pub mod inventory;
pub mod service;

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use rlark_proto::deviceplugin::v1beta1 as api;
use rlark_proto::deviceplugin::v1beta1::device_plugin_server::DevicePluginServer;
use rlark_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use self::inventory::{Health, Inventory};
pub use self::inventory::{camera_device_id, robot_device_id};
use self::service::PluginService;
use crate::camera::CameraController;
use crate::config::EmbodiedConfig;
use crate::config::device_plugin::DevicePluginConfig;
use crate::robot::RobotController;

/// The device-plugin API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Device health values of the API.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// Where allocated containers find the client tools (RLark's path).
pub const CONTAINER_BIN_DIR: &str = "/opt/rlinf/bin";
/// Annotation listing the allocated device IDs (comma-separated).
pub const DEVICES_ANNOTATION: &str = "rlinf.io/devices";
/// How often the directory is polled besides inotify (a missing directory, missed events).
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// How often device health is recomputed without a change signal (device nodes).
pub const HEALTH_RECHECK: Duration = Duration::from_secs(5);
/// How long one Register call may take.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before registering again after a failure.
pub const REGISTER_RETRY: Duration = Duration::from_secs(1);
/// How long a stopped plugin server may take to close its connections.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Start the device plugin of `config` (its `devicePlugin` section) for the runtime whose
/// sockets are in `socket_dir`. Runs until `shutdown` is cancelled; then the plugin's socket
/// is removed and the returned task ends.
pub fn start(
    config: Arc<EmbodiedConfig>,
    socket_dir: &Path,
    robots: Arc<RobotController>,
    cameras: Arc<CameraController>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    // Containers mount the socket directory at the same path: it must be absolute.
    let socket_dir = std::path::absolute(socket_dir).unwrap_or_else(|_| socket_dir.to_path_buf());
    let plugin = config.device_plugin.clone();
    let inventory = Arc::new(Inventory::new(
        config,
        robots.clone(),
        cameras.clone(),
        &socket_dir,
    ));
    let health = inventory.health();
    log_health(&[], &health);
    let (devices, devices_rx) = watch::channel(Inventory::to_devices(&health));
    tokio::spawn(watch_health(
        inventory.clone(),
        devices,
        health,
        robots.state_changes(),
        cameras.changes(),
        shutdown.clone(),
    ));
    tokio::spawn(run(plugin, inventory, devices_rx, shutdown))
}

/// Log devices whose health changed from `before` to `now`.
fn log_health(before: &[Health], now: &[Health]) {
    for device in now {
        let old = before.iter().find(|b| b.id == device.id);
        if old.map(|o| &o.problem) == Some(&device.problem) {
            continue;
        }
        match &device.problem {
            Some(problem) => tracing::warn!(device = %device.id, %problem, "device unhealthy"),
            None if old.is_some() => tracing::info!(device = %device.id, "device healthy again"),
            None => {}
        }
    }
}

/// Wait for the next tick of `rx`; forever once its sender is gone.
async fn next_change(rx: &mut watch::Receiver<u64>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Recompute health on every controller change (and every [`HEALTH_RECHECK`]); publish
/// the device list when it differs.
async fn watch_health(
    inventory: Arc<Inventory>,
    devices: watch::Sender<Vec<api::Device>>,
    mut last: Vec<Health>,
    mut robots: watch::Receiver<u64>,
    mut cameras: watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = next_change(&mut robots) => {}
            _ = next_change(&mut cameras) => {}
            _ = tokio::time::sleep(HEALTH_RECHECK) => {}
        }
        let now = inventory.health();
        log_health(&last, &now);
        let list = Inventory::to_devices(&now);
        devices.send_if_modified(|current| {
            if *current == list {
                false
            } else {
                *current = list;
                true
            }
        });
        last = now;
    }
}

/// Identity of a file: device, inode and change time (a re-created file differs in at
/// least one, in practice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

fn file_id(path: &Path) -> Option<FileId> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some(FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        ctime: meta.ctime(),
        ctime_nsec: meta.ctime_nsec(),
    })
}

/// The plugin's gRPC server on its socket.
struct Served {
    path: PathBuf,
    id: Option<FileId>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Served {
    /// Whether our socket file is still the one we bound (the kubelet deletes it when it
    /// restarts).
    fn intact(&self) -> bool {
        self.id.is_some() && file_id(&self.path) == self.id
    }

    async fn stop(mut self) {
        self.stop.cancel();
        if tokio::time::timeout(STOP_TIMEOUT, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        if self.intact() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

async fn serve(
    path: &Path,
    inventory: &Arc<Inventory>,
    devices: &watch::Receiver<Vec<api::Device>>,
) -> Result<Served, crate::socket::BindError> {
    let listener = crate::socket::bind(path).await?;
    let stop = CancellationToken::new();
    let service = PluginService {
        inventory: inventory.clone(),
        devices: devices.clone(),
        stop: stop.clone(),
    };
    let signal = stop.clone();
    let socket = path.to_path_buf();
    let task = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .trace_fn(|request| tracing::info_span!("rpc", path = %request.uri().path()))
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                signal.cancelled_owned(),
            )
            .await;
        if let Err(e) = result {
            tracing::error!(socket = %socket.display(), error = %e, "device plugin server failed");
        }
    });
    Ok(Served {
        path: path.to_path_buf(),
        id: file_id(path),
        stop,
        task,
    })
}

/// Register with the kubelet at `kubelet` as `endpoint` for `resource`.
async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<(), String> {
    let request = api::RegisterRequest {
        version: API_VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(service::options()),
    };
    let call = async {
        let channel = crate::client::connect(kubelet)
            .await
            .map_err(|e| e.to_string())?;
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|status| {
                format!(
                    "the kubelet refused: {:?}: {}",
                    status.code(),
                    status.message()
                )
            })
    };
    match tokio::time::timeout(REGISTER_TIMEOUT, call).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => Err(format!("no answer within {REGISTER_TIMEOUT:?}")),
    }
}

/// The serve-and-register loop.
async fn run(
    plugin: DevicePluginConfig,
    inventory: Arc<Inventory>,
    devices: watch::Receiver<Vec<api::Device>>,
    shutdown: CancellationToken,
) {
    let dir = plugin.kubelet_dir.clone();
    let endpoint = plugin.socket_name();
    let resource = plugin.resource_name();
    let socket = dir.join(&endpoint);
    let kubelet = dir.join(KUBELET_SOCKET);
    tracing::info!(
        resource = %resource,
        socket = %socket.display(),
        devices = ?inventory.ids().collect::<Vec<_>>(),
        "device plugin starting"
    );
    let mut watcher: Option<DirWatcher> = None;
    let mut served: Option<Served> = None;
    // The kubelet socket we registered with, if any.
    let mut registered: Option<FileId> = None;
    let mut retry_at = Instant::now();
    // A lasting problem is logged once, not on every tick.
    let mut last_problem = String::new();

    loop {
        if watcher.is_none() && dir.is_dir() {
            watcher = DirWatcher::new(&dir);
        }
        if served.as_ref().is_none_or(|s| !s.intact()) {
            if let Some(old) = served.take() {
                tracing::info!(socket = %socket.display(), "plugin socket was removed (kubelet restart?): serving again");
                old.stop().await;
            }
            registered = None;
            match serve(&socket, &inventory, &devices).await {
                Ok(new) => served = Some(new),
                Err(e) => report(
                    &mut last_problem,
                    format!("cannot serve the plugin socket: {e}"),
                ),
            }
        }
        let current = file_id(&kubelet);
        if current.is_none() {
            if registered.take().is_some() {
                tracing::info!(kubelet = %kubelet.display(), "kubelet socket is gone; waiting for it");
            }
            report(
                &mut last_problem,
                format!(
                    "waiting for the kubelet: {} does not exist",
                    kubelet.display()
                ),
            );
        } else if served.is_some() && registered != current && Instant::now() >= retry_at {
            match register(&kubelet, &endpoint, &resource).await {
                Ok(()) => {
                    tracing::info!(resource = %resource, endpoint = %endpoint, "registered with the kubelet");
                    crate::metrics::device_plugin_registrations().inc();
                    registered = current;
                    last_problem.clear();
                }
                Err(e) => {
                    report(
                        &mut last_problem,
                        format!("register with the kubelet at {}: {e}", kubelet.display()),
                    );
                    retry_at = Instant::now() + REGISTER_RETRY;
                }
            }
        }

        let event = async {
            match watcher.as_mut() {
                Some(w) => w.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            event = event => match event {
                DirEvent::KubeletCreated => {
                    // A new kubelet: register again even if the file looks the same.
                    registered = None;
                    retry_at = Instant::now();
                }
                DirEvent::Gone => watcher = None,
            }
        }
    }
    if let Some(served) = served {
        served.stop().await;
    }
    tracing::info!("device plugin stopped");
}

/// Log `problem` unless it is the one logged last.
fn report(last: &mut String, problem: String) {
    if problem != *last {
        tracing::warn!(%problem, "device plugin");
        *last = problem;
    }
}

/// What the directory watcher reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DirEvent {
    /// `kubelet.sock` was created (or renamed into place).
    KubeletCreated,
    /// The directory itself is gone; watch it again once it is back.
    Gone,
}

/// Watches the kubelet directory with inotify on a thread of its own (blocking reads with a
/// timeout, so it notices being dropped within [`WATCHER_TICK`]).
struct DirWatcher {
    events: tokio::sync::mpsc::UnboundedReceiver<DirEvent>,
    stop: Arc<AtomicBool>,
}

/// How long the watcher thread blocks before checking whether it should end.
const WATCHER_TICK: u16 = 250;

impl Drop for DirWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl DirWatcher {
    /// `None` when inotify is unavailable (the poll still covers everything, later).
    fn new(dir: &Path) -> Option<Self> {
        let setup = || -> io::Result<Inotify> {
            let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
            inotify.add_watch(
                dir,
                AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_DELETE_SELF,
            )?;
            Ok(inotify)
        };
        let inotify = match setup() {
            Ok(inotify) => inotify,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the kubelet directory; polling it");
                return None;
            }
        };
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("deviceplugin-watch".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
                    match nix::poll::poll(&mut fds, PollTimeout::from(WATCHER_TICK)) {
                        Ok(0) => continue,
                        Ok(_) => {}
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(_) => break,
                    }
                    let Ok(events) = inotify.read_events() else {
                        break;
                    };
                    for event in events {
                        let report = if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                            Some(DirEvent::Gone)
                        } else if event.name.as_deref() == Some(OsStr::new(KUBELET_SOCKET))
                            && event
                                .mask
                                .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                        {
                            Some(DirEvent::KubeletCreated)
                        } else {
                            None
                        };
                        if let Some(report) = report
                            && tx.send(report).is_err()
                        {
                            return;
                        }
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Self { events, stop }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the directory watcher; polling only");
                None
            }
        }
    }

    /// The next event; [`DirEvent::Gone`] once the watcher has ended.
    async fn next(&mut self) -> DirEvent {
        self.events.recv().await.unwrap_or(DirEvent::Gone)
    }
}
