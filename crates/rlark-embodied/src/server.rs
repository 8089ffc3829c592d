//! Serving the controllers on unix sockets.
//!
//! Each socket file is created in the socket directory (made if missing) by
//! [`crate::socket::bind`]: mode 0660 (the robot and camera sockets 0666 once the agent
//! publishes holders: [`crate::access`] then authorizes every call for one device); a stale
//! socket file left by a previous run is removed, but a socket some live server still
//! answers on is refused, as is a path that is not a socket. Every accepted connection goes
//! through the [`ConnTracker`] (peer PID for the watchdog and the authorization). On
//! shutdown the servers stop accepting, open connections get up to
//! [`DRAIN_TIMEOUT`] to finish (frame streams end at once), every robot is stopped, every
//! camera closed, and the socket files are removed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use rlark_observe::metrics_endpoint::MetricsListener;
use rlark_proto::camera::v1::camera_controller_server::CameraControllerServer;
use rlark_proto::robot::v1::robot_controller_server::RobotControllerServer;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::access::Authorizer;
use crate::camera::service::CameraService;
use crate::camera::{CameraController, v4l2};
use crate::config::{Backend, EmbodiedConfig};
use crate::peer::ConnTracker;
use crate::robot::RobotController;
use crate::robot::service::RobotService;
use crate::socket::{BindError, bind};

/// How long open connections may keep a server alive after shutdown began.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why serving could not start (or failed).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("create socket directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A socket could not be bound (see [`BindError`]).
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("serve {}: {message}", path.display())]
    Serve { path: PathBuf, message: String },
    // `error`, not `source`: the message already includes it (printed once).
    #[error("--metrics-listen {addr}: {error}")]
    Metrics {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("embodied runtime task failed: {0}")]
    Task(String),
}

/// A running embodied runtime (see [`serve`]).
pub struct Running {
    robots: Arc<RobotController>,
    cameras: Arc<CameraController>,
    sockets: Vec<PathBuf>,
    metrics_addr: Option<SocketAddr>,
    task: JoinHandle<Result<(), ServeError>>,
}

/// Options of [`serve_with`] beyond the configuration.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`--metrics-listen`; port 0 picks
    /// a free port, see [`Running::metrics_addr`]). Bound before anything else starts.
    pub metrics_listen: Option<SocketAddr>,
}

impl Running {
    /// The robot controller behind the sockets.
    pub fn robots(&self) -> &Arc<RobotController> {
        &self.robots
    }

    /// The camera controller behind `camera-ctrl.sock`.
    pub fn cameras(&self) -> &Arc<CameraController> {
        &self.cameras
    }

    /// The socket files being served.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// The bound address of the `/metrics` listener, when one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Wait until shutdown has completed (robots stopped, sockets removed).
    pub async fn wait(self) -> Result<(), ServeError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(ServeError::Task(e.to_string())),
        }
    }
}

/// Bind the sockets of `config` in `socket_dir` and serve them until `shutdown` is
/// cancelled. Returns once the sockets accept connections.
pub async fn serve(
    config: EmbodiedConfig,
    socket_dir: &Path,
    shutdown: CancellationToken,
) -> Result<Running, ServeError> {
    serve_with(config, socket_dir, ServeOptions::default(), shutdown).await
}

