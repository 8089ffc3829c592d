//! The simulated kubelet and scheduler, pure: the status a Pod should have given what the
//! test told the simulator about it, and the Node a Pod goes to.

use serde_json::{Value, json};

/// What the test said a Pod's containers do ([`super::KubeSim::set_pod_phase`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not started; the containers wait with this reason (`ContainerCreating`,
    /// `ErrImagePull`, `ImagePullBackOff`, ...).
    Pending { reason: String },
    /// Every container runs and is ready.
    Running,
    /// Every container exited 0.
    Succeeded,
    /// The containers exited with `exit_code` (not 0). Under `restartPolicy: Always` or
    /// `OnFailure` this is a restart (`restartCount` + 1, `CrashLoopBackOff`), as the
    /// kubelet does; under `Never` the Pod fails.
    Failed { exit_code: i32 },
}

impl Phase {
    /// `Pending` with `ContainerCreating`.
    pub fn pending() -> Self {
        Phase::Pending {
            reason: "ContainerCreating".into(),
        }
    }
}

/// What the simulator remembers about one Pod (one uid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodRecord {
    pub uid: String,
    pub state: ContainerState,
    pub restarts: u32,
    /// `lastState.terminated` after a restart.
    pub last_terminated: Option<Value>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub pod_ip: String,
    /// Images the test said are pulled ([`super::KubeSim::pull_image`]) while the
    /// containers wait; once they have run, every image is there.
    pub pulled: std::collections::BTreeSet<String>,
}

/// The containers' state (all containers of a Pod move together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ContainerState {
    Waiting(String),
    Running,
    Terminated {
        exit_code: i32,
    },
    /// Waiting to be restarted after a failure.
    CrashLoop,
}

/// How `phase` changes a Pod's record under its restart policy. Returns whether the
/// containers restarted (their log instance ends), and whether they ended for good.
pub(crate) fn apply_phase(
    record: &mut PodRecord,
    restart_policy: &str,
    phase: &Phase,
    now: &str,
) -> (bool, bool) {
    let terminated = |exit_code: i32, started: &str| {
        json!({"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" },
               "startedAt": started, "finishedAt": now})
    };
    match phase {
        Phase::Pending { reason } => {
            record.state = ContainerState::Waiting(reason.clone());
            (false, false)
        }
        Phase::Running => {
            if record.state != ContainerState::Running {
                record.state = ContainerState::Running;
                record.started_at = now.to_string();
            }
            (false, false)
        }
        Phase::Succeeded | Phase::Failed { .. } => {
            let exit_code = match phase {
                Phase::Failed { exit_code } => *exit_code,
                _ => 0,
            };
            let restarts = match restart_policy {
                "Never" => false,
                "OnFailure" => exit_code != 0,
                _ => true,
            };
            if restarts {
                record.restarts += 1;
                record.last_terminated = Some(terminated(exit_code, &record.started_at));
                record.state = if exit_code == 0 {
                    record.started_at = now.to_string();
                    ContainerState::Running
                } else {
                    ContainerState::CrashLoop
                };
                (true, false)
            } else {
                record.state = ContainerState::Terminated { exit_code };
                record.finished_at = Some(now.to_string());
                (false, true)
            }
        }
    }
}

/// The Pod's restart policy (`Always` when unset, as the API server defaults it).
pub(crate) fn restart_policy(pod: &Value) -> &str {
    pod.pointer("/spec/restartPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Always")
}

/// `(container, image)` of each container of `pod`.
pub(crate) fn images(pod: &Value) -> Vec<(String, String)> {
    containers(pod)
        .into_iter()
        .map(|c| {
            let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (field("name"), field("image"))
        })
        .collect()
}

fn containers(pod: &Value) -> Vec<&Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default()
}

fn condition(kind: &str, status: bool, at: &str) -> Value {
    json!({"type": kind, "status": if status { "True" } else { "False" }, "lastTransitionTime": at})
}

