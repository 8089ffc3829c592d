//! The `rlark` client commands as a kubectl user expects them, against the real
//! `rlark server` process: strict field validation on apply and the server's warnings,
//! global flags anywhere, `KUBECONFIG` lists and `~/.kube/config`, `RLARK_*` environment
//! variables, `KIND/NAME` and `KIND NAME` with objects found across namespaces, error
//! chains printed once, and a connection's log line that does not grow per request.
//!
//! Every command runs with an empty `HOME` and working directory and without `KUBECONFIG`
//! or `RLARK_*` from the developer's environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail};
use rlark_testkit::ServerProcess;

const BINARY: &str = env!("CARGO_BIN_EXE_rlark");

/// A server process plus an isolated place to run the CLI from.
struct Env {
    server: ServerProcess,
    _data: tempfile::TempDir,
    home: tempfile::TempDir,
    cwd: tempfile::TempDir,
}

impl Env {
    fn start() -> anyhow::Result<Env> {
        let data = tempfile::tempdir()?;
        let server = ServerProcess::spawn_with_args(
            Path::new(BINARY),
            data.path(),
            &["--controllers=false"],
        )?;
        Ok(Env {
            server,
            _data: data,
            home: tempfile::tempdir()?,
            cwd: tempfile::tempdir()?,
        })
    }

    fn kubeconfig(&self) -> PathBuf {
        self.server.kubeconfig_path().to_path_buf()
    }

    /// `rlark ARGS` with nothing from the environment: no kubeconfig unless the args or
    /// `envs` give one.
    fn command(&self, args: &[&str], envs: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(BINARY);
        cmd.args(args)
            .current_dir(self.cwd.path())
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .env_remove("RLARK_SERVER")
            .env_remove("RLARK_DATA_DIR")
            .envs(envs.iter().copied())
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<Output> {
        self.command(args, envs)
            .output()
            .with_context(|| format!("run rlark {args:?}"))
    }

    /// Run with `--kubeconfig` (last) and require success; stdout.
    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let kubeconfig = self.kubeconfig();
        let all = with_kubeconfig(args, &kubeconfig)?;
        let out = self.run(&all, &[])?;
        if !out.status.success() {
            bail!(
                "rlark {args:?} failed ({}):\nstdout: {}\nstderr: {}",
                out.status,
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        Ok(text(&out.stdout))
    }

    /// Run with `--kubeconfig` (last); the output whatever the exit code.
    fn any(&self, args: &[&str]) -> anyhow::Result<Output> {
        let kubeconfig = self.kubeconfig();
        let all = with_kubeconfig(args, &kubeconfig)?;
        self.run(&all, &[])
    }

    fn write(&self, name: &str, content: &str) -> anyhow::Result<PathBuf> {
        let path = self.cwd.path().join(name);
        std::fs::write(&path, content)?;
        Ok(path)
    }
}

/// `args` plus `--kubeconfig PATH`, before a `--` (after which `exec` takes the command).
fn with_kubeconfig<'a>(args: &[&'a str], kubeconfig: &'a Path) -> anyhow::Result<Vec<&'a str>> {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut all = args[..split].to_vec();
    all.extend(["--kubeconfig", kubeconfig.to_str().context("path")?]);
    all.extend(&args[split..]);
    Ok(all)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const TYPO_JOB: &str = "apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: typo
spec:
  tasks:
    - name: main
      agentType: Raw
      role: Actor
      raw:
        entrypoint: [sleep, '1']
        replcas: 3
";

/// Issue 18, item 1: a misspelt field is refused (strict by default) with the server's
/// words; `--validate=warn` creates the object and prints the server's `Warning`;
/// `--validate=false` drops the field silently.
#[test]
fn apply_refuses_unknown_fields_unless_told_otherwise() -> anyhow::Result<()> {
    let env = Env::start()?;
    let file = env.write("typo.yaml", TYPO_JOB)?;
    let file = file.to_str().context("path")?;

    let out = env.any(&["apply", "-f", file])?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!(
            "Error from server (BadRequest): error when creating {file:?}: strict decoding \
             error: unknown field \"spec.tasks[0].raw.replcas\"\n"
        )
    );
    assert_eq!(text(&out.stdout), "");
    let out = env.any(&["get", "job", "typo"])?;
    assert_eq!(out.status.code(), Some(1), "the job was not created");

    // `--validate=strict` and `--validate=true` are the default.
    for flag in ["--validate=strict", "--validate=true", "--validate"] {
        let out = env.any(&["apply", "-f", file, flag])?;
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", text(&out.stderr));
    }

    let out = env.any(&["apply", "-f", file, "--validate=warn"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "job.rlinf.io/typo created\n");
    assert_eq!(
        text(&out.stderr),
        "Warning: unknown field \"spec.tasks[0].raw.replcas\"\n"
    );

    // An update of the same file: patched (warned again), nothing stored changes.
    let out = env.any(&["apply", "-f", file, "--validate=false"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "job.rlinf.io/typo unchanged\n");
    assert_eq!(text(&out.stderr), "");
    let out = env.any(&["apply", "-f", file])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "Error from server (BadRequest): error when patching {file:?}: strict decoding \
             error: unknown field \"spec.tasks[0].raw.replcas\"\n"
        )
    );
    let yaml = env.ok(&["get", "job", "typo", "-o", "yaml"])?;
    assert!(!yaml.contains("replcas"), "{yaml}");

    let out = env.any(&["apply", "-f", file, "--validate=lax"])?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("use strict, warn or ignore"),
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

/// Issue 18, item 2: `--kubeconfig`, `--context` and `-n` before or after the subcommand.
#[test]
fn global_flags_go_anywhere() -> anyhow::Result<()> {
    let env = Env::start()?;
    let kubeconfig = env.kubeconfig();
    let kubeconfig = kubeconfig.to_str().context("path")?;

    for args in [
        vec![
            "--kubeconfig",
            kubeconfig,
            "token",
            "create",
            "--ttl",
            "10m",
            "--cluster-id",
            "c9",
        ],
        vec![
            "token",
            "--kubeconfig",
            kubeconfig,
            "create",
            "--ttl",
            "10m",
            "--cluster-id",
            "c9",
        ],
        vec![
            "token",
            "create",
            "--ttl",
            "10m",
            "--cluster-id",
            "c9",
            "--kubeconfig",
            kubeconfig,
        ],
    ] {
        let out = env.run(&args, &[])?;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).starts_with("Bootstrap token "),
            "{}",
            text(&out.stdout)
        );
    }

