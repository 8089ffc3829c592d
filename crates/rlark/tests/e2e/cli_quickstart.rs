//! Issue 18, item 10: the README quickstart works as written from any directory. A fresh
//! `rlark up` (the built binary, real processes, data in `./.rlark` of its working
//! directory) writes the examples into its data directory and prints their absolute path;
//! `rlark apply -f PATH` from another directory creates them. The long-running example
//! keeps its Task Running, printing a counter, until `stopped: true` stops it and
//! `stopped: false` resumes it, which `rlark get -w` shows. `rlark get nodes -A` names each
//! node's agent and runtime type and shows its capacity.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::up::Up;

const BIN: &str = env!("CARGO_BIN_EXE_rlark");
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(90);

/// The `rlark` CLI run from `cwd` with the admin kubeconfig of `up`.
struct Cli {
    cwd: PathBuf,
    kubeconfig: PathBuf,
}

impl Cli {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .current_dir(&self.cwd)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        command
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

    /// `rlark ARGS` running, its stdout line by line (killed when dropped).
    fn follow(&self, args: &[&str]) -> anyhow::Result<Lines> {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
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
        Ok(Lines { child, rx })
    }
}

struct Lines {
    child: Child,
    rx: mpsc::Receiver<std::io::Result<String>>,
}

impl Lines {
    /// Lines until one equal to `wanted` (an error after [`WAIT`]).
    fn until(&self, wanted: &str) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + WAIT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let line = line?;
                    if line == wanted {
                        return Ok(seen);
                    }
                    seen.push(line);
                }
                Err(e) => bail!("no line {wanted:?} within {WAIT:?} ({e}); saw {seen:?}"),
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn wait_for(what: &str, mut check: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while !check()? {
        if Instant::now() >= deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The path in the banner's `rlark apply -f PATH` line.
fn banner_examples_path(banner: &str) -> anyhow::Result<String> {
    let line = banner
        .lines()
        .find(|l| l.trim_start().starts_with("rlark apply -f "))
        .with_context(|| format!("no `rlark apply -f` line in the banner:\n{banner}"))?;
    let path = line.trim_start()["rlark apply -f ".len()..]
        .split_whitespace()
        .next()
        .context("no path")?;
    Ok(path.to_string())
}

/// A table's rows as column name → cell, cut at the header's column offsets.
fn table_rows(table: &str) -> Vec<HashMap<String, String>> {
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts = Vec::new();
    let mut previous = ' ';
    for (i, c) in header.char_indices() {
        if c != ' ' && previous == ' ' {
            starts.push(i);
        }
        previous = c;
    }
    lines
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(n, &start)| {
                    let end = starts.get(n + 1).copied().unwrap_or(line.len());
                    let name = header[start..].split(' ').next().unwrap_or_default();
                    let cell = line.get(start..end.min(line.len())).unwrap_or_default();
                    (name.to_string(), cell.trim().to_string())
                })
                .collect()
        })
        .collect()
}

#[test]
fn quickstart_works_from_any_directory() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let elsewhere = tempfile::tempdir()?;
    let up = Up::start_in(home.path());
    let banner = up.output();

    // The examples sit in the data directory, named by an absolute path.
    let examples = banner_examples_path(&banner)?;
    let data_dir = std::fs::canonicalize(home.path())?.join(".rlark");
    assert_eq!(
        std::fs::canonicalize(&examples)?,
        data_dir.join("examples"),
        "{banner}"
    );
    assert!(Path::new(&examples).is_absolute(), "{banner}");
    assert!(examples.ends_with('/'), "{banner}");
    let cli = Cli {
        cwd: elsewhere.path().to_path_buf(),
        kubeconfig: data_dir.join("admin.kubeconfig"),
    };
    let applied = cli.ok(&["apply", "-f", &examples])?;
    assert_eq!(
        applied,
        "domain.rlinf.io/demo-net created\njob.rlinf.io/ppo-train created\n\
         job.rlinf.io/counter created\nworkflow.rlinf.io/train-eval created\n"
    );

    nodes_show_agent_type_and_capacity(&cli)?;
    long_running_example_stops_and_resumes(&cli, &examples)?;
    Ok(())
}

