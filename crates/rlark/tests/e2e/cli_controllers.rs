//! `rlark cordon` / `uncordon`, `rlark describe` and `rlark controller-manager` as real
//! processes against a real `rlark server --controllers=false` process.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rlark_api::types::{AgentType, Node, NodePhase, NodeSpec, Task, TaskPhase, TaskPlacement};
use rlark_testkit::ServerProcess;

fn rlark() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlark"));
    cmd.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    cmd
}

fn run(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    rlark()
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .with_context(|| format!("run rlark {args:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

async fn create_node(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let mut node = Node::new(
        name,
        NodeSpec {
            agent_type: AgentType::Raw,
            unschedulable: false,
        },
    );
    node.metadata.namespace = Some(namespace.into());
    Api::<Node>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &node)
        .await?;
    Ok(())
}

async fn unschedulable(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<bool> {
    Ok(Api::<Node>::namespaced(client.clone(), namespace)
        .get(name)
        .await?
        .spec
        .unschedulable)
}

#[tokio::test]
async fn cordon_and_uncordon_find_the_node() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        dir.path(),
        &["--controllers=false"],
    )?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let client = server.client().await?;
    for ns in ["rlark-a", "rlark-b"] {
        create_namespace(&client, ns).await?;
        create_node(&client, ns, "gpu-0").await?;
    }
    create_node(&client, "rlark-a", "cpu-0").await?;

    // A unique name is found across namespaces.
    let out = run(&kubeconfig, &["cordon", "cpu-0"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cpu-0 cordoned"),
        "{}",
        text(&out.stdout)
    );
    assert!(unschedulable(&client, "rlark-a", "cpu-0").await?);
    let out = run(&kubeconfig, &["cordon", "cpu-0"])?;
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("already cordoned"),
        "{}",
        text(&out.stdout)
    );
    let out = run(&kubeconfig, &["uncordon", "rlark-a/cpu-0"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cpu-0 uncordoned"));
    assert!(!unschedulable(&client, "rlark-a", "cpu-0").await?);

    // An ambiguous name is refused, naming both candidates.
    let out = run(&kubeconfig, &["cordon", "gpu-0"])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("ambiguous"), "{stderr}");
    assert!(
        stderr.contains("rlark-a/gpu-0") && stderr.contains("rlark-b/gpu-0"),
        "{stderr}"
    );
    assert!(!unschedulable(&client, "rlark-a", "gpu-0").await?);

    // ... and accepted with a namespace, either way of giving it.
    let out = run(&kubeconfig, &["cordon", "gpu-0", "-n", "rlark-b"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(unschedulable(&client, "rlark-b", "gpu-0").await?);
    assert!(!unschedulable(&client, "rlark-a", "gpu-0").await?);
    let out = run(&kubeconfig, &["cordon", "rlark-a/gpu-0"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(unschedulable(&client, "rlark-a", "gpu-0").await?);

    // Unknown names fail clearly.
    let out = run(&kubeconfig, &["cordon", "tpu-9"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found in any namespace"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&kubeconfig, &["uncordon", "rlark-b/tpu-9"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("NotFound"),
        "{}",
        text(&out.stderr)
    );

    server.terminate()?;
    Ok(())
}

/// `rlark controller-manager` as a child; killed on drop.
struct ManagerProcess {
    child: Child,
    metrics: String,
}

impl ManagerProcess {
    fn spawn(kubeconfig: &Path, log: &Path, extra: &[&str]) -> anyhow::Result<ManagerProcess> {
        let log = std::fs::File::create(log)?;
        let mut child = rlark()
            .arg("controller-manager")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("spawn controller-manager")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("read the listener line")?;
        let metrics = line
            .split("http://")
            .nth(1)
            .map(|a| a.trim().to_string())
            .with_context(|| format!("no address in {line:?}"))?;
        Ok(ManagerProcess { child, metrics })
    }

    fn get(&self, path: &str) -> anyhow::Result<String> {
        let mut tcp = std::net::TcpStream::connect(&self.metrics)?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.metrics
        )?;
        let mut response = String::new();
        tcp.read_to_string(&mut response)?;
        Ok(response)
    }

    fn terminate(mut self) -> anyhow::Result<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("controller-manager did not exit after SIGTERM")
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn poll<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn controller_manager_process_and_describe_show_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("server");
    let server = ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        &data,
        &["--controllers=false"],
    )?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let client = server.client().await?;
    create_namespace(&client, "rlark-a").await?;
    // A Node that never heartbeats, with a Task placed on it.
    create_node(&client, "rlark-a", "cpu-0").await?;
    let mut task = Task::new(
        "ppo-actor",
        serde_json::from_value(serde_json::json!({
            "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["train"]}
        }))?,
    );
    task.metadata.namespace = Some("rlark-a".into());
    task.spec.placement = Some(TaskPlacement {
        cluster_id: "a".into(),
        nodes: vec!["cpu-0".into()],
    });
    let tasks: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
    tasks.create(&PostParams::default(), &task).await?;

    let manager = ManagerProcess::spawn(
        &kubeconfig,
        &dir.path().join("manager.log"),
        &[
            "--node-grace-period",
            "2s",
            "--node-check-interval",
            "200ms",
        ],
    )?;
    let health = manager.get("/healthz")?;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok"),
        "{health}"
    );

    let nodes: Api<Node> = Api::namespaced(client.clone(), "rlark-a");
    poll("node Offline", || async {
        let node = nodes.get("cpu-0").await?;
        Ok((node.status.and_then(|s| s.phase) == Some(NodePhase::Offline)).then_some(()))
    })
    .await?;
    poll("task Failed", || async {
        let task = tasks.get("ppo-actor").await?;
        Ok((task.status.and_then(|s| s.phase) == Some(TaskPhase::Failed)).then_some(()))
    })
    .await?;

    // describe: the Node with its Event, the Task with its NodeLost condition and Event.
    let describe = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        async move {
            poll("describe with events", || {
                let kubeconfig = kubeconfig.clone();
                async move {
                    let out = run(&kubeconfig, args)?;
                    if !out.status.success() {
                        bail!("describe failed: {}", text(&out.stderr));
                    }
                    let stdout = text(&out.stdout);
                    Ok((!stdout.contains("Events:        <none>")).then_some(stdout))
                }
            })
            .await
        }
    };
    let node = describe(&["describe", "nodes.rlinf.io", "cpu-0", "-n", "rlark-a"]).await?;
    assert!(node.contains("Name:          cpu-0"), "{node}");
    assert!(node.contains("Namespace:     rlark-a"), "{node}");
    assert!(node.contains("phase: Offline"), "{node}");
    assert!(node.contains("NodeHeartbeatLost"), "{node}");
    assert!(node.contains("NodeNotReady"), "{node}");
    assert!(node.contains("Warning"), "{node}");

    let task = describe(&["describe", "task", "ppo-actor", "-n", "rlark-a"]).await?;
    assert!(task.contains("Conditions:"), "{task}");
    let condition = task
        .lines()
        .find(|l| l.trim_start().starts_with("NodeLost"))
        .with_context(|| format!("no NodeLost condition row:\n{task}"))?;
    assert!(condition.contains("True"), "{condition}");
    assert!(task.contains("phase: Failed"), "{task}");
    let events: Vec<&str> = task
        .lines()
        .skip_while(|l| !l.starts_with("Events:"))
        .collect();
    assert!(events.iter().any(|l| l.contains("NodeLost")), "{task}");
    // Events are listed oldest first: the Task controller's Pending→Failed story ends with
    // the failure.
    assert!(
        events.last().is_some_and(|l| l.contains("Warning")),
        "{task}"
    );

    let out = run(&kubeconfig, &["describe", "task", "nope", "-n", "rlark-a"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("NotFound"),
        "{}",
        text(&out.stderr)
    );

    // Metrics of the process.
    let metrics = manager.get("/metrics")?;
    assert!(
        metrics
            .contains(r#"rlark_controller_reconciles_total{controller="node",result="success"}"#),
        "{metrics}"
    );
    assert!(metrics.contains("rlark_controller_leader 1"), "{metrics}");

    // SIGTERM: graceful exit, the Lease released for a successor.
    let status = manager.terminate()?;
    assert!(status.success(), "{status}");
    let lease = Api::<Lease>::namespaced(client.clone(), "default")
        .get("rlark-controller-manager")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.is_empty(), "lease still held by {holder}");

    server.terminate()?;
    Ok(())
}

#[tokio::test]
async fn rlark_server_runs_the_controllers_in_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = ServerProcess::spawn(Path::new(env!("CARGO_BIN_EXE_rlark")), dir.path())?;
    let client = server.client().await?;
    create_namespace(&client, "rlark-a").await?;
    let mut task = Task::new(
        "solo",
        serde_json::from_value(serde_json::json!({
            "agentType": "Raw", "role": "Env", "raw": {"entrypoint": ["sim"]}
        }))?,
    );
    task.metadata.namespace = Some("rlark-a".into());
    let tasks: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
    tasks.create(&PostParams::default(), &task).await?;
    let mut pod = rlark_api::types::Pod::new(
        "solo-0",
        rlark_api::types::PodSpec {
            task_name: Some("solo".into()),
            task_namespace: Some("rlark-a".into()),
            replica_index: Some(0),
            ..Default::default()
        },
    );
    pod.metadata.namespace = Some("rlark-a".into());
    let pods: Api<rlark_api::types::Pod> = Api::namespaced(client.clone(), "rlark-a");
    pods.create(&PostParams::default(), &pod).await?;
    pods.patch_status(
        "solo-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"status": {"phase": "Running", "node": "n1"}})),
    )
    .await?;

    // The in-process Task controller aggregates the Pod.
    poll("task Running", || async {
        let task = tasks.get("solo").await?;
        Ok((task.status.and_then(|s| s.phase) == Some(TaskPhase::Running)).then_some(()))
    })
    .await?;
    // Under leader election, as the server.
    let leases = Api::<Lease>::namespaced(client.clone(), "default");
    let holder = leases
        .get("rlark-controller-manager")
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.starts_with("rlark-server-"), "{holder}");

    // SIGTERM releases the Lease before the listener closes.
    let data_dir = server.data_dir().to_path_buf();
    let status = server.terminate()?;
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(data_dir.join("server.log"))?;
    assert!(log.contains("released leadership"), "{log}");
    Ok(())
}
