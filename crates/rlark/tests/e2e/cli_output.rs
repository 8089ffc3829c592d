//! Issue 18, item 8: `rlark get` output as kubectl's: `-o jsonpath=TEMPLATE`,
//! `-o custom-columns=SPEC`, `-w` (rows as objects change; with `-o`, an object per change;
//! with a NAME, that object only), several kinds at once (`jobs,tasks`), and
//! `rlark describe -o json|yaml`, against a real `rlark server` process.

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
        self.apply_labelled_task(name, role, "ppo")
    }

    /// A Task in `default` with labels `app: APP`.
    fn apply_labelled_task(&self, name: &str, role: &str, app: &str) -> anyhow::Result<()> {
        self.apply(
            name,
            &format!(
                "apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata:\n  name: {name}\n  \
                 namespace: default\n  labels: {{app: {app}}}\nspec:\n  role: {role}\n  \
                 agentType: Raw\n  raw:\n    entrypoint: [\"true\"]\n"
            ),
        )
    }

    fn apply(&self, name: &str, manifest: &str) -> anyhow::Result<()> {
        let path = self.cwd.path().join(format!("{name}.yaml"));
        std::fs::write(&path, manifest)?;
        self.ok(&["apply", "-f", path.to_str().context("path")?])?;
        Ok(())
    }

    /// `rlark ARGS` running, its stdout line by line (killed when dropped).
    fn follow(&self, args: &[&str]) -> anyhow::Result<Lines> {
        let mut child = self
            .command(args)
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
        Ok(Lines { child, rx })
    }
}

/// The stdout lines of a running `rlark`.
struct Lines {
    child: std::process::Child,
    rx: mpsc::Receiver<std::io::Result<String>>,
}

