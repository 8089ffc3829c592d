//! Per-camera Prometheus counters, kept by the [`CameraController`](super::CameraController)
//! and registered by [`crate::metrics::registry`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The `camera` label of per-camera metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CameraLabel {
    pub camera: String,
}

/// Per-camera counters, kept by the [`CameraController`](super::CameraController) and
/// updated where frames are captured and where WatchFrames streams skip frames.
#[derive(Clone, Debug, Default)]
pub struct CameraCounters {
    /// Frames captured, per camera.
    pub frames: Family<CameraLabel, Counter>,
    /// Frames WatchFrames readers skipped, per camera.
    pub watch_dropped: Family<CameraLabel, Counter>,
}

impl CameraCounters {
    /// The frames counter of `camera` (taken when it opens). Also creates its
    /// skipped-frames series, so both show (at 0) from its first open.
    pub fn frames_of(&self, camera: &str) -> Counter {
        let label = CameraLabel {
            camera: camera.to_string(),
        };
        self.watch_dropped.get_or_create_owned(&label);
        self.frames.get_or_create_owned(&label)
    }

    /// The skipped-frames counter of `camera`.
    pub fn watch_dropped_of(&self, camera: &str) -> Counter {
        self.watch_dropped.get_or_create_owned(&CameraLabel {
            camera: camera.to_string(),
        })
    }
}
