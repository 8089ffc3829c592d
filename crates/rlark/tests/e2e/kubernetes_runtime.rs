//! The Kubernetes runtime end to end: an in-process server with its controllers,
//! `rlark agent --agent-type Kubernetes --member-kubeconfig <kubesim>` (the built binary),
//! and a simulated member cluster ([`rlark_testkit::kubesim`]: rlark's API server in member
//! simulation plus a simulator playing the workload controllers and kubelets; a test
//! harness, not a kube-apiserver, docs/tasks.md).
//!
//! The rlark Nodes the scheduler places on are the agent's mirrors of the member nodes
//! (`member::nodes`); the test registers none itself.
//!
//! Every wait is bounded by [`DEADLINE`]; nothing asserts a duration.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job as MemberJob;
use k8s_openapi::api::core::v1::{Event, Pod as MemberPod, Secret, Service};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlark_api::types::{Job, JobPhase, Pod, PodPhase, Task, TaskPhase};
use rlark_testkit::TestServer;
use rlark_testkit::kubesim::{Extras, MemberCluster, MemberNode, Phase, Policy};
use rlark_testkit::real_agent::{DEADLINE, eventually, start_server_with_controllers};
use rlark_testkit::tunnel_agent::bootstrap_token;
use serde_json::{Value, json};
use tempfile::TempDir;

const RLARK: &str = env!("CARGO_BIN_EXE_rlark");
/// The Kubernetes agent's cluster.
const CLUSTER: &str = "k";
/// Its namespace.
const NS: &str = "rlark-k";
/// The member namespace (the agent's default).
const MNS: &str = "rlark-workloads";

/// `rlark agent --agent-type Kubernetes` as a child process; SIGKILLed if dropped.
struct KubeAgent {
    child: Option<Child>,
    log: PathBuf,
}

impl KubeAgent {
    fn spawn(
        server: &TestServer,
        dir: &Path,
        kubeconfig: &Path,
        join: Option<&Value>,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log = dir.with_extension("agent.log");
        let mut command = Command::new(RLARK);
        command
            .args(["agent", "--server", &server.url(), "--cluster-id", CLUSTER])
            .arg("--data-dir")
            .arg(dir)
            .args(["--node-name", "kube-agent", "--heartbeat-interval", "500ms"])
            .args(["--agent-type", "Kubernetes", "--net-mode", "auto"])
            .arg("--member-kubeconfig")
            .arg(kubeconfig)
            .args(extra);
        if let Some(token) = join {
            command
                .arg("--token")
                .arg(token["token"].as_str().context("token")?)
                .arg("--ca-hash")
                .arg(token["caHash"].as_str().context("caHash")?);
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = command
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start rlark agent")?;
        Ok(KubeAgent {
            child: Some(child),
            log,
        })
    }

    /// Send `signal` and wait (bounded) for the exit.
    async fn end(mut self, signal: Signal) -> anyhow::Result<()> {
        let mut child = self.child.take().context("no agent process")?;
        kill(Pid::from_raw(i32::try_from(child.id())?), signal)?;
        let until = tokio::time::Instant::now() + DEADLINE;
        loop {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                let _ = child.kill();
                bail!(
                    "the agent did not exit after {signal}; log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KubeAgent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The control plane and a member cluster with `nodes` (agents are started by each test).
struct World {
    server: TestServer,
    _server_dir: TempDir,
    admin: kube::Client,
    member: MemberCluster,
    mclient: kube::Client,
    scratch: TempDir,
    token: Value,
}

impl World {
    async fn start(nodes: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(nodes, Extras::default()).await
    }

    /// [`Self::start`] with a member cluster that serves `extras` too.
    async fn start_with(nodes: &[&str], extras: Extras) -> anyhow::Result<Self> {
        let (server, server_dir) = start_server_with_controllers().await?;
        let admin = server.client().await?;
        let member = MemberCluster::start_with(extras).await?;
        for node in nodes {
            member.sim().add_node(MemberNode::new(node)).await?;
        }
        let mclient = member.client().await?;
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
            )
            .await?;
        let token = bootstrap_token(&server, CLUSTER).await?;
        Ok(World {
            server,
            _server_dir: server_dir,
            admin,
            member,
            mclient,
            scratch: tempfile::tempdir()?,
            token,
        })
    }

    fn agent(&self, extra: &[&str]) -> anyhow::Result<KubeAgent> {
        KubeAgent::spawn(
            &self.server,
            &self.scratch.path().join("agent"),
            self.member.kubeconfig_path(),
            Some(&self.token),
            extra,
        )
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.member.stop().await?;
        self.server.stop().await
    }

    async fn create_job(&self, name: &str, tasks: Value) -> anyhow::Result<()> {
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": tasks},
        }))?;
        Api::<Job>::all(self.admin.clone())
            .create(&PostParams::default(), &job)
            .await?;
        Ok(())
    }

    async fn task_phase(&self, task: &str, phase: TaskPhase) -> anyhow::Result<Task> {
        let api: Api<Task> = Api::namespaced(self.admin.clone(), NS);
        eventually(&format!("task {task} {phase:?}"), || async {
            Ok(api
                .get_opt(task)
                .await?
                .filter(|t| t.status.as_ref().and_then(|s| s.phase) == Some(phase)))
        })
        .await
    }

    /// The member Pods of `task` (by rlark's task-name label).
    async fn member_pods(&self, task: &str) -> anyhow::Result<Vec<MemberPod>> {
        let api: Api<MemberPod> = Api::namespaced(self.mclient.clone(), MNS);
        Ok(api
            .list(&ListParams::default().labels(&format!("rlark.io/task-name={task}")))
            .await?
            .items)
    }

    /// Wait until `task` has `n` member Pods in phase `phase`; their names, sorted.
    async fn wait_member_pods(
        &self,
        task: &str,
        n: usize,
        phase: &str,
    ) -> anyhow::Result<Vec<String>> {
        eventually(&format!("{n} member pods of {task} {phase}"), || async {
            let pods = self.member_pods(task).await?;
            let mut names: Vec<String> = pods
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| p.name_any())
                .collect();
            names.sort();
            Ok((names.len() == n && pods.len() == n).then_some(names))
        })
        .await
    }