impl Lines {
    fn next(&self, what: &str) -> anyhow::Result<String> {
        match self.rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => Ok(line?),
            Err(e) => bail!("no line {what} within 30 s: {e}"),
        }
    }

    /// The lines up to (without) the next one equal to `end`.
    fn until(&self, end: &str, what: &str) -> anyhow::Result<Vec<String>> {
        let mut lines = Vec::new();
        loop {
            let line = self.next(what)?;
            if line == end {
                return Ok(lines);
            }
            lines.push(line);
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
        "custom-columns=NAME:.metadata.name,ROLE:.spec.role,PHASE:.status.phase,NODE:.spec.nodeName",
    ])?;
    // A new Task is Pending from its creation; a field it does not have prints <none>.
    assert_eq!(
        out,
        "NAME      ROLE      PHASE     NODE\nt-a       Actor     Pending   <none>\nt-b       Rollout   Pending   <none>\n"
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
        // Its first row already has a phase: a Task is Pending from its creation.
        assert!(
            added.contains(" Pending "),
            "no phase in the first row: {added}"
        );
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

/// `get -w` with `-o`: the listed objects, then an object per change (JSON documents, YAML
/// documents separated by `---`, names, template output); with a NAME only that object.
#[test]
fn get_watch_prints_objects_and_follows_one_by_name() -> anyhow::Result<()> {
    let env = Env::start()?;
    env.apply_labelled_task("o-a", "Actor", "v1")?;

    // JSON: a pretty document per object; the stream parses as consecutive documents.
    let json = env.follow(&["get", "tasks", "-n", "default", "-w", "-o", "json"])?;
    let first = json.until("}", "of the listed task")?;
    let first: serde_json::Value = serde_json::from_str(&format!("{}\n}}", first.join("\n")))?;
    assert_eq!(first["kind"], "Task", "{first}");
    assert_eq!(first["apiVersion"], "rlinf.io/v1alpha1");
    assert_eq!(first["metadata"]["name"], "o-a");
    env.apply_labelled_task("o-b", "Rollout", "v1")?;
    let added = json.until("}", "after the create")?;
    let added: serde_json::Value = serde_json::from_str(&format!("{}\n}}", added.join("\n")))?;
    assert_eq!(added["metadata"]["name"], "o-b", "{added}");
    drop(json);

    // One object by name (found without -n), as names, YAML, a template and table rows.
    let names = env.follow(&["get", "task/o-b", "-w", "-o", "name"])?;
    let yaml = env.follow(&["get", "task", "o-b", "-n", "default", "-w", "-o", "yaml"])?;
    let template = env.follow(&[
        "get",
        "task",
        "o-b",
        "-w",
        "-o",
        r#"jsonpath={.metadata.name}={.metadata.labels.app}{"\n"}"#,
    ])?;
    let rows = env.follow(&["get", "task", "o-b", "-w"])?;
    assert_eq!(names.next("of o-b")?, "task.rlinf.io/o-b");
    assert_eq!(template.next("of o-b")?, "o-b=v1");
    let header = rows.next("header")?;
    assert!(header.starts_with("NAMESPACE   NAME "), "{header}");
    let row = rows.next("of o-b")?;
    assert!(row.starts_with("default     o-b "), "{row}");

    // Another task changes: nothing of it shows. Then o-b changes.
    env.apply_labelled_task("o-a", "Actor", "v2")?;
    env.apply_labelled_task("o-b", "Rollout", "v2")?;
    assert_eq!(names.next("after the change")?, "task.rlinf.io/o-b");
    assert_eq!(template.next("after the change")?, "o-b=v2");
    let changed = rows.next("after the change")?;
    assert!(changed.starts_with("default     o-b "), "{changed}");
    // YAML: the first document, `---`, the changed one.
    let document = yaml.until("---", "of o-b")?;
    assert_eq!(document[0], "apiVersion: rlinf.io/v1alpha1", "{document:?}");
    assert!(document.iter().any(|l| l == "  name: o-b"), "{document:?}");
    assert!(
        document.iter().any(|l| l.trim() == "app: v1"),
        "{document:?}"
    );
    let mut second = Vec::new();
    while !second.iter().any(|l: &String| l.trim() == "app: v2") {
        second.push(yaml.next("of the changed o-b")?);
    }
    assert_eq!(second[0], "apiVersion: rlinf.io/v1alpha1", "{second:?}");
    assert!(
        second.iter().all(|l| l != "---" && !l.contains("o-a")),
        "{second:?}"
    );
    Ok(())
}

#[test]
fn get_watch_refuses_what_it_cannot_follow() -> anyhow::Result<()> {
    let env = Env::start()?;
    for (args, message) in [
        (
            &["get", "jobs,tasks", "-w"][..],
            "error: --watch follows one kind, not jobs, tasks: run one `rlark get -w` per kind\n",
        ),
        (
            &["get", "task", "a", "b", "-n", "default", "-w"][..],
            "error: --watch follows one object or a whole list, not 2 objects: name one (or \
             narrow the list with -l or -n)\n",
        ),
        (
            &["get", "tunnels", "-w"][..],
            "error: --watch does not follow tunnels (they are not stored objects)\n",
        ),
    ] {
        let out = env.run(args)?;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(text(&out.stderr), message, "{args:?}");
    }
    let out = env.run(&[
        "get", "task", "nothere", "-n", "default", "-w", "-o", "json",
    ])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("NotFound") && stderr.contains("\"nothere\" not found"),
        "{stderr}"
    );
    Ok(())
}