    let ns = env.write(
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n",
    )?;
    env.ok(&["apply", "-f", ns.to_str().context("path")?])?;
    let task = env.write("task.yaml", &task_manifest("t1", None))?;
    let out = env.run(
        &[
            "-n",
            "team-a",
            "--kubeconfig",
            kubeconfig,
            "apply",
            "-f",
            task.to_str().context("path")?,
        ],
        &[],
    )?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "task.rlinf.io/t1 created\n");
    let listed = env.run(
        &[
            "--namespace=team-a",
            "--context",
            "rlark",
            "get",
            "tasks",
            "-o",
            "name",
            "--kubeconfig",
            kubeconfig,
        ],
        &[],
    )?;
    assert_eq!(
        text(&listed.stdout),
        "task.rlinf.io/t1\n",
        "{}",
        text(&listed.stderr)
    );

    let out = env.run(
        &[
            "--context",
            "nope",
            "--kubeconfig",
            kubeconfig,
            "get",
            "jobs",
        ],
        &[],
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("nope"), "{}", text(&out.stderr));
    Ok(())
}

/// A kubeconfig whose only context points at a port nothing listens on.
const DEAD_KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: dead
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: dead
  context:
    cluster: dead
    user: dead
current-context: dead
users:
- name: dead
  user:
    token: nothing
";

