//! The reward summary a Task and a Job carry in their status (`status.reward`): what an RL
//! user watches, folded from the Task's `reward` reports by the server as each is stored
//! (`rlark-server`'s reports), and combined over a Job's Tasks by the Job controller.
//! `get -o wide` shows it as the REWARD column (`summary`: `last/mean`), `describe` in full.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The report type whose `value` is a reward.
pub const REWARD_REPORT_TYPE: &str = "reward";

/// Digits of the numbers in [`RewardSummary::summary`] (a table cell, not the record).
const SUMMARY_DIGITS: u32 = 4;

/// Last, mean and best of the rewards a Task reported in this run (its uid; a restart keeps
/// them), or of a Job's Tasks together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RewardSummary {
    /// The newest reward (a Job: the mean of its Tasks' newest rewards).
    pub last: f64,
    /// Mean of every reward reported (a Job: over all its Tasks' reports).
    pub mean: f64,
    /// Largest reward reported.
    pub max: f64,
    /// Rewards reported.
    pub count: u64,
    /// `step` of the newest reward, when it had one (a Job: the largest of its Tasks').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i64>,
    /// `last/mean` with four significant digits: the REWARD column of `get -o wide`.
    #[serde(default)]
    pub summary: String,
}

impl RewardSummary {
    /// The summary after one more reward `value` (at `step`) on top of `previous`.
    pub fn fold(previous: Option<&RewardSummary>, value: f64, step: Option<i64>) -> Self {
        let mut next = match previous {
            Some(p) if p.count > 0 => {
                let count = p.count.saturating_add(1);
                // An incremental mean: exact enough for counts far beyond the 1,000 reports
                // a task keeps, and it never needs the old reports.
                let mean = p.mean + (value - p.mean) / count as f64;
                RewardSummary {
                    last: value,
                    mean,
                    max: p.max.max(value),
                    count,
                    step,
                    summary: String::new(),
                }
            }
            _ => RewardSummary {
                last: value,
                mean: value,
                max: value,
                count: 1,
                step,
                summary: String::new(),
            },
        };
        next.summary = next.format_summary();
        next
    }

    /// The summary of several Tasks' summaries together (`None` when none reported).
    pub fn combine<'a>(parts: impl IntoIterator<Item = &'a RewardSummary>) -> Option<Self> {
        let parts: Vec<&RewardSummary> = parts.into_iter().filter(|p| p.count > 0).collect();
        let (first, rest) = parts.split_first()?;
        if rest.is_empty() {
            let mut only = (*first).clone();
            only.summary = only.format_summary();
            return Some(only);
        }
        let count: u64 = parts.iter().map(|p| p.count).sum();
        let weighted: f64 = parts.iter().map(|p| p.mean * p.count as f64).sum();
        let mut combined = RewardSummary {
            last: parts.iter().map(|p| p.last).sum::<f64>() / parts.len() as f64,
            mean: weighted / count as f64,
            max: parts
                .iter()
                .map(|p| p.max)
                .fold(f64::NEG_INFINITY, f64::max),
            count,
            step: parts.iter().filter_map(|p| p.step).max(),
            summary: String::new(),
        };
        combined.summary = combined.format_summary();
        Some(combined)
    }

    fn format_summary(&self) -> String {
        format!(
            "{}/{}",
            significant(self.last, SUMMARY_DIGITS),
            significant(self.mean, SUMMARY_DIGITS)
        )
    }
}

/// `value` as a person reads it: `digits` significant digits, trailing zeros dropped
/// (`0.30000000000000004` → `0.3`, `-1.2345678` → `-1.23457` with 6, `2.0` → `2`);
/// exponent notation for magnitudes below 1e-6 or from 1e15.
pub fn significant(value: f64, digits: u32) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    if value == 0.0 {
        return "0".into();
    }
    let digits = digits.clamp(1, 17);
    let magnitude = value.abs().log10().floor() as i32;
    if !(-6..15).contains(&magnitude) {
        let text = format!("{value:.*e}", (digits - 1) as usize);
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = match mantissa.contains('.') {
            true => mantissa.trim_end_matches('0').trim_end_matches('.'),
            false => mantissa,
        };
        return format!("{mantissa}e{exponent}");
    }
    let decimals = usize::try_from((digits as i32 - 1 - magnitude).max(0)).unwrap_or(0);
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_with_the_digits_asked_for() {
        assert_eq!(significant(0.1 + 0.2, 6), "0.3");
        assert_eq!(significant(-1.2345678, 6), "-1.23457");
        assert_eq!(significant(2.0, 6), "2");
        assert_eq!(significant(123456.789, 4), "123457");
        assert_eq!(significant(0.000123456, 4), "0.0001235");
        assert_eq!(significant(1.5e-9, 4), "1.5e-9");
        assert_eq!(significant(2.5e20, 4), "2.5e20");
        assert_eq!(significant(0.0, 4), "0");
        assert_eq!(significant(f64::NAN, 4), "NaN");
    }

    #[test]
    fn a_fold_keeps_last_mean_max_and_count() {
        let one = RewardSummary::fold(None, 1.0, Some(1));
        assert_eq!((one.last, one.mean, one.max, one.count), (1.0, 1.0, 1.0, 1));
        assert_eq!(one.summary, "1/1");
        let two = RewardSummary::fold(Some(&one), 4.0, Some(2));
        let three = RewardSummary::fold(Some(&two), -2.0, None);
        assert_eq!(three.last, -2.0);
        assert!((three.mean - 1.0).abs() < 1e-12, "{three:?}");
        assert_eq!(three.max, 4.0);
        assert_eq!(three.count, 3);
        assert_eq!(three.step, None);
        assert_eq!(three.summary, "-2/1");
        let mean = RewardSummary::fold(Some(&three), 1.0 / 3.0, Some(4));
        assert_eq!(mean.summary, "0.3333/0.8333");
    }

    #[test]
    fn tasks_combine_into_a_job() {
        assert_eq!(RewardSummary::combine([]), None);
        let a = RewardSummary::fold(Some(&RewardSummary::fold(None, 1.0, Some(1))), 3.0, Some(2));
        let b = RewardSummary::fold(None, 5.0, Some(7));
        let only = RewardSummary::combine([&a]).expect("one");
        assert_eq!(only, a);
        let both = RewardSummary::combine([&a, &b, &RewardSummary::default()]).expect("both");
        assert_eq!(both.last, 4.0);
        assert_eq!(both.mean, 3.0);
        assert_eq!(both.max, 5.0);
        assert_eq!(both.count, 3);
        assert_eq!(both.step, Some(7));
        assert_eq!(both.summary, "4/3");
    }
}
