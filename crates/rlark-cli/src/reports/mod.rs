//! `rlark reports task/NAME|job/NAME [-n NS] [-f] [-o json]` and
//! `rlark reports --compare RUN RUN... [--type reward]`: the reports tasks posted (rewards,
//! metrics), read from `GET /rlark/v1/namespaces/{ns}/tasks/{name}/reports` (admins,
//! viewers, the agent owning the namespace).
//!
//! The table has the columns TIME, TYPE, STEP, VALUE (a float with six significant digits,
//! [`readable`]) and DETAILS (the report's other fields as compact JSON); for a Job, a TASK
//! column after TIME and the reports of all its Tasks (label `rlinf.io/job`) in time order.
//! `-o json` prints the server's list (a Job's: its Tasks' lists together; with `-f`: one
//! stored record per line). `-f` keeps printing new reports as they are stored, until
//! interrupted. `--compare` prints the runs' curves side by side ([`compare`]).
//!
//! Without `-n` a Task is looked up across namespaces (it lives in the agent namespace
//! `rlark-<clusterID>`); with `-n` the reports are read even when the Task is gone.

use std::io::Write as _;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use futures::{AsyncBufReadExt as _, StreamExt as _};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use rlark_api::labels;
use rlark_api::types::reward::significant;
use rlark_api::types::{Job, REWARD_REPORT_TYPE, Task};
use serde_json::{Map, Value, json};

use super::ClientArgs;
use super::client::Session;
use super::table::align;

mod compare;

#[derive(Debug, Args)]
pub(crate) struct ReportsArgs {
    /// What reported: `task/NAME` (or `NAME`) or `job/NAME` (all its tasks); with
    /// `--compare`, two or more of them.
    #[arg(required = true, value_name = "TASK|JOB")]
    pub targets: Vec<String>,
    /// Keep printing new reports as they are stored.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Print the runs' curves side by side: one row per step, one column per run (the
    /// value of `--type` reports), then each run's last, mean and max.
    #[arg(long)]
    pub compare: bool,
    /// With `--compare`: the report type whose `value` makes the curve.
    #[arg(long = "type", value_name = "TYPE", default_value = REWARD_REPORT_TYPE)]
    pub report_type: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputFormat>,
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Json,
}

const HEADER: [&str; 5] = ["TIME", "TYPE", "STEP", "VALUE", "DETAILS"];
/// Column widths of followed rows (they cannot be measured in advance).
const FOLLOW_WIDTHS: [usize; 4] = [27, 16, 8, 12];
/// Width of a followed Job's TASK column.
const FOLLOW_TASK_WIDTH: usize = 24;

/// What reported: one Task, or every Task of a Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Task(String),
    Job(String),
}

/// Parse `task/NAME`, `job/NAME` (or `NAME`, a task).
pub(crate) fn parse_target(target: &str) -> anyhow::Result<Target> {
    let (kind, name) = match target.split_once('/') {
        Some((kind, name)) => match kind.to_ascii_lowercase().as_str() {
            "task" | "tasks" | "task.rlinf.io" | "tasks.rlinf.io" => ("task", name),
            "job" | "jobs" | "job.rlinf.io" | "jobs.rlinf.io" | "rljob" => ("job", name),
            other => bail!(
                "reports are kept per task; use task/NAME or job/NAME (all its tasks), not \
                 {other}/..."
            ),
        },
        None => ("task", target),
    };
    if name.is_empty() || name.contains('/') {
        bail!("invalid target {target:?}: use task/NAME or job/NAME");
    }
    Ok(match kind {
        "job" => Target::Job(name.to_string()),
        _ => Target::Task(name.to_string()),
    })
}

/// The cells of one stored report record.
pub(crate) fn row(record: &Value) -> Vec<String> {
    let spec = &record["spec"];
    let report = spec["report"].as_object().cloned().unwrap_or_default();
    let cell = |key: &str| match report.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if n.is_f64() => n.as_f64().map(readable).unwrap_or_default(),
        Some(other) => other.to_string(),
    };
    let details: Map<String, Value> = report
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "type" | "step" | "value"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vec![
        spec["time"].as_str().unwrap_or_default().to_string(),
        cell("type"),
        cell("step"),
        cell("value"),
        if details.is_empty() {
            String::new()
        } else {
            Value::Object(details).to_string()
        },
    ]
}