/// The status of a Pod on `node_ip`'s Node with `record`.
pub(crate) fn pod_status(pod: &Value, record: &PodRecord, host_ip: &str) -> Value {
    let started = &record.started_at;
    let ready = record.state == ContainerState::Running;
    let (phase, state) = match &record.state {
        ContainerState::Waiting(reason) => ("Pending", json!({"waiting": {"reason": reason}})),
        ContainerState::Running => ("Running", json!({"running": {"startedAt": started}})),
        ContainerState::CrashLoop => (
            "Running",
            json!({"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off restarting failed container in pod {}", pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""))}}),
        ),
        ContainerState::Terminated { exit_code } => (
            if *exit_code == 0 {
                "Succeeded"
            } else {
                "Failed"
            },
            json!({"terminated": {"exitCode": exit_code,
                "reason": if *exit_code == 0 { "Completed" } else { "Error" },
                "startedAt": started, "finishedAt": record.finished_at}}),
        ),
    };
    let uid = &record.uid;
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|c| {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            // The kubelet reports an image ID once the image is there: a waiting container
            // whose image was not pulled yet has none.
            let present = !matches!(record.state, ContainerState::Waiting(_))
                || record.pulled.contains(image);
            let image_id = if present {
                format!("sim://{image}")
            } else {
                String::new()
            };
            let mut status = json!({
                "name": name,
                "image": image,
                "imageID": image_id,
                "ready": ready,
                "started": matches!(record.state, ContainerState::Running),
                "restartCount": record.restarts,
                "state": state,
                "lastState": {},
            });
            if !matches!(record.state, ContainerState::Waiting(_)) {
                status["containerID"] = json!(format!("sim://{uid}/{name}"));
            }
            if let Some(last) = &record.last_terminated {
                status["lastState"] = json!({"terminated": last});
            }
            status
        })
        .collect();
    // Native sidecars (init containers with `restartPolicy: Always`): running beside the
    // main containers, stopped (exit 0) once they end, waiting while they wait.
    let sidecar_state = match &record.state {
        ContainerState::Waiting(reason) => json!({"waiting": {"reason": reason}}),
        ContainerState::Running | ContainerState::CrashLoop => {
            json!({"running": {"startedAt": started}})
        }
        ContainerState::Terminated { .. } => json!({"terminated": {"exitCode": 0,
            "reason": "Completed", "startedAt": started, "finishedAt": record.finished_at}}),
    };
    let sidecars: Vec<Value> = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always"))
        .map(|c| {
            let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            json!({
                "name": field("name"),
                "image": field("image"),
                "imageID": format!("sim://{}", field("image")),
                "ready": ready,
                "started": !matches!(record.state, ContainerState::Waiting(_)),
                "restartCount": 0,
                "state": sidecar_state,
                "lastState": {},
            })
        })
        .collect();
    let scheduled_at = pod
        .pointer("/metadata/creationTimestamp")
        .cloned()
        .unwrap_or(Value::Null);
    let scheduled_at = scheduled_at.as_str().unwrap_or(started);
    json!({
        "phase": phase,
        "hostIP": host_ip,
        "podIP": record.pod_ip,
        "podIPs": [{"ip": record.pod_ip}],
        "startTime": scheduled_at,
        "qosClass": "BestEffort",
        "conditions": [
            condition("PodScheduled", true, scheduled_at),
            condition("Initialized", true, scheduled_at),
            condition("ContainersReady", ready, started),
            condition("Ready", ready, started),
        ],
        "containerStatuses": statuses,
        "initContainerStatuses": sidecars,
    })
}

/// The status of a Pod no Node fits.
pub(crate) fn unschedulable_status(message: &str, at: &str) -> Value {
    json!({
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message, "lastTransitionTime": at}],
    })
}

