//! Node controller: heartbeat timeout → `Offline`, and `NodeLost` on the Tasks placed on
//! a lost Node.
//!
//! Every `config.node_check_interval` it lists the Nodes and the heartbeat Leases
//! (`node-<name>` in the Node's namespace) and decides per Node with the pure
//! [`node_health`]:
//!
//! - **Lost** → `status.phase: Offline`, `reason: NodeHeartbeatLost` (Event
//!   `NodeNotReady`); every non-terminal Task of the Node's namespace placed on it
//!   (`spec.placement.nodes`, or `status.observedNodes`) gets the condition `NodeLost`
//!   and, per `spec.nodeLostPolicy`: `Fail` (default) → `status.phase: Failed` with a
//!   message naming the node; `Reschedule` → the Task is deleted and its Job controller
//!   (which recreates the missing Tasks of a `Pending`/`Running` Job) places and creates
//!   it again, possibly on another cluster; a `Reschedule` Task no Job owns fails instead,
//!   since nothing would recreate it (Event `NodeLost` on the Task either way).
//! - **Healthy again** while `Offline` with our reason → `Online` (Event `NodeReady`).
//!   A Node the agent itself reported `Offline` for another reason is left to the agent.
//!
//! # Which heartbeat counts
//!
//! The reported heartbeat is the newer of `status.heartbeatTime` and the Lease's
//! `renewTime` (the creation time when neither exists). A Node is lost only when that is
//! older than the grace period **and** this controller has not seen it change for the
//! grace period either (kube's node lifecycle controller does the same): so a skewed agent
//! clock does not flap the Node, and a controller that starts after an outage of the
//! control plane gives every Node one grace period to report before failing its Tasks.
//!
//! A Node no agent can be (outside every `rlark-<cluster-id>` namespace, or labelled with
//! another cluster's ID: written by hand, like RLark's Node sample) is never placed on;
//! it is marked `Offline` with reason `NotAnAgentNode` at once, with a Warning Event
//! saying why and what registers Nodes ([`foreign_node`]).
//!
//! Every step is idempotent and re-derived from the API each tick, so a controller that
//! restarts half-way converges.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::types::{Node, NodeLostPolicy, NodePhase, Task, TaskPhase};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::Context;
use crate::error::Error;
use crate::events::{EventType, Recorder};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "node";
/// `status.reason` of a Node this controller marked `Offline`.
pub const REASON_HEARTBEAT_LOST: &str = "NodeHeartbeatLost";
/// `status.reason` of a Node this controller brought back `Online`.
pub const REASON_HEARTBEAT_RESTORED: &str = "NodeHeartbeatRestored";
/// `status.reason` of a Node no agent can be: one outside the agent namespaces, or whose
/// cluster label contradicts its namespace (created by hand, e.g. RLark's Node sample).
pub const REASON_NOT_AN_AGENT_NODE: &str = "NotAnAgentNode";
/// Task condition type (and reason) added when the Task's Node is lost.
pub const CONDITION_NODE_LOST: &str = "NodeLost";

/// What a Node's heartbeat says at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// A heartbeat within the grace period.
    Healthy,
    /// No heartbeat for longer than the grace period; `silent_for` is the age of the
    /// reported heartbeat.
    Lost { silent_for: Duration },
}

/// Decide a Node's health (pure).
///
/// - `reported`: the newest heartbeat the agent reported (its clock);
/// - `observed`: when this controller last saw `reported` change, or first saw the Node
///   (its own clock).
///
/// Lost when both are older than `grace`. A heartbeat from the future counts as fresh.
pub fn node_health(
    now: Timestamp,
    reported: Timestamp,
    observed: Timestamp,
    grace: Duration,
) -> NodeHealth {
    let age = |t: Timestamp| {
        let span = now.duration_since(t);
        if span.is_negative() {
            Duration::ZERO
        } else {
            span.unsigned_abs()
        }
    };
    let (reported_age, observed_age) = (age(reported), age(observed));
    if reported_age > grace && observed_age > grace {
        NodeHealth::Lost {
            silent_for: reported_age,
        }
    } else {
        NodeHealth::Healthy
    }
}

