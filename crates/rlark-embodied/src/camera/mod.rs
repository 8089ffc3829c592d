//! The camera controller (`docs/embodied.md`, "Cameras"): cameras from the configuration
//! plus V4L2 devices found in sysfs, each opened into a capture loop that keeps its latest
//! frame, served as RLark's `CameraController` on `camera-ctrl.sock` ([`service`]).
//!
//! - Drivers: [`sim`] (a moving test pattern with the frame counter and time burned in),
//!   `v4l2`, `rtsp` and `file` through an ffmpeg child process ([`ffmpeg`]); discovery of
//!   V4L2 devices in [`v4l2`].
//! - Each open camera runs one capture loop (`capture`) publishing its latest [`Frame`] in a
//!   `tokio::sync::watch`: readers never queue frames, a slow one just sees a newer frame
//!   next time (the sequence gap is the drop). A frame is encoded once per encoding and the
//!   bytes are shared by every reader ([`frame`]).
//! - Frames captured and skipped per camera are counted in [`counters`] (Prometheus,
//!   [`crate::metrics`]).
//! - A failing source (ffmpeg exits, a camera is unplugged) puts the camera in ERROR; the
//!   loop restarts it with backoff until it works again or the camera is closed.
//!   [`CameraController::changes`] ticks on every such change of state.

mod capture;
pub mod counters;
mod error;
pub mod ffmpeg;
mod font;
pub mod frame;
pub mod service;
pub mod sim;
pub mod v4l2;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::CameraState;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::counters::CameraCounters;
use crate::config::{Camera, CameraDriver, Encoding};
use capture::{CaptureLoop, Feed, SharedEncoding, Starter};
pub use error::CameraError;
pub use frame::Frame;

/// How long CaptureFrame waits for a first frame when the request gives no timeout.
pub const DEFAULT_CAPTURE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait a request may ask for.
pub const MAX_CAPTURE_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long OpenCamera waits for the first frame, so that a source failing right away
/// (a missing file, an unreachable stream) is reported by the call instead of later.
pub const OPEN_WAIT: Duration = Duration::from_secs(3);
/// Frame sizes and rates a camera may be opened with.
pub const MAX_SIDE: u32 = 8192;
pub const MAX_FPS: u32 = 240;

/// Size and rate of an open camera.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub width: u32,
    pub height: u32,
    pub fps: u32,
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} at {} fps", self.width, self.height, self.fps)
    }
}

/// What OpenCamera may change; unset = the camera's configured value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub fps: Option<u32>,
    pub encoding: Option<Encoding>,
}

/// A frame as a reader gets it: the frame, its bytes in the asked encoding, and (for a
/// watcher) how many frames it skipped so far.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub frame: Arc<Frame>,
    pub data: Bytes,
    pub encoding: Encoding,
    pub dropped: u64,
}

/// Every camera of the runtime and their capture loops.
pub struct CameraController {
    configured: Vec<Arc<Entry>>,
    /// Unconfigured V4L2 devices, refreshed from sysfs on lookups and listings.
    detected: Mutex<Vec<Arc<Entry>>>,
    /// sysfs directory of V4L2 devices; `None` disables discovery.
    v4l2_root: Option<PathBuf>,
    next_session: AtomicU64,
    /// V4L2 device -> the camera capturing from it.
    devices_in_use: Mutex<BTreeMap<PathBuf, String>>,
    changes: watch::Sender<u64>,
    shutdown: CancellationToken,
    /// Frames captured and skipped by watchers, per camera (Prometheus).
    counters: CameraCounters,
}

/// One camera.
struct Entry {
    spec: Camera,
    /// An unconfigured V4L2 device: its sysfs name and serial.
    detected: Option<v4l2::V4l2Device>,
    /// The open session; the lock serializes open and close.
    session: tokio::sync::Mutex<Option<Session>>,
    feed: watch::Sender<Feed>,
    /// The default encoding: the open session's, else the configured one.
    encoding: Arc<SharedEncoding>,
    status: Mutex<Status>,
}

