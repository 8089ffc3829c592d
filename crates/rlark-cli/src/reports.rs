//! `rlark reports task/NAME [-n NS] [-f] [-o json]`: the reports a task posted (rewards,
//! metrics), read from `GET /rlark/v1/namespaces/{ns}/tasks/{name}/reports` (admins,
//! viewers, the agent owning the namespace).
//!
//! The table has the columns TIME, TYPE, STEP, VALUE (a float with six significant digits,
//! [`readable`]) and DETAILS (the report's other fields as compact JSON). `-o json` prints the server's list (with `-f`: one stored record per
//! line). `-f` keeps printing new reports as they are stored, until interrupted.
//!
//! Without `-n` the Task is looked up across namespaces (it lives in the agent namespace
//! `rlark-<clusterID>`); with `-n` the reports are read even when the Task is gone.

use std::io::Write as _;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use futures::AsyncBufReadExt as _;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use rlark_api::types::Task;
use serde_json::{Map, Value};

use super::ClientArgs;
use super::client::Session;
use super::table::align;

#[derive(Debug, Args)]
pub(crate) struct ReportsArgs {
    /// The task: `task/NAME` (or `NAME`).
    pub target: String,
    /// Keep printing new reports as they are stored.
    #[arg(short = 'f', long)]
    pub follow: bool,
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

/// Parse `task/NAME` (or `NAME`).
pub(crate) fn parse_target(target: &str) -> anyhow::Result<String> {
    let name = match target.split_once('/') {
        Some((kind, name)) => match kind.to_ascii_lowercase().as_str() {
            "task" | "tasks" | "task.rlinf.io" | "tasks.rlinf.io" => name,
            other => bail!("reports are kept per task; use task/NAME, not {other}/..."),
        },
        None => target,
    };
    if name.is_empty() || name.contains('/') {
        bail!("invalid target {target:?}: use task/NAME");
    }
    Ok(name.to_string())
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

/// A reported number as a person reads it: six significant digits, trailing zeros dropped
/// (`0.30000000000000004` → `0.3`, `-1.2345678` → `-1.23457`, `2.0` → `2`); the stored
/// value keeps every digit (`-o json`).
pub(crate) fn readable(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    if value == 0.0 {
        return "0".into();
    }
    let magnitude = value.abs().log10().floor() as i32;
    if !(-6..15).contains(&magnitude) {
        let text = format!("{value:.5e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    let decimals = usize::try_from((5 - magnitude).max(0)).unwrap_or(0);
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn fixed_width(cells: &[String]) -> String {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        line.push_str(cell);
        if let Some(width) = FOLLOW_WIDTHS.get(i) {
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

pub(crate) async fn reports(args: ReportsArgs) -> anyhow::Result<()> {
    let name = parse_target(&args.target)?;
    let session = Session::connect(&args.client).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let client = session.client;
    let namespace = task_namespace(&client, &name, namespace.as_deref()).await?;
    let path = format!("/rlark/v1/namespaces/{namespace}/tasks/{name}/reports");
    let json = args.output == Some(OutputFormat::Json);
    if !args.follow {
        let request = http::Request::get(&path).body(Vec::new())?;
        let list: Value = client
            .request(request)
            .await
            .with_context(|| format!("list the reports of task {namespace}/{name}"))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(());
        }
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if items.is_empty() {
            eprintln!("No reports found for task {namespace}/{name}.");
            return Ok(());
        }
        let mut lines = vec![HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
        lines.extend(items.iter().map(row));
        print!("{}", align(&lines));
        return Ok(());
    }
    let request = http::Request::get(format!("{path}?follow=true")).body(Vec::new())?;
    let mut stream = client
        .request_stream(request)
        .await
        .with_context(|| format!("follow the reports of task {namespace}/{name}"))?;
    let mut stdout = std::io::stdout();
    if !json {
        let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
        writeln!(stdout, "{}", fixed_width(&header))?;
        stdout.flush()?;
    }
    let mut line = String::new();
    loop {
        line.clear();
        let read = stream
            .read_line(&mut line)
            .await
            .context("read the report stream")?;
        if read == 0 {
            return Ok(());
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if json {
            writeln!(stdout, "{text}")?;
        } else {
            let record: Value = serde_json::from_str(text).context("an report of the stream")?;
            writeln!(stdout, "{}", fixed_width(&row(&record)))?;
        }
        stdout.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn targets_name_tasks() {
        assert_eq!(parse_target("task/a").unwrap(), "a");
        assert_eq!(parse_target("tasks/a").unwrap(), "a");
        assert_eq!(parse_target("a").unwrap(), "a");
        assert!(parse_target("pod/a").is_err());
        assert!(parse_target("task/").is_err());
    }

    #[test]
    fn rows_show_the_common_fields_and_the_rest() {
        let record = json!({"spec": {"time": "2026-01-01T00:00:00.000Z", "report": {
            "type": "reward", "value": 1.5, "step": 3, "episode": "e1", "ok": true}}});
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
}
