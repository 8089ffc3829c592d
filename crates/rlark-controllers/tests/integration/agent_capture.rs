//! Issue 14, finding 2: an agent cannot capture another cluster's workloads. Against a real
//! server (TLS, in-process controllers) with the certificate of the agent of cluster `a`,
//! each forgery is refused, and a Job meant for cluster `other` is never placed on a Node
//! that only claims to be `other` — also when that Node was written by an admin, where the
//! scheduler's own check is what protects.
//!
//! Every wait is bounded by `rlark_testkit::real_agent::DEADLINE`; nothing asserts times.

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rlark_api::labels;
use rlark_api::types::{Job, Node, Task};
use rlark_testkit::TestServer;
use rlark_testkit::real_agent::{agent_client, eventually, start_server_with_controllers};
use serde_json::{Value, json};
use tempfile::TempDir;

/// A running server with namespaces `rlark-a` and `rlark-other`, its admin, and the agent
/// of cluster `a`.
struct World {
    server: TestServer,
    _server_dir: TempDir,
    dir: TempDir,
    admin: kube::Client,
    agent: kube::Client,
}

impl World {
    async fn start() -> anyhow::Result<World> {
        let (server, server_dir) = start_server_with_controllers().await?;
        let admin = server.client().await?;
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        for name in ["rlark-a", "rlark-other"] {
            let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
            namespaces
                .create(&PostParams::default(), &namespace)
                .await?;
        }
        let dir = tempfile::tempdir()?;
        let agent = agent_client(&server, &admin, "a", dir.path()).await?;
        Ok(World {
            server,
            _server_dir: server_dir,
            dir,
            admin,
            agent,
        })
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.server.stop().await
    }
}

fn nodes(client: &kube::Client, namespace: &str) -> Api<Node> {
    Api::namespaced(client.clone(), namespace)
}

fn node(name: &str, labels: Value) -> anyhow::Result<Node> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"agentType": "Raw"}
    }))?)
}

