//! The client commands (`apply`, `get`, `delete`) of the real binary against an in-process
//! server: the examples apply, list as tables, print as YAML/JSON and delete again.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::Context as _;
use rlark_testkit::TestServer;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Cli<'a> {
    kubeconfig: &'a Path,
}

impl Cli<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlark"));
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(self.kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG");
        cmd
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = self.command(args);
        let args = format!("{args:?}");
        // The server runs on this test's runtime: never block it.
        tokio::task::spawn_blocking(move || cmd.output())
            .await?
            .with_context(|| format!("run rlark {args}"))
    }

    /// Run, require exit 0, return stdout.
    async fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args).await?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        anyhow::ensure!(
            out.status.success(),
            "rlark {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }

    async fn apply_stdin(&self, manifest: &str) -> anyhow::Result<Output> {
        let mut cmd = self.command(&["apply", "-f", "-"]);
        let manifest = manifest.to_string();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Output> {
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, manifest.as_bytes())?;
            drop(child.stdin.take());
            Ok(child.wait_with_output()?)
        })
        .await?
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_delete_round_trip() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let cli = Cli {
        kubeconfig: server.kubeconfig_path(),
    };
    let examples = repo_root().join("examples");
    let examples = examples.to_str().context("examples path")?;

    let applied = cli.ok(&["apply", "-f", examples]).await?;
    assert!(
        applied.contains("job.rlinf.io/ppo-train created"),
        "{applied}"
    );
    assert!(
        applied.contains("domain.rlinf.io/demo-net created"),
        "{applied}"
    );
    assert!(
        applied.contains("workflow.rlinf.io/train-eval created"),
        "{applied}"
    );
    let again = cli.ok(&["apply", "-f", examples]).await?;
    assert!(
        again.contains("job.rlinf.io/ppo-train unchanged"),
        "{again}"
    );

    // A change is "configured".
    let job = std::fs::read_to_string(repo_root().join("examples/job.yaml"))?;
    let changed = job.replace("replicas: 2", "replicas: 3");
    anyhow::ensure!(changed != job, "examples/job.yaml changed shape");
    let out = cli.apply_stdin(&changed).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("job.rlinf.io/ppo-train configured"),
        "{stdout}"
    );

    // Namespaced objects go to -n; kinds resolve by short name.
    cli.apply_stdin("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n")
        .await?;
    let task = "apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata:\n  name: t1\n  namespace: team-a\n\
                spec:\n  role: Actor\n  agentType: Raw\n  raw:\n    entrypoint: [\"true\"]\n";
    let out = cli.apply_stdin(task).await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Tables.
    let jobs = cli.ok(&["get", "jobs"]).await?;
    let header = jobs.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME"), "{jobs}");
    assert!(jobs.contains("ppo-train"), "{jobs}");
    let tasks = cli.ok(&["get", "tasks", "-A"]).await?;
    assert!(tasks.starts_with("NAMESPACE"), "{tasks}");
    assert!(tasks.contains("team-a") && tasks.contains("t1"), "{tasks}");
    let ns = cli.ok(&["get", "ns"]).await?;
    assert!(ns.contains("team-a"), "{ns}");
    let one = cli.ok(&["get", "rljob", "ppo-train"]).await?;
    assert_eq!(one.lines().count(), 2, "{one}");

    // Objects.
    let yaml = cli.ok(&["get", "job", "ppo-train", "-o", "yaml"]).await?;
    assert!(
        yaml.contains("kind: Job") && yaml.contains("resourceVersion"),
        "{yaml}"
    );
    let json = cli
        .ok(&["get", "tasks", "-n", "team-a", "-o", "json"])
        .await?;
    let list: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"][0]["metadata"]["name"], "t1");
    assert_eq!(list["items"][0]["kind"], "Task");
    let names = cli.ok(&["get", "jobs", "-o", "name"]).await?;
    assert!(
        names.lines().any(|l| l == "job.rlinf.io/ppo-train"),
        "{names}"
    );

    // Server errors print like kubectl and exit 1.
    let out = cli.run(&["get", "job", "nope"]).await?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("Error from server (NotFound):"),
        "{stderr}"
    );
    let out = cli.run(&["get", "gizmos"]).await?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "error: the server doesn't have a resource type \"gizmos\""
    );

    // Delete by name and by file.
    let deleted = cli.ok(&["delete", "task", "t1", "-n", "team-a"]).await?;
    assert_eq!(deleted.trim(), "task.rlinf.io \"t1\" deleted");
    // A Domain in use by a Job is not deleted: first the Job.
    let out = cli
        .run(&[
            "delete",
            "-f",
            &repo_root()
                .join("examples/domain.yaml")
                .display()
                .to_string(),
        ])
        .await?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by Job \"ppo-train\""), "{stderr}");
    cli.ok(&["delete", "job", "ppo-train"]).await?;
    let deleted = cli
        .ok(&[
            "delete",
            "-f",
            &repo_root()
                .join("examples/domain.yaml")
                .display()
                .to_string(),
        ])
        .await?;
    assert!(
        deleted.contains("domain.rlinf.io \"demo-net\" deleted"),
        "{deleted}"
    );
    let out = cli.run(&["get", "domains"]).await?;
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No resources found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli.run(&["delete", "domain", "demo-net"]).await?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    cli.ok(&["delete", "domain", "demo-net", "--ignore-not-found"])
        .await?;

    server.stop().await?;
    Ok(())
}
