//! The gRPC `ros.controller.v1.RobotController` service over a [`RobotController`]. One
//! instance per socket: `ros-ctrl.sock` serves the ros1 and sim robots, `ros2-ctrl.sock`
//! the ros2 robots; a robot of the other socket is NotFound here (with a hint). Every call
//! for one robot is authorized by [`crate::access`] (after the robot is known to be served
//! here); ListRobots and WatchRobots show the robots the caller may call.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::BoxStream;

use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::robot_controller_server::RobotController as RobotControllerRpc;
use tonic::{Request, Response, Status};

use super::packages::Catalog;
use super::{Caller, RobotController, RobotError};
use crate::access::{Authorizer, robot_device_id};
use crate::config::Backend;
use crate::peer::PeerInfo;

pub use rlark_proto::sockets::{
    DETACH_METADATA, MAX_OWNER_LABEL, MAX_REASON, OWNER_ENV, OWNER_METADATA, REASON_METADATA,
};

/// The RobotController service of one socket.
pub struct RobotService {
    controller: Arc<RobotController>,
    /// Backends of the robots served here.
    backends: Vec<Backend>,
    catalog: Catalog,
    access: Arc<Authorizer>,
}

impl RobotService {
    /// The service for the robots whose backend is in `backends`, its calls authorized by
    /// `access`.
    pub fn new(
        controller: Arc<RobotController>,
        backends: &[Backend],
        access: Arc<Authorizer>,
    ) -> Self {
        let catalog = Catalog::new(controller.config(), backends);
        Self {
            controller,
            backends: backends.to_vec(),
            catalog,
            access,
        }
    }

    /// `id` is a robot of this socket and the caller of `request` may call it.
    async fn authorize<T>(&self, request: &Request<T>, id: &str) -> Result<(), Status> {
        self.check_robot(id)?;
        let peer = request.extensions().get::<PeerInfo>();
        self.access.check(peer, &robot_device_id(id)).await
    }

    /// `id`, if it is a robot of this socket.
    fn check_robot(&self, id: &str) -> Result<(), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("robot_id is required"));
        }
        match self.controller.backend_of(id) {
            Some(backend) if self.backends.contains(&backend) => Ok(()),
            Some(backend) => {
                let socket = match backend {
                    Backend::Ros2 => crate::ROS2_SOCKET,
                    Backend::Ros1 | Backend::Sim => crate::ROS_SOCKET,
                };
                Err(Status::not_found(format!(
                    "robot {id:?} is not served on this socket: it is a {backend} robot, on {socket}"
                )))
            }
            None => Err(RobotError::NotFound(format!("robot {id:?} not found")).into()),
        }
    }
}

/// Who calls: the peer's PID, `rlark-detach`, `rlark-owner` (an empty, non-ASCII or
/// overlong label is `InvalidArgument` naming the key).
fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    let pid = request.extensions().get::<PeerInfo>().and_then(|p| p.pid);
    let detach = request
        .metadata()
        .get(DETACH_METADATA)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v.trim(), "true" | "1"));
    let owner = match request.metadata().get(OWNER_METADATA) {
        None => None,
        Some(value) => Some(owner_label(value.to_str().ok())?),
    };
    Ok(Caller { pid, detach, owner })
}

/// A valid `rlark-owner` label: 1 to [`MAX_OWNER_LABEL`] visible ASCII characters.
fn owner_label(value: Option<&str>) -> Result<String, Status> {
    let label = value.map(str::trim).unwrap_or_default();
    if label.is_empty()
        || label.len() > MAX_OWNER_LABEL
        || !label.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(Status::invalid_argument(format!(
            "metadata {OWNER_METADATA} must be 1 to {MAX_OWNER_LABEL} visible ASCII characters (the replica's label, e.g. namespace/pod)"
        )));
    }
    Ok(label.to_string())
}

/// The calling process, if known.
fn peer_pid<T>(request: &Request<T>) -> Option<i32> {
    request.extensions().get::<PeerInfo>().and_then(|p| p.pid)
}

/// The robots of `controller` whose backend is in `backends` and that `visible` shows, as
/// ListRobots answers them.
fn served_robots(
    controller: &RobotController,
    backends: &[Backend],
    visible: &crate::access::Visible,
) -> Result<Vec<pb::RobotInfo>, Status> {
    Ok(controller
        .robot_ids()
        .into_iter()
        .filter(|id| {
            controller
                .backend_of(id)
                .is_some_and(|b| backends.contains(&b))
                && visible.shows(&robot_device_id(id))
        })
        .map(|id| controller.status(&id))
        .collect::<Result<Vec<_>, _>>()?)
}