/// What a descriptor reports besides the feed.
struct Status {
    settings: Settings,
    /// Why the last open failed (cleared by a successful open).
    last_error: String,
    /// The V4L2 device the open session captures from.
    device: Option<PathBuf>,
}

struct Session {
    settings: Settings,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    device: Option<PathBuf>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data stays consistent across a panic (plain assignments), so a poisoned lock is
    // still usable.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Entry {
    fn new(spec: Camera, detected: Option<v4l2::V4l2Device>) -> Arc<Entry> {
        let settings = Settings {
            width: spec.width,
            height: spec.height,
            fps: spec.fps,
        };
        Arc::new(Entry {
            encoding: Arc::new(SharedEncoding::new(spec.encoding)),
            spec,
            detected,
            session: tokio::sync::Mutex::new(None),
            feed: watch::Sender::new(Feed::Closed),
            status: Mutex::new(Status {
                settings,
                last_error: String::new(),
                device: None,
            }),
        })
    }

    fn id(&self) -> &str {
        &self.spec.id
    }

    fn is_open(&self) -> bool {
        !matches!(*self.feed.borrow(), Feed::Closed)
    }
}

/// The canonical path of a device (symlinks such as `/dev/v4l/by-id/...` resolved).
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A request's timeout in seconds: unset = [`DEFAULT_CAPTURE_TIMEOUT`].
pub fn capture_timeout(seconds: Option<f64>) -> Result<Duration, CameraError> {
    match seconds {
        None => Ok(DEFAULT_CAPTURE_TIMEOUT),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(
            s.min(MAX_CAPTURE_TIMEOUT.as_secs_f64()),
        )),
        Some(s) => Err(CameraError::InvalidArgument(format!(
            "timeout {s} must be a number of seconds, 0 or more"
        ))),
    }
}

impl CameraController {
    /// The controller of `cameras` (validated configuration), discovering unconfigured V4L2
    /// devices under `v4l2_root` (normally [`v4l2::SYSFS_ROOT`]; `None` = no discovery).
    /// Capture loops stop when `shutdown` is cancelled (see also [`Self::shutdown`]).
    pub fn new(
        cameras: &[Camera],
        v4l2_root: Option<PathBuf>,
        shutdown: CancellationToken,
    ) -> Arc<CameraController> {
        let controller = CameraController {
            configured: cameras
                .iter()
                .map(|c| Entry::new(c.clone(), None))
                .collect(),
            detected: Mutex::new(Vec::new()),
            v4l2_root,
            next_session: AtomicU64::new(0),
            devices_in_use: Mutex::new(BTreeMap::new()),
            changes: watch::Sender::new(0),
            shutdown,
            counters: CameraCounters::default(),
        };
        controller.rescan();
        Arc::new(controller)
    }

    /// Frames captured and skipped by watchers, per camera (see [`crate::metrics`]).
    pub fn counters(&self) -> &CameraCounters {
        &self.counters
    }

    /// How many cameras have an open session (no rescan).
    pub fn open_count(&self) -> usize {
        let detected = lock(&self.detected).clone();
        self.configured
            .iter()
            .chain(detected.iter())
            .filter(|e| e.feed.borrow().session().is_some())
            .count()
    }

    /// Whether there is any camera to serve: configured, or a V4L2 device found now.
    pub fn has_cameras(&self) -> bool {
        !self.configured.is_empty() || !lock(&self.detected).is_empty()
    }