    /// `rlark ARGS` against the control plane, with `stdin` (else none); bounded by
    /// [`DEADLINE`].
    async fn rlark(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> anyhow::Result<std::process::Output> {
        use tokio::io::AsyncWriteExt as _;
        let mut child = tokio::process::Command::new(RLARK)
            .env("KUBECONFIG", self.server.kubeconfig_path())
            .env_remove("RUST_LOG")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start rlark")?;
        let mut input = child.stdin.take().context("stdin")?;
        if let Some(bytes) = stdin {
            input.write_all(bytes).await?;
        }
        drop(input);
        tokio::time::timeout(DEADLINE, child.wait_with_output())
            .await
            .with_context(|| format!("rlark {args:?} did not end"))?
            .context("rlark")
    }

    async fn rlark_pod(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Pod) -> bool,
    ) -> anyhow::Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.admin.clone(), NS);
        eventually(&format!("rlark pod {name} {what}"), || async {
            Ok(api.get_opt(name).await?.filter(|p| pred(p)))
        })
        .await
    }
}

fn phase_of(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

/// A task running `kind` with `replicas` of one container `main`.
fn kube_task(name: &str, kind: &str, replicas: i32) -> Value {
    json!({
        "name": name,
        "agentType": "Kubernetes",
        "role": "Actor",
        "kubernetes": {"workload": {
            "kind": kind,
            "replicas": replicas,
            "template": {"spec": {"containers": [{"name": "main", "image": "rlinf/rlinf:dev"}]}},
        }},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_job_succeeds_and_a_failed_container_fails_the_task_with_its_exit_code()
-> anyhow::Result<()> {
    let world = World::start(&["m-0"]).await?;
    let agent = world.agent(&[])?;
    world
        .create_job("batch", json!([kube_task("main", "Job", 1)]))
        .await?;
    world
        .create_job("crash", json!([kube_task("main", "Job", 1)]))
        .await?;

    // A batch Job on the member cluster, its Pod mirrored with its member Pod and node.
    let pods = world.wait_member_pods("batch-main", 1, "Running").await?;
    let jobs: Api<MemberJob> = Api::namespaced(world.mclient.clone(), MNS);
    let job = jobs.get("batch-main").await?;
    assert_eq!(
        job.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("rlark")
    );
    let spec = job.spec.clone().context("job spec")?;
    assert_eq!(spec.backoff_limit, Some(0));
    let env: Vec<String> = spec.template.spec.clone().context("pod spec")?.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    assert!(env.contains(&"RLARK_TASK".to_string()), "{env:?}");

    // The task token: a Secret of the run, owned by the Job (so it cascades), read by
    // every container (RLARK_TOKEN by secretKeyRef, the CA mounted as RLARK_CA_FILE); its
    // token and CA reach the control plane's report endpoint.
    let pod_spec = spec.template.spec.clone().context("pod spec")?;
    let token_ref = pod_spec.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "RLARK_TOKEN")
        .and_then(|e| e.value_from.as_ref()?.secret_key_ref.clone())
        .with_context(|| {
            format!(
                "RLARK_TOKEN is not a secretKeyRef: {:?}",
                pod_spec.containers[0].env
            )
        })?;
    assert_eq!(
        (token_ref.name.as_str(), token_ref.key.as_str()),
        ("batch-main-rlark-token", "token")
    );
    assert!(
        pod_spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/var/run/rlark" && m.name == "rlark-task-token"),
        "{:?}",
        pod_spec.containers[0].volume_mounts
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(world.mclient.clone(), MNS);
    let secret = eventually("the token secret of batch-main", || async {
        Ok(secrets.get_opt("batch-main-rlark-token").await?)
    })
    .await?;
    let owners = secret.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners.iter().any(|o| o.kind == "Job"
            && o.name == "batch-main"
            && Some(&o.uid) == job.metadata.uid.as_ref()),
        "{owners:?}"
    );
    let data = secret.data.clone().unwrap_or_default();
    let token = String::from_utf8(data.get("token").context("no token")?.0.clone())?;
    let ca = data.get("ca.crt").context("no ca.crt")?.0.clone();
    let ca_path = world.scratch.path().join("member-ca.crt");
    std::fs::write(&ca_path, &ca)?;
    let kubeconfig = world.scratch.path().join("task-token.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \"{}\"\n    \
             certificate-authority: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: t\n\
             current-context: c\nusers:\n- name: t\n  user: {{token: \"{token}\"}}\n",
            world.server.url(),
            ca_path.display()
        ),
    )?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &Default::default(),
    )
    .await?;
    let as_task = kube::Client::try_from(config)?;
    let report = http::Request::post(format!(
        "/rlark/v1/namespaces/{NS}/tasks/batch-main/reports"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(
        &json!({"type": "reward", "value": 1.5, "step": 1}),
    )?)?;
    as_task
        .request_text(report)
        .await
        .context("a report with the member Pods' token and CA")?;
    let forged = http::Request::post(format!(
        "/rlark/v1/namespaces/{NS}/tasks/crash-main/reports"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(&json!({"type": "reward", "value": 1}))?)?;
    match as_task.request_text(forged).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => bail!("a report to another task with this token: {other:?}"),
    }
    let mirrored = world
        .rlark_pod(&pods[0], "Running", |p| {
            phase_of(p) == Some(PodPhase::Running)
        })
        .await?;
    assert_eq!(
        mirrored.annotations().get("rlark.io/member-pod"),
        Some(&format!("{MNS}/{}", pods[0]))
    );
    assert_eq!(
        mirrored.status.as_ref().and_then(|s| s.node.as_deref()),
        Some("m-0")
    );
    world.task_phase("batch-main", TaskPhase::Running).await?;

    // `rlark logs` of the mirrored Pod: CLI → server → tunnel → this agent → member API.
    world
        .member
        .sim()
        .write_log(MNS, &pods[0], "main", "step 1\nstep 2\n");
    let out = Command::new(env!("CARGO_BIN_EXE_rlark"))
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .args(["logs", &format!("pod/{}", pods[0]), "-n", NS, "--tail", "1"])
        .arg("--kubeconfig")
        .arg(world.server.kubeconfig_path())
        .output()?;
    ensure!(
        out.status.success(),
        "rlark logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "step 2\n");

    // `rlark exec` of the mirrored Pod: CLI → server → tunnel → this agent → the member
    // API's pods/exec (the simulation runs the command as a local process in a directory
    // of the Pod's own); output, stdin, `-c` and the exit code come back.
    let pod_ref = format!("pod/{}", pods[0]);
    let out = world
        .rlark(&["exec", &pod_ref, "-n", NS, "--", "echo", "hi"], None)
        .await?;
    ensure!(
        out.status.success(),
        "rlark exec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let out = world
        .rlark(
            &[
                "exec",
                &pod_ref,
                "-n",
                NS,
                "-c",
                "main",
                "--",
                "sh",
                "-c",
                "echo oops >&2; exit 3",
            ],
            None,
        )
        .await?;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    let out = world
        .rlark(
            &[
                "exec",
                "-i",
                &pod_ref,
                "-n",
                NS,
                "--",
                "sh",
                "-c",
                "cat > in.txt; cat in.txt",
            ],
            Some(b"through stdin\n"),
        )
        .await?;
    ensure!(
        out.status.success(),
        "rlark exec -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through stdin\n");
    assert_eq!(
        std::fs::read_to_string(
            world
                .member
                .exec()
                .dir(MNS, &pods[0], "main")
                .join("in.txt")
        )?,
        "through stdin\n"
    );
    let out = world
        .rlark(
            &["exec", &pod_ref, "-n", NS, "-c", "nope", "--", "true"],
            None,
        )
        .await?;
    assert!(!out.status.success());
    let refusal = String::from_utf8_lossy(&out.stderr);
    assert!(refusal.contains("container nope is not valid"), "{refusal}");

    // Completed: the Task and the Job succeed.
    world
        .member
        .sim()
        .set_pod_phase(MNS, &pods[0], Phase::Succeeded)
        .await?;
    world.task_phase("batch-main", TaskPhase::Succeeded).await?;
    let jobs_api: Api<Job> = Api::all(world.admin.clone());
    eventually("job batch Succeeded", || async {
        let job = jobs_api.get("batch").await?;
        Ok((job.status.and_then(|s| s.phase) == Some(JobPhase::Succeeded)).then_some(()))
    })
    .await?;

    // A failed container fails its Task with the exit code.
    let crash = world.wait_member_pods("crash-main", 1, "Running").await?;
    world
        .member
        .sim()
        .set_pod_phase(MNS, &crash[0], Phase::Failed { exit_code: 3 })
        .await?;
    let task = world.task_phase("crash-main", TaskPhase::Failed).await?;
    let message = task.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains('3'), "{message}");
    let pod = world
        .rlark_pod(&crash[0], "Failed", |p| {
            phase_of(p) == Some(PodPhase::Failed)
        })
        .await?;
    assert_eq!(pod.status.and_then(|s| s.exit_code), Some(3));

    // A deleted Job: its workloads go, and so do the mirrored Pods.
    Api::<Job>::all(world.admin.clone())
        .delete("batch", &Default::default())
        .await?;
    eventually("the member Job of a deleted task is deleted", || async {
        Ok(jobs.get_opt("batch-main").await?.is_none().then_some(()))
    })
    .await?;
    let rlark_pods: Api<Pod> = Api::namespaced(world.admin.clone(), NS);
    eventually("the mirrored pod of a deleted task is deleted", || async {
        Ok(rlark_pods.get_opt(&pods[0]).await?.is_none().then_some(()))
    })
    .await?;

    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_resume_and_adoption_after_agent_kill_9() -> anyhow::Result<()> {
    let world = World::start(&["m-0", "m-1"]).await?;
    let agent = world.agent(&[])?;
    world
        .create_job("ppo", json!([kube_task("actor", "StatefulSet", 2)]))
        .await?;
    let pods = world.wait_member_pods("ppo-actor", 2, "Running").await?;
    assert_eq!(pods, ["ppo-actor-0", "ppo-actor-1"]);
    world.task_phase("ppo-actor", TaskPhase::Running).await?;
    let sts: Api<StatefulSet> = Api::namespaced(world.mclient.clone(), MNS);
    let uid = sts.get("ppo-actor").await?.uid();

    // kill -9 and a new agent: the StatefulSet is adopted, not created again. Its token
    // Secret goes missing meanwhile (as when its create failed before the kill): the new
    // agent finds it missing and creates it.
    agent.end(Signal::SIGKILL).await?;
    let secrets: Api<Secret> = Api::namespaced(world.mclient.clone(), MNS);
    secrets
        .delete("ppo-actor-rlark-token", &DeleteParams::default())
        .await?;
    let agent = world.agent(&[])?;
    let secret = eventually("the token Secret again", || async {
        Ok(secrets.get_opt("ppo-actor-rlark-token").await?)
    })
    .await?;
    ensure!(
        secret.data.is_some_and(|d| d.contains_key("token")),
        "the Secret holds a token"
    );
    // The new agent is at work once it reflects a change: stop the Job.
    Api::<Job>::all(world.admin.clone())
        .patch(
            "ppo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    eventually("the StatefulSet is scaled to 0", || async {
        let s = sts.get("ppo-actor").await?;
        Ok((s.spec.as_ref().and_then(|s| s.replicas) == Some(0)).then_some(()))
    })
    .await?;
    assert_eq!(
        sts.get("ppo-actor").await?.uid(),
        uid,
        "adopted, not recreated"
    );
    let all = sts.list(&ListParams::default()).await?.items;
    assert_eq!(all.len(), 1, "no duplicate workload");
    world.task_phase("ppo-actor", TaskPhase::Stopped).await?;
    eventually("no member pods while stopped", || async {
        Ok(world
            .member_pods("ppo-actor")
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;

    // Resume.
    Api::<Job>::all(world.admin.clone())
        .patch(
            "ppo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": false}})),
        )
        .await?;
    world.wait_member_pods("ppo-actor", 2, "Running").await?;
    world.task_phase("ppo-actor", TaskPhase::Running).await?;
    assert_eq!(sts.get("ppo-actor").await?.uid(), uid);

    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_override_is_corrected_and_an_invalid_object_fails_with_the_member_message()
-> anyhow::Result<()> {
    let world = World::start(&["m-0"]).await?;
    let agent = world.agent(&[])?;
    let template = |image: &str| {
        json!({
            "name": "agent",
            "agentType": "Kubernetes",
            "role": "Env",
            "input": {"question": "2+2"},
            "kubernetes": {"jobTemplate": format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {{{{ job_name }}}}}}\nspec:\n  backoffLimit: 6\n  template:\n    spec:\n      restartPolicy: OnFailure\n      containers:\n        - name: agent\n          {image}\n          env:\n            - {{name: QUESTION, value: {{{{ input.question | yaml_escape }}}}}}\n"
            )},
        })
    };
    world
        .create_job("calc", json!([template("image: calc-x-agent:dev")]))
        .await?;
    // No image: the member API refuses the Job (422).
    world.create_job("noimage", json!([template("")])).await?;

    let jobs: Api<MemberJob> = Api::namespaced(world.mclient.clone(), MNS);
    let job = eventually("the rendered Job", || async {
        Ok(jobs.get_opt("calc-agent").await?)
    })
    .await?;
    let spec = job.spec.context("spec")?;
    assert_eq!(spec.backoff_limit, Some(0), "forced");
    let pod = spec.template.spec.context("pod spec")?;
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"), "forced");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "QUESTION" && e.value.as_deref() == Some("2+2")),
        "{env:?}"
    );
    let events: Api<Event> = Api::namespaced(world.admin.clone(), NS);
    let warning = eventually("the Warning event on the task", || async {
        let list = events.list(&ListParams::default()).await?.items;
        Ok(list.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("calc-agent")
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("FieldsCorrected")
        }))
    })
    .await?;
    let message = warning.message.unwrap_or_default();
    assert!(
        message.contains("spec.backoffLimit") && message.contains("restartPolicy"),
        "{message}"
    );
    world.wait_member_pods("calc-agent", 1, "Running").await?;

    let task = world.task_phase("noimage-agent", TaskPhase::Failed).await?;
    let message = task.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("422") && message.contains("image"),
        "{message}"
    );
    ensure!(jobs.get_opt("noimage-agent").await?.is_none());

    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

