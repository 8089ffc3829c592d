//! `tensorBoardDir` on a raw task, end to end with the real TensorBoard (`pip install
//! tensorboard`; scripts/test.sh installs it): an in-process server with a real agent runs
//! the task, the agent starts TensorBoard beside the replica and reports its port in the
//! Pod's `status.tensorBoard`; through the task proxy
//! (`/rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/`) TensorBoard's own page and its
//! `data/environment` answer (the log directory resolved against the replica's working
//! directory); `rlark describe task/NAME` prints the link; deleting the Job stops it.
//! Without `tensorboard` in the replica's PATH the task runs anyway, and the Pod status, a
//! Warning Event on the Task and `rlark describe` say why no TensorBoard runs.
//! An agent killed with SIGKILL leaves its TensorBoard running; the next agent adopts the
//! replica, kills it and starts a new one. A replica that restarts reports its TensorBoard status
//! again at each start, with one Event per replica.
//!
//! Without TensorBoard installed the first test is skipped, or fails under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1` (`tests/support/missing_tool.rs`). Every wait is bounded by
//! `rlark_testkit::wait::DEADLINE`.

use crate::missing_tool;
use kube::api::{Api, DeleteParams, PostParams};
use rlark_api::types::{Job, Pod, PodPhase, PodTensorBoard};
use rlark_testkit::real_agent::{Harness, NAMESPACE, run_cli, text};
use rlark_testkit::wait::eventually;
use serde_json::json;

/// Whether `tensorboard` is an executable in this process's PATH.
fn tensorboard_installed() -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join("tensorboard")).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
    })
}

async fn create_job(h: &Harness, name: &str, task: serde_json::Value) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [task]},
    }))?;
    Api::<Job>::all(h.admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// The Pod's `status.tensorBoard`, once the agent reported one.
async fn tensorboard_status(h: &Harness, pod: &str) -> anyhow::Result<PodTensorBoard> {
    let pods: Api<Pod> = Api::namespaced(h.admin.clone(), NAMESPACE);
    eventually(&format!("status.tensorBoard of pod {pod}"), || async {
        Ok(pods
            .get_opt(pod)
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.tensor_board))
    })
    .await
}

/// GET `path` as `client`: status and body (an API error's status and message).
async fn get(client: &kube::Client, path: &str) -> anyhow::Result<(u16, String)> {
    let request = http::Request::get(path).body(Vec::new())?;
    match client.send(request.map(kube::client::Body::from)).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        }
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other.into()),
    }
}