/// Whether a Pod counts as ready (its `Ready` condition is `True`).
pub(crate) fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The Pod's phase (`Pending` when unset).
pub(crate) fn phase_of(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

fn node_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn quantity(value: Option<&Value>) -> i64 {
    match value {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// GPUs a Pod requests (limits count as requests for extended resources).
fn gpus(pod: &Value) -> i64 {
    containers(pod)
        .into_iter()
        .map(|c| {
            let requests = c.pointer("/resources/requests/nvidia.com~1gpu");
            quantity(requests.or_else(|| c.pointer("/resources/limits/nvidia.com~1gpu")))
        })
        .sum()
}

fn tolerates(pod: &Value, taint: &Value) -> bool {
    pod.pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| {
            let key_ok = match t.get("key").and_then(Value::as_str) {
                None | Some("") => t["operator"] == "Exists",
                Some(key) => Some(key) == taint["key"].as_str(),
            };
            let value_ok = t["operator"] == "Exists" || t.get("value") == taint.get("value");
            let effect_ok = match t.get("effect").and_then(Value::as_str) {
                None | Some("") => true,
                Some(effect) => Some(effect) == taint["effect"].as_str(),
            };
            key_ok && value_ok && effect_ok
        })
}

/// Why `node` cannot take `pod` (`None`: it can). `used_gpus`: GPUs of the Pods already
/// bound there.
fn misfit(pod: &Value, node: &Value, used_gpus: i64) -> Option<&'static str> {
    if !node_ready(node) {
        return Some("node(s) were not ready");
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        return Some("node(s) were unschedulable");
    }
    let labels = node.pointer("/metadata/labels");
    let selector_ok = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    if !selector_ok {
        return Some("node(s) didn't match Pod's node affinity/selector");
    }
    let untolerated = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
        .any(|t| !tolerates(pod, t));
    if untolerated {
        return Some("node(s) had untolerated taint");
    }
    let allocatable = quantity(node.pointer("/status/allocatable/nvidia.com~1gpu"));
    if gpus(pod) > allocatable - used_gpus {
        return Some("Insufficient nvidia.com/gpu");
    }
    None
}

/// The Node for `pod` among `nodes` given the Pods already bound (the least loaded that
/// fits), or the scheduler's message when none fits.
pub(crate) fn schedule(pod: &Value, nodes: &[Value], bound: &[Value]) -> Result<String, String> {
    let mut reasons: Vec<&str> = Vec::new();
    let mut best: Option<(usize, String)> = None;
    for node in nodes {
        let name = node
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let on_node: Vec<&Value> = bound
            .iter()
            .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name))
            .filter(|p| !matches!(phase_of(p), "Succeeded" | "Failed"))
            .collect();
        let used: i64 = on_node.iter().map(|p| gpus(p)).sum();
        match misfit(pod, node, used) {
            Some(reason) => reasons.push(reason),
            None if best.as_ref().is_none_or(|(load, _)| on_node.len() < *load) => {
                best = Some((on_node.len(), name.to_string()));
            }
            None => {}
        }
    }
    best.map(|(_, name)| name).ok_or_else(|| {
        reasons.sort_unstable();
        let mut counted: Vec<String> = Vec::new();
        let mut i = 0;
        while i < reasons.len() {
            let n = reasons[i..]
                .iter()
                .take_while(|r| **r == reasons[i])
                .count();
            counted.push(format!("{n} {}", reasons[i]));
            i += n;
        }
        format!(
            "0/{} nodes are available: {}.",
            nodes.len(),
            if counted.is_empty() {
                "no nodes".to_string()
            } else {
                counted.join(", ")
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> PodRecord {
        PodRecord {
            uid: "u".into(),
            state: ContainerState::Waiting("ContainerCreating".into()),
            restarts: 0,
            last_terminated: None,
            started_at: "t0".into(),
            finished_at: None,
            pod_ip: "10.244.0.2".into(),
            pulled: Default::default(),
        }
    }

    fn pod(restart_policy: &str) -> Value {
        json!({"metadata": {"name": "p", "creationTimestamp": "t0"},
               "spec": {"restartPolicy": restart_policy, "containers": [{"name": "c", "image": "img"}]}})
    }

    #[test]
    fn a_failure_restarts_under_always_and_fails_under_never() {
        let table = [
            (
                "Always",
                Phase::Failed { exit_code: 3 },
                "Running",
                1,
                Some(3),
            ),
            (
                "OnFailure",
                Phase::Failed { exit_code: 3 },
                "Running",
                1,
                Some(3),
            ),
            ("Never", Phase::Failed { exit_code: 3 }, "Failed", 0, None),
            ("Never", Phase::Succeeded, "Succeeded", 0, None),
            ("OnFailure", Phase::Succeeded, "Succeeded", 0, None),
            ("Always", Phase::Succeeded, "Running", 1, Some(0)),
        ];
        for (policy, phase, want_phase, want_restarts, last_exit) in table {
            let mut r = record();
            apply_phase(&mut r, policy, &Phase::Running, "t1");
            apply_phase(&mut r, policy, &phase, "t2");
            let status = pod_status(&pod(policy), &r, "10.0.0.1");
            assert_eq!(status["phase"], want_phase, "{policy} {phase:?}");
            let container = &status["containerStatuses"][0];
            assert_eq!(
                container["restartCount"], want_restarts,
                "{policy} {phase:?}"
            );
            assert_eq!(
                container
                    .pointer("/lastState/terminated/exitCode")
                    .and_then(Value::as_i64),
                last_exit.map(i64::from),
                "{policy} {phase:?}"
            );
            if want_phase == "Failed" {
                assert_eq!(container["state"]["terminated"]["exitCode"], 3);
            }
        }
    }

    #[test]
    fn pending_shows_the_waiting_reason() {
        let mut r = record();
        apply_phase(
            &mut r,
            "Always",
            &Phase::Pending {
                reason: "ImagePullBackOff".into(),
            },
            "t1",
        );
        let status = pod_status(&pod("Always"), &r, "10.0.0.1");
        assert_eq!(status["phase"], "Pending");
        assert_eq!(
            status["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ImagePullBackOff"
        );
        assert!(!is_ready(&json!({"status": status})));
    }

    #[test]
    fn a_waiting_container_has_an_image_id_once_its_image_is_pulled() {
        let image_id = |r: &PodRecord| {
            pod_status(&pod("Always"), r, "10.0.0.1")["containerStatuses"][0]["imageID"].clone()
        };
        let mut r = record();
        assert_eq!(image_id(&r), "", "waiting on its image");
        r.pulled.insert("img".into());
        assert_eq!(image_id(&r), "sim://img");
        let mut running = record();
        apply_phase(&mut running, "Always", &Phase::Running, "t1");
        assert_eq!(
            image_id(&running),
            "sim://img",
            "a container that ran has its image"
        );
    }

    fn node(name: &str, gpus: i64, labels: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels},
               "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string()},
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    #[test]
    fn scheduling_honours_selectors_gpus_and_taints() {
        let nodes = [
            node("a", 0, json!({"pool": "cpu"})),
            node("b", 2, json!({"pool": "gpu"})),
        ];
        let gpu_pod =
            json!({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        assert_eq!(schedule(&gpu_pod, &nodes, &[]).unwrap(), "b");
        let bound = [
            json!({"spec": {"nodeName": "b", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        ];
        assert_eq!(
            schedule(&gpu_pod, &nodes, &bound).unwrap_err(),
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
        );
        let selected = json!({"spec": {"nodeSelector": {"pool": "cpu"}}});
        assert_eq!(schedule(&selected, &nodes, &[]).unwrap(), "a");
        let mut tainted = node("t", 0, json!({}));
        tainted["spec"] = json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]});
        let plain = json!({"spec": {}});
        assert!(schedule(&plain, std::slice::from_ref(&tainted), &[]).is_err());
        let tolerant =
            json!({"spec": {"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]}});
        assert_eq!(
            schedule(&tolerant, std::slice::from_ref(&tainted), &[]).unwrap(),
            "t"
        );
        // The least loaded Node wins.
        let two = [node("x", 0, json!({})), node("y", 0, json!({}))];
        let bound = [json!({"spec": {"nodeName": "x"}})];
        assert_eq!(schedule(&plain, &two, &bound).unwrap(), "y");
    }
}
