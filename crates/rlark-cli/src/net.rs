//! `rlark net check SOURCE DESTINATION`: open a test connection from a replica of a Domain
//! task to another member and print the path taken (`local`, `direct` or `relay`) and its
//! setup latency, through the server
//! (`POST /rlark/v1/namespaces/{ns}/tasks/{name}/netcheck`, admins only; docs/tunnel.md,
//! "Net check").
//!
//! - SOURCE is `task/NAME` or `NAME` (a Task); `--replica N` picks the replica (default 0).
//!   Without `-n` the Task is looked up across namespaces, as `rlark exec` does.
//! - DESTINATION is a virtual IP, or `task/NAME` / `NAME` (its replica `--to-replica`,
//!   default 0; its namespace `--to-namespace`, else looked up across namespaces), resolved
//!   by the server to its address in a Domain the source replica is in.
//! - `--port P` connects to that port; without it the destination member is probed
//!   (authorized and checked, no payload).
//! - Exit code 0 when the connection was set up; 1 with the reason otherwise.

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use kube::ResourceExt as _;
use serde_json::{Value, json};

use super::ClientArgs;
use super::client::Session;
use super::logs::{Kind, find_task, parse_target};

#[derive(Debug, Subcommand)]
pub(crate) enum NetCommand {
    /// Open a test connection from a replica of a Domain task to another member and print
    /// the path taken (local, direct or relay) and its setup latency.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The source: `task/NAME` or `NAME` (a Task).
    pub source: String,
    /// The destination: a virtual IP, or `task/NAME` / `NAME`.
    pub destination: String,
    /// The source replica.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub replica: u32,
    /// Namespace of the destination Task. Default: looked up across namespaces.
    #[arg(long, value_name = "NS")]
    pub to_namespace: Option<String>,
    /// The destination replica (with a task destination).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub to_replica: u32,
    /// Destination port; without it the destination member is only probed.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    #[arg(skip)]
    pub client: ClientArgs,
}

pub(crate) async fn net(command: NetCommand, client: ClientArgs) -> anyhow::Result<()> {
    match command {
        NetCommand::Check(mut args) => {
            args.client = client;
            let line = check(args).await?;
            println!("{line}");
            Ok(())
        }
    }
}

/// A task target: `task/NAME` or `NAME`.
fn task_name(target: &str, what: &str) -> anyhow::Result<String> {
    let (kind, name) = parse_target(target)?;
    // `parse_target` reads a bare NAME as a Pod; here a bare NAME is a Task.
    let bare = !target.contains('/');
    if kind != Kind::Task && !bare {
        bail!("{what} {target:?}: use task/NAME or NAME (a Task)");
    }
    Ok(name)
}

/// Runs the check; the line to print.
pub(crate) async fn check(args: CheckArgs) -> anyhow::Result<String> {
    let source = task_name(&args.source, "source")?;
    let destination: Option<std::net::IpAddr> = args.destination.parse().ok();
    if destination.is_some() && (args.to_namespace.is_some() || args.to_replica != 0) {
        bail!("--to-namespace and --to-replica apply to a task destination, not to an IP");
    }
    let session = Session::connect(&args.client).await?;
    let namespace = match session.namespace_explicit {
        true => session.namespace.clone(),
        false => find_task(&session.client, &source, None)
            .await?
            .namespace()
            .unwrap_or_default(),
    };
    let (to, to_label) = match destination {
        Some(ip) => (json!(ip.to_string()), ip.to_string()),
        None => {
            let task = task_name(&args.destination, "destination")?;
            let to_namespace = match &args.to_namespace {
                Some(ns) => ns.clone(),
                None => find_task(&session.client, &task, None)
                    .await?
                    .namespace()
                    .unwrap_or_default(),
            };
            let label = format!("{to_namespace}/{task}-{}", args.to_replica);
            (
                json!({"task": task, "namespace": to_namespace, "replica": args.to_replica}),
                label,
            )
        }
    };
    let mut body = json!({"replica": args.replica, "to": to});
    if let Some(port) = args.port {
        body["port"] = json!(port);
    }
    let path = format!("/rlark/v1/namespaces/{namespace}/tasks/{source}/netcheck");
    let request = http::Request::post(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(body.to_string().into_bytes())
        .context("build request")?;
    let from = format!("{namespace}/{source}-{}", args.replica);
    let answer: Value = session
        .client
        .request(request)
        .await
        .map_err(|error| match error {
            kube::Error::Api(status) => anyhow::anyhow!("{}", status.message),
            other => anyhow::Error::new(other),
        })
        .with_context(|| format!("net check from {from} to {to_label}"))?;
    format_answer(&from, &to_label, &answer)
}

/// `rlark-a/j-w-0 -> rlark-b/j-h-0 (10.8.0.3:8080): path relay, setup 1.52 ms`.
pub(crate) fn format_answer(from: &str, to: &str, answer: &Value) -> anyhow::Result<String> {
    let path = answer["path"]
        .as_str()
        .with_context(|| format!("the server's answer has no path: {answer}"))?;
    let micros = answer["setupMicros"]
        .as_u64()
        .with_context(|| format!("the server's answer has no setupMicros: {answer}"))?;
    let ip = answer["to"]["ip"].as_str().unwrap_or("?");
    let address = match (answer["to"]["port"].as_u64(), ip.contains(':')) {
        (Some(port), true) => format!("[{ip}]:{port}"),
        (Some(port), false) => format!("{ip}:{port}"),
        (None, _) => format!("{ip}, probe"),
    };
    let to = if to == ip {
        address
    } else {
        format!("{to} ({address})")
    };
    // Display: milliseconds with microsecond precision.
    let millis = micros as f64 / 1000.0;
    Ok(format!("{from} -> {to}: path {path}, setup {millis:.3} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_formatted() {
        let answer = json!({"path": "relay", "setupMicros": 1520,
                            "to": {"ip": "10.8.0.3", "port": 8080}});
        assert_eq!(
            format_answer("rlark-a/j-w-0", "rlark-b/j-h-0", &answer).unwrap(),
            "rlark-a/j-w-0 -> rlark-b/j-h-0 (10.8.0.3:8080): path relay, setup 1.520 ms"
        );
        let answer = json!({"path": "direct", "setupMicros": 250,
                            "to": {"ip": "fd00::3", "port": null}});
        assert_eq!(
            format_answer("rlark-a/j-w-0", "fd00::3", &answer).unwrap(),
            "rlark-a/j-w-0 -> fd00::3, probe: path direct, setup 0.250 ms"
        );
        assert!(format_answer("a", "b", &json!({"setupMicros": 1})).is_err());
    }

    #[test]
    fn targets() {
        assert_eq!(task_name("task/j-w", "source").unwrap(), "j-w");
        assert_eq!(task_name("j-w", "source").unwrap(), "j-w");
        assert!(task_name("pod/j-w-0", "source").is_err());
        assert!(task_name("job/j", "source").is_err());
    }
}