/// Issue 18, item 2: `KUBECONFIG` is a list (missing files skipped, the first file to set
/// a value wins, `--context` picks any merged context); without it, `./.rlark` then
/// `~/.kube/config`.
#[test]
fn kubeconfig_lists_merge_and_fall_back_to_home() -> anyhow::Result<()> {
    let env = Env::start()?;
    let admin = env.kubeconfig();
    let admin = admin.to_str().context("path")?;
    let dead = env.write("dead.kubeconfig", DEAD_KUBECONFIG)?;
    let dead = dead.to_str().context("path")?;
    let missing = env.cwd.path().join("missing.kubeconfig");
    let missing = missing.to_str().context("path")?;

    let get = |envs: &[(&str, &str)], extra: &[&str]| -> anyhow::Result<Output> {
        let mut args = vec!["get", "ns", "default", "-o", "name"];
        args.extend(extra);
        env.run(&args, envs)
    };
    let list = format!("{missing}:{admin}:{dead}");
    let out = get(&[("KUBECONFIG", &list)], &[])?;
    assert_eq!(
        text(&out.stdout),
        "namespace/default\n",
        "{}",
        text(&out.stderr)
    );

    // The dead file first: its current-context wins and the command fails to connect...
    let list = format!("{dead}:{missing}:{admin}");
    let out = get(&[("KUBECONFIG", &list)], &[])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("Connection refused"),
        "{}",
        text(&out.stderr)
    );
    // ...unless --context names the admin file's context.
    let out = get(&[("KUBECONFIG", &list)], &["--context", "rlark"])?;
    assert_eq!(
        text(&out.stdout),
        "namespace/default\n",
        "{}",
        text(&out.stderr)
    );

    // Only missing files: an error naming them.
    let out = get(&[("KUBECONFIG", missing)], &[])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!("error: none of the kubeconfig files in $KUBECONFIG exists ({missing})\n")
    );

    // No KUBECONFIG and no ./.rlark: ~/.kube/config.
    let out = get(&[], &[])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("~/.kube/config"),
        "{}",
        text(&out.stderr)
    );
    std::fs::create_dir_all(env.home.path().join(".kube"))?;
    std::fs::copy(admin, env.home.path().join(".kube/config"))?;
    let out = get(&[], &[])?;
    assert_eq!(
        text(&out.stdout),
        "namespace/default\n",
        "{}",
        text(&out.stderr)
    );
    // ./.rlark/admin.kubeconfig comes first.
    std::fs::create_dir_all(env.cwd.path().join(".rlark"))?;
    std::fs::copy(dead, env.cwd.path().join(".rlark/admin.kubeconfig"))?;
    let out = get(&[], &[])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("Connection refused"),
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

/// Issue 18, item 2: `RLARK_DATA_DIR` and `RLARK_SERVER` stand for `--data-dir` and
/// `--server`.
#[test]
fn rlark_environment_variables_stand_for_flags() -> anyhow::Result<()> {
    let env = Env::start()?;
    let data_dir = env.server.data_dir().to_str().context("path")?.to_string();
    let out = env.run(&["kubeconfig", "--path"], &[("RLARK_DATA_DIR", &data_dir)])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        PathBuf::from(text(&out.stdout).trim()),
        std::path::absolute(env.server.kubeconfig_path())?
    );
    // The flag wins over the variable.
    let out = env.run(
        &["kubeconfig", "--path", "--data-dir", "/nonexistent-rlark"],
        &[("RLARK_DATA_DIR", &data_dir)],
    )?;
    assert_eq!(out.status.code(), Some(1));

    let created = env.ok(&["token", "create", "--cluster-id", "c1", "-o", "json"])?;
    let created: serde_json::Value = serde_json::from_str(&created)?;
    let token = created["token"].as_str().context("token")?;
    let ca_hash = created["caHash"].as_str().context("caHash")?;
    let agent_dir = env.cwd.path().join("agent");
    let out = env.run(
        &[
            "join",
            "--token",
            token,
            "--ca-hash",
            ca_hash,
            "--cluster-id",
            "c1",
            "--dir",
            agent_dir.to_str().context("path")?,
        ],
        &[("RLARK_SERVER", &format!("https://{}", env.server.addr()?))],
    )?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(agent_dir.join(rlark_agent::join::AGENT_PEM).exists());
    Ok(())
}

/// Issue 18, item 6: each cause once.
#[test]
fn error_chains_print_each_cause_once() -> anyhow::Result<()> {
    let env = Env::start()?;
    let out = env.run(
        &["get", "jobs", "--kubeconfig", "/nonexistent/kubeconfig"],
        &[],
    )?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: failed to read kubeconfig from '\"/nonexistent/kubeconfig\"': No such file or \
         directory (os error 2)\n"
    );
    let out = env.any(&["apply", "-f", "/nonexistent/m.yaml"])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).matches("(os error 2)").count(),
        1,
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

fn task_manifest(name: &str, namespace: Option<&str>) -> String {
    let namespace = namespace.map_or(String::new(), |ns| format!("\n  namespace: {ns}"));
    format!(
        "apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata:\n  name: {name}{namespace}\n\
         spec:\n  role: Actor\n  agentType: Raw\n  raw:\n    entrypoint: [\"true\"]\n"
    )
}

