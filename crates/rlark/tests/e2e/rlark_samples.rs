//! Manifests in the shape of RLark's samples and examples (`tests/fixtures/rlark-shaped`,
//! written for rlark: its README says which RLark file each mirrors) applied with the real kubectl to
//! `rlark up` (the built binary: the server and one raw agent, cluster `cloud`), as a new
//! user would. Every file is accepted, and every object it makes ends either doing its job
//! or with a condition (and where it is a Node, an Event) telling the user what to do:
//!
//! - the Job sample: `Unschedulable`, naming each of its three tasks with a remedy (no
//!   Kubernetes agent: how to join one; `rlinf.io/node=lab-node-c`: no Node has it);
//! - the Node sample: three Nodes in `default`, which no agent can be: `Offline`, reason
//!   `NotAnAgentNode`, a Warning Event each, never placed on;
//! - the Task sample: three Tasks in `default`: condition `NotInAgentNamespace`;
//! - the Workflow sample (a `CloneSet` task): accepted; its first Job `Unschedulable`
//!   with the remedy, the second waiting on it;
//! - `domain.yaml` (namespace `rlark-system` on a cluster-scoped kind): the Domain, with
//!   its capacity;
//! - `ping.yaml` (`role: Head`, a Domain): `Unschedulable`, naming both
//!   tasks and the clusters no agent joined as.
//!
//! Every wait is bounded; nothing asserts a duration.

use crate::missing_tool;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(90);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/rlark-shaped")
}

/// A running `rlark up` on a data directory of its own, driven with kubectl.
struct Up {
    up: crate::up::Up,
    data_dir: tempfile::TempDir,
}

impl Up {
    fn start() -> Result<Up> {
        let data_dir = tempfile::tempdir()?;
        let up = crate::up::Up::start(data_dir.path(), &[]);
        Ok(Up { up, data_dir })
    }

    fn kubeconfig(&self) -> PathBuf {
        self.up.kubeconfig()
    }

    /// `kubectl ARGS` against this rlark; (success, stdout, stderr).
    fn kubectl(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.data_dir.path().join("kubectl-cache"))
            .args(args)
            .output()
            .context("run kubectl")?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// `kubectl get ARGS -o json`, parsed; `None` when kubectl fails (not found yet).
    fn get(&self, args: &[&str]) -> Result<Option<Value>> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let (ok, stdout, _) = self.kubectl(&all)?;
        if !ok {
            return Ok(None);
        }
        Ok(Some(
            serde_json::from_str(&stdout).context("kubectl -o json")?,
        ))
    }

    /// The message of condition `type_` of `kind/name` (in `namespace`), once it is `True`.
    fn wait_condition(
        &self,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
        type_: &str,
    ) -> Result<String> {
        let mut args = vec!["get", kind, name];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        wait_for(&format!("{kind}/{name} condition {type_}"), || {
            let Some(object) = self.get(&args)? else {
                return Ok(None);
            };
            Ok(object["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_ && c["status"] == "True")
                .and_then(|c| c["message"].as_str())
                .map(str::to_string))
        })
    }
}

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + WAIT;
    let mut last_error = None;
    loop {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(format!("{error:#}")),
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what} (last error: {last_error:?})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn contains_all(text: &str, needles: &[&str]) -> Result<()> {
    for needle in needles {
        ensure!(text.contains(needle), "{needle:?} is not in:\n{text}");
    }
    Ok(())
}

