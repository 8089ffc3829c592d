//! `rlark logs (pod/NAME | task/NAME | job/NAME) [-n NS] [-c CONTAINER] [-f] [--tail N]
//! [--previous]`:
//! the output of replicas, read by their agents through the server
//! (`GET /rlark/v1/namespaces/{ns}/pods/{pod}/log`, admins and viewers).
//!
//! - `pod/NAME` (or just `NAME`): one replica;
//! - `task/NAME`: every Pod of the Task (label `rlark.io/task-name=NAME`);
//! - `job/NAME`: every Pod of every Task of the Job (label `rlinf.io/job=NAME`, in any
//!   namespace).
//!
//! `-c NAME` (kubectl's flag) reads that container of a `docker` replica (a sidecar's
//! output); without it, the main (first) container. A name the replica does not have is
//! an error listing the names it has.
//!
//! Without `-n`, Pods and Tasks are looked up across namespaces (they live in the agent
//! namespaces `rlark-<clusterID>`). With more than one Pod, each line is prefixed with
//! `[pod-name] `; `-f` follows all of them at once, until every replica has exited. A Pod
//! whose log cannot be read (its agent is not connected, it never ran, ...) gets an error
//! line on stderr and the others go on; the exit code is then 1.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::Args;
use futures::{AsyncBufReadExt as _, AsyncReadExt as _};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use rlark_api::labels;
use rlark_api::types::{Job, Pod, Task};

use super::ClientArgs;
use super::client::{Reported, Session, format_status, status_of};

#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// What to read: `pod/NAME` (or `NAME`), `task/NAME`, or `job/NAME`; or the kind alone,
    /// followed by NAME.
    pub target: String,
    /// The name, when TARGET is only the kind (`rlark logs task NAME`).
    pub name: Option<String>,
    /// Keep streaming new output until the replicas exit.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only the last N lines of each Pod.
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// The previous run of the replica (an earlier Task of the same name).
    #[arg(long)]
    pub previous: bool,
    /// At most N bytes of each Pod.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit_bytes: Option<u64>,
    /// The container of a docker replica to read (default: the main, first one).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub container: Option<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

/// What the target names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Pod,
    Task,
    Job,
}

/// Parse `KIND/NAME` (or `NAME`, a Pod).
pub(crate) fn parse_target(target: &str) -> anyhow::Result<(Kind, String)> {
    let (kind, name) = match target.split_once('/') {
        Some((kind, name)) => {
            let kind = match kind.to_ascii_lowercase().as_str() {
                "pod" | "pods" | "po" | "pod.rlinf.io" | "pods.rlinf.io" => Kind::Pod,
                "task" | "tasks" | "task.rlinf.io" | "tasks.rlinf.io" => Kind::Task,
                "job" | "jobs" | "job.rlinf.io" | "jobs.rlinf.io" => Kind::Job,
                other => {
                    bail!("cannot read logs of {other:?}: use pod/NAME, task/NAME or job/NAME")
                }
            };
            (kind, name)
        }
        None => (Kind::Pod, target),
    };
    if name.is_empty() || name.contains('/') {
        bail!("invalid target {target:?}: use pod/NAME, task/NAME or job/NAME");
    }
    Ok((kind, name.to_string()))
}

/// One Pod to read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

pub(crate) async fn logs(args: LogsArgs) -> anyhow::Result<()> {
    let (kind, name) = parse_target(&super::names::join_target(
        &args.target,
        args.name.as_deref(),
    )?)?;
    let session = Session::connect(&args.client).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let client = session.client;
    let mut pods = match kind {
        Kind::Pod => vec![find_pod(&client, &name, namespace.as_deref()).await?],
        Kind::Task => {
            let task = find_task(&client, &name, namespace.as_deref()).await?;
            let pods = pods_of_task(&client, &task).await?;
            if pods.is_empty() {
                bail!(
                    "task {}/{name} has no pods yet (it is not running anywhere)",
                    task.namespace().unwrap_or_default()
                );
            }
            pods
        }
        Kind::Job => pods_of_job(&client, &name).await?,
    };
    pods.sort();
    pods.dedup();
    let query = query(&args);
    let prefix = pods.len() > 1;
    let out = Arc::new(std::sync::Mutex::new(()));
    let read = |pod: PodRef| {
        let client = client.clone();
        let query = query.clone();
        let out = out.clone();
        async move {
            let result = stream_pod(&client, &pod, &query, prefix, &out).await;
            if let Err(error) = &result {
                let message = match status_of(error) {
                    Some(status) => format_status(status),
                    None => format!("error: {}", super::client::error_chain(error)),
                };
                let _guard = out
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                eprintln!("pod {}/{}: {message}", pod.namespace, pod.name);
            }
            result.is_err()
        }
    };
    let failed = if args.follow {
        futures::future::join_all(pods.into_iter().map(read))
            .await
            .into_iter()
            .filter(|failed| *failed)
            .count()
    } else {
        let mut failed = 0;
        for pod in pods {
            if read(pod).await {
                failed += 1;
            }
        }
        failed
    };
    if failed > 0 {
        return Err(Reported { count: failed }.into());
    }
    Ok(())
}