/// The creation limit at its default (100 a minute): 150 Tasks → 100 workloads at once,
/// the other 50 wait `Pending` (never `Failed`) and are created once the window moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_fifty_creates_in_a_minute_are_deferred_not_failed() -> anyhow::Result<()> {
    const TASKS: usize = 150;
    const LIMIT: usize = 100;
    let world = World::start(&["m-0"]).await?;
    let agent = world.agent(&[])?;
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| kube_task(&format!("t{i}"), "Job", 1))
        .collect();
    world.create_job("burst", Value::Array(tasks)).await?;
    let jobs: Api<MemberJob> = Api::namespaced(world.mclient.clone(), MNS);
    let count = || async { anyhow::Ok(jobs.list(&ListParams::default()).await?.items.len()) };
    // Bounded generously: 150 Tasks placed and 100 workloads created while the other
    // tests of this binary run beside it.
    rlark_testkit::wait::eventually_within(
        Duration::from_secs(180),
        "100 Jobs created",
        || async { Ok((count().await? >= LIMIT).then_some(())) },
    )
    .await?;
    // The others wait: Pending, not Failed.
    let task_api: Api<Task> = Api::namespaced(world.admin.clone(), NS);
    let listed = task_api.list(&ListParams::default()).await?.items;
    ensure!(listed.len() == TASKS, "{} tasks", listed.len());
    for task in &listed {
        let phase = task.status.as_ref().and_then(|s| s.phase);
        ensure!(
            phase != Some(TaskPhase::Failed),
            "{} failed",
            task.name_any()
        );
    }
    // A minute after the first creations the rest are created.
    rlark_testkit::wait::eventually_within(
        Duration::from_secs(180),
        "all 150 Jobs created",
        || async { Ok((count().await? == TASKS).then_some(())) },
    )
    .await?;
    // The member's creation times (whole seconds) show both halves of the promise. The
    // agent counts a creation when it sends it and the member stamps it when it stores
    // it, a request's latency later, so the window checked is 50 s, not 60: no 50 s saw
    // more than 100 creations, and the last came at least 50 s after the first (without
    // the limit all 150 would come within seconds).
    let mut created: Vec<i64> = jobs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|j| {
            j.metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second())
        })
        .collect();
    created.sort_unstable();
    for (i, start) in created.iter().enumerate() {
        let in_window = created[i..].iter().take_while(|t| **t < start + 50).count();
        ensure!(
            in_window <= LIMIT,
            "{in_window} creations within 50 s from {start}: {created:?}"
        );
    }
    let spread = created.last().copied().unwrap_or_default() - created[0];
    ensure!(spread >= 50, "all creations within {spread} s: {created:?}");
    rlark_testkit::wait::eventually_within(Duration::from_secs(180), "every task runs", || async {
        let tasks = task_api.list(&ListParams::default()).await?.items;
        let running = tasks
            .iter()
            .filter(|t| t.status.as_ref().and_then(|s| s.phase) == Some(TaskPhase::Running))
            .count();
        ensure!(
            !tasks
                .iter()
                .any(|t| t.status.as_ref().and_then(|s| s.phase) == Some(TaskPhase::Failed)),
            "a task failed"
        );
        Ok((running == TASKS).then_some(()))
    })
    .await?;
    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

