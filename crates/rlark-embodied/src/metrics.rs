//! Prometheus metrics of the embodied runtime: `GET /metrics` on the optional
//! `--metrics-listen` address (see [`crate::server::ServeOptions`], `docs/embodied.md`),
//! served by [`rlark_observe::metrics_endpoint`].
//!
//! - `rlark_embodied_robots{state}` (gauge): robots per state, read from the robot
//!   controller at scrape time (every state is reported, 0 included).
//! - `rlark_embodied_cameras_open` (gauge): cameras with an open session, at scrape time.
//! - `rlark_embodied_camera_frames_total{camera}` (counter): frames captured.
//! - `rlark_embodied_watch_frames_dropped_total{camera}` (counter): frames WatchFrames
//!   streams skipped because their reader was slower than the camera.
//! - `rlark_embodied_device_plugin_registrations_total` (counter): successful
//!   registrations of the device plugin with the kubelet.
//! - `rlark_embodied_calls_denied_total` (counter): device calls refused because the
//!   caller does not hold the device ([`crate::access`]).

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use rlark_proto::robot::v1::RobotState;

use crate::camera::CameraController;
use crate::robot::{RobotController, state_name};

/// Prefix of every metric name.
pub const PREFIX: &str = "rlark_embodied";

/// Device plugin registrations with the kubelet (one counter per process).
pub fn device_plugin_registrations() -> &'static Counter {
    static REGISTRATIONS: std::sync::OnceLock<Counter> = std::sync::OnceLock::new();
    REGISTRATIONS.get_or_init(Counter::default)
}

/// The registry of a runtime: collectors over its robot and camera controllers, and
/// their counters.
pub fn registry(robots: Arc<RobotController>, cameras: Arc<CameraController>) -> Registry {
    let mut registry = Registry::with_prefix(PREFIX);
    let counters = cameras.counters().clone();
    registry.register(
        "camera_frames",
        "Frames captured, per camera",
        counters.frames,
    );
    registry.register(
        "watch_frames_dropped",
        "Frames WatchFrames streams skipped because their reader was slower than the camera",
        counters.watch_dropped,
    );
    registry.register(
        "device_plugin_registrations",
        "Successful registrations of the device plugin with the kubelet",
        device_plugin_registrations().clone(),
    );
    registry.register(
        "calls_denied",
        "Device calls refused because the caller does not hold the device",
        crate::access::calls_denied().clone(),
    );
    registry.register_collector(Box::new(StateCollector { robots, cameras }));
    registry
}

/// The `state` label of `rlark_embodied_robots`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// The label value of a robot state: `stopped`, `running`, ...
pub fn state_label(state: RobotState) -> String {
    state_name(state).to_ascii_lowercase()
}

/// Reads robot states and open cameras at scrape time.
struct StateCollector {
    robots: Arc<RobotController>,
    cameras: Arc<CameraController>,
}

impl fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateCollector").finish_non_exhaustive()
    }
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let robots = Family::<StateLabel, Gauge>::default();
        for state in [
            RobotState::Starting,
            RobotState::Running,
            RobotState::Stopping,
            RobotState::Stopped,
            RobotState::Error,
        ] {
            robots
                .get_or_create(&StateLabel {
                    state: state_label(state),
                })
                .set(0);
        }
        for id in self.robots.robot_ids() {
            if let Ok(info) = self.robots.status(&id) {
                let state = RobotState::try_from(info.state).unwrap_or(RobotState::Unspecified);
                robots
                    .get_or_create(&StateLabel {
                        state: state_label(state),
                    })
                    .inc();
            }
        }
        let metric =
            encoder.encode_descriptor("robots", "Robots per state", None, robots.metric_type())?;
        robots.encode(metric)?;

        let open = ConstGauge::new(i64::try_from(self.cameras.open_count()).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "cameras_open",
            "Cameras with an open session",
            None,
            open.metric_type(),
        )?;
        open.encode(metric)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::ConnTracker;
    use rlark_observe::metrics_endpoint;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn robots_per_state_and_camera_counters_are_encoded() {
        let config =
            crate::EmbodiedConfig::from_yaml(include_str!("../../../examples/embodied/sim.yaml"))
                .unwrap();
        let robots = RobotController::new(Arc::new(config.clone()), ConnTracker::new());
        let cameras = CameraController::new(&config.cameras, None, CancellationToken::new());
        cameras.counters().frames_of("cam-0").inc_by(3);
        let registry = registry(robots, cameras);
        let response = metrics_endpoint::response("/metrics", &registry);
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = format!("{:?}", response.body());
        assert!(
            body.contains("rlark_embodied_robots{state=\\\"stopped\\\"} 1"),
            "{body}"
        );
        assert!(
            body.contains("rlark_embodied_robots{state=\\\"running\\\"} 0"),
            "{body}"
        );
        assert!(body.contains("rlark_embodied_cameras_open 0"), "{body}");
        assert!(
            body.contains("rlark_embodied_camera_frames_total{camera=\\\"cam-0\\\"} 3"),
            "{body}"
        );
        assert!(
            body.contains("rlark_embodied_device_plugin_registrations_total"),
            "{body}"
        );
        assert!(body.contains("rlark_embodied_calls_denied_total"), "{body}");
        assert_eq!(
            metrics_endpoint::response("/", &registry).status(),
            http::StatusCode::NOT_FOUND
        );
    }
}
