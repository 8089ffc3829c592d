//! The simulated arm: a built-in robot backend that needs no ROS. It runs launches of the
//! built-in package `rlark_sim` (see [`super::sim_launch`] for its launch file and arguments).
//!
//! While running, a tokio interval steps every joint toward its target by at most
//! `speed × elapsed`. Positions survive stops and mode switches (a real arm does not jump)
//! and are zeroed by ResetRobot, or when `joints` changes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::backend::{Backend, EventKind, LaunchContext, LaunchError};
use super::plan::LaunchPlan;
use super::process::LogRing;
use super::sim_launch::SimParams;
use rlark_proto::robot::v1::SimArmState;

/// Log prefix of the arm.
const SOURCE: &str = "sim-arm";
/// A joint within this of its target counts as there (radians).
const EPSILON: f64 = 1e-9;

/// Joint state shared with status readers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmState {
    pub positions: Vec<f64>,
    pub targets: Vec<f64>,
    pub speed: f64,
}

impl ArmState {
    pub fn moving(&self) -> bool {
        self.positions
            .iter()
            .zip(&self.targets)
            .any(|(p, t)| (p - t).abs() > EPSILON)
    }

    pub fn to_proto(&self) -> SimArmState {
        SimArmState {
            positions: self.positions.clone(),
            targets: self.targets.clone(),
            speed: self.speed,
            moving: self.moving(),
        }
    }

    /// Move every joint toward its target by at most `speed * dt` seconds.
    fn step(&mut self, dt: f64) {
        let max = self.speed * dt;
        for (p, t) in self.positions.iter_mut().zip(&self.targets) {
            let delta = (t - *p).clamp(-max, max);
            *p += delta;
            if (t - *p).abs() <= EPSILON {
                *p = *t;
            }
        }
    }
}

/// The simulated arm backend.
pub struct SimBackend {
    arm: Arc<Mutex<ArmState>>,
    logs: Arc<LogRing>,
    physics: Option<JoinHandle<()>>,
}

impl SimBackend {
    pub fn new(logs: Arc<LogRing>) -> Self {
        Self {
            arm: Arc::new(Mutex::new(ArmState::default())),
            logs,
            physics: None,
        }
    }

    /// The joint state, readable while an operation runs.
    pub fn arm(&self) -> Arc<Mutex<ArmState>> {
        self.arm.clone()
    }

    fn halt(&mut self) {
        if let Some(physics) = self.physics.take() {
            physics.abort();
            self.logs.push(SOURCE, "halted");
        }
    }
}

fn lock(arm: &Mutex<ArmState>) -> std::sync::MutexGuard<'_, ArmState> {
    // Plain numbers; a panicked step cannot leave them unusable.
    arm.lock().unwrap_or_else(PoisonError::into_inner)
}

fn format_joints(values: &[f64]) -> String {
    let parts: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
    format!("[{}]", parts.join(", "))
}

#[async_trait::async_trait]
impl Backend for SimBackend {
    async fn launch(&mut self, plan: &LaunchPlan, ctx: LaunchContext) -> Result<(), LaunchError> {
        self.halt();
        let params = SimParams::from_args(&plan.args).map_err(LaunchError::new)?;
        {
            let mut arm = lock(&self.arm);
            if arm.positions.len() != params.joints {
                arm.positions = vec![0.0; params.joints];
            }
            arm.targets = params
                .target
                .clone()
                .unwrap_or_else(|| arm.positions.clone());
            arm.speed = params.speed;
            self.logs.push(
                SOURCE,
                &format!(
                    "mode {}: {} joints at {}, target {}, speed {} rad/s, {} steps/s",
                    plan.mode.name,
                    params.joints,
                    format_joints(&arm.positions),
                    format_joints(&arm.targets),
                    params.speed,
                    params.rate
                ),
            );
        }
        let arm = self.arm.clone();
        let logs = self.logs.clone();
        let period = Duration::from_secs_f64(1.0 / params.rate);
        let fault = params.fault.clone();
        self.physics = Some(tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut last = Instant::now();
            let mut was_moving = lock(&arm).moving();
            loop {
                interval.tick().await;
                if let Some(fault) = &fault {
                    logs.push(SOURCE, &format!("fault: {fault}"));
                    ctx.report(EventKind::Failed(format!("simulated arm fault: {fault}")));
                    return;
                }
                let now = Instant::now();
                let dt = now.duration_since(last).as_secs_f64();
                last = now;
                let mut state = lock(&arm);
                state.step(dt);
                let moving = state.moving();
                if was_moving && !moving {
                    logs.push(
                        SOURCE,
                        &format!("target reached: {}", format_joints(&state.positions)),
                    );
                }
                was_moving = moving;
            }
        }));
        Ok(())
    }

    async fn stop_launch(&mut self) {
        self.halt();
    }

    async fn shutdown(&mut self) {
        self.halt();
    }

    async fn reset(&mut self) -> Result<(), LaunchError> {
        self.halt();
        let mut arm = lock(&self.arm);
        let joints = arm.positions.len();
        arm.positions = vec![0.0; joints];
        arm.targets = vec![0.0; joints];
        self.logs
            .push(SOURCE, "reset: joints zeroed, fault cleared");
        Ok(())
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        if let Some(physics) = self.physics.take() {
            physics.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joints_move_at_most_speed_times_time() {
        let mut arm = ArmState {
            positions: vec![0.0, 1.0],
            targets: vec![1.0, 0.9],
            speed: 0.5,
        };
        arm.step(1.0);
        assert_eq!(arm.positions, vec![0.5, 0.9]);
        assert!(arm.moving());
        arm.step(1.0);
        assert_eq!(arm.positions, vec![1.0, 0.9]);
        assert!(!arm.moving());
    }
}