/// [`row`] with the task's name after TIME (a Job's reports).
fn row_with_task(record: &Value) -> Vec<String> {
    let mut cells = row(record);
    let task = record["spec"]["task"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    cells.insert(1, task);
    cells
}

/// A reported number as a person reads it: six significant digits, trailing zeros dropped
/// (`0.30000000000000004` → `0.3`, `-1.2345678` → `-1.23457`, `2.0` → `2`); the stored
/// value keeps every digit (`-o json`).
pub(crate) fn readable(value: f64) -> String {
    significant(value, 6)
}

fn fixed_width(cells: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        line.push_str(cell);
        if let Some(width) = widths.get(i) {
            let pad = width.saturating_sub(cell.chars().count()).max(1);
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    line.trim_end().to_string()
}

/// The namespace of task `name`: `-n`, else the one namespace it exists in.
async fn task_namespace(
    client: &kube::Client,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(ns) = namespace {
        return Ok(ns.to_string());
    }
    let found = Api::<Task>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .context("list tasks")?;
    let mut namespaces: Vec<String> = found.items.iter().filter_map(|t| t.namespace()).collect();
    namespaces.sort();
    match namespaces.len() {
        0 => {
            bail!("task {name:?} not found in any namespace (list them with `rlark get tasks -A`)")
        }
        1 => Ok(namespaces.remove(0)),
        _ => bail!(
            "task name {name:?} is ambiguous: it exists in {}; pass -n",
            namespaces.join(", ")
        ),
    }
}

/// The (namespace, name) of every Task of Job `job` (in `namespace` when given), by name.
async fn job_tasks(
    client: &kube::Client,
    job: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    let params = ListParams::default().labels(&format!("{}={job}", labels::JOB));
    let found = match namespace {
        Some(ns) => {
            Api::<Task>::namespaced(client.clone(), ns)
                .list(&params)
                .await
        }
        None => Api::<Task>::all(client.clone()).list(&params).await,
    }
    .with_context(|| format!("list the tasks of job {job}"))?;
    let mut tasks: Vec<(String, String)> = found
        .items
        .iter()
        .map(|t| (t.namespace().unwrap_or_default(), t.name_any()))
        .collect();
    tasks.sort();
    if tasks.is_empty() {
        let exists = Api::<Job>::all(client.clone())
            .get_opt(job)
            .await
            .with_context(|| format!("get job {job}"))?
            .is_some();
        match exists {
            true => bail!(
                "job {job:?} has no tasks yet, so no reports (see why with `rlark describe \
                 job/{job}`)"
            ),
            false => bail!("job {job:?} not found (list them with `rlark get jobs`)"),
        }
    }
    Ok(tasks)
}

/// The Tasks `target` names, as (namespace, name).
pub(crate) async fn resolve(
    client: &kube::Client,
    target: &Target,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    match target {
        Target::Task(name) => Ok(vec![(
            task_namespace(client, name, namespace).await?,
            name.clone(),
        )]),
        Target::Job(job) => job_tasks(client, job, namespace).await,
    }
}

fn reports_path(namespace: &str, name: &str) -> String {
    format!("/rlark/v1/namespaces/{namespace}/tasks/{name}/reports")
}

/// The stored reports of each task, in sequence order.
pub(crate) async fn stored(
    client: &kube::Client,
    tasks: &[(String, String)],
) -> anyhow::Result<Vec<Vec<Value>>> {
    let mut all = Vec::with_capacity(tasks.len());
    for (namespace, name) in tasks {
        let request = http::Request::get(reports_path(namespace, name)).body(Vec::new())?;
        let list: Value = client
            .request(request)
            .await
            .with_context(|| format!("list the reports of task {namespace}/{name}"))?;
        all.push(list["items"].as_array().cloned().unwrap_or_default());
    }
    Ok(all)
}

pub(crate) async fn reports(args: ReportsArgs) -> anyhow::Result<()> {
    let targets = args
        .targets
        .iter()
        .map(|t| parse_target(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.compare {
        if targets.len() < 2 {
            bail!("--compare needs two or more runs, e.g. `rlark reports --compare job/a job/b`");
        }
        if args.follow {
            bail!("--compare prints what is stored and does not follow; drop -f");
        }
    } else if targets.len() > 1 {
        bail!(
            "{} targets given: reports prints one task or job; add --compare to put several \
             side by side",
            targets.len()
        );
    }
    let session = Session::connect(&args.client).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let client = session.client;
    let json = args.output == Some(OutputFormat::Json);
    if args.compare {
        let mut runs = Vec::with_capacity(targets.len());
        for (text, target) in args.targets.iter().zip(&targets) {
            let tasks = resolve(&client, target, namespace.as_deref()).await?;
            let records = stored(&client, &tasks).await?;
            runs.push(compare::Run::of(text, &records, &args.report_type));
        }
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&compare::to_json(&runs, &args.report_type))?
            );
        } else {
            print!("{}", compare::render(&runs, &args.report_type));
        }
        return Ok(());
    }
    let Some(target) = targets.first() else {
        bail!("name a task or job: `rlark reports task/NAME`");
    };
    let tasks = resolve(&client, target, namespace.as_deref()).await?;
    let is_job = matches!(target, Target::Job(_));
    let what = match target {
        Target::Task(name) => format!("task {}/{name}", tasks[0].0),
        Target::Job(job) => format!("job {job}"),
    };
    if !args.follow {
        let mut items: Vec<Value> = stored(&client, &tasks)
            .await?
            .into_iter()
            .flatten()
            .collect();
        if is_job {
            // RFC 3339 with milliseconds, all in UTC: text order is time order.
            items.sort_by(|a, b| {
                let time = |r: &Value| r["spec"]["time"].as_str().unwrap_or_default().to_string();
                time(a).cmp(&time(b))
            });
        }
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json!({"items": items}))?
            );
            return Ok(());
        }
        if items.is_empty() {
            eprintln!("No reports found for {what}.");
            return Ok(());
        }
        let mut header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
        if is_job {
            header.insert(1, "TASK".into());
        }
        let mut lines = vec![header];
        lines.extend(
            items
                .iter()
                .map(|r| if is_job { row_with_task(r) } else { row(r) }),
        );
        print!("{}", align(&lines));
        return Ok(());
    }
    follow(&client, &tasks, is_job, json).await
}