/// [`serve`] with [`ServeOptions`] (the metrics listener).
pub async fn serve_with(
    config: EmbodiedConfig,
    socket_dir: &Path,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<Running, ServeError> {
    // The metrics listener first: a bad address fails before any socket or robot exists.
    let metrics_listener = match options.metrics_listen {
        Some(addr) => Some(
            MetricsListener::bind(addr)
                .await
                .map_err(|error| ServeError::Metrics { addr, error })?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().map(MetricsListener::local_addr);
    std::fs::create_dir_all(socket_dir).map_err(|source| ServeError::CreateDir {
        path: socket_dir.to_path_buf(),
        source,
    })?;
    let config = Arc::new(config);
    let tracker = ConnTracker::new();
    // Who may call a device: the holders rlark's agent publishes in the socket directory.
    let access = Authorizer::new(socket_dir);
    let robots = RobotController::new(config.clone(), tracker.clone());

    // Which robots each RobotController socket serves: ros1 and sim on one, ros2 on the
    // other; a socket exists only when it has robots.
    let present = |wanted: &[Backend]| -> Vec<Backend> {
        wanted
            .iter()
            .copied()
            .filter(|b| config.robots.iter().any(|r| r.backend == *b))
            .collect()
    };
    let mut plan: Vec<(&str, Vec<Backend>)> = Vec::new();
    for (name, backends) in [
        (crate::ROS_SOCKET, present(&[Backend::Ros1, Backend::Sim])),
        (crate::ROS2_SOCKET, present(&[Backend::Ros2])),
    ] {
        if !backends.is_empty() {
            plan.push((name, backends));
        }
    }
    if plan.is_empty() {
        tracing::warn!("the configuration has no robots: no RobotController socket is served");
    }

    let mut listeners = Vec::new();
    for (name, backends) in plan {
        let path = socket_dir.join(name);
        match bind(&path).await {
            Ok(listener) => listeners.push((path, listener, backends)),
            Err(e) => {
                robots.shutdown().await;
                for (path, _, _) in &listeners {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e.into());
            }
        }
    }

    // The camera socket exists when there are cameras: configured ones, or V4L2 devices
    // found at startup.
    let cameras = CameraController::new(
        &config.cameras,
        Some(PathBuf::from(v4l2::SYSFS_ROOT)),
        shutdown.clone(),
    );
    let camera_listener = if cameras.has_cameras() {
        let path = socket_dir.join(crate::CAMERA_SOCKET);
        match bind(&path).await {
            Ok(listener) => Some((path, listener)),
            Err(e) => {
                robots.shutdown().await;
                for (path, _, _) in &listeners {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e.into());
            }
        }
    } else {
        tracing::info!("no cameras configured or found: no CameraController socket is served");
        None
    };

    // DeviceService (devinit) exists when macvlans are configured.
    let devinit_listener = if config.macvlans.is_empty() {
        None
    } else {
        let path = socket_dir.join(crate::DEVINIT_SOCKET);
        match bind(&path).await {
            Ok(listener) => Some((path, listener)),
            Err(e) => {
                robots.shutdown().await;
                let bound = listeners.iter().map(|(path, _, _)| path);
                for path in bound.chain(camera_listener.as_ref().map(|(path, _)| path)) {
                    let _ = std::fs::remove_file(path);
                }
                return Err(e.into());
            }
        }
    };

    let mut servers = Vec::new();
    let mut sockets = Vec::new();
    for (path, listener, backends) in listeners {
        let ids: Vec<String> = config
            .robots
            .iter()
            .filter(|r| backends.contains(&r.backend))
            .map(|r| r.id.clone())
            .collect();
        tracing::info!(socket = %path.display(), robots = ?ids, "serving RobotController");
        let service = RobotControllerServer::new(RobotService::new(
            robots.clone(),
            &backends,
            access.clone(),
        ));
        servers.push(spawn_grpc(service, &path, listener, &tracker, &shutdown));
        sockets.push(path);
    }
    if let Some((path, listener)) = camera_listener {
        let ids: Vec<String> = cameras.list().into_iter().map(|c| c.camera_id).collect();
        tracing::info!(socket = %path.display(), cameras = ?ids, "serving CameraController");
        let service =
            CameraControllerServer::new(CameraService::new(cameras.clone(), access.clone()));
        servers.push(spawn_grpc(service, &path, listener, &tracker, &shutdown));
        sockets.push(path);
    }
    // The robot and camera sockets are opened to every user once holders are published.
    access.serve_sockets(&sockets);
    tokio::spawn(Arc::clone(&access).watch_for_holders(shutdown.clone()));
    if let Some((path, listener)) = devinit_listener {
        let names: Vec<&str> = config.macvlans.iter().map(|m| m.name.as_str()).collect();
        tracing::info!(socket = %path.display(), macvlans = ?names, "serving DeviceService (devinit)");
        let service = crate::devinit::Devinit::new(config.macvlans.clone(), socket_dir).server();
        servers.push(spawn_grpc(service, &path, listener, &tracker, &shutdown));
        sockets.push(path);
    }
    // The kubelet device plugin serves its own socket in the kubelet's directory.
    let device_plugin = config.device_plugin.enabled.then(|| {
        crate::deviceplugin::start(
            config.clone(),
            socket_dir,
            robots.clone(),
            cameras.clone(),
            shutdown.clone(),
        )
    });

    if let Some(listener) = metrics_listener {
        let addr = listener.local_addr();
        tracing::info!(%addr, "embodied metrics at http://{addr}/metrics");
        let registry = crate::metrics::registry(robots.clone(), cameras.clone());
        tokio::spawn(listener.serve(Arc::new(registry), shutdown.clone()));
    }

    let task_robots = robots.clone();
    let task_cameras = cameras.clone();
    let task_sockets = sockets.clone();
    let task = tokio::spawn(async move {
        shutdown.cancelled().await;
        let mut result = Ok(());
        for mut server in servers {
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => result = Err(e),
                Ok(Err(e)) => tracing::error!(error = %e, "server task failed"),
                Err(_) => {
                    tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
                    server.abort();
                }
            }
        }
        if let Some(plugin) = device_plugin {
            let _ = plugin.await;
        }
        task_robots.shutdown().await;
        task_cameras.shutdown().await;
        for path in &task_sockets {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!("embodied runtime stopped");
        result
    });
    Ok(Running {
        robots,
        cameras,
        sockets,
        metrics_addr,
        task,
    })
}

/// Serve one gRPC service on `listener` (the socket at `path`) until `shutdown`, every
/// connection tracked for its peer credentials; one span per call, named by its RPC path.
fn spawn_grpc<S>(
    service: S,
    path: &Path,
    listener: UnixListener,
    tracker: &Arc<ConnTracker>,
    shutdown: &CancellationToken,
) -> JoinHandle<Result<(), ServeError>>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let tracker = Arc::clone(tracker);
    let incoming = UnixListenerStream::new(listener)
        .map(move |accepted| accepted.map(|stream| tracker.track(stream)));
    let signal = shutdown.clone();
    let path = path.to_path_buf();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .trace_fn(|request| tracing::info_span!("rpc", path = %request.uri().path()))
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, signal.cancelled_owned())
            .await
            .map_err(|e| ServeError::Serve {
                path,
                message: e.to_string(),
            })
    })
}