/// What to do to a Node's status (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// Nothing to change.
    Keep,
    /// Set `Offline` / [`REASON_HEARTBEAT_LOST`].
    MarkOffline,
    /// Set `Online` / [`REASON_HEARTBEAT_RESTORED`] (only undoes our own `Offline`).
    MarkOnline,
}

/// Decide the status change of a Node from its phase, reason and health (pure).
pub fn node_action(
    phase: Option<NodePhase>,
    reason: Option<&str>,
    health: NodeHealth,
) -> NodeAction {
    let ours = phase == Some(NodePhase::Offline) && reason == Some(REASON_HEARTBEAT_LOST);
    match health {
        NodeHealth::Lost { .. } if !ours => NodeAction::MarkOffline,
        NodeHealth::Healthy if ours => NodeAction::MarkOnline,
        _ => NodeAction::Keep,
    }
}

/// The newest heartbeat a Node reported: `status.heartbeatTime`, the Lease's `renewTime`,
/// else its creation time; `None` only for an object without any of them.
pub fn reported_heartbeat(node: &Node, lease: Option<&Lease>) -> Option<Timestamp> {
    let status = node
        .status
        .as_ref()
        .and_then(|s| s.heartbeat_time.as_ref())
        .map(|t| t.0);
    let renewed = lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    status
        .into_iter()
        .chain(renewed)
        .max()
        .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Whether a Task is placed on (or observed running on) `node`.
pub fn task_on_node(task: &Task, node: &str) -> bool {
    let placed = task
        .spec
        .placement
        .as_ref()
        .is_some_and(|p| p.nodes.iter().any(|n| n == node));
    let observed = task
        .status
        .as_ref()
        .is_some_and(|s| s.observed_nodes.iter().any(|n| n == node));
    placed || observed
}

/// Whether a Task still needs handling when its Node is lost: not finished, not stopped,
/// not being deleted.
pub fn task_needs_node_lost(task: &Task) -> bool {
    let phase = task.status.as_ref().and_then(|s| s.phase);
    task.metadata.deletion_timestamp.is_none()
        && !matches!(
            phase,
            Some(TaskPhase::Succeeded | TaskPhase::Failed | TaskPhase::Stopped)
        )
}

/// What the controller remembers about a Node between ticks.
#[derive(Clone, Debug)]
struct Seen {
    reported: Option<Timestamp>,
    observed: Timestamp,
}

/// Run the Node controller until `shutdown` is cancelled: one check every
/// `config.node_check_interval` (the first right away).
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut memory: HashMap<String, Seen> = HashMap::new();
    let mut interval = tokio::time::interval(ctx.config.node_check_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = interval.tick() => {}
        }
        let span = tracing::info_span!("reconcile", controller = CONTROLLER);
        let pass = check(&ctx, &mut memory, Timestamp::now()).instrument(span);
        let result = ctx.metrics.measure(CONTROLLER, pass).await;
        if let Err(error) = result {
            tracing::warn!(controller = CONTROLLER, %error, "node check failed; retrying next interval");
        }
    }
}

