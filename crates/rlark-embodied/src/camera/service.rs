//! The gRPC `camera.controller.v1.CameraController` service over a [`CameraController`].
//! Every call for a camera is authorized by [`crate::access`] (CaptureFrames: each camera,
//! a refused one answering its own error); ListCameras and WatchCameras show the cameras
//! the caller may call.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::camera_controller_server::CameraController as CameraControllerRpc;
use tonic::{Request, Response, Status};

use super::{CameraController, CameraError, Delivered, OpenOptions, capture_timeout};
use crate::access::{Authorizer, Visible, camera_device_id};
use crate::config::Encoding;
use crate::peer::PeerInfo;

/// The CameraController service of `camera-ctrl.sock`.
pub struct CameraService {
    controller: Arc<CameraController>,
    access: Arc<Authorizer>,
}

impl CameraService {
    /// The service of `controller`'s cameras, its calls authorized by `access`.
    pub fn new(controller: Arc<CameraController>, access: Arc<Authorizer>) -> Self {
        Self { controller, access }
    }

    /// The caller of `request` may call camera `id`.
    async fn authorize<T>(&self, request: &Request<T>, id: &str) -> Result<(), Status> {
        let peer = request.extensions().get::<PeerInfo>();
        self.access.check(peer, &camera_device_id(id)).await
    }
}

/// The cameras of `controller` that `visible` shows.
fn shown(controller: &CameraController, visible: &Visible) -> Vec<pb::CameraDescriptor> {
    let mut cameras = controller.list();
    cameras.retain(|c| visible.shows(&camera_device_id(&c.camera_id)));
    cameras
}

/// A request's optional encoding name.
fn encoding(name: Option<&str>) -> Result<Option<Encoding>, CameraError> {
    name.map(Encoding::parse).transpose()
}

#[tonic::async_trait]
impl CameraControllerRpc for CameraService {
    async fn list_cameras(
        &self,
        request: Request<pb::ListCamerasRequest>,
    ) -> Result<Response<pb::ListCamerasResponse>, Status> {
        let visible = self
            .access
            .visible(request.extensions().get::<PeerInfo>())
            .await;
        Ok(Response::new(pb::ListCamerasResponse {
            cameras: shown(&self.controller, &visible),
        }))
    }

    type WatchCamerasStream = BoxStream<'static, Result<pb::ListCamerasResponse, Status>>;

    async fn watch_cameras(
        &self,
        request: Request<pb::WatchCamerasRequest>,
    ) -> Result<Response<Self::WatchCamerasStream>, Status> {
        let controller = Arc::clone(&self.controller);
        let access = Arc::clone(&self.access);
        let peer = request.extensions().get::<PeerInfo>().cloned();
        // The caller's view as of the first list (a starting replica may wait for it).
        access.visible(peer.as_ref()).await;
        // The counter's current value first (the cameras now), then one list per change;
        // changes during a list are coalesced into the next one. What the caller may see
        // is decided again for each list.
        let lists = tokio_stream::wrappers::WatchStream::new(controller.changes()).map(move |_| {
            let visible = access.visible_now(peer.as_ref());
            Ok(pb::ListCamerasResponse {
                cameras: shown(&controller, &visible),
            })
        });
        Ok(Response::new(lists.boxed()))
    }

    async fn get_camera_info(
        &self,
        request: Request<pb::GetCameraInfoRequest>,
    ) -> Result<Response<pb::GetCameraInfoResponse>, Status> {
        self.authorize(&request, &request.get_ref().camera_id)
            .await?;
        let camera = self.controller.info(&request.into_inner().camera_id)?;
        Ok(Response::new(pb::GetCameraInfoResponse {
            camera: Some(camera),
        }))
    }

    async fn open_camera(
        &self,
        request: Request<pb::OpenCameraRequest>,
    ) -> Result<Response<pb::OpenCameraResponse>, Status> {
        self.authorize(&request, &request.get_ref().camera_id)
            .await?;
        let r = request.into_inner();
        let options = OpenOptions {
            width: r.width,
            height: r.height,
            fps: r.fps,
            encoding: encoding(r.encoding.as_deref())?,
        };
        // Opening waits for the first frame: finish it even if the client goes away, so
        // the camera is not left half-open.
        let controller = self.controller.clone();
        let opened = tokio::spawn(async move { controller.open(&r.camera_id, options).await })
            .await
            .map_err(|e| Status::internal(format!("open camera task failed: {e}")))??;
        Ok(Response::new(opened))
    }