/// `rlark get nodes -A`: AGENT is the cluster, TYPE the runtime, then PHASE and the
/// capacity (CPU, MEMORY, GPU); `-o wide` adds CATEGORY.
fn nodes_show_agent_type_and_capacity(cli: &Cli) -> anyhow::Result<()> {
    let table = cli.ok(&["get", "nodes", "-A"])?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "AGENT",
            "TYPE",
            "PHASE",
            "CPU",
            "MEMORY",
            "GPU",
            "AGE"
        ],
        "{table}"
    );
    let listed: Value = serde_json::from_str(&cli.ok(&["get", "nodes", "-A", "-o", "json"])?)?;
    let nodes = listed["items"].as_array().context("items")?;
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    for (row, node) in rows.iter().zip(nodes) {
        let cluster = node["metadata"]["namespace"]
            .as_str()
            .and_then(|ns| ns.strip_prefix("rlark-"))
            .context("agent namespace")?;
        let capacity = &node["status"]["capacity"];
        assert_eq!(
            row["NAME"],
            node["metadata"]["name"].as_str().unwrap_or_default()
        );
        assert_eq!(row["AGENT"], cluster, "{table}");
        assert_eq!(row["TYPE"], "Raw", "{table}");
        assert_eq!(row["PHASE"], "Online", "{table}");
        assert_eq!(
            row["CPU"],
            capacity["cpu"].as_str().unwrap_or_default(),
            "{table}"
        );
        assert!(!row["CPU"].is_empty(), "{table}");
        assert_eq!(
            row["MEMORY"],
            capacity["memory"].as_str().unwrap_or_default()
        );
        assert!(!row["MEMORY"].is_empty(), "{table}");
        assert_eq!(
            row["GPU"],
            capacity["nvidia.com/gpu"].as_str().unwrap_or_default(),
            "{table}"
        );
    }
    let agents: Vec<&str> = rows.iter().map(|r| r["AGENT"].as_str()).collect();
    assert_eq!(agents, ["cloud", "edge"], "{table}");
    let wide = cli.ok(&["get", "nodes", "-A", "-o", "wide"])?;
    let categories: Vec<String> = table_rows(&wide)
        .iter()
        .map(|r| r["CATEGORY"].clone())
        .collect();
    assert_eq!(categories, ["cloud", "edge"], "{wide}");
    Ok(())
}

/// The counter Job runs until `stopped: true`, and again after `stopped: false`; a watch
/// of its Task shows each phase.
fn long_running_example_stops_and_resumes(cli: &Cli, examples: &str) -> anyhow::Result<()> {
    // The Task is created by the Job controller: wait for it before watching it.
    wait_for("the counter Task", || {
        Ok(cli.run(&["get", "task", "counter-main"])?.status.success())
    })?;
    let phases = cli.follow(&[
        "get",
        "task",
        "counter-main",
        "-w",
        "-o",
        r#"jsonpath={.status.phase}{"\n"}"#,
    ])?;
    phases.until("Running")?;
    wait_for("the counter in the logs", || {
        let out = cli.run(&["logs", "job/counter"])?;
        Ok(text(&out.stdout).contains("count 2\n"))
    })?;

    let manifest = std::fs::read_to_string(Path::new(examples).join("long-running.yaml"))?;
    assert!(manifest.contains("  stopped: false\n"), "{manifest}");
    let stopped = cli.cwd.join("counter-stopped.yaml");
    std::fs::write(
        &stopped,
        manifest.replace("  stopped: false\n", "  stopped: true\n"),
    )?;
    let out = cli.ok(&["apply", "-f", stopped.to_str().context("path")?])?;
    assert_eq!(out, "job.rlinf.io/counter configured\n");
    phases.until("Stopped")?;
    let job = cli.ok(&["get", "job", "counter", "-o", "jsonpath={.status.phase}"])?;
    wait_for("the Job to be Stopped", || {
        Ok(cli.ok(&["get", "job", "counter", "-o", "jsonpath={.status.phase}"])? == "Stopped")
    })
    .with_context(|| format!("job phase {job}"))?;

    let out = cli.ok(&["apply", "-f", &format!("{examples}long-running.yaml")])?;
    assert_eq!(out, "job.rlinf.io/counter configured\n");
    phases.until("Running")?;
    Ok(())
}
