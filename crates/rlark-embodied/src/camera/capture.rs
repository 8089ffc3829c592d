//! The capture loop of an open camera: pulls raw frames from its driver's [`Source`],
//! numbers them, encodes each once in the camera's encoding and publishes the latest as
//! the camera's [`Feed`] (a `tokio::sync::watch`, so readers always see the newest frame
//! and nothing queues). A failing source puts the camera in ERROR and is restarted with
//! backoff until it works again or the camera is closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::CameraError;
use super::frame::{Frame, encoded, unix_nanos};
use crate::config::Encoding;

/// First wait before restarting a failed source; doubles up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest wait between restarts of a failed source.
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// One raw frame from a source.
pub(crate) struct RawFrame {
    /// RGB8, `width * height * 3` bytes.
    pub rgb: Vec<u8>,
    /// When it was captured (read from the device or rendered).
    pub captured: SystemTime,
}

/// A started driver: yields frames at the camera's pace until it fails.
#[async_trait::async_trait]
pub(crate) trait Source: Send {
    /// The next frame, waiting as long as the source paces frames. `sequence` is the
    /// number the frame will get (the sim burns it in).
    async fn next_frame(&mut self, sequence: u64) -> Result<RawFrame, CameraError>;
}

/// Starts a camera's source (again after a failure).
#[async_trait::async_trait]
pub(crate) trait Starter: Send + Sync {
    async fn start(&self) -> Result<Box<dyn Source>, CameraError>;
}

/// What a camera's readers see: its latest state and frame.
#[derive(Clone, Debug)]
pub(crate) enum Feed {
    /// Not open.
    Closed,
    /// Open, no frame yet.
    Starting { session: u64 },
    /// The latest frame of the open session.
    Frame(Arc<Frame>),
    /// The source failed; the loop is restarting it.
    Failed { session: u64, error: CameraError },
}

impl Feed {
    /// The open session this state belongs to.
    pub fn session(&self) -> Option<u64> {
        match self {
            Feed::Closed => None,
            Feed::Starting { session } | Feed::Failed { session, .. } => Some(*session),
            Feed::Frame(frame) => Some(frame.session),
        }
    }
}

/// The encoding a camera delivers by default, changeable while it runs.
#[derive(Debug)]
pub(crate) struct SharedEncoding(AtomicU8);

impl SharedEncoding {
    pub fn new(encoding: Encoding) -> Self {
        SharedEncoding(AtomicU8::new(Self::code(encoding)))
    }

    fn code(encoding: Encoding) -> u8 {
        match encoding {
            Encoding::Jpeg => 0,
            Encoding::Png => 1,
            Encoding::Raw => 2,
        }
    }

    pub fn get(&self) -> Encoding {
        match self.0.load(Ordering::Relaxed) {
            0 => Encoding::Jpeg,
            1 => Encoding::Png,
            _ => Encoding::Raw,
        }
    }

    pub fn set(&self, encoding: Encoding) {
        self.0.store(Self::code(encoding), Ordering::Relaxed);
    }
}

/// Everything one capture loop needs.
pub(crate) struct CaptureLoop {
    pub camera_id: String,
    pub session: u64,
    pub width: u32,
    pub height: u32,
    pub starter: Box<dyn Starter>,
    pub encoding: Arc<SharedEncoding>,
    pub feed: watch::Sender<Feed>,
    /// Bumped when the camera's state changes (ERROR and back).
    pub changes: watch::Sender<u64>,
    pub cancel: CancellationToken,
    /// Frames captured by this camera (Prometheus).
    pub frames: prometheus_client::metrics::counter::Counter,
}

impl CaptureLoop {
    /// Capture until cancelled, restarting a failed source with backoff.
    pub async fn run(self) {
        let mut sequence = 0;
        let mut backoff = RETRY_MIN;
        loop {
            let error = tokio::select! {
                _ = self.cancel.cancelled() => return,
                error = self.capture(&mut sequence, &mut backoff) => error,
            };
            tracing::warn!(
                camera = %self.camera_id,
                error = %error,
                retry_in = ?backoff,
                "camera capture failed"
            );
            self.feed.send_replace(Feed::Failed {
                session: self.session,
                error,
            });
            self.changes.send_modify(|n| *n += 1);
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Start the source and publish its frames; returns why it stopped.
    async fn capture(&self, sequence: &mut u64, backoff: &mut Duration) -> CameraError {
        let mut source = match self.starter.start().await {
            Ok(source) => source,
            Err(e) => return e,
        };
        loop {
            let raw = match source.next_frame(*sequence + 1).await {
                Ok(raw) => raw,
                Err(e) => return e,
            };
            *sequence += 1;
            let frame = match Frame::new(
                self.session,
                *sequence,
                unix_nanos(raw.captured),
                self.width,
                self.height,
                Bytes::from(raw.rgb),
            ) {
                Ok(frame) => Arc::new(frame),
                Err(e) => return e,
            };
            // Encode once here, so every reader of the default encoding just shares it.
            if let Err(e) = encoded(&frame, self.encoding.get()).await {
                return e;
            }
            let recovered = matches!(*self.feed.borrow(), Feed::Failed { .. });
            self.feed.send_replace(Feed::Frame(frame));
            self.frames.inc();
            if recovered {
                tracing::info!(camera = %self.camera_id, "camera capture recovered");
                *backoff = RETRY_MIN;
                self.changes.send_modify(|n| *n += 1);
            }
        }
    }
}
