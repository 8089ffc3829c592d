//! What launching the simulated arm takes: the built-in package `rlark_sim`, its one launch
//! file `arm.launch` and that file's arguments, parsed. The launch planner, the package
//! catalog and the configuration check use this; the arm itself is [`super::sim`].
//!
//! | argument | default | meaning |
//! |---|---|---|
//! | `joints` | 6 | number of joints (1-32) |
//! | `target` | hold the current position | commanded joint positions, radians, comma-separated |
//! | `speed` | 0.5 | joint speed limit, radians per second |
//! | `rate` | 50 | physics steps per second (1-1000) |
//! | `fault` | empty | inject a fault: when set, the arm reports it on its first step and the robot goes to ERROR |

use std::collections::BTreeMap;

use rlark_proto::robot::v1::LaunchArg;

/// The built-in package every sim mode launches.
pub const PACKAGE: &str = "rlark_sim";
/// Its one launch file.
pub const LAUNCH_FILE: &str = "arm.launch";

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
}