/// A Pod waiting on its image: the pull shows on the rlark Pod and on the Task (`Pulling`,
/// then `Done` with the size and speed the kubelet's `Pulled` Event gives), and is gone
/// once the Pod runs.
/// `tensorBoardDir` on a Kubernetes task: the member Pod gets the TensorBoard native sidecar
/// (the agent's `--tensorboard-image`, an `emptyDir` at the directory in both containers),
/// and the rlark Pod reports its port once the sidecar runs, which `rlark describe` links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensor_board_dir_gets_a_sidecar_and_its_port_on_the_pod() -> anyhow::Result<()> {
    let world = World::start(&["m-0"]).await?;
    let agent = world.agent(&["--tensorboard-image", "registry.example/tb:2"])?;
    let mut task = kube_task("w", "StatefulSet", 1);
    task["tensorBoardDir"] = json!("/work/runs");
    world.create_job("tb", json!([task])).await?;
    world.task_phase("tb-w", TaskPhase::Running).await?;
    let pod = world
        .rlark_pod("tb-w-0", "with its TensorBoard", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.tensor_board.as_ref())
                .is_some_and(|t| t.port.is_some())
        })
        .await?;
    let board = pod
        .status
        .and_then(|s| s.tensor_board)
        .context("tensorBoard")?;
    assert_eq!(board.port, Some(6006));
    assert_eq!(board.log_dir.as_deref(), Some("/work/runs"));

    let sets: Api<StatefulSet> = Api::namespaced(world.mclient.clone(), MNS);
    let set = sets.get("tb-w").await?;
    let pod_spec = set
        .spec
        .and_then(|s| s.template.spec)
        .context("pod template")?;
    let sidecar = pod_spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "tensorboard")
        .context("no tensorboard sidecar")?;
    assert_eq!(sidecar.image.as_deref(), Some("registry.example/tb:2"));
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    let main = &pod_spec.containers[0];
    assert!(
        main.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/work/runs"),
        "the main container writes where the sidecar reads: {:?}",
        main.volume_mounts
    );

    let out = world
        .rlark(&["describe", "task/tb-w", "-n", NS], None)
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/rlark/v1/namespaces/rlark-k/tasks/tb-w/proxy/6006/"),
        "{text}"
    );
    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pulls_show_on_the_pod_and_the_task_while_pending() -> anyhow::Result<()> {
    const IMAGE: &str = "rlinf/rlinf:dev";
    let world = World::start(&["m-0"]).await?;
    world.member.sim().set_policy(Policy::Hold);
    let agent = world.agent(&[])?;
    world
        .create_job("pull", json!([kube_task("w", "StatefulSet", 1)]))
        .await?;
    let pulls = |pod: &Pod| {
        pod.status
            .as_ref()
            .map(|s| s.pull_progress.clone())
            .unwrap_or_default()
    };
    let pod = world
        .rlark_pod("pull-w-0", "pulling its image", |p| {
            let p = pulls(p);
            p.len() == 1 && p[0].image == IMAGE && p[0].status == "Pulling"
        })
        .await?;
    assert_eq!(phase_of(&pod), Some(PodPhase::Pending));
    let task_api: Api<Task> = Api::namespaced(world.admin.clone(), NS);
    let task_pulls = |name: &'static str| {
        let api = task_api.clone();
        async move {
            anyhow::Ok(
                api.get(name)
                    .await?
                    .status
                    .map(|s| s.pull_progress)
                    .unwrap_or_default(),
            )
        }
    };
    eventually("the Task shows the pull", || async {
        let p = task_pulls("pull-w").await?;
        Ok((p.len() == 1 && p[0].status == "Pulling").then_some(()))
    })
    .await?;

    world
        .member
        .sim()
        .pull_image(MNS, "pull-w-0", IMAGE, 50_000_000, Duration::from_secs(2))
        .await?;
    let pod = world
        .rlark_pod("pull-w-0", "with its image pulled", |p| {
            pulls(p).first().is_some_and(|p| p.status == "Done")
        })
        .await?;
    let done = &pulls(&pod)[0];
    assert_eq!((done.downloaded, done.total), (50_000_000, 50_000_000));
    assert!((done.speed - 25_000_000.0).abs() < 1.0, "{}", done.speed);
    eventually("the Task shows it done", || async {
        let p = task_pulls("pull-w").await?;
        Ok((p.len() == 1 && p[0].status == "Done" && p[0].total == 50_000_000).then_some(()))
    })
    .await?;

    world
        .member
        .sim()
        .set_pod_phase(MNS, "pull-w-0", Phase::Running)
        .await?;
    world.task_phase("pull-w", TaskPhase::Running).await?;
    world
        .rlark_pod("pull-w-0", "running, no pulls", |p| {
            phase_of(p) == Some(PodPhase::Running) && pulls(p).is_empty()
        })
        .await?;
    eventually("the Task lists no pull once it runs", || async {
        Ok(task_pulls("pull-w").await?.is_empty().then_some(()))
    })
    .await?;
    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_format_job_runs_on_a_kubernetes_cluster_and_a_raw_cluster_at_once()