    async fn close_camera(
        &self,
        request: Request<pb::CloseCameraRequest>,
    ) -> Result<Response<pb::CloseCameraResponse>, Status> {
        self.authorize(&request, &request.get_ref().camera_id)
            .await?;
        let id = request.into_inner().camera_id;
        let controller = self.controller.clone();
        let closed = tokio::spawn(async move { controller.close(&id).await })
            .await
            .map_err(|e| Status::internal(format!("close camera task failed: {e}")))??;
        Ok(Response::new(closed))
    }

    async fn capture_frame(
        &self,
        request: Request<pb::CaptureFrameRequest>,
    ) -> Result<Response<pb::CaptureFrameResponse>, Status> {
        self.authorize(&request, &request.get_ref().camera_id)
            .await?;
        let r = request.into_inner();
        let timeout = capture_timeout(r.timeout)?;
        let encoding = encoding(r.encoding.as_deref())?;
        let d = self
            .controller
            .latest(&r.camera_id, encoding, timeout)
            .await?;
        Ok(Response::new(pb::CaptureFrameResponse {
            camera_id: r.camera_id,
            data: d.data.to_vec(),
            width: d.frame.width,
            height: d.frame.height,
            encoding: d.encoding.as_str().into(),
            timestamp_ns: d.frame.timestamp_ns,
            sequence: d.frame.sequence,
        }))
    }

    async fn capture_frames(
        &self,
        request: Request<pb::CaptureFramesRequest>,
    ) -> Result<Response<pb::CaptureFramesResponse>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let r = request.into_inner();
        let timeout = capture_timeout(r.timeout)?;
        let encoding = encoding(r.encoding.as_deref())?;
        let mut ids: Vec<String> = Vec::new();
        for id in r.camera_ids {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        if ids.is_empty() {
            return Err(Status::invalid_argument("camera_ids is empty"));
        }
        let reads = ids.iter().map(|id| {
            let controller = &self.controller;
            let access = &self.access;
            let peer = peer.as_ref();
            async move {
                access
                    .check(peer, &camera_device_id(id))
                    .await
                    .map_err(|denied| {
                        CameraError::PermissionDenied(denied.message().to_string())
                    })?;
                controller.latest(id, encoding, timeout).await
            }
        });
        let results = futures::future::join_all(reads).await;
        let frames = ids
            .into_iter()
            .zip(results)
            .map(|(camera_id, result)| match result {
                Ok(d) => pb::CapturedFrame {
                    camera_id,
                    data: d.data.to_vec(),
                    width: d.frame.width,
                    height: d.frame.height,
                    encoding: d.encoding.as_str().into(),
                    timestamp_ns: d.frame.timestamp_ns,
                    error_code: 0,
                    error: String::new(),
                    sequence: d.frame.sequence,
                },
                Err(e) => pb::CapturedFrame {
                    camera_id,
                    error_code: e.code() as i32,
                    error: e.message().into(),
                    ..Default::default()
                },
            })
            .collect();
        Ok(Response::new(pb::CaptureFramesResponse { frames }))
    }

    type WatchFramesStream = BoxStream<'static, Result<pb::VideoFrame, Status>>;

    async fn watch_frames(
        &self,
        request: Request<pb::WatchFramesRequest>,
    ) -> Result<Response<Self::WatchFramesStream>, Status> {
        self.authorize(&request, &request.get_ref().camera_id)
            .await?;
        let r = request.into_inner();
        let encoding = encoding(r.encoding.as_deref())?;
        let frames = self.controller.watch(&r.camera_id, encoding)?;
        tracing::debug!(camera = %r.camera_id, "watch frames");
        Ok(Response::new(
            frames
                .map(|item| item.map(video_frame).map_err(Status::from))
                .boxed(),
        ))
    }
}

fn video_frame(d: Delivered) -> pb::VideoFrame {
    pb::VideoFrame {
        data: d.data.to_vec(),
        width: d.frame.width,
        height: d.frame.height,
        encoding: d.encoding.as_str().into(),
        timestamp_ns: d.frame.timestamp_ns,
        sequence: d.frame.sequence,
        // Every encoding is a still image.
        keyframe: true,
        dropped: d.dropped,
    }
}