    /// Ticks whenever a camera opens, closes, fails or recovers (device health).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Scan sysfs and refresh the unconfigured V4L2 cameras: new devices are added,
    /// vanished ones dropped unless open (they show ERROR until closed). Returns the scan.
    fn rescan(&self) -> Vec<v4l2::V4l2Device> {
        let Some(root) = &self.v4l2_root else {
            return Vec::new();
        };
        let scanned = v4l2::scan(root);
        // Devices a configured camera names, and those configured cameras capture from.
        let mut claimed: Vec<PathBuf> = self
            .configured
            .iter()
            .filter_map(|e| e.spec.device.as_deref().map(canonical))
            .collect();
        let configured_ids: Vec<&str> = self.configured.iter().map(|e| e.id()).collect();
        claimed.extend(
            lock(&self.devices_in_use)
                .iter()
                .filter(|(_, camera)| configured_ids.contains(&camera.as_str()))
                .map(|(device, _)| device.clone()),
        );
        let mut detected = lock(&self.detected);
        let mut next: Vec<Arc<Entry>> = Vec::new();
        for device in &scanned {
            if claimed.contains(&canonical(&device.device))
                || configured_ids.contains(&device.node.as_str())
            {
                continue;
            }
            match detected.iter().find(|e| e.id() == device.node) {
                Some(entry) => next.push(entry.clone()),
                None => next.push(Entry::new(
                    Camera {
                        id: device.node.clone(),
                        driver: CameraDriver::V4l2,
                        width: 640,
                        height: 480,
                        fps: 30,
                        encoding: Encoding::Jpeg,
                        device: Some(device.device.clone()),
                        url: None,
                        path: None,
                    },
                    Some(device.clone()),
                )),
            }
        }
        for entry in detected.iter() {
            if entry.is_open() && !next.iter().any(|e| e.id() == entry.id()) {
                next.push(entry.clone());
            }
        }
        *detected = next;
        scanned
    }

    fn find(&self, id: &str) -> Option<Arc<Entry>> {
        self.configured
            .iter()
            .find(|e| e.id() == id)
            .cloned()
            .or_else(|| lock(&self.detected).iter().find(|e| e.id() == id).cloned())
    }

    /// The camera `id` (rescanning V4L2 devices when it is not known yet).
    fn entry(&self, id: &str) -> Result<Arc<Entry>, CameraError> {
        if id.is_empty() {
            return Err(CameraError::InvalidArgument("camera_id is required".into()));
        }
        if let Some(entry) = self.find(id) {
            return Ok(entry);
        }
        self.rescan();
        self.find(id)
            .ok_or_else(|| CameraError::NotFound(format!("camera {id:?} not found")))
    }

    /// Every camera: the configured ones in configuration order, then the unconfigured
    /// V4L2 devices (rescanned now).
    pub fn list(&self) -> Vec<pb::CameraDescriptor> {
        let scanned = self.rescan();
        let detected = lock(&self.detected).clone();
        self.configured
            .iter()
            .chain(detected.iter())
            .map(|e| self.descriptor(e, &scanned))
            .collect()
    }