/// One pass over all Nodes at `now`.
async fn check(
    ctx: &Context,
    memory: &mut HashMap<String, Seen>,
    now: Timestamp,
) -> Result<(), Error> {
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let leases: HashMap<(String, String), Lease> = Api::<Lease>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|lease| {
            let name = lease.metadata.name.clone()?;
            let node = rlark_api::agent::lease_node(&name)?.to_string();
            Some(((lease.namespace().unwrap_or_default(), node), lease))
        })
        .collect();

    let grace = ctx.config.node_grace_period;
    let mut live = BTreeSet::new();
    // Namespace → lost node names (with how long they were silent).
    let mut lost: HashMap<String, Vec<(String, Duration)>> = HashMap::new();
    for node in &nodes {
        let namespace = node.namespace().unwrap_or_default();
        let name = node.name_any();
        let key = format!("{namespace}/{name}/{}", node.uid().unwrap_or_default());
        live.insert(key.clone());
        if let Some(problem) = crate::scheduler::node_identity_problem(node) {
            if let Some(message) = foreign_node(node, &problem) {
                let node_span = tracing::info_span!("node", %namespace, node = %name);
                match flag_foreign_node(ctx, node, &message)
                    .instrument(node_span)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.is_conflict() || e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            continue;
        }
        let reported = reported_heartbeat(node, leases.get(&(namespace.clone(), name.clone())));
        let seen = memory
            .entry(key)
            .and_modify(|seen| {
                if seen.reported != reported {
                    seen.reported = reported;
                    seen.observed = now;
                }
            })
            .or_insert(Seen {
                reported,
                observed: now,
            });
        let health = node_health(now, reported.unwrap_or(seen.observed), seen.observed, grace);
        let status = node.status.clone().unwrap_or_default();
        let action = node_action(status.phase, status.reason.as_deref(), health);
        let node_span = tracing::info_span!("node", %namespace, node = %name);
        match set_node_phase(ctx, node, action, health)
            .instrument(node_span)
            .await
        {
            Ok(()) => {}
            // The agent wrote meanwhile: decide again next tick on fresh data.
            Err(e) if e.is_conflict() || e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
        if let NodeHealth::Lost { silent_for } = health {
            lost.entry(namespace).or_default().push((name, silent_for));
        }
    }
    memory.retain(|key, _| live.contains(key));

    for (namespace, lost_nodes) in lost {
        let tasks = Api::<Task>::namespaced(ctx.client.clone(), &namespace)
            .list(&ListParams::default())
            .await?
            .items;
        for (node, silent_for) in &lost_nodes {
            for task in tasks
                .iter()
                .filter(|t| task_needs_node_lost(t) && task_on_node(t, node))
            {
                let message = format!(
                    "node {namespace}/{node} lost: no heartbeat for {}s (grace period {}s)",
                    silent_for.as_secs(),
                    grace.as_secs()
                );
                let span = tracing::info_span!("task", %namespace, task = %task.name_any(), %node);
                match handle_lost_task(ctx, task, node, &message, now)
                    .instrument(span)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.is_conflict() || e.is_not_found() => {
                        tracing::debug!(error = %e, "task changed meanwhile; next tick decides again");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// What to say of a Node no agent can be (`problem`: its
/// [`crate::scheduler::node_identity_problem`]), unless it is flagged already (pure).
pub fn foreign_node(node: &Node, problem: &str) -> Option<String> {
    let status = node.status.as_ref();
    let flagged = status.is_some_and(|s| {
        s.phase == Some(NodePhase::Offline) && s.reason.as_deref() == Some(REASON_NOT_AN_AGENT_NODE)
    });
    (!flagged).then(|| {
        format!(
            "node {}/{} is no agent's: {problem}. Agents register their own Nodes (`rlark \
             agent --cluster-id ID` reports its host in namespace rlark-ID); nothing is \
             placed on this one",
            node.namespace().unwrap_or_default(),
            node.name_any()
        )
    })
}

/// Mark a Node no agent can be `Offline` (reason [`REASON_NOT_AN_AGENT_NODE`]) with a
/// Warning Event saying `message`.
async fn flag_foreign_node(ctx: &Context, node: &Node, message: &str) -> Result<(), Error> {
    let body = json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "status": {"phase": NodePhase::Offline, "reason": REASON_NOT_AN_AGENT_NODE},
    });
    Api::<Node>::namespaced(ctx.client.clone(), &node.namespace().unwrap_or_default())
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await?;
    tracing::warn!(%message, "node flagged: no agent can be it");
    ctx.recorder
        .record(
            &Recorder::reference(node),
            EventType::Warning,
            REASON_NOT_AN_AGENT_NODE,
            message,
        )
        .await;
    Ok(())
}

async fn set_node_phase(
    ctx: &Context,
    node: &Node,
    action: NodeAction,
    health: NodeHealth,
) -> Result<(), Error> {
    let (phase, reason, event_type, event_reason, message) = match (action, health) {
        (NodeAction::Keep, _) => return Ok(()),
        (NodeAction::MarkOffline, NodeHealth::Lost { silent_for }) => (
            NodePhase::Offline,
            REASON_HEARTBEAT_LOST,
            EventType::Warning,
            "NodeNotReady",
            format!(
                "node {} stopped sending heartbeats: last one {}s ago (grace period {}s)",
                node.name_any(),
                silent_for.as_secs(),
                ctx.config.node_grace_period.as_secs()
            ),
        ),
        (_, _) => (
            NodePhase::Online,
            REASON_HEARTBEAT_RESTORED,
            EventType::Normal,
            "NodeReady",
            format!("node {} is sending heartbeats again", node.name_any()),
        ),
    };
    let namespace = node.namespace().unwrap_or_default();
    let body = json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "status": {"phase": phase, "reason": reason},
    });
    Api::<Node>::namespaced(ctx.client.clone(), &namespace)
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await?;
    tracing::info!(phase = %phase, reason, "node phase changed");
    ctx.recorder
        .record(
            &Recorder::reference(node),
            event_type,
            event_reason,
            &message,
        )
        .await;
    Ok(())
}

/// How a lost Node's Task is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostTaskAction {
    /// `status.phase: Failed` (policy `Fail`, or `Reschedule` of a Task no Job owns).
    Fail,
    /// Delete the Task: its Job controller places and creates it again (policy
    /// `Reschedule` of a Task a Job owns; it may land on another cluster, i.e. in another
    /// namespace, so it cannot simply be re-placed in place).
    Delete,
}

/// Decide what happens to a Task whose Node is lost (pure).
pub fn lost_task_action(task: &Task) -> LostTaskAction {
    let owned_by_job = task
        .owner_references()
        .iter()
        .any(|o| o.kind == "Job" && o.controller == Some(true));
    match task.spec.node_lost_policy.unwrap_or_default() {
        NodeLostPolicy::Reschedule if owned_by_job => LostTaskAction::Delete,
        _ => LostTaskAction::Fail,
    }
}

/// Add `NodeLost` to the Task and apply its `nodeLostPolicy` (see [`lost_task_action`]).
async fn handle_lost_task(
    ctx: &Context,
    task: &Task,
    node: &str,
    message: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let namespace = task.namespace().unwrap_or_default();
    let name = task.name_any();
    let api = Api::<Task>::namespaced(ctx.client.clone(), &namespace);
    let policy = task.spec.node_lost_policy.unwrap_or_default();
    let action = lost_task_action(task);
    let conditions = with_node_lost(task, message, now);
    let mut status = json!({"conditions": conditions});
    let event_message = match (action, policy) {
        (LostTaskAction::Delete, _) => {
            format!(
                "{message}; the task is deleted so its Job places it again (nodeLostPolicy Reschedule)"
            )
        }
        (LostTaskAction::Fail, NodeLostPolicy::Reschedule) => {
            format!(
                "{message}; task failed (nodeLostPolicy Reschedule, but no Job owns the task to place it again)"
            )
        }
        (LostTaskAction::Fail, NodeLostPolicy::Fail) => {
            format!("{message}; task failed (nodeLostPolicy Fail)")
        }
    };
    if action == LostTaskAction::Fail {
        status["phase"] = json!(TaskPhase::Failed);
        status["message"] = json!(event_message);
        status["completionTime"] = json!(Time(now));
    }
    let body = json!({
        "metadata": {"resourceVersion": task.resource_version()},
        "status": status,
    });
    let patched = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    if action == LostTaskAction::Delete {
        // Only the Task we decided about: not a newer one of the same name.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: patched.uid(),
                resource_version: patched.resource_version(),
            }),
            ..DeleteParams::background()
        };
        api.delete(&name, &params).await?;
    }
    tracing::warn!(policy = %policy, ?action, %node, "task's node lost");
    ctx.recorder
        .record(
            &Recorder::reference(task),
            EventType::Warning,
            CONDITION_NODE_LOST,
            &event_message,
        )
        .await;
    Ok(())
}

