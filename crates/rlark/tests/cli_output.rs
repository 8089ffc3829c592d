//! Issue 18, item 8: `rlark get` output as kubectl's: `-o jsonpath=TEMPLATE`,
//! `-o custom-columns=SPEC` and `-w` (rows as objects change), against a real
//! `rlark server` process.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rlark_testkit::ServerProcess;

const BINARY: &str = env!("CARGO_BIN_EXE_rlark");

struct Env {
    server: ServerProcess,
    _data: tempfile::TempDir,
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
            cwd: tempfile::tempdir()?,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BINARY);
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(self.server.kubeconfig_path())
            .current_dir(self.cwd.path())
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.command(args)
            .output()
            .with_context(|| format!("run rlark {args:?}"))
    }

    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args)?;
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

    fn apply_task(&self, name: &str, role: &str) -> anyhow::Result<()> {
        let path = self.cwd.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata:\n  name: {name}\n  \
                 namespace: default\n  labels: {{app: ppo}}\nspec:\n  role: {role}\n  \
                 agentType: Raw\n  raw:\n    entrypoint: [\"true\"]\n"
            ),
        )?;
        self.ok(&["apply", "-f", path.to_str().context("path")?])?;
        Ok(())
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn get_prints_jsonpath_and_custom_columns() -> anyhow::Result<()> {
    let env = Env::start()?;
    env.apply_task("t-a", "Actor")?;
    env.apply_task("t-b", "Rollout")?;

    // A list: the template applies to the List, `{range}` walks its items.
    let out = env.ok(&[
        "get",
        "tasks",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}:{.spec.role}{"\n"}{end}"#,
    ])?;
    assert_eq!(out, "t-a:Actor\nt-b:Rollout\n");
    let out = env.ok(&["get", "tasks", "-o", "jsonpath={.items[*].metadata.name}"])?;
    assert_eq!(
        out, "t-a t-b",
        "several matches are joined by a space, no newline"
    );
    // One named object: the template applies to the object.
    let out = env.ok(&["get", "task/t-b", "-o", "jsonpath={.spec.role}"])?;
    assert_eq!(out, "Rollout");
    let out = env.ok(&["get", "task", "t-a", "-o", "jsonpath={.metadata.labels}"])?;
    assert_eq!(out, r#"{"app":"ppo"}"#, "non-strings print as JSON");

    let out = env.ok(&[
        "get",
        "tasks",
        "-o",
        "custom-columns=NAME:.metadata.name,ROLE:.spec.role,PHASE:.status.phase",
    ])?;
    assert_eq!(
        out,
        "NAME      ROLE      PHASE\nt-a       Actor     <none>\nt-b       Rollout   <none>\n"
    );
    let out = env.ok(&[
        "get",
        "tasks",
        "-l",
        "app=ppo",
        "--no-headers",
        "-o",
        "custom-columns=N:.metadata.name",
    ])?;
    assert_eq!(out, "t-a\nt-b\n");

    // Bad templates and specs are usage errors naming the problem.
    for (format, message) in [
        (
            "jsonpath={.items",
            "error: invalid value 'jsonpath={.items' for '--output <FORMAT>': jsonpath template \
             \"{.items\": unclosed '{'\n",
        ),
        (
            "custom-columns=NAME",
            "error: invalid value 'custom-columns=NAME' for '--output <FORMAT>': custom-columns \
             \"NAME\": \"NAME\" is not HEADER:JSONPATH (e.g. NAME:.metadata.name,PHASE:.status.phase)\n",
        ),
        (
            "table",
            "error: invalid value 'table' for '--output <FORMAT>': one of yaml, json, wide, name, \
             jsonpath=TEMPLATE, custom-columns=SPEC\n",
        ),
    ] {
        let out = env.run(&["get", "tasks", "-o", format])?;
        assert_eq!(out.status.code(), Some(2), "{format}");
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with(message), "{format}: {stderr}");
    }
    Ok(())
}

/// `get -w`: the table, then a row for each change, as they happen.
#[test]
fn get_watch_prints_rows_as_objects_change() -> anyhow::Result<()> {
    let env = Env::start()?;
    env.apply_task("w-a", "Actor")?;
    let mut child = env
        .command(&["get", "tasks", "-n", "default", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = |what: &str| -> anyhow::Result<String> {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => Ok(line?),
            Err(e) => bail!("no line {what} within 30 s: {e}"),
        }
    };
    let result = (|| -> anyhow::Result<()> {
        let header = next_line("header")?;
        assert!(header.starts_with("NAME "), "{header}");
        let first = next_line("of the listed task")?;
        assert!(first.starts_with("w-a "), "{first}");
        env.apply_task("w-b", "Rollout")?;
        let added = next_line("after the create")?;
        assert!(added.starts_with("w-b "), "{added}");
        env.ok(&["delete", "task", "w-a", "-n", "default"])?;
        // Deletion may come as one or two events (a finalizer-free delete is one).
        let deleted = next_line("after the delete")?;
        assert!(deleted.starts_with("w-a "), "{deleted}");
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[test]
fn get_watch_refuses_what_it_cannot_follow() -> anyhow::Result<()> {
    let env = Env::start()?;
    let out = env.run(&["get", "task", "x", "-w"])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: --watch follows a whole list: name no object (narrow it with -l or -n)\n"
    );
    let out = env.run(&["get", "tasks", "-w", "-o", "yaml"])?;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: --watch prints table rows: use it without -o or with -o wide\n"
    );
    Ok(())
}