    /// One camera.
    pub fn info(&self, id: &str) -> Result<pb::CameraDescriptor, CameraError> {
        let entry = self.entry(id)?;
        let scanned = match entry.spec.driver {
            CameraDriver::V4l2 => self
                .v4l2_root
                .as_deref()
                .map(v4l2::scan)
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        Ok(self.descriptor(&entry, &scanned))
    }

    fn descriptor(&self, entry: &Entry, scanned: &[v4l2::V4l2Device]) -> pb::CameraDescriptor {
        let feed = entry.feed.borrow().clone();
        let status = lock(&entry.status);
        let (state, message, last_sequence) = match &feed {
            Feed::Closed => (CameraState::Closed, status.last_error.clone(), 0),
            Feed::Starting { .. } => (CameraState::Open, String::new(), 0),
            Feed::Frame(frame) => (CameraState::Open, String::new(), frame.sequence),
            Feed::Failed { error, .. } => (CameraState::Error, error.to_string(), 0),
        };
        let spec = &entry.spec;
        // A V4L2 camera is named after its device: the one it captures from, or names.
        let device = status.device.clone().or_else(|| spec.device.clone());
        let v4l2 = entry.detected.clone().or_else(|| {
            let device = canonical(device.as_deref()?);
            scanned
                .iter()
                .find(|d| canonical(&d.device) == device)
                .cloned()
        });
        let (name, serial_number) = match v4l2 {
            Some(d) => (format!("{} ({})", d.name, d.device.display()), d.serial),
            None => (spec.id.clone(), String::new()),
        };
        let settings = status.settings;
        let mut resolutions = vec![(settings.width, settings.height)];
        let mut rates = vec![settings.fps];
        if spec.driver == CameraDriver::Sim {
            // Any size and rate works; these are the usual ones.
            resolutions.extend([(320, 240), (640, 480), (1280, 720), (1920, 1080)]);
            rates.extend([15, 30, 60, 90, 120]);
        }
        resolutions.sort_unstable();
        resolutions.dedup();
        rates.sort_unstable();
        rates.dedup();
        pb::CameraDescriptor {
            camera_id: spec.id.clone(),
            name,
            camera_type: driver_name(spec.driver).into(),
            serial_number,
            width: settings.width,
            height: settings.height,
            fps: settings.fps,
            enable_depth: false,
            state: state as i32,
            supported_resolutions: resolutions
                .into_iter()
                .map(|(width, height)| pb::Resolution { width, height })
                .collect(),
            supported_fps: rates,
            // What frames are captured as, before encoding.
            pixel_format: "rgb24".into(),
            encoding: entry.encoding.get().as_str().into(),
            message,
            last_sequence,
        }
    }

    /// Open camera `id`: start its capture loop and wait up to [`OPEN_WAIT`] for the first
    /// frame (an immediate failure is returned and the camera stays closed). Opening an open
    /// camera with the same size and fps (or none given) succeeds and may change its default
    /// encoding; a different size or fps is `FailedPrecondition`.
    pub async fn open(
        &self,
        id: &str,
        options: OpenOptions,
    ) -> Result<pb::OpenCameraResponse, CameraError> {
        let entry = self.entry(id)?;
        for (field, value, max) in [
            ("width", options.width, MAX_SIDE),
            ("height", options.height, MAX_SIDE),
            ("fps", options.fps, MAX_FPS),
        ] {
            if let Some(v) = value
                && !(1..=max).contains(&v)
            {
                return Err(CameraError::InvalidArgument(format!(
                    "{field} {v} is out of range (1-{max})"
                )));
            }
        }
        let mut slot = entry.session.lock().await;
        if let Some(session) = slot.as_ref() {
            let current = session.settings;
            let wanted = Settings {
                width: options.width.unwrap_or(current.width),
                height: options.height.unwrap_or(current.height),
                fps: options.fps.unwrap_or(current.fps),
            };
            if wanted != current {
                return Err(CameraError::FailedPrecondition(format!(
                    "camera {id:?} is open at {current}; close it first to open it at {wanted}"
                )));
            }
            if let Some(encoding) = options.encoding {
                entry.encoding.set(encoding);
            }
            return Ok(self.opened(&entry, current));
        }
        if self.shutdown.is_cancelled() {
            return Err(CameraError::Unavailable(
                "the embodied runtime is shutting down".into(),
            ));
        }
        let spec = &entry.spec;
        let settings = Settings {
            width: options.width.unwrap_or(spec.width),
            height: options.height.unwrap_or(spec.height),
            fps: options.fps.unwrap_or(spec.fps),
        };
        let device = self.claim_device(&entry)?;
        let starter: Box<dyn Starter> = match (spec.driver, &device) {
            (CameraDriver::Sim, _) => Box::new(SimStarter(settings)),
            (CameraDriver::V4l2, Some(device)) => ffmpeg_starter(
                id,
                ffmpeg::Input::V4l2 {
                    device: device.clone(),
                },
                settings,
            ),
            (CameraDriver::V4l2, None) => {
                return Err(CameraError::Internal(format!(
                    "camera {id:?}: no V4L2 device was picked"
                )));
            }
            (CameraDriver::Rtsp, _) => ffmpeg_starter(
                id,
                ffmpeg::Input::Rtsp {
                    url: spec.url.clone().unwrap_or_default(),
                },
                settings,
            ),
            (CameraDriver::File, _) => ffmpeg_starter(
                id,
                ffmpeg::Input::File {
                    path: spec.path.clone().unwrap_or_default(),
                },
                settings,
            ),
        };
        let session_id = self.next_session.fetch_add(1, Ordering::Relaxed) + 1;
        entry
            .encoding
            .set(options.encoding.unwrap_or(spec.encoding));
        {
            let mut status = lock(&entry.status);
            status.settings = settings;
            status.device = device.clone();
        }
        entry.feed.send_replace(Feed::Starting {
            session: session_id,
        });
        let cancel = self.shutdown.child_token();
        let task = tokio::spawn(
            CaptureLoop {
                camera_id: id.to_string(),
                session: session_id,
                width: settings.width,
                height: settings.height,
                starter,
                encoding: entry.encoding.clone(),
                feed: entry.feed.clone(),
                changes: self.changes.clone(),
                cancel: cancel.clone(),
                frames: self.counters.frames_of(id),
            }
            .run(),
        );
        let session = Session {
            settings,
            cancel,
            task,
            device,
        };
        if let Err(error) = first_frame(&entry, session_id).await {
            self.stop(&entry, session).await;
            lock(&entry.status).last_error = error.to_string();
            self.changed();
            tracing::warn!(camera = %id, error = %error, "open camera failed");
            return Err(error);
        }
        *slot = Some(session);
        lock(&entry.status).last_error.clear();
        self.changed();
        tracing::info!(
            camera = %id,
            driver = driver_name(spec.driver),
            settings = %settings,
            encoding = entry.encoding.get().as_str(),
            "camera opened"
        );
        Ok(self.opened(&entry, settings))
    }

    fn opened(&self, entry: &Entry, settings: Settings) -> pb::OpenCameraResponse {
        let state = match *entry.feed.borrow() {
            Feed::Failed { .. } => CameraState::Error,
            _ => CameraState::Open,
        };
        pb::OpenCameraResponse {
            camera_id: entry.id().into(),
            state: state as i32,
            encoding: entry.encoding.get().as_str().into(),
            width: settings.width,
            height: settings.height,
            fps: settings.fps,
        }
    }

    /// The V4L2 device a camera being opened captures from, reserved for it: its configured
    /// device, or (auto-detect) the first one found that nothing else uses.
    fn claim_device(&self, entry: &Entry) -> Result<Option<PathBuf>, CameraError> {
        let spec = &entry.spec;
        if spec.driver != CameraDriver::V4l2 {
            return Ok(None);
        }
        let id = spec.id.as_str();
        let device = match &spec.device {
            Some(device) => device.clone(),
            None => {
                let named: Vec<PathBuf> = self
                    .configured
                    .iter()
                    .filter_map(|e| e.spec.device.as_deref().map(canonical))
                    .collect();
                let in_use = lock(&self.devices_in_use).clone();
                let scanned = self
                    .v4l2_root
                    .as_deref()
                    .map(v4l2::scan)
                    .unwrap_or_default();
                scanned
                    .into_iter()
                    .map(|d| d.device)
                    .find(|d| {
                        let c = canonical(d);
                        !named.contains(&c) && !in_use.contains_key(&c)
                    })
                    .ok_or_else(|| {
                        CameraError::FailedPrecondition(format!(
                            "camera {id:?}: no free V4L2 capture device found in {}",
                            self.v4l2_root
                                .as_deref()
                                .unwrap_or(Path::new(v4l2::SYSFS_ROOT))
                                .display()
                        ))
                    })?
            }
        };
        let key = canonical(&device);
        let mut in_use = lock(&self.devices_in_use);
        if let Some(other) = in_use.get(&key)
            && other != id
        {
            return Err(CameraError::FailedPrecondition(format!(
                "camera {id:?}: V4L2 device {} is in use by camera {other:?}",
                device.display()
            )));
        }
        in_use.insert(key, id.to_string());
        Ok(Some(device))
    }

    /// Stop a session's capture loop and mark the camera closed.
    async fn stop(&self, entry: &Entry, session: Session) {
        session.cancel.cancel();
        if let Err(e) = session.task.await {
            tracing::error!(camera = %entry.id(), error = %e, "camera capture task failed");
        }
        if let Some(device) = &session.device {
            lock(&self.devices_in_use).remove(&canonical(device));
        }
        entry.feed.send_replace(Feed::Closed);
        entry.encoding.set(entry.spec.encoding);
        let mut status = lock(&entry.status);
        status.settings = Settings {
            width: entry.spec.width,
            height: entry.spec.height,
            fps: entry.spec.fps,
        };
        status.device = None;
    }

    /// Close camera `id` (a no-op when it is closed). Its watchers' streams end.
    pub async fn close(&self, id: &str) -> Result<pb::CloseCameraResponse, CameraError> {
        let entry = self.entry(id)?;
        let mut slot = entry.session.lock().await;
        if let Some(session) = slot.take() {
            self.stop(&entry, session).await;
            self.changed();
            tracing::info!(camera = %id, "camera closed");
        }
        Ok(pb::CloseCameraResponse {
            camera_id: id.into(),
            state: CameraState::Closed as i32,
        })
    }

    /// The encoding `requested`, else the camera's default.
    fn encoding_for(entry: &Entry, requested: Option<Encoding>) -> Encoding {
        requested.unwrap_or_else(|| entry.encoding.get())
    }

    /// The latest frame of open camera `id` in `encoding` (default: the camera's), waiting
    /// up to `timeout` for a first frame. `FailedPrecondition` when the camera is not open,
    /// `Unavailable` when no frame came in time or its capture is failing.
    pub async fn latest(
        &self,
        id: &str,
        encoding: Option<Encoding>,
        timeout: Duration,
    ) -> Result<Delivered, CameraError> {
        let entry = self.entry(id)?;
        let encoding = Self::encoding_for(&entry, encoding);
        let mut feed = entry.feed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        let frame = loop {
            let current = feed.borrow_and_update().clone();
            match current {
                Feed::Frame(frame) => break frame,
                Feed::Closed => return Err(not_open(id)),
                Feed::Failed { error, .. } => return Err(unavailable(id, &error)),
                Feed::Starting { .. } => {
                    match tokio::time::timeout_at(deadline, feed.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return Err(not_open(id)),
                        Err(_) => {
                            return Err(CameraError::Unavailable(format!(
                                "camera {id:?} has not delivered a frame yet (waited {timeout:?})"
                            )));
                        }
                    }
                }
            }
        };
        let data = frame::encoded(&frame, encoding).await?;
        Ok(Delivered {
            frame,
            data,
            encoding,
            dropped: 0,
        })
    }

    /// Every new frame of open camera `id` in `encoding` (default: the camera's), starting
    /// with the latest one. The stream holds one frame at a time: when the reader is slower
    /// than the camera it gets the newest frame next and `dropped` grows by the frames it
    /// skipped. It ends with `FailedPrecondition` when the camera is closed, `Unavailable`
    /// when its capture fails or the runtime shuts down.
    pub fn watch(
        &self,
        id: &str,
        encoding: Option<Encoding>,
    ) -> Result<BoxStream<'static, Result<Delivered, CameraError>>, CameraError> {
        let entry = self.entry(id)?;
        let encoding = Self::encoding_for(&entry, encoding);
        let mut feed = entry.feed.subscribe();
        let Some(session) = feed.borrow_and_update().session() else {
            return Err(not_open(id));
        };
        // The current frame (if any) goes out first.
        feed.mark_changed();
        let state = Watcher {
            id: id.to_string(),
            feed,
            session,
            encoding,
            last: 0,
            dropped: 0,
            dropped_total: self.counters.watch_dropped_of(id),
            shutdown: self.shutdown.clone(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut w| async move {
                if w.done {
                    return None;
                }
                let item = w.next().await;
                w.done = item.is_err();
                Some((item, w))
            },
        )))
    }

    /// Close every camera (their capture loops stop, ffmpeg children are killed).
    pub async fn shutdown(&self) {
        let detected = lock(&self.detected).clone();
        for entry in self.configured.iter().chain(detected.iter()) {
            let mut slot = entry.session.lock().await;
            if let Some(session) = slot.take() {
                self.stop(entry, session).await;
                self.changed();
            }
        }
    }
}