async fn describe(h: &Harness, task: &str) -> anyhow::Result<String> {
    let out = run_cli(
        env!("CARGO_BIN_EXE_rlark"),
        h.server.kubeconfig_path(),
        &["describe", &format!("task/{task}"), "-n", NAMESPACE],
    )
    .await?;
    anyhow::ensure!(
        out.status.success(),
        "describe failed: {}",
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensorboard_runs_beside_a_raw_task_and_opens_through_the_proxy() -> anyhow::Result<()> {
    if !tensorboard_installed() {
        missing_tool::skip_or_fail("tensorboard is not installed (pip install tensorboard)");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_with(supervisor).await?;
    create_job(
        &h,
        "board",
        json!({
            "name": "main", "agentType": "Raw", "role": "Actor",
            "tensorBoardDir": "runs",
            "raw": {"entrypoint": ["sh", "-c", "mkdir -p runs && exec sleep 600"]},
        }),
    )
    .await?;
    h.wait_pod("board-main-0", PodPhase::Running).await?;
    let board = tensorboard_status(&h, "board-main-0").await?;
    let work = h.work_dir("board-main").await?;
    assert_eq!(board.message, None, "{board:?}");
    assert_eq!(
        board.log_dir.as_deref(),
        Some(work.join("runs").display().to_string().as_str())
    );
    let port = board.port.expect("a port");
    let prefix = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/board-main/proxy/{port}");

    // TensorBoard's page through the proxy (it takes a few seconds to start listening).
    let page = eventually("TensorBoard's page through the task proxy", || async {
        let (status, body) = get(&h.admin, &format!("{prefix}/")).await?;
        Ok(if status == 200 {
            Ok(body)
        } else {
            Err(format!(
                "{status}: {}",
                body.chars().take(200).collect::<String>()
            ))
        })
    })
    .await?;
    assert!(
        page.contains("<meta name=\"tb-relative-root\""),
        "not TensorBoard's page: {}",
        page.chars().take(400).collect::<String>()
    );
    // Its data API, relative to the page: the log directory it reads.
    let (status, environment) = get(&h.admin, &format!("{prefix}/data/environment")).await?;
    assert_eq!(status, 200, "{environment}");
    let environment: serde_json::Value = serde_json::from_str(&environment)?;
    assert_eq!(
        environment["data_location"],
        work.join("runs").display().to_string()
    );

    // describe links it.
    let described = describe(&h, "board-main").await?;
    let url = format!("{}{prefix}/", h.server.url().trim_end_matches('/'));
    assert!(
        described.contains(&format!("replica 0: {url}")),
        "describe does not link {url}:\n{described}"
    );

    // Deleting the Job stops the replica and its TensorBoard.
    Api::<Job>::all(h.admin.clone())
        .delete("board", &DeleteParams::default())
        .await?;
    eventually("TensorBoard stopped with its replica", || async {
        Ok(
            tokio::net::TcpStream::connect(("127.0.0.1", u16::try_from(port)?))
                .await
                .is_err(),
        )
    })
    .await?;
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tensorboard_the_task_runs_and_says_why() -> anyhow::Result<()> {
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_with(supervisor).await?;
    // The replica's PATH (the Task's) holds no tensorboard.
    let empty = tempfile::tempdir()?;
    let path = empty.path().display().to_string();
    create_job(
        &h,
        "plain",
        json!({
            "name": "main", "agentType": "Raw", "role": "Actor",
            "tensorBoardDir": "/tmp/runs",
            "raw": {"entrypoint": ["/bin/sleep", "600"],
                    "environment": [{"name": "PATH", "value": path}]},
        }),
    )
    .await?;
    h.wait_pod("plain-main-0", PodPhase::Running).await?;
    let board = tensorboard_status(&h, "plain-main-0").await?;
    assert_eq!(board.port, None, "{board:?}");
    let message = board.message.clone().unwrap_or_default();
    let expected =
        format!("TensorBoard was not started: no executable \"tensorboard\" in PATH ({path})");
    assert!(message.starts_with(&expected), "{message}");
    assert_eq!(board.log_dir.as_deref(), Some("/tmp/runs"));
    // Still running.
    h.wait_pod("plain-main-0", PodPhase::Running).await?;
    // A Warning Event on the Task says it too.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(h.admin.clone(), NAMESPACE);
    let event = eventually("the TensorBoardNotStarted event", || async {
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("TensorBoardNotStarted")))
    })
    .await?;
    assert_eq!(event.involved_object.name.as_deref(), Some("plain-main"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with(&format!("replica 0: {expected}"))),
        "{event:?}"
    );
    let described = describe(&h, "plain-main").await?;
    assert!(
        described.contains(&format!("replica 0: {expected}")),
        "{described}"
    );
    assert!(described.contains("TensorBoardNotStarted"), "{described}");
    h.stop().await
}

/// `rlark agent` (the built binary) of cluster `a` on `data_dir` as a child process.
fn spawn_agent(
    server: &rlark_testkit::TestServer,
    data_dir: &std::path::Path,
    token: Option<&serde_json::Value>,
) -> anyhow::Result<std::process::Child> {
    let log = data_dir.with_extension("agent.log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    command
        .args(["agent", "--server", &server.url(), "--cluster-id", "a"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--node-name", "host-0", "--heartbeat-interval", "500ms"]);
    if let Some(token) = token {
        command
            .arg("--token")
            .arg(token["token"].as_str().unwrap_or_default())
            .arg("--ca-hash")
            .arg(token["caHash"].as_str().unwrap_or_default());
    }
    Ok(command
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?)
}

/// An agent killed with SIGKILL leaves its TensorBoard running; the next agent adopts the
/// replica, kills that TensorBoard (`tensorboard.pid`) and starts its own, which the Pod
/// status and the proxy then show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_replica_gets_a_new_tensorboard_and_the_old_one_is_killed() -> anyhow::Result<()>
{
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if !tensorboard_installed() {
        missing_tool::skip_or_fail("tensorboard is not installed (pip install tensorboard)");
        return Ok(());
    }
    let (server, _server_dir) = rlark_testkit::real_agent::start_server_with_controllers().await?;
    let admin = server.client().await?;
    let scratch = tempfile::tempdir()?;
    let data_dir = scratch.path().join("agent");
    let token = rlark_testkit::tunnel_agent::bootstrap_token(&server, "a").await?;
    let mut first = spawn_agent(&server, &data_dir, Some(&token))?;
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job", "metadata": {"name": "kept"},
        "spec": {"tasks": [{"name": "main", "agentType": "Raw", "role": "Actor",
                            "tensorBoardDir": "runs",
                            "raw": {"entrypoint": ["sleep", "600"]}}]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let port_of = |pod: &Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.tensor_board.as_ref())
            .and_then(|b| b.port)
    };
    let pod = eventually("kept-main-0 with a TensorBoard port", || async {
        Ok(pods
            .get_opt("kept-main-0")
            .await?
            .filter(|p| port_of(p).is_some()))
    })
    .await?;
    anyhow::ensure!(port_of(&pod).is_some());
    let task = Api::<rlark_api::types::Task>::namespaced(admin.clone(), NAMESPACE)
        .get("kept-main")
        .await?;
    let replica_dir = rlark_agent::tasks::replica_dir(
        &data_dir.join("tasks"),
        NAMESPACE,
        "kept-main",
        &kube::ResourceExt::uid(&task).unwrap_or_default(),
        0,
    );
    let recorded = std::fs::read_to_string(replica_dir.join("tensorboard.pid"))?;
    let old_pid: i32 = recorded
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .parse()?;

    // kill -9: the agent's TensorBoard outlives it.
    kill(Pid::from_raw(i32::try_from(first.id())?), Signal::SIGKILL)?;
    first.wait()?;
    anyhow::ensure!(
        rlark_agent::runtime::process::process_running(u32::try_from(old_pid)?, None),
        "the old TensorBoard outlives its agent"
    );

    let mut second = spawn_agent(&server, &data_dir, None)?;
    let result = async {
        // The old one is killed, a new one reported and reachable.
        eventually("the old TensorBoard killed", || async {
            // Gone, or a zombie until whoever inherited it reaps it.
            Ok(!rlark_agent::runtime::process::process_running(
                u32::try_from(old_pid)?,
                None,
            ))
        })
        .await?;
        eventually("the new TensorBoard's pid recorded", || async {
            let now =
                std::fs::read_to_string(replica_dir.join("tensorboard.pid")).unwrap_or_default();
            Ok(!now.is_empty() && now != recorded)
        })
        .await?;
        // The port the Pod reports now (the old one until the new agent's write lands).
        let page = eventually("the new TensorBoard through the proxy", || async {
            let Some(port) = pods
                .get_opt("kept-main-0")
                .await?
                .as_ref()
                .and_then(port_of)
            else {
                return Ok(None);
            };
            let prefix = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/kept-main/proxy/{port}");
            let (status, body) = get(&admin, &format!("{prefix}/")).await?;
            Ok((status == 200).then_some(body))
        })
        .await?;
        anyhow::ensure!(page.contains("tb-relative-root"), "not TensorBoard's page");
        anyhow::Ok(())
    }
    .await;
    let _ = second.kill();
    let _ = second.wait();
    // The replica and the new TensorBoard: the agent was killed, so stop them here.
    if let Ok(text) = std::fs::read_to_string(replica_dir.join("tensorboard.pid"))
        && let Some(Ok(pid)) = text.split_whitespace().next().map(str::parse::<i32>)
    {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    if let Ok(text) = std::fs::read_to_string(replica_dir.join("pid.json"))
        && let Ok(record) = serde_json::from_str::<serde_json::Value>(&text)
        && let Some(pgid) = record["pgid"].as_i64()
    {
        let _ = nix::sys::signal::killpg(Pid::from_raw(i32::try_from(pgid)?), Signal::SIGKILL);
    }
    result?;
    server.stop().await
}

/// A replica that restarts reports its TensorBoard status again at each start (it is
/// removed when the run ends and rides on the next `Running` write), and the Event is
/// written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_reports_its_tensorboard_again() -> anyhow::Result<()> {
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_with(supervisor).await?;
    let empty = tempfile::tempdir()?;
    create_job(
        &h,
        "again",
        json!({
            "name": "main", "agentType": "Raw", "role": "Actor",
            "tensorBoardDir": "runs",
            "raw": {"entrypoint": ["/bin/sleep", "0.3"], "restartPolicy": "Always",
                    "environment": [{"name": "PATH",
                                     "value": empty.path().display().to_string()}]},
        }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(h.admin.clone(), NAMESPACE);
    let pod = eventually("again-main-0 running again after 2 restarts", || async {
        Ok(pods.get_opt("again-main-0").await?.filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase == Some(PodPhase::Running)
                    && s.reason.is_none()
                    && s.restart_count >= Some(2)
            })
        }))
    })
    .await?;
    let status = pod.status.unwrap_or_default();
    let board = status.tensor_board.unwrap_or_default();
    assert!(
        board
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("TensorBoard was not started: no executable")),
        "{board:?}"
    );
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(h.admin.clone(), NAMESPACE);
    let written = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("TensorBoardNotStarted")
                && e.involved_object.name.as_deref() == Some("again-main")
        })
        .count();
    assert_eq!(written, 1, "one Event per replica, not one per restart");
    h.stop().await
}