#[tonic::async_trait]
impl RobotControllerRpc for RobotService {
    async fn start_robot(
        &self,
        request: Request<pb::StartRobotRequest>,
    ) -> Result<Response<pb::StartRobotResponse>, Status> {
        let caller = caller(&request)?;
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let controller = self.controller.clone();
        let info = to_completion(async move {
            controller
                .start(&r.robot_id, &r.mode, r.mode_config.as_ref(), &caller)
                .await
        })
        .await?;
        Ok(Response::new(pb::StartRobotResponse {
            robot_id: info.robot_id,
            state: info.state,
            current_mode: info.current_mode,
            ros_master_uri: info.ros_master_uri,
            params: info.params,
            ros_domain_id: info.ros_domain_id,
            message: info.message,
            backend: info.backend,
            robot_type: info.robot_type,
            owner_pid: info.owner_pid,
            sim: info.sim,
        }))
    }

    async fn stop_robot(
        &self,
        request: Request<pb::StopRobotRequest>,
    ) -> Result<Response<pb::StopRobotResponse>, Status> {
        let pid = peer_pid(&request);
        let why = request
            .metadata()
            .get(REASON_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().chars().take(MAX_REASON).collect::<String>())
            .filter(|v| !v.is_empty());
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let mut reason = match pid {
            Some(pid) => format!("stopped by process {pid}"),
            None => "stopped by request".to_string(),
        };
        if let Some(why) = why {
            reason = format!("{reason}: {why}");
        }
        let controller = self.controller.clone();
        let info =
            to_completion(async move { controller.stop(&r.robot_id, &reason).await }).await?;
        Ok(Response::new(pb::StopRobotResponse {
            robot_id: info.robot_id,
            state: info.state,
        }))
    }

    async fn get_robot_status(
        &self,
        request: Request<pb::GetRobotStatusRequest>,
    ) -> Result<Response<pb::GetRobotStatusResponse>, Status> {
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let info = self.controller.status(&r.robot_id)?;
        Ok(Response::new(pb::GetRobotStatusResponse {
            robot_id: info.robot_id,
            mode: info.mode,
            state: info.state,
            current_mode: info.current_mode,
            ros_master_uri: info.ros_master_uri,
            params: info.params,
            ros_domain_id: info.ros_domain_id,
            message: info.message,
            backend: info.backend,
            robot_type: info.robot_type,
            owner_pid: info.owner_pid,
            sim: info.sim,
        }))
    }

    async fn switch_mode(
        &self,
        request: Request<pb::SwitchModeRequest>,
    ) -> Result<Response<pb::SwitchModeResponse>, Status> {
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let controller = self.controller.clone();
        let info = to_completion(async move {
            controller
                .switch(&r.robot_id, &r.mode, r.mode_config.as_ref())
                .await
        })
        .await?;
        Ok(Response::new(pb::SwitchModeResponse {
            robot_id: info.robot_id,
            mode: info.mode,
            state: info.state,
            current_mode: info.current_mode,
            ros_master_uri: info.ros_master_uri,
            params: info.params,
            ros_domain_id: info.ros_domain_id,
            message: info.message,
            backend: info.backend,
            robot_type: info.robot_type,
            owner_pid: info.owner_pid,
            sim: info.sim,
        }))
    }

    async fn list_robots(
        &self,
        request: Request<pb::ListRobotsRequest>,
    ) -> Result<Response<pb::ListRobotsResponse>, Status> {
        let visible = self
            .access
            .visible(request.extensions().get::<PeerInfo>())
            .await;
        let robots = served_robots(&self.controller, &self.backends, &visible)?;
        Ok(Response::new(pb::ListRobotsResponse { robots }))
    }

    type WatchRobotsStream = BoxStream<'static, Result<pb::ListRobotsResponse, Status>>;

    async fn watch_robots(
        &self,
        request: Request<pb::WatchRobotsRequest>,
    ) -> Result<Response<Self::WatchRobotsStream>, Status> {
        let controller = Arc::clone(&self.controller);
        let backends = self.backends.clone();
        let access = Arc::clone(&self.access);
        let peer = request.extensions().get::<PeerInfo>().cloned();
        // The caller's view as of the first list (a starting replica may wait for it).
        access.visible(peer.as_ref()).await;
        // The counter's current value first (the robots now), then one list per change;
        // changes during a list are coalesced into the next one. What the caller may see
        // is decided again for each list.
        let lists =
            tokio_stream::wrappers::WatchStream::new(controller.state_changes()).map(move |_| {
                let visible = access.visible_now(peer.as_ref());
                served_robots(&controller, &backends, &visible)
                    .map(|robots| pb::ListRobotsResponse { robots })
            });
        Ok(Response::new(lists.boxed()))
    }