/// The query string of the log route.
fn query(args: &LogsArgs) -> String {
    let mut parts = Vec::new();
    if let Some(tail) = args.tail {
        parts.push(format!("tail={tail}"));
    }
    if args.follow {
        parts.push("follow=true".to_string());
    }
    if args.previous {
        parts.push("previous=true".to_string());
    }
    if let Some(limit) = args.limit_bytes {
        parts.push(format!("limitBytes={limit}"));
    }
    if let Some(container) = &args.container {
        // A DNS label when valid; the server refuses anything else by name, so only
        // characters that would break the query are escaped here.
        parts.push(format!(
            "container={}",
            rlark_api::agent::local::percent_encode(container)
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// Copy the log of `pod` to stdout: as is, or line by line with `[pod] ` in front.
async fn stream_pod(
    client: &kube::Client,
    pod: &PodRef,
    query: &str,
    prefix: bool,
    out: &std::sync::Mutex<()>,
) -> anyhow::Result<()> {
    let path = format!(
        "/rlark/v1/namespaces/{}/pods/{}/log{query}",
        pod.namespace, pod.name
    );
    let request = http::Request::get(&path)
        .header(http::header::ACCEPT, "text/plain")
        .body(Vec::new())
        .context("build the request")?;
    let mut body = client
        .request_stream(request)
        .await
        .with_context(|| format!("GET {path}"))?;
    let write = |bytes: &[u8]| -> anyhow::Result<()> {
        let _guard = out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(bytes)?;
        stdout.flush()?;
        Ok(())
    };
    if !prefix {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = body.read(&mut buf).await.context("read the log")?;
            if n == 0 {
                return Ok(());
            }
            write(&buf[..n])?;
        }
    }
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = body
            .read_until(b'\n', &mut line)
            .await
            .context("read the log")?;
        if n == 0 {
            return Ok(());
        }
        let mut text = format!("[{}] ", pod.name).into_bytes();
        text.extend_from_slice(&line);
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        write(&text)?;
    }
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }
}

/// The Pod `name`: in `namespace`, else the only one of that name in any namespace.
pub(crate) async fn find_pod(
    client: &kube::Client,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<PodRef> {
    if let Some(ns) = namespace {
        let pod = Api::<Pod>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .with_context(|| format!("get pod {ns}/{name}"))?;
        return Ok(pod_ref(&pod));
    }
    let found = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .context("list pods")?;
    let mut pods: Vec<PodRef> = found.items.iter().map(pod_ref).collect();
    pods.sort();
    match pods.as_slice() {
        [] => bail!(
            "pod {name:?} not found in any namespace (list them with `rlark get pods.rlinf.io -A`)"
        ),
        [one] => Ok(one.clone()),
        many => bail!(
            "pod name {name:?} is ambiguous: it exists in {}; pass -n",
            many.iter()
                .map(|p| p.namespace.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The Task `name`: in `namespace`, else the only one of that name in any namespace.
pub(crate) async fn find_task(
    client: &kube::Client,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Task> {
    if let Some(ns) = namespace {
        return Api::<Task>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .with_context(|| format!("get task {ns}/{name}"));
    }
    let found = Api::<Task>::all(client.clone())
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .context("list tasks")?;
    let mut tasks = found.items;
    tasks.sort_by_key(|t| t.namespace());
    match tasks.len() {
        0 => {
            bail!("task {name:?} not found in any namespace (list them with `rlark get tasks -A`)")
        }
        1 => Ok(tasks.remove(0)),
        _ => bail!(
            "task name {name:?} is ambiguous: it exists in {}; pass -n",
            tasks
                .iter()
                .filter_map(|t| t.namespace())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The Pods of `task` (label `rlark.io/task-name`, in its namespace).
pub(crate) async fn pods_of_task(
    client: &kube::Client,
    task: &Task,
) -> anyhow::Result<Vec<PodRef>> {
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels(&format!("{}={name}", labels::TASK_NAME)))
        .await
        .with_context(|| format!("list the pods of task {namespace}/{name}"))?;
    Ok(pods.items.iter().map(pod_ref).collect())
}

/// The Pods of every Task of Job `name` (label `rlinf.io/job`, any namespace).
async fn pods_of_job(client: &kube::Client, name: &str) -> anyhow::Result<Vec<PodRef>> {
    let tasks = Api::<Task>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={name}", labels::JOB)))
        .await
        .with_context(|| format!("list the tasks of job {name}"))?;
    if tasks.items.is_empty() {
        Api::<Job>::all(client.clone())
            .get(name)
            .await
            .with_context(|| format!("get job {name}"))?;
        bail!("job {name} has no tasks yet");
    }
    let mut pods = Vec::new();
    for task in &tasks.items {
        pods.extend(pods_of_task(client, task).await?);
    }
    if pods.is_empty() {
        bail!("the tasks of job {name} have no pods yet (they are not running anywhere)");
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            parse_target("pod/a-0").unwrap(),
            (Kind::Pod, "a-0".to_string())
        );
        assert_eq!(parse_target("a-0").unwrap(), (Kind::Pod, "a-0".to_string()));
        assert_eq!(
            parse_target("task/a").unwrap(),
            (Kind::Task, "a".to_string())
        );
        assert_eq!(
            parse_target("jobs/ppo").unwrap(),
            (Kind::Job, "ppo".to_string())
        );
        for bad in ["node/x", "pod/", "pod/a/b", ""] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