-> anyhow::Result<()> {
    let world = World::start(&["gpu-0", "gpu-1"]).await?;
    let agent = world.agent(&[])?;
    let raw_dir = tempfile::tempdir()?;
    let raw = rlark_testkit::real_agent::start_agent_with(
        &world.server,
        "r",
        "raw-0",
        raw_dir.path(),
        vec![RLARK.into(), "supervise".into()],
    )
    .await?;
    let mut actor = kube_task("actor", "StatefulSet", 2);
    actor["head"] = json!(true);
    world
        .create_job(
            "rl",
            json!([
                actor,
                kube_task("rollout", "Deployment", 1),
                {
                    "name": "env",
                    "agentType": "Raw",
                    "role": "Env",
                    "raw": {"entrypoint": ["/bin/sh", "-c", "echo env $RLARK_TASK; sleep 30"]},
                },
            ]),
        )
        .await?;
    world.wait_member_pods("rl-actor", 2, "Running").await?;
    world.wait_member_pods("rl-rollout", 1, "Running").await?;
    let services: Api<Service> = Api::namespaced(world.mclient.clone(), MNS);
    let head = eventually("the Ray head Service", || async {
        Ok(services.get_opt("rl-actor-ray-head").await?)
    })
    .await?;
    assert_eq!(
        head.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("None"),
        "headless"
    );
    let sts: Api<StatefulSet> = Api::namespaced(world.mclient.clone(), MNS);
    let actor_sts = sts.get("rl-actor").await?;
    assert_eq!(
        actor_sts.spec.and_then(|s| s.service_name).as_deref(),
        Some("rl-actor-ray-head")
    );
    let deployments: Api<Deployment> = Api::namespaced(world.mclient.clone(), MNS);
    ensure!(deployments.get_opt("rl-rollout").await?.is_some());
    world.task_phase("rl-actor", TaskPhase::Running).await?;
    world.task_phase("rl-rollout", TaskPhase::Running).await?;
    let raw_pods: Api<Pod> = Api::namespaced(world.admin.clone(), "rlark-r");
    eventually("the raw task runs on the raw cluster", || async {
        Ok(raw_pods
            .get_opt("rl-env-0")
            .await?
            .filter(|p| phase_of(p) == Some(PodPhase::Running)))
    })
    .await?;
    let jobs_api: Api<Job> = Api::all(world.admin.clone());
    eventually("job rl Running", || async {
        let job = jobs_api.get("rl").await?;
        Ok((job.status.and_then(|s| s.phase) == Some(JobPhase::Running)).then_some(()))
    })
    .await?;

    raw.stop().await?;
    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_agent_without_a_member_cluster_does_not_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let run = |extra: &[&str]| {
        Command::new(RLARK)
            .args([
                "agent",
                "--server",
                "https://127.0.0.1:1",
                "--cluster-id",
                "k",
            ])
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--node-name", "n", "--agent-type", "Kubernetes"])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .output()
    };
    let out = run(&[])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--member-kubeconfig"), "{err}");
    let out = run(&["--member-kubeconfig", "/nonexistent/kubeconfig"])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    // A member API that does not answer: named in the error.
    let member = MemberCluster::start().await?;
    let kubeconfig = dir.path().join("member.kubeconfig");
    std::fs::copy(member.kubeconfig_path(), &kubeconfig)?;
    let url = member.server().url();
    member.stop().await?;
    let out = run(&["--member-kubeconfig", kubeconfig.to_str().context("path")?])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not answer") && err.contains(url.trim_end_matches('/')),
        "{err}"
    );
    let out = run(&["--member-kubeconfig", "/x", "--max-creates-per-minute", "0"])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-creates-per-minute"), "{err}");
    Ok(())
}