/// State of one WatchFrames stream.
struct Watcher {
    id: String,
    feed: watch::Receiver<Feed>,
    session: u64,
    encoding: Encoding,
    /// Sequence number of the last frame sent (0 before the first).
    last: u64,
    dropped: u64,
    /// The camera's skipped-frames counter (all its watchers).
    dropped_total: prometheus_client::metrics::counter::Counter,
    shutdown: CancellationToken,
    done: bool,
}

impl Watcher {
    async fn next(&mut self) -> Result<Delivered, CameraError> {
        loop {
            let changed = tokio::select! {
                _ = self.shutdown.cancelled() => {
                    return Err(CameraError::Unavailable("the embodied runtime is shutting down".into()));
                }
                changed = self.feed.changed() => changed,
            };
            if changed.is_err() {
                return Err(CameraError::Unavailable(
                    "the camera controller stopped".into(),
                ));
            }
            let current = self.feed.borrow_and_update().clone();
            match current {
                Feed::Frame(frame) if frame.session == self.session => {
                    if frame.sequence <= self.last {
                        continue;
                    }
                    if self.last > 0 {
                        let skipped = frame.sequence - self.last - 1;
                        self.dropped += skipped;
                        self.dropped_total.inc_by(skipped);
                    }
                    self.last = frame.sequence;
                    let data = frame::encoded(&frame, self.encoding).await?;
                    return Ok(Delivered {
                        frame,
                        data,
                        encoding: self.encoding,
                        dropped: self.dropped,
                    });
                }
                Feed::Starting { session } if session == self.session => {}
                Feed::Failed { session, error } if session == self.session => {
                    return Err(unavailable(&self.id, &error));
                }
                // Closed, or closed and opened again: this stream's session is over.
                _ => {
                    return Err(CameraError::FailedPrecondition(format!(
                        "camera {:?} was closed",
                        self.id
                    )));
                }
            }
        }
    }
}