/// The Task's conditions with `NodeLost` (status True) set, others kept as they are.
fn with_node_lost(task: &Task, message: &str, now: Timestamp) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = task
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let condition = Condition {
        type_: CONDITION_NODE_LOST.into(),
        status: "True".into(),
        reason: CONDITION_NODE_LOST.into(),
        message: message.into(),
        last_transition_time: Time(now),
        observed_generation: task.meta().generation,
    };
    match conditions
        .iter_mut()
        .find(|c| c.type_ == CONDITION_NODE_LOST)
    {
        Some(existing) if existing.status == "True" => {
            existing.message = condition.message;
            existing.observed_generation = condition.observed_generation;
        }
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
    conditions
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use rlark_api::types::{AgentType, NodeSpec, NodeStatus, TaskPlacement, TaskStatus};

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    const GRACE: Duration = Duration::from_secs(40);

    #[test]
    fn health_needs_both_the_reported_and_the_observed_heartbeat_to_be_stale() {
        assert_eq!(
            node_health(ts(40), ts(0), ts(0), GRACE),
            NodeHealth::Healthy
        );
        assert_eq!(
            node_health(ts(41), ts(0), ts(0), GRACE),
            NodeHealth::Lost {
                silent_for: Duration::from_secs(41)
            }
        );
        // The controller just started (or the value just changed): one more grace period.
        assert_eq!(
            node_health(ts(100), ts(0), ts(90), GRACE),
            NodeHealth::Healthy
        );
        assert!(matches!(
            node_health(ts(131), ts(0), ts(90), GRACE),
            NodeHealth::Lost { .. }
        ));
        // Agent clock behind but heartbeats keep changing: healthy.
        assert_eq!(
            node_health(ts(500), ts(300), ts(499), GRACE),
            NodeHealth::Healthy
        );
        // A heartbeat from the future is fresh.
        assert_eq!(
            node_health(ts(0), ts(100), ts(-100), GRACE),
            NodeHealth::Healthy
        );
    }

    #[test]
    fn actions_only_undo_our_own_offline() {
        let lost = NodeHealth::Lost {
            silent_for: Duration::from_secs(50),
        };
        let online = Some(NodePhase::Online);
        let offline = Some(NodePhase::Offline);
        assert_eq!(node_action(online, None, lost), NodeAction::MarkOffline);
        assert_eq!(node_action(None, None, lost), NodeAction::MarkOffline);
        assert_eq!(
            node_action(offline, Some("AgentStopped"), lost),
            NodeAction::MarkOffline
        );
        assert_eq!(
            node_action(offline, Some(REASON_HEARTBEAT_LOST), lost),
            NodeAction::Keep
        );
        assert_eq!(
            node_action(offline, Some(REASON_HEARTBEAT_LOST), NodeHealth::Healthy),
            NodeAction::MarkOnline
        );
        assert_eq!(
            node_action(offline, Some("AgentStopped"), NodeHealth::Healthy),
            NodeAction::Keep
        );
        assert_eq!(
            node_action(online, None, NodeHealth::Healthy),
            NodeAction::Keep
        );
    }

    fn node(heartbeat: Option<i64>) -> Node {
        let mut node = Node::new(
            "n1",
            NodeSpec {
                agent_type: AgentType::Raw,
                unschedulable: false,
            },
        );
        node.metadata.creation_timestamp = Some(Time(ts(-1000)));
        node.status = Some(NodeStatus {
            heartbeat_time: heartbeat.map(|s| Time(ts(s))),
            ..Default::default()
        });
        node
    }

    #[test]
    fn a_node_no_agent_can_be_is_flagged_once() {
        let mut by_hand = node(None);
        by_hand.metadata.namespace = Some("default".into());
        let problem = crate::scheduler::node_identity_problem(&by_hand).expect("a problem");
        let message = foreign_node(&by_hand, &problem).expect("flagged");
        assert!(
            message.starts_with(
                "node default/n1 is no agent's: namespace \"default\" is not an agent namespace"
            ) && message.contains("rlark agent --cluster-id ID"),
            "{message}"
        );
        // Once it is Offline with the reason, nothing more is said.
        let status = by_hand.status.as_mut().expect("status");
        status.phase = Some(NodePhase::Offline);
        status.reason = Some(REASON_NOT_AN_AGENT_NODE.into());
        assert_eq!(foreign_node(&by_hand, &problem), None);
        // An agent's Node has no identity problem: never flagged.
        let mut agents = node(Some(0));
        agents.metadata.namespace = Some("rlark-a".into());
        assert_eq!(crate::scheduler::node_identity_problem(&agents), None);
    }

    fn lease(renew: i64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(ts(renew))),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reported_heartbeat_is_the_newest_source() {
        assert_eq!(reported_heartbeat(&node(Some(10)), None), Some(ts(10)));
        assert_eq!(
            reported_heartbeat(&node(Some(10)), Some(&lease(20))),
            Some(ts(20))
        );
        assert_eq!(
            reported_heartbeat(&node(Some(30)), Some(&lease(20))),
            Some(ts(30))
        );
        assert_eq!(
            reported_heartbeat(&node(None), Some(&lease(5))),
            Some(ts(5))
        );
        assert_eq!(reported_heartbeat(&node(None), None), Some(ts(-1000)));
    }

    fn task(nodes: &[&str], phase: Option<TaskPhase>) -> Task {
        let mut task = Task::new(
            "t",
            serde_json::from_value(
                json!({"agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["x"]}}),
            )
            .unwrap(),
        );
        task.spec.placement = Some(TaskPlacement {
            cluster_id: "c1".into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        task.status = Some(TaskStatus {
            phase,
            ..Default::default()
        });
        task
    }

    #[test]
    fn tasks_on_a_lost_node() {
        assert!(task_on_node(&task(&["n1", "n2"], None), "n2"));
        assert!(!task_on_node(&task(&["n1"], None), "n2"));
        let mut t = task(&[], None);
        t.status.as_mut().unwrap().observed_nodes = vec!["n2".into()];
        assert!(task_on_node(&t, "n2"));
        assert!(task_needs_node_lost(&task(
            &["n1"],
            Some(TaskPhase::Running)
        )));
        assert!(task_needs_node_lost(&task(&["n1"], None)));
        assert!(!task_needs_node_lost(&task(
            &["n1"],
            Some(TaskPhase::Failed)
        )));
        assert!(!task_needs_node_lost(&task(
            &["n1"],
            Some(TaskPhase::Stopped)
        )));
    }

    #[test]
    fn reschedule_deletes_only_tasks_a_job_recreates() {
        let mut t = task(&["n1"], Some(TaskPhase::Running));
        assert_eq!(lost_task_action(&t), LostTaskAction::Fail);
        t.spec.node_lost_policy = Some(NodeLostPolicy::Reschedule);
        assert_eq!(lost_task_action(&t), LostTaskAction::Fail);
        t.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "rlinf.io/v1alpha1".into(),
                kind: "Job".into(),
                name: "j".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        assert_eq!(lost_task_action(&t), LostTaskAction::Delete);
        t.spec.node_lost_policy = Some(NodeLostPolicy::Fail);
        assert_eq!(lost_task_action(&t), LostTaskAction::Fail);
    }

    #[test]
    fn node_lost_condition_keeps_other_conditions() {
        let mut t = task(&["n1"], Some(TaskPhase::Running));
        t.status.as_mut().unwrap().conditions = vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Ready".into(),
            message: String::new(),
            last_transition_time: Time(ts(0)),
            observed_generation: None,
        }];
        let conditions = with_node_lost(&t, "node n1 lost", ts(5));
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0].type_, "Ready");
        assert_eq!(conditions[1].type_, CONDITION_NODE_LOST);
        assert_eq!(conditions[1].status, "True");
        t.status.as_mut().unwrap().conditions = conditions;
        // Again: updated in place, transition time kept.
        let again = with_node_lost(&t, "node n1 lost again", ts(9));
        assert_eq!(again.len(), 2);
        assert_eq!(again[1].last_transition_time, Time(ts(5)));
        assert_eq!(again[1].message, "node n1 lost again");
    }
}