    async fn list_modes(
        &self,
        request: Request<pb::ListModesRequest>,
    ) -> Result<Response<pb::ListModesResponse>, Status> {
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let modes = self.controller.modes(&r.robot_id)?;
        Ok(Response::new(pb::ListModesResponse {
            robot_id: r.robot_id,
            modes,
        }))
    }

    async fn get_robot_logs(
        &self,
        request: Request<pb::GetRobotLogsRequest>,
    ) -> Result<Response<pb::GetRobotLogsResponse>, Status> {
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let tail = usize::try_from(r.tail).map_err(|_| {
            Status::invalid_argument(format!("tail {} must not be negative", r.tail))
        })?;
        let lines = self.controller.logs(&r.robot_id, tail)?;
        Ok(Response::new(pb::GetRobotLogsResponse {
            robot_id: r.robot_id,
            lines,
        }))
    }

    async fn list_packages(
        &self,
        _request: Request<pb::ListPackagesRequest>,
    ) -> Result<Response<pb::ListPackagesResponse>, Status> {
        let catalog = self.catalog.clone();
        // Package discovery reads the file system.
        let packages = tokio::task::spawn_blocking(move || {
            catalog
                .packages()
                .values()
                .map(|p| catalog.info(p))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| Status::internal(format!("package discovery failed: {e}")))?;
        Ok(Response::new(pb::ListPackagesResponse { packages }))
    }

    async fn get_package_info(
        &self,
        request: Request<pb::GetPackageInfoRequest>,
    ) -> Result<Response<pb::GetPackageInfoResponse>, Status> {
        let name = request.into_inner().name;
        let catalog = self.catalog.clone();
        let package = blocking(move || catalog.package(&name).map(|p| catalog.info(&p))).await?;
        Ok(Response::new(pb::GetPackageInfoResponse {
            package: Some(package),
        }))
    }

    async fn get_package_launch_files(
        &self,
        request: Request<pb::GetPackageLaunchFilesRequest>,
    ) -> Result<Response<pb::GetPackageLaunchFilesResponse>, Status> {
        let name = request.into_inner().name;
        let catalog = self.catalog.clone();
        let lookup = name.clone();
        let launch_files = blocking(move || catalog.launch_files(&lookup)).await?;
        Ok(Response::new(pb::GetPackageLaunchFilesResponse {
            name,
            launch_files,
        }))
    }

    async fn get_launch_file_args(
        &self,
        request: Request<pb::GetLaunchFileArgsRequest>,
    ) -> Result<Response<pb::GetLaunchFileArgsResponse>, Status> {
        let r = request.into_inner();
        let catalog = self.catalog.clone();
        let (package, launch_file) = (r.package.clone(), r.launch_file.clone());
        let args = blocking(move || catalog.launch_args(&package, &launch_file)).await?;
        Ok(Response::new(pb::GetLaunchFileArgsResponse {
            package: r.package,
            launch_file: r.launch_file,
            args,
        }))
    }

    async fn reset_robot(
        &self,
        request: Request<pb::ResetRobotRequest>,
    ) -> Result<Response<pb::ResetRobotResponse>, Status> {
        self.authorize(&request, &request.get_ref().robot_id)
            .await?;
        let r = request.into_inner();
        let controller = self.controller.clone();
        let info = to_completion(async move { controller.reset(&r.robot_id).await }).await?;
        Ok(Response::new(pb::ResetRobotResponse {
            robot_id: info.robot_id,
            state: info.state,
            ros_master_uri: info.ros_master_uri,
            ros_domain_id: info.ros_domain_id,
        }))
    }
}

/// Run a robot operation in its own task, so it completes even when the client goes away
/// mid-call (tonic drops the handler of a cancelled request, which would otherwise leave a
/// robot half-started).
async fn to_completion<T: Send + 'static>(
    operation: impl Future<Output = Result<T, RobotError>> + Send + 'static,
) -> Result<T, Status> {
    tokio::spawn(operation)
        .await
        .map_err(|e| Status::internal(format!("robot operation failed: {e}")))?
        .map_err(Status::from)
}

/// Run file-system work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RobotError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(format!("package lookup failed: {e}")))?
        .map_err(Status::from)
}
