//! The simulated arm: a built-in robot backend that needs no ROS.
//!
//! It behaves like a launch of the built-in package `rlark_sim`, launch file `arm.launch`,
//! whose arguments set it up:
//!
//! | argument | default | meaning |
//! |---|---|---|
//! | `joints` | 6 | number of joints (1-32) |
//! | `target` | hold the current position | commanded joint positions, radians, comma-separated |
//! | `speed` | 0.5 | joint speed limit, radians per second |
//! | `rate` | 50 | physics steps per second (1-1000) |
//! | `fault` | empty | inject a fault: when set, the arm reports it on its first step and the robot goes to ERROR |
//!
//! While running, a tokio interval steps every joint toward its target by at most
//! `speed × elapsed`. Positions survive stops and mode switches (a real arm does not jump)
//! and are zeroed by ResetRobot, or when `joints` changes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::backend::{Backend, EventKind, LaunchContext, LaunchError};
use super::plan::LaunchPlan;
use super::process::LogRing;
use rlark_proto::robot::v1::{LaunchArg, SimArmState};

/// The built-in package every sim mode launches.
pub const PACKAGE: &str = "rlark_sim";
/// Its one launch file.
pub const LAUNCH_FILE: &str = "arm.launch";
/// Log prefix of the arm.
const SOURCE: &str = "sim-arm";
/// A joint within this of its target counts as there (radians).
const EPSILON: f64 = 1e-9;

/// The launch arguments of `rlark_sim/arm.launch`, as GetLaunchFileArgs reports them.
pub fn launch_args() -> Vec<LaunchArg> {
    let arg = |name: &str, default: &str, description: &str| LaunchArg {
        name: name.into(),
        required: false,
        default: default.into(),
        description: description.into(),
    };
    vec![
        arg("joints", "6", "number of joints (1-32)"),
        arg(
            "target",
            "",
            "commanded joint positions in radians, comma-separated (default: hold the current position)",
        ),
        arg("speed", "0.5", "joint speed limit, radians per second"),
        arg("rate", "50", "physics steps per second (1-1000)"),
        arg(
            "fault",
            "",
            "inject a fault with this text: the robot goes to ERROR on the first step",
        ),
    ]
}

/// Parsed `arm.launch` arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct SimParams {
    pub joints: usize,
    pub target: Option<Vec<f64>>,
    pub speed: f64,
    pub rate: f64,
    pub fault: Option<String>,
}

impl SimParams {
    /// Parse and check the launch arguments; the error names the argument.
    pub fn from_args(args: &BTreeMap<String, String>) -> Result<Self, String> {
        for name in args.keys() {
            if !matches!(
                name.as_str(),
                "joints" | "target" | "speed" | "rate" | "fault"
            ) {
                return Err(format!(
                    "{PACKAGE}/{LAUNCH_FILE} has no argument {name:?} (it takes joints, target, speed, rate, fault)"
                ));
            }
        }
        let joints = match args.get("joints") {
            None => 6,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=32).contains(n))
                .ok_or_else(|| format!("argument joints={v:?} must be a whole number 1-32"))?,
        };
        let number =
            |name: &str, default: f64, range: std::ops::RangeInclusive<f64>| match args.get(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| range.contains(x))
                    .ok_or_else(|| {
                        format!(
                            "argument {name}={v:?} must be a number in {}-{}",
                            range.start(),
                            range.end()
                        )
                    }),
            };
        let speed = number("speed", 0.5, 1e-6..=100.0)?;
        let rate = number("rate", 50.0, 1.0..=1000.0)?;
        let target = match args.get("target").map(|t| t.trim()) {
            None | Some("") => None,
            Some(text) => {
                let values = text
                    .split(',')
                    .map(|v| v.trim().parse::<f64>().ok().filter(|x| x.is_finite()))
                    .collect::<Option<Vec<f64>>>()
                    .ok_or_else(|| {
                        format!(
                            "argument target={text:?} must be comma-separated numbers (radians)"
                        )
                    })?;
                if values.len() != joints {
                    return Err(format!(
                        "argument target has {} values but the arm has {joints} joints",
                        values.len()
                    ));
                }
                Some(values)
            }
        };
        let fault = args
            .get("fault")
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty());
        Ok(Self {
            joints,
            target,
            speed,
            rate,
            fault,
        })
    }
}

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

    fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_checks_arguments() {
        let p = SimParams::from_args(&args(&[])).expect("defaults");
        assert_eq!(
            (p.joints, p.target.clone(), p.speed, p.rate),
            (6, None, 0.5, 50.0)
        );
        let p = SimParams::from_args(&args(&[
            ("joints", "2"),
            ("target", "0.5, -1"),
            ("fault", " "),
        ]))
        .expect("valid");
        assert_eq!(p.target, Some(vec![0.5, -1.0]));
        assert_eq!(p.fault, None);
        for (bad, needle) in [
            (args(&[("joints", "0")]), "joints"),
            (args(&[("joints", "2"), ("target", "1")]), "2 joints"),
            (args(&[("target", "a,b,c,d,e,f")]), "target"),
            (args(&[("speed", "-1")]), "speed"),
            (args(&[("rate", "0")]), "rate"),
            (args(&[("color", "red")]), "no argument \"color\""),
        ] {
            let e = SimParams::from_args(&bad).expect_err("invalid");
            assert!(e.contains(needle), "{e}");
        }
    }

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
