//! `rlark reports --compare RUN RUN...`: runs' curves side by side, as one compares runs in
//! TensorBoard or W&B, in a terminal.
//!
//! A run is a task or a job. Its curve is the `value` of its reports of one type (`reward`
//! unless `--type`), by step: a report's integer `step`, else its position among the
//! task's reports of that type (1, 2, ...). Two reports of one task at the same step: the
//! later counts. A Job with several reporting tasks: the mean of its tasks' values at each
//! step. The table has a row per step any run reported (`-` where a run has none), then
//! each run's last, mean and max value and how many steps it reported.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::readable;
use crate::table::align;

/// One run's curve.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Run {
    /// The run as the user named it (`job/a`).
    pub name: String,
    /// Value by step.
    pub points: BTreeMap<i64, f64>,
}

impl Run {
    /// The curve of `report_type` in `records` (each task's stored reports, in sequence
    /// order).
    pub(crate) fn of(name: &str, records: &[Vec<Value>], report_type: &str) -> Self {
        let mut sums: BTreeMap<i64, (f64, u32)> = BTreeMap::new();
        for task in records {
            let mut by_step: BTreeMap<i64, f64> = BTreeMap::new();
            let mut position = 0i64;
            for record in task {
                let report = &record["spec"]["report"];
                if report["type"].as_str() != Some(report_type) {
                    continue;
                }
                let Some(value) = report["value"].as_f64().filter(|v| v.is_finite()) else {
                    continue;
                };
                position += 1;
                let step = report["step"]
                    .as_i64()
                    .or_else(|| {
                        report["step"]
                            .as_f64()
                            .filter(|s| s.fract() == 0.0)
                            .map(|s| s as i64)
                    })
                    .unwrap_or(position);
                by_step.insert(step, value);
            }
            for (step, value) in by_step {
                let entry = sums.entry(step).or_insert((0.0, 0));
                entry.0 += value;
                entry.1 += 1;
            }
        }
        Run {
            name: name.to_string(),
            points: sums
                .into_iter()
                .map(|(step, (sum, n))| (step, sum / f64::from(n)))
                .collect(),
        }
    }

    /// (last, mean, max) of the curve, `None` when it is empty.
    fn summary(&self) -> Option<(f64, f64, f64)> {
        let (_, last) = self.points.last_key_value()?;
        let values: Vec<f64> = self.points.values().copied().collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((*last, mean, max))
    }
}

/// The side-by-side table and the summary below it.
pub(crate) fn render(runs: &[Run], report_type: &str) -> String {
    let mut steps: Vec<i64> = runs.iter().flat_map(|r| r.points.keys().copied()).collect();
    steps.sort_unstable();
    steps.dedup();
    if steps.is_empty() {
        return format!("No {report_type} reports in any of the runs.\n");
    }
    let mut lines = vec![
        std::iter::once("STEP".to_string())
            .chain(runs.iter().map(|r| r.name.clone()))
            .collect::<Vec<_>>(),
    ];
    for step in &steps {
        let mut line = vec![step.to_string()];
        line.extend(runs.iter().map(|r| match r.points.get(step) {
            Some(value) => readable(*value),
            None => "-".into(),
        }));
        lines.push(line);
    }
    let mut out = align(&lines);
    out.push('\n');
    let mut summary = vec![
        ["RUN", "LAST", "MEAN", "MAX", "STEPS"]
            .map(String::from)
            .to_vec(),
    ];
    for run in runs {
        summary.push(match run.summary() {
            Some((last, mean, max)) => vec![
                run.name.clone(),
                readable(last),
                readable(mean),
                readable(max),
                run.points.len().to_string(),
            ],
            None => vec![
                run.name.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("0 (no {report_type} reports)"),
            ],
        });
    }
    out.push_str(&align(&summary));
    out
}

/// `-o json`: `{"type": ..., "runs": [{"name", "points": [{"step", "value"}]}]}`.
pub(crate) fn to_json(runs: &[Run], report_type: &str) -> Value {
    json!({
        "type": report_type,
        "runs": runs.iter().map(|r| json!({
            "name": r.name,
            "points": r.points.iter().map(|(s, v)| json!({"step": s, "value": v})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(report: Value) -> Value {
        json!({"spec": {"report": report}})
    }

    #[test]
    fn curves_align_by_step_and_jobs_average_their_tasks() {
        let a = Run::of(
            "job/a",
            &[vec![
                record(json!({"type": "reward", "step": 1, "value": 0.1})),
                record(json!({"type": "metrics", "step": 1, "loss": 3})),
                record(json!({"type": "reward", "step": 2, "value": 0.5})),
                // The later report of a step counts.
                record(json!({"type": "reward", "step": 2, "value": 0.30000000000000004})),
            ]],
            "reward",
        );
        // Two tasks: the mean at each step; reports without a step count by position.
        let b = Run::of(
            "job/b",
            &[
                vec![
                    record(json!({"type": "reward", "value": 1.0})),
                    record(json!({"type": "reward", "value": 2.0})),
                    record(json!({"type": "reward", "value": 4.0})),
                ],
                vec![record(json!({"type": "reward", "step": 1, "value": 3.0}))],
            ],
            "reward",
        );
        assert_eq!(b.points, BTreeMap::from([(1, 2.0), (2, 2.0), (3, 4.0)]));
        let none = Run::of("task/c", &[vec![]], "reward");
        let text = render(&[a.clone(), b.clone(), none.clone()], "reward");
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0], ["STEP", "job/a", "job/b", "task/c"]);
        assert_eq!(rows[1], ["1", "0.1", "2", "-"]);
        assert_eq!(rows[2], ["2", "0.3", "2", "-"]);
        assert_eq!(rows[3], ["3", "-", "4", "-"]);
        assert_eq!(rows[4], Vec::<&str>::new());
        assert_eq!(rows[5], ["RUN", "LAST", "MEAN", "MAX", "STEPS"]);
        assert_eq!(rows[6], ["job/a", "0.3", "0.2", "0.3", "2"]);
        assert_eq!(rows[7], ["job/b", "4", "2.66667", "4", "3"]);
        assert_eq!(
            rows[8],
            ["task/c", "-", "-", "-", "0", "(no", "reward", "reports)"]
        );
        assert_eq!(
            render(&[none], "reward"),
            "No reward reports in any of the runs.\n"
        );
        let json = to_json(&[a, b], "reward");
        assert_eq!(
            json["runs"][1]["points"][2],
            json!({"step": 3, "value": 4.0})
        );
    }

    #[test]
    fn another_type_makes_another_curve() {
        let run = Run::of(
            "task/t",
            &[vec![
                record(json!({"type": "reward", "step": 1, "value": 1.0})),
                record(json!({"type": "success", "step": 1, "value": 0.5})),
            ]],
            "success",
        );
        assert_eq!(run.points, BTreeMap::from([(1, 0.5)]));
    }
}