/// `get jobs,tasks`: each kind in turn, a table each with kind-prefixed names and a blank
/// line between; one List (or names) across kinds with `-o`; `KIND/NAME` of several kinds.
#[test]
fn get_lists_several_kinds_in_turn() -> anyhow::Result<()> {
    let env = Env::start()?;
    env.apply_task("k-a", "Actor")?;
    env.apply_task("k-b", "Rollout")?;
    env.apply(
        "job",
        "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata:\n  name: k-job\nspec:\n  tasks:\n  \
         - name: main\n    agentType: Raw\n    role: Env\n    raw:\n      entrypoint: [\"true\"]\n",
    )?;

    let out = env.ok(&["get", "jobs,tasks", "-n", "default"])?;
    let tables: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(tables.len(), 2, "a blank line between the kinds:\n{out}");
    let jobs: Vec<&str> = tables[0].lines().collect();
    assert!(
        jobs[0].starts_with("NAME ") && jobs[0].contains("PHASE"),
        "{out}"
    );
    assert!(jobs[1].starts_with("job.rlinf.io/k-job "), "{out}");
    assert_eq!(jobs.len(), 2, "{out}");
    let tasks: Vec<&str> = tables[1].lines().collect();
    assert!(
        tasks[0].starts_with("NAME ") && tasks[0].contains("ROLE"),
        "{out}"
    );
    assert!(tasks[1].starts_with("task.rlinf.io/k-a "), "{out}");
    assert!(tasks[2].starts_with("task.rlinf.io/k-b "), "{out}");
    assert_eq!(tasks.len(), 3, "{out}");

    let out = env.ok(&["get", "jobs,tasks", "-o", "name"])?;
    assert_eq!(
        out,
        "job.rlinf.io/k-job\ntask.rlinf.io/k-a\ntask.rlinf.io/k-b\n"
    );
    let out = env.ok(&["get", "tasks,jobs", "-o", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(list["kind"], "List");
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["Task", "Task", "Job"]);
    let out = env.ok(&["get", "task/k-b", "job/k-job", "task/k-a", "-o", "name"])?;
    assert_eq!(
        out, "task.rlinf.io/k-b\ntask.rlinf.io/k-a\njob.rlinf.io/k-job\n",
        "grouped by kind, kinds in command-line order"
    );
    // Namespaced objects found by name without -n: a NAMESPACE column.
    let out = env.ok(&["get", "task/k-b", "job/k-job", "--no-headers"])?;
    assert!(
        out.starts_with("default   task.rlinf.io/k-b ") && out.contains("\n\njob.rlinf.io/k-job "),
        "{out}"
    );

    // Bad input names the problem; nothing is printed for the kinds that were fine.
    for (args, message) in [
        (
            &["get", "jobs,jbos"][..],
            "error: the server doesn't have a resource type \"jbos\"\n",
        ),
        (
            &["get", "jobs,"][..],
            "error: \"jobs,\" has an empty resource type: list kinds as KIND,KIND (e.g. \
             jobs,tasks)\n",
        ),
        (
            &["get", "job,task/k-a"][..],
            "error: invalid argument \"job,task/k-a\": arguments in resource/name form must \
             have a single resource and name\n",
        ),
        (
            &["get", "jobs,tunnels"][..],
            "error: tunnels are listed alone: `rlark get tunnels`, then the other kinds\n",
        ),
    ] {
        let out = env.run(args)?;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert_eq!(text(&out.stderr), message, "{args:?}");
    }
    Ok(())
}

/// `describe -o json|yaml` prints the object exactly as `get -o json|yaml` does, and
/// nothing else.
#[test]
fn describe_prints_the_object_as_get_does() -> anyhow::Result<()> {
    let env = Env::start()?;
    env.apply_task("d-a", "Actor")?;
    for format in ["json", "yaml"] {
        let described = env.ok(&["describe", "task", "d-a", "-o", format])?;
        let got = env.ok(&["get", "task", "d-a", "-o", format])?;
        assert_eq!(described, got, "-o {format}");
        let described = env.ok(&["describe", "task/d-a", "-o", format])?;
        assert_eq!(described, got, "task/d-a -o {format}");
    }
    let object: serde_json::Value =
        serde_json::from_str(&env.ok(&["describe", "task", "d-a", "-o", "json"])?)?;
    assert_eq!(object["kind"], "Task");
    assert_eq!(object["metadata"]["name"], "d-a");
    assert_eq!(object["spec"]["role"], "Actor");

    let out = env.run(&["describe", "task", "d-a", "-o", "wide"])?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("[possible values: json, yaml]"),
        "{}",
        text(&out.stderr)
    );
    let out = env.run(&["describe", "task", "nothere", "-o", "json"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    Ok(())
}