/// Print the stored reports of `tasks`, then new ones as they are stored, until every
/// stream ends.
async fn follow(
    client: &kube::Client,
    tasks: &[(String, String)],
    is_job: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut streams = Vec::with_capacity(tasks.len());
    for (namespace, name) in tasks {
        let request = http::Request::get(format!("{}?follow=true", reports_path(namespace, name)))
            .body(Vec::new())?;
        let stream = client
            .request_stream(request)
            .await
            .with_context(|| format!("follow the reports of task {namespace}/{name}"))?;
        streams.push(stream.lines().boxed());
    }
    let mut lines = futures::stream::select_all(streams);
    let mut widths = FOLLOW_WIDTHS.to_vec();
    let mut header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    if is_job {
        widths.insert(1, FOLLOW_TASK_WIDTH);
        header.insert(1, "TASK".into());
    }
    let mut stdout = std::io::stdout();
    if !json {
        writeln!(stdout, "{}", fixed_width(&header, &widths))?;
        stdout.flush()?;
    }
    while let Some(line) = lines.next().await {
        let line = line.context("read the report stream")?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if json {
            writeln!(stdout, "{text}")?;
        } else {
            let record: Value = serde_json::from_str(text).context("a report of the stream")?;
            let cells = if is_job {
                row_with_task(&record)
            } else {
                row(&record)
            };
            writeln!(stdout, "{}", fixed_width(&cells, &widths))?;
        }
        stdout.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_name_tasks_and_jobs() {
        assert_eq!(parse_target("task/a").unwrap(), Target::Task("a".into()));
        assert_eq!(parse_target("tasks/a").unwrap(), Target::Task("a".into()));
        assert_eq!(parse_target("a").unwrap(), Target::Task("a".into()));
        assert_eq!(parse_target("job/rl").unwrap(), Target::Job("rl".into()));
        assert_eq!(
            parse_target("jobs.rlinf.io/rl").unwrap(),
            Target::Job("rl".into())
        );
        let error = parse_target("pod/a").unwrap_err().to_string();
        assert!(error.contains("task/NAME or job/NAME"), "{error}");
        assert!(parse_target("task/").is_err());
        assert!(parse_target("job/a/b").is_err());
    }

    #[test]
    fn rows_show_the_common_fields_and_the_rest() {
        let record = json!({"spec": {"time": "2026-01-01T00:00:00.000Z", "task": "rl-main",
            "report": {"type": "reward", "value": 1.5, "step": 3, "episode": "e1", "ok": true}}});
        assert_eq!(
            row(&record),
            [
                "2026-01-01T00:00:00.000Z",
                "reward",
                "3",
                "1.5",
                r#"{"episode":"e1","ok":true}"#
            ]
        );
        assert_eq!(
            row_with_task(&record)[..3],
            ["2026-01-01T00:00:00.000Z", "rl-main", "reward"]
        );
        // Floats with six significant digits; integers as they are.
        let noisy = json!({"spec": {"time": "t", "report": {"type": "reward",
            "value": 0.30000000000000004, "step": 7}}});
        assert_eq!(row(&noisy)[2..4], ["7", "0.3"]);
        for (value, shown) in [
            (-1.2345678, "-1.23457"),
            (2.0, "2"),
            (12345.678, "12345.7"),
            (0.0001234567, "0.000123457"),
            (-0.0, "0"),
            (1.5e-7, "1.5e-7"),
            (6.02e23, "6.02e23"),
        ] {
            assert_eq!(readable(value), shown, "{value}");
        }
        let bare = json!({"spec": {"time": "t", "report": {"type": "start"}}});
        assert_eq!(row(&bare), ["t", "start", "", "", ""]);
    }

    #[test]
    fn followed_rows_keep_their_columns() {
        let cells: Vec<String> = ["t", "reward", "3", "1.5", ""].map(String::from).to_vec();
        assert_eq!(fixed_width(&cells, &[3, 8, 3, 4]), "t  reward  3  1.5");
    }
}
