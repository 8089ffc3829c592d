//! End-to-end: the real kubectl against the real `rlark server` process.
//!
//! This is the "Must show" sequence of the API-server issue: apply the examples, list with
//! printer columns, get as YAML, watch a change made from another client, merge-patch,
//! api-resources, explain, and a cascading delete.

use crate::missing_tool;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rlark_testkit::ServerProcess;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

struct Kubectl {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .env("HOME", self.cache.path());
        cmd
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        let output = self
            .command(args)
            .output()
            .with_context(|| format!("running kubectl {args:?}"))?;
        Ok(output)
    }

    /// Run with `input` on stdin and require success; returns stdout.
    fn ok_with_stdin(&self, args: &[&str], input: &str) -> Result<String> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, input.as_bytes())?;
        let output = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!(
                "kubectl {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(stdout)
    }

    /// Run and require success; returns stdout.
    fn ok(&self, args: &[&str]) -> Result<String> {
        let output = self.run(args)?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            bail!(
                "kubectl {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
                output.status
            );
        }
        Ok(stdout)
    }
}

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn kubectl_end_to_end() -> Result<()> {
    if !kubectl_available() {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let data_dir = tempfile::tempdir()?;
    // The API alone: this test creates the Workflow's Job itself to check garbage
    // collection, which the Workflow controller would otherwise do (and race with).
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        data_dir.path(),
        &["--controllers=false"],
    )?;
    let k = Kubectl {
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        cache: tempfile::tempdir()?,
    };
    let examples = repo_root().join("examples");
    let examples = examples.to_str().context("examples path")?;

    // Discovery as kubectl sees it.
    let resources = k.ok(&["api-resources", "--api-group=rlinf.io"])?;
    for (name, short, kind) in [
        ("jobs", "rljob", "Job"),
        ("tasks", "task", "Task"),
        ("workflows", "rlwf", "Workflow"),
    ] {
        assert!(
            resources
                .lines()
                .any(|l| l.starts_with(name) && l.contains(short) && l.contains(kind)),
            "api-resources misses {name}:\n{resources}"
        );
    }

    // Apply the examples (a Domain, a Job, a Workflow).
    let applied = k.ok(&["apply", "-f", examples])?;
    assert!(
        applied.contains("job.rlinf.io/ppo-train created"),
        "{applied}"
    );
    assert!(
        applied.contains("workflow.rlinf.io/train-eval created"),
        "{applied}"
    );
    assert!(
        applied.contains("domain.rlinf.io/demo-net created"),
        "{applied}"
    );
    // Applying again changes nothing.
    let again = k.ok(&["apply", "-f", examples])?;
    assert!(
        again.contains("job.rlinf.io/ppo-train unchanged"),
        "{again}"
    );

    // A Task (namespaced), as the Job controller will create them.
    k.ok(&["create", "namespace", "rlark-edge"])?;
    let task = r#"
apiVersion: rlinf.io/v1alpha1
kind: Task
metadata:
  name: ppo-train-actor
  namespace: rlark-edge
spec:
  role: Actor
  agentType: Raw
  raw:
    entrypoint: ["python3", "-c", "print('actor')"]
"#;
    k.ok_with_stdin(&["apply", "-f", "-"], task)?;

    // Printer columns.
    let listed = k.ok(&["get", "jobs,tasks,workflows", "-A"])?;
    assert!(
        listed.contains("PHASE") && listed.contains("AGE"),
        "no printer columns:\n{listed}"
    );
    assert!(
        listed.contains("ppo-train")
            && listed.contains("train-eval")
            && listed.contains("ppo-train-actor")
    );
    let tasks = k.ok(&["get", "tasks", "-n", "rlark-edge"])?;
    assert!(
        tasks
            .lines()
            .next()
            .is_some_and(|h| h.contains("ROLE") && h.contains("AGENT") && h.contains("TYPE")),
        "{tasks}"
    );
    // TYPE is the runtime; AGENT the cluster once the task is placed.
    assert!(tasks.contains("Actor") && tasks.contains("Raw"), "{tasks}");

    // Full object.
    let yaml = k.ok(&["get", "job", "ppo-train", "-o", "yaml"])?;
    assert!(
        yaml.contains("apiVersion: rlinf.io/v1alpha1") && yaml.contains("kind: Job"),
        "{yaml}"
    );
    assert!(
        yaml.contains("resourceVersion:")
            && yaml.contains("uid:")
            && yaml.contains("generation: 1"),
        "{yaml}"
    );

    // Watch: start `get tasks -w`, change the task from another client, see the change stream.
    let mut watcher = k
        .command(&[
            "get",
            "tasks",
            "-n",
            "rlark-edge",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,DOMAIN:.spec.domain",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = watcher.stdout.take().context("watch stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .context("watch printed nothing")?;
    assert!(first.contains("NAME"), "header expected, got {first:?}");
    let initial = rx
        .recv_timeout(Duration::from_secs(20))
        .context("no initial row")?;
    assert!(initial.contains("ppo-train-actor"), "{initial}");
    k.ok(&[
        "patch",
        "task",
        "ppo-train-actor",
        "-n",
        "rlark-edge",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"domain":"demo-net"}}"#,
    ])?;
    let changed = rx
        .recv_timeout(Duration::from_secs(20))
        .context("watch did not stream the patch")?;
    assert!(
        changed.contains("ppo-train-actor") && changed.contains("demo-net"),
        "{changed}"
    );
    watcher.kill()?;
    let _ = watcher.wait();

    // Merge patch on a cluster-scoped Job bumps generation.
    k.ok(&[
        "patch",
        "job",
        "ppo-train",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"stopped":true}}"#,
    ])?;
    let stopped = k.ok(&[
        "get",
        "job",
        "ppo-train",
        "-o",
        "jsonpath={.spec.stopped} {.metadata.generation}",
    ])?;
    assert_eq!(stopped.trim(), "true 2");

    // Explain reads the published OpenAPI schema.
    let explain = k.ok(&["explain", "job.spec.tasks"])?;
    assert!(
        explain.contains("KIND:") && explain.contains("Job") && explain.contains("FIELDS:"),
        "{explain}"
    );
    assert!(
        explain.contains("role") && explain.contains("agentType"),
        "{explain}"
    );

    // Bad input is refused with a message naming the problem.
    let bad = k.run(&["patch", "job", "ppo-train", "--type", "merge", "-p", r#"{"spec":{"tasks":[{"name":"x","role":"Driver","agentType":"Raw","raw":{"entrypoint":["true"]}}]}}"#])?;
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("Driver") && err.contains("role"), "{err}");

    // Cascading delete: Workflow -> Job -> Task by ownerReferences.
    let wf_uid = k.ok(&[
        "get",
        "workflow",
        "train-eval",
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    let owned_job = format!(
        r#"{{"apiVersion":"rlinf.io/v1alpha1","kind":"Job","metadata":{{"name":"train-eval-train","ownerReferences":[{{"apiVersion":"rlinf.io/v1alpha1","kind":"Workflow","name":"train-eval","uid":"{wf_uid}","controller":true,"blockOwnerDeletion":true}}]}},"spec":{{"tasks":[{{"name":"learner","role":"Actor","agentType":"Raw","raw":{{"entrypoint":["true"]}}}}]}}}}"#
    );
    k.ok_with_stdin(&["create", "-f", "-"], &owned_job)?;
    let job_uid = k.ok(&[
        "get",
        "job",
        "train-eval-train",
        "-o",
        "jsonpath={.metadata.uid}",
    ])?;
    let owned_task = format!(
        r#"{{"apiVersion":"rlinf.io/v1alpha1","kind":"Task","metadata":{{"name":"train-eval-train-learner","namespace":"rlark-edge","ownerReferences":[{{"apiVersion":"rlinf.io/v1alpha1","kind":"Job","name":"train-eval-train","uid":"{job_uid}","controller":true}}]}},"spec":{{"role":"Actor","agentType":"Raw","raw":{{"entrypoint":["true"]}}}}}}"#
    );
    k.ok_with_stdin(&["create", "-f", "-"], &owned_task)?;

    let deleted = k.ok(&["delete", "workflow", "train-eval"])?;
    assert!(
        deleted.contains("workflow.rlinf.io \"train-eval\" deleted"),
        "{deleted}"
    );
    // Garbage collection is asynchronous (background propagation): poll, bounded.
    let mut gone = false;
    for _ in 0..100 {
        let jobs = k.ok(&["get", "jobs", "-o", "name"])?;
        let tasks = k.ok(&["get", "tasks", "-A", "-o", "name"])?;
        if !jobs.contains("train-eval-train") && !tasks.contains("train-eval-train-learner") {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        gone,
        "dependents of the deleted Workflow were not garbage-collected"
    );
    // Unrelated objects stay.
    assert!(
        k.ok(&["get", "job", "ppo-train", "-o", "name"])?
            .contains("ppo-train")
    );
    assert!(
        k.ok(&[
            "get",
            "task",
            "ppo-train-actor",
            "-n",
            "rlark-edge",
            "-o",
            "name"
        ])?
        .contains("ppo-train-actor")
    );

    server.terminate()?;
    Ok(())
}

/// RLark fields a task's runtime does not act on are accepted, and kubectl prints one
/// `Warning:` per field naming its path; fields the runtime does act on (a Kubernetes
/// task's `prepareScript`) and manifests without such fields get none.
#[test]
fn kubectl_apply_warns_about_fields_rlark_does_not_act_on() -> Result<()> {
    if !kubectl_available() {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let data_dir = tempfile::tempdir()?;
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        data_dir.path(),
        &["--controllers=false"],
    )?;
    let k = Kubectl {
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        cache: tempfile::tempdir()?,
    };
    // kubectl prints the server's warnings on stderr, even when the apply succeeds.
    let apply = |manifest: &str| -> Result<String> {
        let mut child = k
            .command(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, manifest.as_bytes())?;
        let output = child.wait_with_output()?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            bail!("kubectl apply failed ({}): {stderr}", output.status);
        }
        Ok(stderr)
    };
    let warnings = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter_map(|l| l.strip_prefix("Warning: "))
            .map(str::to_string)
            .collect()
    };

    let job = r#"apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: inert-fields
spec:
  sshPublicKey: ssh-ed25519 AAAAC3Nza
  tasks:
    - name: head
      head: true
      agentType: Kubernetes
      role: Actor
      prepareScript: pip install rlinf
      tensorBoardDir: /logs
      downstreamName: head-down
      kubernetes:
        workload:
          kind: Job
          template:
            spec:
              containers: [{name: main, image: busybox}]
    - name: rollout
      agentType: Raw
      role: Rollout
      runScript: python3 rollout.py
      raw:
        entrypoint: ["python3", "-c", "print('rollout')"]
"#;
    let stderr = apply(job)?;
    let mut paths: Vec<String> = warnings(&stderr)
        .iter()
        .map(|w| w.split(':').next().unwrap_or("").to_string())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        // sshPublicKey is acted on (the SSH endpoint, docs/ssh.md), and so is the Kubernetes
        // task's tensorBoardDir (a TensorBoard sidecar): no warning.
        ["spec.tasks[0].downstreamName", "spec.tasks[1].runScript"],
        "stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(
            "Warning: spec.tasks[1].runScript: accepted but not acted on for agentType Raw"
        ) && stderr.contains("see docs/compat.md"),
        "stderr:\n{stderr}"
    );
    // The fields are stored as given: RLark manifests round-trip.
    let stored = k.ok(&["get", "jobs.rlinf.io", "inert-fields", "-o", "yaml"])?;
    assert!(stored.contains("tensorBoardDir: /logs"), "{stored}");

    // An update of the same Job warns again (the fields are still not acted on).
    let updated = apply(&job.replace("/logs", "/tb"))?;
    assert_eq!(warnings(&updated).len(), 2, "stderr:\n{updated}");

    // A Task and a Workflow's job templates, by their own paths.
    let task = r#"apiVersion: rlinf.io/v1alpha1