/// Waits for an open camera's first frame: `Err` when its source fails first; `Ok` also
/// when [`OPEN_WAIT`] passes without a frame (the camera stays open, frames may come).
async fn first_frame(entry: &Entry, session: u64) -> Result<(), CameraError> {
    let mut feed = entry.feed.subscribe();
    let deadline = tokio::time::Instant::now() + OPEN_WAIT;
    loop {
        let current = feed.borrow_and_update().clone();
        match current {
            Feed::Frame(_) => return Ok(()),
            Feed::Failed { error, .. } => return Err(error),
            Feed::Starting { session: s } if s == session => {}
            Feed::Starting { .. } | Feed::Closed => {
                return Err(CameraError::Internal(format!(
                    "camera {:?} changed state while opening",
                    entry.id()
                )));
            }
        }
        match tokio::time::timeout_at(deadline, feed.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return Ok(()),
        }
    }
}

fn not_open(id: &str) -> CameraError {
    CameraError::FailedPrecondition(format!("camera {id:?} is not open (OpenCamera first)"))
}

/// A capture failure as a reader sees it: `Unavailable`, with the reason.
fn unavailable(id: &str, error: &CameraError) -> CameraError {
    let message = error.message();
    if message.contains(&format!("{id:?}")) {
        CameraError::Unavailable(message.to_string())
    } else {
        CameraError::Unavailable(format!("camera {id:?}: {message}"))
    }
}

