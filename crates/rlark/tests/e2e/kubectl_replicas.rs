//! The real kubectl on replicas (issue 18, item 4): an in-process server with its
//! controllers, a real agent running raw tasks, and kubectl reading the replicas as core
//! `v1` Pods — `get pods -A`, `logs` (`--tail`, `-f`), `exec` with exit codes — while
//! writes are refused and rlark's own kind stays reachable as `pods.rlinf.io`.
//!
//! Every wait is bounded by [`DEADLINE`].

use crate::missing_tool;
use std::path::Path;
use std::process::{Output, Stdio};

use anyhow::Context as _;
use rlark_api::types::PodPhase;
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually, text};

/// `kubectl --kubeconfig K ARGS` with its own cache and home, bounded by [`DEADLINE`].
async fn kubectl(kubeconfig: &Path, home: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(home.join("cache"))
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .with_context(|| format!("kubectl {args:?} timed out"))?
        .with_context(|| format!("run kubectl {args:?}"))
}

fn kubectl_available() -> bool {
    std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_logs_of_and_execs_in_replicas() -> anyhow::Result<()> {
    if !kubectl_available() {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let h = Harness::start().await?;
    let home = tempfile::tempdir()?;
    let kubeconfig = h.server.kubeconfig_path().to_path_buf();
    let k = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        let home = home.path().to_path_buf();
        async move { kubectl(&kubeconfig, &home, args).await }
    };
    h.create_job("talk", "echo line-1; echo line-2; sleep 600")
        .await?;
    h.wait_pod("talk-main-0", PodPhase::Running).await?;

    // `kubectl get pods -A`: core Pods, the replica's row with its namespace and phase.
    let out = k(&["get", "pods", "-A"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let header: Vec<&str> = listing
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    if header != ["NAMESPACE", "NAME", "STATUS", "RESTARTS", "AGE"] {
        // kubectl resolved `pods` to another kind: show what discovery told it, to tell a
        // server-side ordering problem from a kubectl one.
        let resources = k(&["api-resources", "-o", "wide"]).await?;
        panic!(
            "`kubectl get pods -A` is not the core Pod table:\n{listing}\napi-resources:\n{}",
            text(&resources.stdout)
        );
    }
    let row: Vec<&str> = listing
        .lines()
        .find(|l| l.contains("talk-main-0"))
        .with_context(|| format!("no talk-main-0 in {listing}"))?
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        [NAMESPACE, "talk-main-0", "Running", "0"],
        "{listing}"
    );
    let out = k(&[
        "get",
        "pod",
        "-n",
        "rlark-a",
        "talk-main-0",
        "-o",
        "jsonpath={.apiVersion} {.spec.nodeName} {.status.containerStatuses[0].name}",
    ])
    .await?;
    assert_eq!(text(&out.stdout), "v1 host-0 main", "{}", text(&out.stderr));
    // rlark's own kind, by its full name.
    let out = k(&["get", "pods.rlinf.io", "-n", "rlark-a", "-o", "name"]).await?;
    assert_eq!(
        text(&out.stdout),
        "pod.rlinf.io/talk-main-0\n",
        "{}",
        text(&out.stderr)
    );

    // `kubectl logs`, whole and tailed.
    let logged = eventually("kubectl logs shows both lines", || async {
        let out = k(&["logs", "-n", "rlark-a", "talk-main-0"]).await?;
        anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
        Ok((text(&out.stdout) == "line-1\nline-2\n").then(|| text(&out.stdout)))
    })
    .await?;
    assert_eq!(logged, "line-1\nline-2\n");
    let out = k(&["logs", "-n", "rlark-a", "talk-main-0", "--tail=1"]).await?;
    assert_eq!(text(&out.stdout), "line-2\n", "{}", text(&out.stderr));
    // What the agent cannot honour is refused by name, not ignored.
    let out = k(&["logs", "-n", "rlark-a", "talk-main-0", "--since=1h"]).await?;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("sinceSeconds is not supported"),
        "{}",
        text(&out.stderr)
    );

    // `kubectl exec`: output and the command's exit code.
    let out = k(&["exec", "-n", "rlark-a", "talk-main-0", "--", "echo", "hi"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let out = k(&[
        "exec",
        "-n",
        "rlark-a",
        "talk-main-0",
        "--",
        "sh",
        "-c",
        "echo $RLARK_POD_NAME; exit 3",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "talk-main-0\n");

    // Writes are refused, naming why.
    let out = k(&["delete", "pod", "-n", "rlark-a", "talk-main-0"]).await?;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("replicas are created and removed through Tasks and Jobs"),
        "{}",
        text(&out.stderr)
    );
    // `kubectl port-forward` is tests/e2e/kubectl_portforward.rs.

    // `kubectl logs -f` follows until the process exits.
    h.create_job("tick", "echo a; sleep 2; echo b").await?;
    h.wait_pod("tick-main-0", PodPhase::Running).await?;
    let out = k(&["logs", "-f", "-n", "rlark-a", "tick-main-0"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "a\nb\n");

    h.stop().await
}