kind: Task
metadata:
  name: inert-task
spec:
  agentType: Raw
  role: Actor
  downstreamName: old
  raw:
    entrypoint: ["true"]
"#;
    let stderr = apply(task)?;
    assert_eq!(
        warnings(&stderr)
            .iter()
            .map(|w| w.split(':').next().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["spec.downstreamName"],
        "stderr:\n{stderr}"
    );
    let workflow = r#"apiVersion: rlinf.io/v1alpha1
kind: Workflow
metadata:
  name: inert-flow
spec:
  jobTemplates:
    - name: train
      spec:
        tasks:
          - name: actor
            agentType: Raw
            role: Actor
            prepareScript: pip install x
            raw:
              entrypoint: ["true"]
"#;
    let stderr = apply(workflow)?;
    assert_eq!(
        warnings(&stderr)
            .iter()
            .map(|w| w.split(':').next().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["spec.jobTemplates[0].spec.tasks[0].prepareScript"],
        "stderr:\n{stderr}"
    );

    // Nothing inert: no warning at all.
    let plain = task
        .replace("inert-task", "plain-task")
        .replace("  downstreamName: old\n", "");
    let stderr = apply(&plain)?;
    assert!(warnings(&stderr).is_empty(), "stderr:\n{stderr}");
    Ok(())
}

/// RLark manifests leave `agentType` out: `kubectl apply` of a Job, a Task and a Workflow
/// without it succeeds, the API server stores the type its one runtime block names (shown by
/// `kubectl get -o yaml`), and a task with no runtime block or two is refused with an error
/// naming the blocks.
#[test]
fn kubectl_apply_infers_agent_type_from_the_runtime_block() -> Result<()> {
    if !kubectl_available() {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let data_dir = tempfile::tempdir()?;
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        data_dir.path(),
        &["--controllers=false"],
    )?;
    let k = Kubectl {
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        cache: tempfile::tempdir()?,
    };
    let job = r#"apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: no-agent-type
spec:
  tasks:
    - name: actor
      role: Actor
      raw:
        entrypoint: ["true"]
    - name: env
      role: Env
      docker:
        containers: [{name: main, image: busybox}]
    - name: rollout
      role: Rollout
      kubernetes:
        workload:
          kind: Deployment
          template:
            spec:
              containers: [{name: main, image: busybox}]
"#;
    k.ok_with_stdin(&["apply", "-f", "-"], job)?;
    let types = k.ok(&[
        "get",
        "jobs.rlinf.io",
        "no-agent-type",
        "-o",
        "jsonpath={.spec.tasks[*].agentType}",
    ])?;
    assert_eq!(types, "Raw Docker Kubernetes");
    let yaml = k.ok(&["get", "jobs.rlinf.io", "no-agent-type", "-o", "yaml"])?;
    assert!(yaml.contains("agentType: Docker"), "{yaml}");
    // Applying the same manifest again is a no-op, not a conflict with the defaulted field.
    k.ok_with_stdin(&["apply", "-f", "-"], job)?;

    let task = r#"apiVersion: rlinf.io/v1alpha1
kind: Task
metadata:
  name: no-agent-type-task
spec:
  role: Actor
  docker:
    containers: [{name: main, image: busybox}]
"#;
    k.ok_with_stdin(&["apply", "-f", "-"], task)?;
    let agent = k.ok(&[
        "get",
        "tasks.rlinf.io",
        "no-agent-type-task",
        "-o",
        "jsonpath={.spec.agentType}",
    ])?;
    assert_eq!(agent, "Docker");

    let workflow = r#"apiVersion: rlinf.io/v1alpha1
kind: Workflow
metadata:
  name: no-agent-type-flow
spec:
  jobTemplates:
    - name: train
      spec:
        tasks:
          - name: actor
            role: Actor
            raw:
              entrypoint: ["true"]
"#;
    k.ok_with_stdin(&["apply", "-f", "-"], workflow)?;
    let agent = k.ok(&[
        "get",
        "workflows.rlinf.io",
        "no-agent-type-flow",
        "-o",
        "jsonpath={.spec.jobTemplates[0].spec.tasks[0].agentType}",
    ])?;
    assert_eq!(agent, "Raw");

    // No block, and two blocks: refused, naming the field and the blocks.
    let refused = |manifest: &str| -> Result<String> {
        let mut child = k
            .command(&["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, manifest.as_bytes())?;
        let output = child.wait_with_output()?;
        if output.status.success() {
            bail!("kubectl apply accepted {manifest}");
        }
        Ok(String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let none = task.replace("no-agent-type-task", "no-block").replace(
        "  docker:\n    containers: [{name: main, image: busybox}]\n",
        "",
    );
    let stderr = refused(&none)?;
    assert!(
        stderr.contains("spec.agentType: Required value: agentType is not set and cannot be inferred: the spec has none of the runtime blocks kubernetes, docker, raw"),
        "{stderr}"
    );
    let two =
        task.replace("no-agent-type-task", "two-blocks") + "  raw:\n    entrypoint: [\"true\"]\n";
    let stderr = refused(&two)?;
    assert!(
        stderr.contains("several runtime blocks (docker, raw)"),
        "{stderr}"
    );
    // An explicit agentType that disagrees with the block is refused as before.
    let wrong = task
        .replace("no-agent-type-task", "wrong-type")
        .replace("  role: Actor\n", "  role: Actor\n  agentType: Raw\n");
    let stderr = refused(&wrong)?;
    assert!(
        stderr.contains(r#"agentType Raw requires the \"raw\" block and no other"#)
            || stderr.contains(r#"agentType Raw requires the "raw" block and no other"#),
        "{stderr}"
    );
    Ok(())
}

/// kubectl's own `--validate` (strict by default) reaches rlark's `fieldValidation`: a
/// misspelt field is refused with the server's words; `--validate=warn` creates the object
/// and kubectl prints the server's `Warning` (issue 18, item 1).
#[test]
fn kubectl_apply_refuses_unknown_fields_strictly() -> Result<()> {
    if !kubectl_available() {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let data_dir = tempfile::tempdir()?;
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        data_dir.path(),
        &["--controllers=false"],
    )?;
    let k = Kubectl {
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        cache: tempfile::tempdir()?,
    };
    let job = "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata:\n  name: typo\nspec:\n  \
               tasks:\n    - name: main\n      agentType: Raw\n      role: Actor\n      raw:\n        \
               entrypoint: [sleep, '1']\n        replcas: 3\n";
    let apply = |args: &[&str]| -> Result<Output> {
        let mut child = k
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(child.stdin.as_mut().context("stdin")?, job.as_bytes())?;
        Ok(child.wait_with_output()?)
    };
    let out = apply(&["apply", "-f", "-"])?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("Error from server (BadRequest)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("strict decoding error: unknown field \"spec.tasks[0].raw.replcas\""),
        "{stderr}"
    );
    let out = apply(&["apply", "-f", "-", "--validate=warn"])?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr,
        "Warning: unknown field \"spec.tasks[0].raw.replcas\"\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "job.rlinf.io/typo created\n"
    );
    Ok(())
}