#[test]
fn rlark_shaped_manifests_apply_unchanged_and_each_object_says_what_to_do() -> Result<()> {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        missing_tool::skip_or_fail("kubectl is not installed");
        return Ok(());
    }
    let up = Up::start()?;
    // The Domain first: the ping example's Job names it.
    for file in [
        "domain.yaml",
        "nodes.yaml",
        "tasks.yaml",
        "job.yaml",
        "workflow.yaml",
        "ping.yaml",
    ] {
        let path = fixtures().join(file);
        let path = path.to_str().context("fixture path")?;
        let (ok, stdout, stderr) = up.kubectl(&["apply", "-f", path])?;
        ensure!(ok, "kubectl apply -f {file} was refused:\n{stdout}{stderr}");
        println!("kubectl apply -f {file}:\n{stdout}{stderr}");
    }

    // The Job sample: every task named, with what would place it.
    let job = up.wait_condition("rljob", "grasp-train", None, "Unschedulable")?;
    contains_all(
        &job,
        &[
            "task \"learner\"",
            "task \"samplers\"",
            "task \"scene\"",
            "no agent runs Kubernetes tasks: join one with `rlark agent --agent-type Kubernetes",
            "no Node has rlinf.io/node=lab-node-c",
            // The sample's hand-made Node of that name does not count.
            "no Node has kubernetes.io/hostname=lab-node-a: no agent reports a Node named \"lab-node-a\"",
        ],
    )?;

    // The Node sample: flagged, with an Event, never placed on (the Job above excludes
    // them by identity, not by a heartbeat they never send).
    for node in ["lab-node-a", "lab-node-b", "lab-node-c"] {
        let status = wait_for(&format!("node {node} flagged"), || {
            let Some(object) = up.get(&["get", "rlnode", node, "-n", "default"])? else {
                return Ok(None);
            };
            Ok((object["status"]["reason"] == "NotAnAgentNode").then(|| object["status"].clone()))
        })?;
        ensure!(status["phase"] == "Offline", "{status}");
        let event = wait_for(&format!("an Event about node {node}"), || {
            let Some(list) = up.get(&[
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                &format!("involvedObject.name={node},reason=NotAnAgentNode"),
            ])?
            else {
                return Ok(None);
            };
            Ok(list["items"]
                .as_array()
                .and_then(|items| items.first())
                .and_then(|e| e["message"].as_str())
                .map(str::to_string))
        })?;
        contains_all(&event, &["is no agent's", "rlark agent --cluster-id"])?;
    }

    // The Task sample: each says it is outside the agent namespaces.
    for task in ["sampler-k8s", "policy-docker", "scene-raw"] {
        let message = up.wait_condition("rltask", task, Some("default"), "NotInAgentNamespace")?;
        contains_all(
            &message,
            &[
                "\"default\" is not an agent namespace",
                "Create a Job instead",
            ],
        )?;
    }

    // The Workflow sample (a CloneSet task): its first Job cannot be placed and says why;
    // the CloneSet task is refused by nothing but the missing agent.
    let first = wait_for("the Workflow's first Job", || {
        let Some(list) = up.get(&["get", "rljob", "-l", "rlinf.io/workflow=grasp-curriculum"])?
        else {
            return Ok(None);
        };
        Ok(list["items"]
            .as_array()
            .and_then(|items| items.first())
            .and_then(|j| j["metadata"]["name"].as_str())
            .map(str::to_string))
    })?;
    let message = up.wait_condition("rljob", &first, None, "Unschedulable")?;
    contains_all(
        &message,
        &[
            "task \"learner\"",
            "no agent runs Kubernetes tasks: join one with",
        ],
    )?;

    // domain.yaml: the Domain exists, cluster-scoped.
    let domain = wait_for("the Domain's status", || {
        Ok(up
            .get(&["get", "rldomain", "lab-net"])?
            .filter(|d| d["status"]["capacity"].is_number() || d["status"]["capacity"].is_string()))
    })?;
    ensure!(domain["spec"]["cidr"] == "10.210.0.0/24", "{domain}");

    // ping.yaml: both tasks named, with the clusters no agent joined as.
    let ping = up.wait_condition("rljob", "lab-ping", None, "Unschedulable")?;
    contains_all(
        &ping,
        &[
            "task \"responder\"",
            "task \"prober\"",
            "no agent runs Kubernetes tasks",
            "no agent joined as cluster \"lab-cluster-east\"",
            "no agent joined as cluster \"lab-cluster-west\"",
        ],
    )?;
    Ok(())
}