/// The driver's name in configuration and descriptors.
pub fn driver_name(driver: CameraDriver) -> &'static str {
    match driver {
        CameraDriver::Sim => "sim",
        CameraDriver::V4l2 => "v4l2",
        CameraDriver::Rtsp => "rtsp",
        CameraDriver::File => "file",
    }
}

struct SimStarter(Settings);

#[async_trait::async_trait]
impl Starter for SimStarter {
    async fn start(&self) -> Result<Box<dyn capture::Source>, CameraError> {
        let Settings { width, height, fps } = self.0;
        Ok(Box::new(sim::SimSource::new(width, height, fps)))
    }
}

fn ffmpeg_starter(id: &str, input: ffmpeg::Input, settings: Settings) -> Box<dyn Starter> {
    Box::new(ffmpeg::FfmpegStarter {
        camera_id: id.to_string(),
        input,
        width: settings.width,
        height: settings.height,
        fps: settings.fps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(capture_timeout(None), Ok(DEFAULT_CAPTURE_TIMEOUT));
        assert_eq!(capture_timeout(Some(0.25)), Ok(Duration::from_millis(250)));
        assert_eq!(capture_timeout(Some(1e12)), Ok(MAX_CAPTURE_TIMEOUT));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = capture_timeout(Some(bad)).expect_err("bad timeout");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
        }
    }
}
