//! The `Reward:` part of `rlark describe task|job`: `status.reward` (the summary the server
//! folds from the task's `reward` reports; a Job's, its tasks' together) as one line, and a
//! Job's per-task summaries below it. The raw numbers stay in `-o yaml`.

use rlark_api::types::reward::significant;
use serde_json::Value;

/// Significant digits of the numbers shown.
const DIGITS: u32 = 6;

/// `last 0.8 · mean 0.5 · max 0.9 over 40 reports (step 39)`, or `None` without a summary.
pub(crate) fn line(reward: &Value) -> Option<String> {
    let count = reward["count"].as_u64().filter(|c| *c > 0)?;
    let number = |key: &str| reward[key].as_f64().map(|v| significant(v, DIGITS));
    let mut text = format!(
        "last {} · mean {} · max {} over {count} report{}",
        number("last")?,
        number("mean")?,
        number("max")?,
        if count == 1 { "" } else { "s" }
    );
    if let Some(step) = reward["step"].as_i64() {
        text.push_str(&format!(" (step {step})"));
    }
    Some(text)
}

/// The `Reward:` section of a Task or Job `object` (empty when it has no reward yet), and
/// `shown` (the object as the Status part prints it) without the summaries printed here.
pub(crate) fn section(object: &Value, shown: &mut Value, label_width: usize) -> String {
    let Some(total) = line(&object["status"]["reward"]) else {
        return String::new();
    };
    let mut out = format!("{:<label_width$}{total}\n", "Reward:");
    if let Some(tasks) = object["status"]["tasks"].as_array() {
        for task in tasks {
            if let (Some(name), Some(text)) = (task["name"].as_str(), line(&task["reward"])) {
                out.push_str(&format!(
                    "  {:<w$}{text}\n",
                    format!("{name}:"),
                    w = label_width - 2
                ));
            }
        }
    }
    if let Some(status) = shown["status"].as_object_mut() {
        status.remove("reward");
        if let Some(tasks) = status.get_mut("tasks").and_then(Value::as_array_mut) {
            for task in tasks {
                if let Some(task) = task.as_object_mut() {
                    task.remove("reward");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_reward_reads_as_one_line_per_run() {
        let summary = json!({"last": 0.30000000000000004, "mean": 0.123456789, "max": 2.0,
                             "count": 40, "step": 39, "summary": "0.3/0.1235"});
        assert_eq!(
            line(&summary).as_deref(),
            Some("last 0.3 · mean 0.123457 · max 2 over 40 reports (step 39)")
        );
        assert_eq!(line(&json!({"count": 0})), None);
        assert_eq!(line(&Value::Null), None);
        let job = json!({"status": {"phase": "Running", "reward": summary,
            "tasks": [{"name": "actor", "phase": "Running", "reward":
                          {"last": 1.0, "mean": 1.0, "max": 1.0, "count": 1}},
                      {"name": "env", "phase": "Running"}]}});
        let mut shown = job.clone();
        let text = section(&job, &mut shown, 15);
        assert_eq!(
            text,
            "Reward:        last 0.3 · mean 0.123457 · max 2 over 40 reports (step 39)\n  \
             actor:       last 1 · mean 1 · max 1 over 1 report\n"
        );
        assert_eq!(
            shown,
            json!({"status": {"phase": "Running",
                "tasks": [{"name": "actor", "phase": "Running"}, {"name": "env", "phase": "Running"}]}})
        );
        let mut untouched = json!({"status": {"phase": "Pending"}});
        assert_eq!(
            section(&json!({"status": {"phase": "Pending"}}), &mut untouched, 15),
            ""
        );
    }
}