/// Issue 18, item 3: `KIND/NAME` and `KIND NAME` name the same object in get, describe,
/// delete, logs, exec, events and cordon; namespaced objects are found in whichever namespace holds
/// them, several candidates are listed, and listing without -n spans every namespace.
#[test]
fn objects_are_named_the_same_way_everywhere() -> anyhow::Result<()> {
    let env = Env::start()?;
    let mut objects = String::new();
    for ns in ["rlark-a", "rlark-b"] {
        objects.push_str(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n"
        ));
    }
    objects.push_str(&task_manifest("solo", Some("rlark-a")));
    objects.push_str("---\n");
    objects.push_str(&task_manifest("twin", Some("rlark-a")));
    objects.push_str("---\n");
    objects.push_str(&task_manifest("twin", Some("rlark-b")));
    objects.push_str(
        "---\napiVersion: rlinf.io/v1alpha1\nkind: Node\nmetadata:\n  name: n1\n  namespace: rlark-b\n\
         spec:\n  agentType: Raw\n",
    );
    objects.push_str(
        "---\napiVersion: v1\nkind: Event\nmetadata:\n  name: solo.1\n  namespace: rlark-a\n\
         involvedObject:\n  apiVersion: rlinf.io/v1alpha1\n  kind: Task\n  name: solo\n  \
         namespace: rlark-a\nreason: Testing\nmessage: hello from the test\ntype: Normal\n\
         lastTimestamp: '2026-01-01T00:00:00Z'\n",
    );
    let file = env.write("objects.yaml", &objects)?;
    env.ok(&["apply", "-f", file.to_str().context("path")?])?;

    // events: both forms and kubectl's --for; all Events with their namespace.
    for args in [
        vec!["events", "task", "solo"],
        vec!["events", "task/solo"],
        vec!["events", "--for", "task/solo"],
    ] {
        let table = env.ok(&args)?;
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 2, "{args:?}: {table}");
        assert_eq!(
            lines[0],
            ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
            "{table}"
        );
        assert_eq!(
            lines[1][1..],
            [
                "Normal",
                "Testing",
                "task/solo",
                "hello",
                "from",
                "the",
                "test"
            ],
            "{table}"
        );
    }
    let all = env.ok(&["events"])?;
    assert!(all.starts_with("NAMESPACE "), "{all}");
    assert!(
        all.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("rlark-a ")),
        "{all}"
    );
    let out = env.any(&["events", "-n", "rlark-b"])?;
    assert_eq!(text(&out.stderr), "No events found in rlark-b namespace.\n");
    let out = env.any(&["events", "task", "twin"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(rlark-a, rlark-b)"),
        "{}",
        text(&out.stderr)
    );

    // get: both forms, found in rlark-a without -n.
    for args in [
        vec!["get", "task", "solo", "-o", "name"],
        vec!["get", "task/solo", "-o", "name"],
        vec!["get", "tasks/solo", "-o", "name", "-n", "rlark-a"],
    ] {
        assert_eq!(env.ok(&args)?, "task.rlinf.io/solo\n", "{args:?}");
    }
    let table = env.ok(&["get", "task/solo"])?;
    assert!(table.starts_with("NAMESPACE "), "{table}");
    assert!(table.contains("rlark-a "), "{table}");
    // Ambiguous: the candidates, exit 1.
    for args in [vec!["get", "task", "twin"], vec!["describe", "task/twin"]] {
        let out = env.any(&args)?;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            text(&out.stderr),
            "error: task.rlinf.io \"twin\" exists in several namespaces (rlark-a, rlark-b): \
             pick one with -n\n",
            "{args:?}"
        );
    }
    let out = env.any(&["get", "task", "ghost"])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: task.rlinf.io \"ghost\" not found in any namespace\n"
    );
    // Listing without -n: every namespace, never "No resources found in default namespace".
    let listed = env.ok(&["get", "tasks", "-o", "name"])?;
    assert_eq!(
        listed,
        "task.rlinf.io/solo\ntask.rlinf.io/twin\ntask.rlinf.io/twin\n"
    );
    let out = env.any(&["get", "pods"])?;
    assert_eq!(text(&out.stderr), "No resources found\n");
    let out = env.any(&["get", "tasks", "-n", "default"])?;
    assert_eq!(
        text(&out.stderr),
        "No resources found in default namespace.\n"
    );

    // describe: both forms.
    for args in [
        vec!["describe", "task", "solo"],
        vec!["describe", "task/solo"],
    ] {
        let described = env.ok(&args)?;
        assert!(described.contains("Namespace:"), "{described}");
        assert!(described.contains("rlark-a"), "{described}");
    }
    // logs and exec resolve `KIND NAME` like `KIND/NAME` (the Task never ran).
    for args in [vec!["logs", "task", "solo"], vec!["logs", "task/solo"]] {
        let out = env.any(&args)?;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            text(&out.stderr),
            "error: task rlark-a/solo has no pods yet (it is not running anywhere)\n",
            "{args:?}"
        );
    }
    for args in [
        vec!["exec", "task", "twin", "--", "true"],
        vec!["exec", "task/twin", "--", "true"],
    ] {
        let out = env.any(&args)?;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("ambiguous")
                && text(&out.stderr).contains("rlark-a, rlark-b"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // cordon: `node NAME`, `node/NAME`, found in rlark-b.
    assert_eq!(
        env.ok(&["cordon", "node", "n1"])?,
        "node.rlinf.io/n1 cordoned (namespace rlark-b)\n"
    );
    assert_eq!(
        env.ok(&["uncordon", "node/n1"])?,
        "node.rlinf.io/n1 uncordoned (namespace rlark-b)\n"
    );

    // delete: both forms, the twin needs -n.
    assert_eq!(
        env.ok(&["delete", "task/solo"])?,
        "task.rlinf.io \"solo\" deleted\n"
    );
    let out = env.any(&["delete", "task", "twin"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(rlark-a, rlark-b)"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        env.ok(&["delete", "task", "twin", "-n", "rlark-b"])?,
        "task.rlinf.io \"twin\" deleted\n"
    );
    assert_eq!(
        env.ok(&["delete", "tasks/twin"])?,
        "task.rlinf.io \"twin\" deleted\n"
    );
    Ok(())
}

/// Issue 18, item 7: the connection's span carries `user=` once, however many requests the
/// connection serves (it used to gain one more per request). A viewer's refused writes are
/// logged (warn, target `rlark::audit`) inside the connection's span.
#[test]
fn a_connections_log_line_keeps_its_size() -> anyhow::Result<()> {
    let env = Env::start()?;
    let viewer = env.cwd.path().join("viewer.kubeconfig");
    env.ok(&[
        "kubeconfig",
        "--data-dir",
        env.server.data_dir().to_str().context("path")?,
        "--user",
        "vera",
        "--role",
        "viewer",
        "-o",
        viewer.to_str().context("path")?,
    ])?;
    let mut objects = String::new();
    for i in 0..5 {
        objects.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: span-{i}\n"
        ));
    }
    let file = env.write("namespaces.yaml", &objects)?;
    // One `rlark apply`: one connection, a GET and a refused POST per object.
    let out = env.run(
        &[
            "apply",
            "-f",
            file.to_str().context("path")?,
            "--kubeconfig",
            viewer.to_str().context("path")?,
        ],
        &[],
    )?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).matches("(Forbidden)").count(),
        5,
        "{}",
        text(&out.stderr)
    );
    let log = std::fs::read_to_string(env.server.log_path())?;
    let spans: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rlark::audit") && l.contains("denied") && l.contains("vera"))
        .map(|l| {
            let start = l.find("conn{").unwrap_or(0);
            let end = l[start..].find('}').map_or(l.len(), |e| start + e + 1);
            &l[start..end]
        })
        .collect();
    assert_eq!(spans.len(), 5, "{log}");
    // The client usually keeps one connection, but may open another (a pooled connection
    // closed under load): lines of the same connection (same peer) must be equal.
    for span in &spans {
        assert!(span.starts_with("conn{"), "{log}");
        assert_eq!(span.matches("user=").count(), 1, "{span}");
        let peer = |s: &str| {
            s.split_whitespace()
                .find(|f| f.contains("peer="))
                .map(str::to_string)
        };
        for other in spans.iter().filter(|o| peer(o) == peer(span)) {
            assert_eq!(span, other, "{log}");
        }
    }
    Ok(())
}