/// Report Node `name` Online now with `capacity` (as capacity and allocatable).
async fn report_online(api: &Api<Node>, name: &str, capacity: Value) -> kube::Result<Node> {
    let status = json!({"status": {
        "phase": "Online", "reason": "AgentReady",
        "capacity": capacity, "allocatable": capacity,
        "heartbeatTime": Time(Timestamp::now()),
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
}

/// The API error of `result`: (code, message); an error when the write succeeded.
fn refusal<T: std::fmt::Debug>(
    result: kube::Result<T>,
    what: &str,
) -> anyhow::Result<(u16, String)> {
    match result {
        Ok(written) => bail!("{what} was accepted: {written:?}"),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(other) => Err(other).with_context(|| what.to_string()),
    }
}

#[tokio::test]
async fn an_agent_cannot_label_its_node_as_another_cluster() -> anyhow::Result<()> {
    let world = World::start().await?;
    let api = nodes(&world.agent, "rlark-a");
    let forged = node("forged", json!({labels::CLUSTER_ID: "other"}))?;
    let (code, message) = refusal(
        api.create(&PostParams::default(), &forged).await,
        "a Node labelled rlark.io/cluster-id=other",
    )?;
    ensure!(code == 403, "{code}: {message}");
    ensure!(
        message.contains(r#"may not set label "rlark.io/cluster-id" to "other""#),
        "{message}"
    );
    ensure!(
        nodes(&world.admin, "rlark-a")
            .get_opt("forged")
            .await?
            .is_none(),
        "the forged Node was stored"
    );
    // Its genuine Node gets the identity from the server.
    let genuine = api
        .create(&PostParams::default(), &node("a-1", json!({}))?)
        .await?;
    ensure!(
        genuine.labels().get(labels::CLUSTER_ID).map(String::as_str) == Some("a"),
        "{genuine:?}"
    );
    ensure!(
        genuine
            .annotations()
            .get(labels::REPORTED_BY)
            .map(String::as_str)
            == Some("system:rlark:agent:a"),
        "{genuine:?}"
    );
    // Nor can it relabel that Node afterwards.
    let relabel = json!({"metadata": {"labels": {labels::CLUSTER_ID: "other"}}});
    let (code, message) = refusal(
        api.patch("a-1", &PatchParams::default(), &Patch::Merge(&relabel))
            .await,
        "relabelling Node a-1 as cluster other",
    )?;
    ensure!(code == 403, "{code}: {message}");
    world.stop().await
}

#[tokio::test]
async fn an_agent_registers_a_bounded_number_of_nodes() -> anyhow::Result<()> {
    let world = World::start().await?;
    let api = nodes(&world.agent, "rlark-a");
    // The default of api.maxNodesPerAgent.
    let limit = 64;
    for i in 0..limit {
        api.create(&PostParams::default(), &node(&format!("n{i}"), json!({}))?)
            .await
            .with_context(|| format!("register node n{i}"))?;
    }
    let (code, message) = refusal(
        api.create(&PostParams::default(), &node("one-too-many", json!({}))?)
            .await,
        "Node number 65",
    )?;
    ensure!(code == 403, "{code}: {message}");
    ensure!(
        message.contains(r#"may register at most 64 Nodes in namespace "rlark-a""#),
        "{message}"
    );
    let count = nodes(&world.admin, "rlark-a")
        .list(&ListParams::default())
        .await?
        .items
        .len();
    ensure!(count == limit, "{count} Nodes in rlark-a");
    world.stop().await
}

#[tokio::test]
async fn absurd_capacity_is_refused() -> anyhow::Result<()> {
    let world = World::start().await?;
    let api = nodes(&world.agent, "rlark-a");
    api.create(&PostParams::default(), &node("a-1", json!({}))?)
        .await?;
    let (code, message) = refusal(
        report_online(
            &api,
            "a-1",
            json!({"cpu": "8", "nvidia.com/gpu": "1000000"}),
        )
        .await,
        "a million GPUs",
    )?;
    ensure!(code == 422, "{code}: {message}");
    ensure!(
        message.contains("status.capacity[nvidia.com/gpu]") && message.contains("at most 65536"),
        "{message}"
    );
    let stored = nodes(&world.admin, "rlark-a").get("a-1").await?;
    ensure!(
        stored.status.is_none(),
        "the capacity was stored: {stored:?}"
    );
    report_online(&api, "a-1", json!({"cpu": "8", "nvidia.com/gpu": "8"})).await?;
    world.stop().await
}

#[tokio::test]
async fn an_agent_cannot_write_events_as_another_component() -> anyhow::Result<()> {
    let world = World::start().await?;
    let events: Api<Event> = Api::namespaced(world.agent.clone(), "rlark-a");
    let event = |name: &str, extra: Value| -> anyhow::Result<Event> {
        let mut event = json!({
            "metadata": {"name": name},
            "involvedObject": {"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "name": "t"},
            "reason": "Scheduled", "message": "placed on cluster a", "type": "Normal"
        });
        for (key, value) in extra.as_object().into_iter().flatten() {
            event[key] = value.clone();
        }
        Ok(serde_json::from_value(event)?)
    };
    for (extra, field) in [
        (
            json!({"reportingComponent": "rlark-controller-manager",
                   "source": {"component": "rlark-controller-manager"}}),
            "reportingComponent",
        ),
        (
            json!({"source": {"component": "rlark-server"}}),
            "source.component",
        ),
        (json!({"reportingInstance": "other"}), "reportingInstance"),
        (
            json!({"involvedObject": {"kind": "Job", "name": "j", "namespace": "rlark-other"}}),
            "involvedObject.namespace",
        ),
    ] {
        let (code, message) = refusal(
            events
                .create(&PostParams::default(), &event("forged", extra.clone())?)
                .await,
            &format!("an Event with {extra}"),
        )?;
        ensure!(code == 403, "{extra}: {code}: {message}");
        ensure!(message.contains(field), "{extra}: {message}");
    }
    // Its own Events are stamped as the agent's.
    let own = events
        .create(&PostParams::default(), &event("own", json!({}))?)
        .await?;
    ensure!(
        own.reporting_component.as_deref() == Some("rlark-agent")
            && own.reporting_instance.as_deref() == Some("a"),
        "{own:?}"
    );
    world.stop().await
}

/// The Tasks of Job `job`, in every namespace.
async fn tasks_of(admin: &kube::Client, job: &str) -> anyhow::Result<Vec<Task>> {
    Ok(Api::<Task>::all(admin.clone())
        .list(&ListParams::default().labels(&format!("{}={job}", labels::JOB)))
        .await?
        .items)
}

#[tokio::test]
async fn a_job_for_another_cluster_is_never_placed_on_a_forged_node() -> anyhow::Result<()> {
    let world = World::start().await?;
    // The agent of `a` has a genuine Node with GPUs.
    let agent_nodes = nodes(&world.agent, "rlark-a");
    agent_nodes
        .create(&PostParams::default(), &node("a-gpu", json!({}))?)
        .await?;
    report_online(
        &agent_nodes,
        "a-gpu",
        json!({"cpu": "8", "nvidia.com/gpu": "8"}),
    )
    .await?;
    // A Node in a's namespace that claims to be cluster `other`, written by an admin (the
    // API server lets admins write anything, as if written straight into the store).
    let admin_nodes = nodes(&world.admin, "rlark-a");
    admin_nodes
        .create(
            &PostParams::default(),
            &node("forged", json!({labels::CLUSTER_ID: "other"}))?,
        )
        .await?;
    report_online(
        &admin_nodes,
        "forged",
        json!({"cpu": "64", "nvidia.com/gpu": "64"}),
    )
    .await?;

    // A Job meant for cluster `other`, carrying a secret.
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": "capture"},
        "spec": {"tasks": [{
            "name": "train", "head": true, "agentType": "Raw", "role": "Actor",
            "nodeSelector": {labels::CLUSTER_ID: "other"},
            "raw": {"entrypoint": ["true"], "replicas": 1,
                    "environment": [{"name": "SECRET", "value": "only-for-other"}],
                    "resources": {"requests": {"nvidia.com/gpu": "1"}}}
        }]}
    }))?;
    let jobs: Api<Job> = Api::all(world.admin.clone());
    jobs.create(&PostParams::default(), &job).await?;

    // The Job waits for capacity; no Task is created, in rlark-a or anywhere.
    enum Outcome {
        Placed(Box<Task>),
        Unschedulable(String),
    }
    let admin = world.admin.clone();
    let outcome = eventually("Job capture placed or Unschedulable", || {
        let (jobs, admin) = (jobs.clone(), admin.clone());
        async move {
            if let Some(task) = tasks_of(&admin, "capture").await?.into_iter().next() {
                return Ok(Some(Outcome::Placed(Box::new(task))));
            }
            let job = jobs.get("capture").await?;
            Ok(job
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .find(|c| c.type_ == "Unschedulable" && c.status == "True")
                .map(|c| Outcome::Unschedulable(c.message.clone())))
        }
    })
    .await?;
    let message = match outcome {
        Outcome::Placed(task) => bail!(
            "the Job meant for cluster other was placed: Task {}/{} with placement {:?}",
            task.namespace().unwrap_or_default(),
            task.name_any(),
            task.spec.placement
        ),
        Outcome::Unschedulable(message) => message,
    };
    ensure!(message.contains("does not fit"), "{message}");
    ensure!(
        tasks_of(&world.admin, "capture").await?.is_empty(),
        "placed after all"
    );

    // Once cluster `other` has a Node, the Job goes there.
    let other = agent_client(&world.server, &world.admin, "other", world.dir.path()).await?;
    let other_nodes = nodes(&other, "rlark-other");
    other_nodes
        .create(&PostParams::default(), &node("o-gpu", json!({}))?)
        .await?;
    report_online(
        &other_nodes,
        "o-gpu",
        json!({"cpu": "4", "nvidia.com/gpu": "1"}),
    )
    .await?;
    let task = eventually("the Job's Task", || {
        let admin = admin.clone();
        async move { Ok(tasks_of(&admin, "capture").await?.into_iter().next()) }
    })
    .await?;
    let placement = task.spec.placement.clone().context("no placement")?;
    ensure!(
        task.namespace().as_deref() == Some("rlark-other")
            && placement.cluster_id == "other"
            && placement.nodes == ["o-gpu"],
        "placed as {:?} in {:?}",
        placement,
        task.namespace()
    );
    world.stop().await
}