/// OpenKruise's CloneSet: refused at placement with the missing CRD named where the member
/// cluster does not serve it; where it does, created as `apps.kruise.io/v1alpha1`
/// CloneSet, its Pods mirrored, stopped by scaling to 0, deleted with the Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloneset_runs_only_where_the_member_serves_openkruise() -> anyhow::Result<()> {
    let clonesets = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "CloneSet"),
        "clonesets",
    );
    let job_condition = |admin: kube::Client, job: &'static str, needle: &'static str| async move {
        eventually(&format!("job {job} says {needle:?}"), || async {
            let job = Api::<Job>::all(admin.clone()).get(job).await?;
            let said = job
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.message.contains(needle))
                .map(|c| c.message.clone());
            Ok(said)
        })
        .await
    };

    // Without OpenKruise: Unschedulable, naming the CRD and what to do.
    let world = World::start(&["m-0"]).await?;
    let agent = world.agent(&[])?;
    eventually("the member node mirrored", || async {
        Ok(
            Api::<rlark_api::types::Node>::namespaced(world.admin.clone(), NS)
                .get_opt("m-0")
                .await?
                .filter(|n| !n.labels().contains_key("rlark.io/serves-cloneset")),
        )
    })
    .await?;
    world
        .create_job("clones", json!([kube_task("rollout", "CloneSet", 2)]))
        .await?;
    let message = job_condition(
        world.admin.clone(),
        "clones",
        "does not serve apps.kruise.io/v1alpha1 CloneSet",
    )
    .await?;
    ensure!(
        message.contains("install OpenKruise on one and restart its agent"),
        "{message}"
    );
    agent.end(Signal::SIGTERM).await?;
    world.stop().await?;

    // With OpenKruise: created as a CloneSet and run.
    let world = World::start_with(&["m-0", "m-1"], Extras { openkruise: true }).await?;
    let agent = world.agent(&[])?;
    eventually("the member nodes labelled as serving CloneSets", || async {
        let nodes = Api::<rlark_api::types::Node>::namespaced(world.admin.clone(), NS)
            .list(&ListParams::default().labels("rlark.io/serves-cloneset=true"))
            .await?;
        Ok((nodes.items.len() == 2).then_some(()))
    })
    .await?;
    world
        .create_job("clones", json!([kube_task("rollout", "CloneSet", 2)]))
        .await?;
    let pods = world
        .wait_member_pods("clones-rollout", 2, "Running")
        .await?;
    world
        .task_phase("clones-rollout", TaskPhase::Running)
        .await?;
    let api: Api<kube::core::DynamicObject> =
        Api::namespaced_with(world.mclient.clone(), MNS, &clonesets);
    let created = api.get("clones-rollout").await?;
    let created_json = serde_json::to_value(&created)?;
    assert_eq!(created_json["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(created_json["spec"]["replicas"], 2);
    for pod in &pods {
        ensure!(pod.starts_with("clones-rollout-"), "{pod}");
        world
            .rlark_pod(pod, "mirrored Running", |p| {
                phase_of(p) == Some(PodPhase::Running)
            })
            .await?;
    }

    // Stop: scaled to 0, the Task Stopped; the same CloneSet (not recreated).
    Api::<Job>::all(world.admin.clone())
        .patch(
            "clones",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    world
        .task_phase("clones-rollout", TaskPhase::Stopped)
        .await?;
    let stopped = serde_json::to_value(api.get("clones-rollout").await?)?;
    assert_eq!(stopped["spec"]["replicas"], 0);
    assert_eq!(stopped["metadata"]["uid"], created_json["metadata"]["uid"]);

    // Deleting the Job deletes the CloneSet and its Pods.
    Api::<Job>::all(world.admin.clone())
        .delete("clones", &DeleteParams::default())
        .await?;
    eventually("the CloneSet deleted", || async {
        Ok(api.get_opt("clones-rollout").await?.is_none().then_some(()))
    })
    .await?;
    agent.end(Signal::SIGTERM).await?;
    world.stop().await
}
