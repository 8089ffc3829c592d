//! The simulated workload controllers, pure: from the objects of one namespace, the Pods
//! and ReplicaSets to create or delete and the statuses to write, named and labelled as
//! Kubernetes' controllers name and label them.

use serde_json::{Map, Value, json};

use super::kubelet::{is_ready, phase_of};

/// A kind the simulator writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Pod,
    ReplicaSet,
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
    /// OpenKruise's CloneSet (served only by a cluster started with it).
    CloneSet,
}

impl Kind {
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Pod => "v1",
            Kind::Job => "batch/v1",
            Kind::CloneSet => "apps.kruise.io/v1alpha1",
            _ => "apps/v1",
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::Job => "Job",
            Kind::CloneSet => "CloneSet",
        }
    }
}

/// One write a pass makes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    Create {
        kind: Kind,
        object: Value,
    },
    Delete {
        kind: Kind,
        name: String,
    },
    /// Merge patch of the main resource (spec, labels).
    Patch {
        kind: Kind,
        name: String,
        patch: Value,
    },
    /// Replace `status` (written only when it differs from the stored one).
    Status {
        kind: Kind,
        name: String,
        status: Value,
    },
}

/// Kubernetes' `generateName` alphabet (no vowels, no look-alikes).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// FNV-1a, 32 bits (what the Deployment controller hashes Pod templates with).
fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// `rand.SafeEncodeString` of a number, as `pod-template-hash` and controller revisions
/// are written.
fn safe_encode(mut value: u32, len: usize) -> String {
    let mut out = String::with_capacity(len);
    for _ in 0..len {
        out.push(char::from(
            ALPHABET[(value % ALPHABET.len() as u32) as usize],
        ));
        value /= ALPHABET.len() as u32;
    }
    out
}

/// The hash of a Pod template (`pod-template-hash`, `controller-revision-hash`).
pub(crate) fn template_hash(template: &Value) -> String {
    let hash = fnv32a(template.to_string().as_bytes());
    // As `rand.SafeEncodeString(fmt.Sprint(hash))`: each byte of the decimal form picks a
    // character of the alphabet.
    hash.to_string()
        .bytes()
        .map(|d| char::from(ALPHABET[usize::from(d) % ALPHABET.len()]))
        .collect()
}

/// A five-character suffix for the `seq`-th Pod an owner creates, stable for a given
/// owner uid and sequence number.
pub(crate) fn suffix(owner_uid: &str, seq: u64) -> String {
    safe_encode(fnv32a(format!("{owner_uid}/{seq}").as_bytes()), 5)
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(crate) fn name_of(object: &Value) -> &str {
    str_at(object, "/metadata/name")
}

pub(crate) fn uid_of(object: &Value) -> &str {
    str_at(object, "/metadata/uid")
}

fn int_at(object: &Value, pointer: &str, default: i64) -> i64 {
    object
        .pointer(pointer)
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

pub(crate) fn is_deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The uid of `object`'s controlling owner.
pub(crate) fn controller_uid(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
}

/// The objects among `objects` that `owner` controls and that are not being deleted.
pub(crate) fn owned<'a>(owner: &Value, objects: &'a [Value]) -> Vec<&'a Value> {
    let uid = uid_of(owner);
    objects
        .iter()
        .filter(|o| controller_uid(o) == Some(uid) && !is_deleting(o))
        .collect()
}

fn owner_reference(kind: Kind, owner: &Value) -> Value {
    json!({
        "apiVersion": kind.api_version(), "kind": kind.name(),
        "name": name_of(owner), "uid": uid_of(owner),
        "controller": true, "blockOwnerDeletion": true
    })
}

/// A Pod from `owner`'s template, with extra labels and spec fields.
fn pod_from_template(
    kind: Kind,
    owner: &Value,
    name: &str,
    labels: &[(&str, String)],
    spec_extra: &[(&str, Value)],
) -> Value {
    let template = owner
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut metadata = template
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if !metadata.is_object() {
        metadata = json!({});
    }
    let label_map = metadata
        .as_object_mut()
        .map(|m| m.entry("labels").or_insert_with(|| json!({})));
    if let Some(Value::Object(map)) = label_map {
        for (k, v) in labels {
            map.insert((*k).to_string(), json!(v));
        }
    }
    metadata["name"] = json!(name);
    metadata["namespace"] = owner
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(Value::Null);
    metadata["ownerReferences"] = json!([owner_reference(kind, owner)]);
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut spec {
        for (k, v) in spec_extra {
            map.insert((*k).to_string(), v.clone());
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// A status action unless `status` is what is stored.
fn status_action(kind: Kind, object: &Value, status: Value) -> Option<Action> {
    (object.get("status") != Some(&status)).then(|| Action::Status {
        kind,
        name: name_of(object).to_string(),
        status,
    })
}

/// A condition keeping the stored one's transition time when its status is unchanged.
fn condition(
    object: &Value,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
) -> Value {
    let status = if status { "True" } else { "False" };
    let previous = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind);
    let since = match previous {
        Some(p) if p["status"] == status => {
            p.get("lastTransitionTime").cloned().unwrap_or(json!(now))
        }
        _ => json!(now),
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since, "lastUpdateTime": since})
}

/// Pods to delete when `excess` of `pods` must go: not ready before ready, then the
/// newest names first.
fn victims<'a>(pods: &[&'a Value], excess: usize) -> Vec<&'a Value> {
    let mut sorted = pods.to_vec();
    sorted.sort_by(|a, b| {
        is_ready(a)
            .cmp(&is_ready(b))
            .then_with(|| name_of(b).cmp(name_of(a)))
    });
    sorted.into_iter().take(excess).collect()
}

fn counts(pods: &[&Value]) -> (i64, i64) {
    let ready = pods.iter().filter(|p| is_ready(p)).count() as i64;
    (pods.len() as i64, ready)
}

/// The StatefulSet controller: Pods `<name>-<ordinal>`, created in order (each after the
/// previous is ready) unless `podManagementPolicy: Parallel`, removed from the highest
/// ordinal down.
pub(crate) fn stateful_set(sts: &Value, pods: &[Value]) -> Vec<Action> {
    let name = name_of(sts);
    let replicas = int_at(sts, "/spec/replicas", 1).max(0) as usize;
    let parallel = str_at(sts, "/spec/podManagementPolicy") == "Parallel";
    let revision = format!(
        "{name}-{}",
        template_hash(sts.pointer("/spec/template").unwrap_or(&Value::Null))
    );
    let mine = owned(sts, pods);
    let ordinal = |pod: &Value| {
        name_of(pod)
            .strip_prefix(&format!("{name}-"))
            .and_then(|n| n.parse::<usize>().ok())
    };
    let mut actions = Vec::new();
    for i in 0..replicas {
        let pod_name = format!("{name}-{i}");
        if pods.iter().any(|p| name_of(p) == pod_name) {
            continue;
        }
        let previous_ready =
            (0..i).all(|j| mine.iter().any(|p| ordinal(p) == Some(j) && is_ready(p)));
        if !parallel && !previous_ready {
            break;
        }
        let mut spec_extra = vec![("hostname", json!(pod_name))];
        if let Some(service) = sts
            .pointer("/spec/serviceName")
            .filter(|s| s.as_str().is_some_and(|s| !s.is_empty()))
        {
            spec_extra.push(("subdomain", service.clone()));
        }
        actions.push(Action::Create {
            kind: Kind::Pod,
            object: pod_from_template(
                Kind::StatefulSet,
                sts,
                &pod_name,
                &[
                    ("controller-revision-hash", revision.clone()),
                    ("statefulset.kubernetes.io/pod-name", pod_name.clone()),
                    ("apps.kubernetes.io/pod-index", i.to_string()),
                ],
                &spec_extra,
            ),
        });
        if !parallel {
            break;
        }
    }
    let mut excess: Vec<&Value> = mine
        .iter()
        .copied()
        .filter(|p| ordinal(p).is_none_or(|o| o >= replicas))
        .collect();
    excess.sort_by_key(|p| std::cmp::Reverse(ordinal(p)));
    if !parallel {
        excess.truncate(1);
    }
    for pod in excess {
        actions.push(Action::Delete {
            kind: Kind::Pod,
            name: name_of(pod).to_string(),
        });
    }
    let (current, ready) = counts(&mine);
    let status = json!({
        "observedGeneration": int_at(sts, "/metadata/generation", 1),
        "replicas": current,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": current,
        "updatedReplicas": current,
        "currentRevision": revision,
        "updateRevision": revision,
        "collisionCount": 0,
    });
    actions.extend(status_action(Kind::StatefulSet, sts, status));
    actions
}

/// The ReplicaSet controller: `spec.replicas` Pods `<rs>-<5 chars>`.
pub(crate) fn replica_set(rs: &Value, pods: &[Value], seq: &mut u64) -> Vec<Action> {
    let replicas = int_at(rs, "/spec/replicas", 1).max(0) as usize;
    let mine = owned(rs, pods);
    let mut actions = Vec::new();
    if mine.len() < replicas {
        for _ in mine.len()..replicas {
            let pod_name = loop {
                *seq += 1;
                let candidate = format!("{}-{}", name_of(rs), suffix(uid_of(rs), *seq));
                if !pods.iter().any(|p| name_of(p) == candidate) {
                    break candidate;
                }
            };
            actions.push(Action::Create {
                kind: Kind::Pod,
                object: pod_from_template(Kind::ReplicaSet, rs, &pod_name, &[], &[]),
            });
        }
    }
    for pod in victims(&mine, mine.len().saturating_sub(replicas)) {
        actions.push(Action::Delete {
            kind: Kind::Pod,
            name: name_of(pod).to_string(),
        });
    }
    let (current, ready) = counts(&mine);
    let status = json!({
        "observedGeneration": int_at(rs, "/metadata/generation", 1),
        "replicas": current,
        "fullyLabeledReplicas": current,
        "readyReplicas": ready,
        "availableReplicas": ready,
    });
    actions.extend(status_action(Kind::ReplicaSet, rs, status));
    actions
}

/// OpenKruise's CloneSet controller: Pods `<cloneset>-<5 chars>` created directly (no
/// ReplicaSets), labelled `controller-revision-hash=<cloneset>-<template hash>` and
/// `apps.kruise.io/cloneset-instance-id=<5 chars>`; `spec.replicas` of them, the newest
/// and not-ready ones removed first; a changed template recreates the Pods of the old
/// revision (Kruise's `ReCreate` update, all at once here).
pub(crate) fn clone_set(cs: &Value, pods: &[Value], seq: &mut u64) -> Vec<Action> {
    let name = name_of(cs);
    let replicas = int_at(cs, "/spec/replicas", 1).max(0) as usize;
    let template = cs
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let revision = format!("{name}-{}", template_hash(&template));
    let mine = owned(cs, pods);
    let (current, old): (Vec<&Value>, Vec<&Value>) = mine
        .iter()
        .partition(|p| str_at(p, "/metadata/labels/controller-revision-hash") == revision);
    let mut actions: Vec<Action> = old
        .iter()
        .map(|p| Action::Delete {
            kind: Kind::Pod,
            name: name_of(p).to_string(),
        })
        .collect();
    for _ in current.len()..replicas {
        let id = loop {
            *seq += 1;
            let id = suffix(uid_of(cs), *seq);
            if !pods.iter().any(|p| name_of(p) == format!("{name}-{id}")) {
                break id;
            }
        };
        actions.push(Action::Create {
            kind: Kind::Pod,
            object: pod_from_template(
                Kind::CloneSet,
                cs,
                &format!("{name}-{id}"),
                &[
                    ("controller-revision-hash", revision.clone()),
                    ("apps.kruise.io/cloneset-instance-id", id),
                ],
                &[],
            ),
        });
    }
    for pod in victims(&current, current.len().saturating_sub(replicas)) {
        actions.push(Action::Delete {
            kind: Kind::Pod,
            name: name_of(pod).to_string(),
        });
    }
    let (total, ready) = counts(&mine);
    let (updated, updated_ready) = counts(&current);
    let status = json!({
        "observedGeneration": int_at(cs, "/metadata/generation", 1),
        "replicas": total,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "updatedReplicas": updated,
        "updatedReadyReplicas": updated_ready,
        "expectedUpdatedReplicas": replicas,
        "updateRevision": revision,
        "currentRevision": revision,
        "labelSelector": cs.pointer("/spec/selector/matchLabels").and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>().join(",")).unwrap_or_default(),
    });
    actions.extend(status_action(Kind::CloneSet, cs, status));
    actions
}

/// The Deployment controller: one ReplicaSet `<deployment>-<pod-template-hash>` per
/// template; the current one gets `spec.replicas`, older ones are scaled to 0 (a rollout
/// here replaces every Pod at once).
pub(crate) fn deployment(deploy: &Value, replica_sets: &[Value], now: &str) -> Vec<Action> {
    let name = name_of(deploy);
    let replicas = int_at(deploy, "/spec/replicas", 1).max(0);
    let template = deploy
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let hash = template_hash(&template);
    let rs_name = format!("{name}-{hash}");
    let mine = owned(deploy, replica_sets);
    let mut actions = Vec::new();
    let current = mine.iter().find(|rs| name_of(rs) == rs_name);
    match current {
        None => {
            let mut template = template.clone();
            template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
            let mut selector = deploy
                .pointer("/spec/selector")
                .cloned()
                .unwrap_or_else(|| json!({}));
            selector["matchLabels"]["pod-template-hash"] = json!(hash);
            let mut labels = template["metadata"]["labels"].clone();
            if !labels.is_object() {
                labels = json!({});
            }
            let revision = mine.len() + 1;
            actions.push(Action::Create {
                kind: Kind::ReplicaSet,
                object: json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": rs_name,
                        "namespace": deploy.pointer("/metadata/namespace"),
                        "labels": labels,
                        "annotations": {"deployment.kubernetes.io/revision": revision.to_string(),
                                        "deployment.kubernetes.io/desired-replicas": replicas.to_string()},
                        "ownerReferences": [owner_reference(Kind::Deployment, deploy)],
                    },
                    "spec": {"replicas": replicas, "selector": selector, "template": template},
                }),
            });
        }
        Some(rs) if int_at(rs, "/spec/replicas", 1) != replicas => actions.push(Action::Patch {
            kind: Kind::ReplicaSet,
            name: rs_name.clone(),
            patch: json!({"spec": {"replicas": replicas}}),
        }),
        Some(_) => {}
    }
    for old in mine.iter().filter(|rs| name_of(rs) != rs_name) {
        if int_at(old, "/spec/replicas", 1) != 0 {
            actions.push(Action::Patch {
                kind: Kind::ReplicaSet,
                name: name_of(old).to_string(),
                patch: json!({"spec": {"replicas": 0}}),
            });
        }
    }
    let sum = |pointer: &str| mine.iter().map(|rs| int_at(rs, pointer, 0)).sum::<i64>();
    let total = sum("/status/replicas");
    let ready = sum("/status/readyReplicas");
    let updated = current.map_or(0, |rs| int_at(rs, "/status/replicas", 0));
    let available = ready >= replicas;
    let complete = available && updated == replicas && total == replicas;
    let status = json!({
        "observedGeneration": int_at(deploy, "/metadata/generation", 1),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": (replicas - ready).max(0),
        "conditions": [
            condition(deploy, "Available", available,
                if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }, now),
            condition(deploy, "Progressing", true,
                if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                &format!("ReplicaSet {rs_name:?} {}", if complete { "has successfully progressed." } else { "is progressing." }), now),
        ],
    });
    actions.extend(status_action(Kind::Deployment, deploy, status));
    actions
}

fn node_matches(ds: &Value, node: &Value) -> bool {
    let labels = node.pointer("/metadata/labels");
    ds.pointer("/spec/template/spec/nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The DaemonSet controller: one Pod `<ds>-<5 chars>` bound to each Node its node selector
/// matches.
pub(crate) fn daemon_set(
    ds: &Value,
    pods: &[Value],
    nodes: &[Value],
    seq: &mut u64,
) -> Vec<Action> {
    let mine = owned(ds, pods);
    let eligible: Vec<&str> = nodes
        .iter()
        .filter(|n| node_matches(ds, n))
        .map(name_of)
        .collect();
    let mut actions = Vec::new();
    for node in &eligible {
        if mine.iter().any(|p| str_at(p, "/spec/nodeName") == *node) {
            continue;
        }
        *seq += 1;
        let pod_name = format!("{}-{}", name_of(ds), suffix(uid_of(ds), *seq));
        actions.push(Action::Create {
            kind: Kind::Pod,
            object: pod_from_template(
                Kind::DaemonSet,
                ds,
                &pod_name,
                &[],
                &[("nodeName", json!(node))],
            ),
        });
    }
    let mut scheduled = Vec::new();
    for pod in &mine {
        if eligible.contains(&str_at(pod, "/spec/nodeName")) {
            scheduled.push(*pod);
        } else {
            actions.push(Action::Delete {
                kind: Kind::Pod,
                name: name_of(pod).to_string(),
            });
        }
    }
    let (current, ready) = counts(&scheduled);
    let status = json!({
        "observedGeneration": int_at(ds, "/metadata/generation", 1),
        "desiredNumberScheduled": eligible.len(),
        "currentNumberScheduled": current,
        "updatedNumberScheduled": current,
        "numberMisscheduled": 0,
        "numberReady": ready,
        "numberAvailable": ready,
        "numberUnavailable": (eligible.len() as i64 - ready).max(0),
    });
    actions.extend(status_action(Kind::DaemonSet, ds, status));
    actions
}

fn finished(job: &Value) -> Option<&str> {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| {
            matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True"
        })
        .and_then(|c| c["type"].as_str())
}

/// The Job controller: Pods `<job>-<5 chars>` up to `parallelism` until `completions`
/// succeeded (`Complete`) or more than `backoffLimit` failed (`Failed`,
/// `BackoffLimitExceeded`); `activeDeadlineSeconds` past `startTime` fails it
/// (`DeadlineExceeded`); `suspend: true` removes its active Pods (`Suspended`).
/// `now_seconds`: the current Unix time, for the deadline.
pub(crate) fn job(
    job: &Value,
    pods: &[Value],
    now: &str,
    now_seconds: i64,
    seq: &mut u64,
) -> Vec<Action> {
    let mine = owned(job, pods);
    let succeeded = mine.iter().filter(|p| phase_of(p) == "Succeeded").count() as i64;
    let failed = mine.iter().filter(|p| phase_of(p) == "Failed").count() as i64;
    let active: Vec<&Value> = mine
        .iter()
        .copied()
        .filter(|p| !matches!(phase_of(p), "Succeeded" | "Failed"))
        .collect();
    let completions = int_at(job, "/spec/completions", 1).max(1);
    let parallelism = int_at(job, "/spec/parallelism", 1).max(0);
    let backoff_limit = int_at(job, "/spec/backoffLimit", 6);
    let suspended = job.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
    let start_time = job
        .pointer("/status/startTime")
        .cloned()
        .filter(|v| !v.is_null());
    let mut status = job
        .get("status")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let mut conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut actions = Vec::new();
    let delete_active = |actions: &mut Vec<Action>| {
        for pod in &active {
            actions.push(Action::Delete {
                kind: Kind::Pod,
                name: name_of(pod).to_string(),
            });
        }
    };
    let set_condition = |conditions: &mut Vec<Value>,
                         kind: &str,
                         on: bool,
                         reason: &str,
                         message: &str| {
        let status = if on { "True" } else { "False" };
        match conditions.iter_mut().find(|c| c["type"] == kind) {
            Some(c) if c["status"] == status => {}
            Some(c) => {
                *c = json!({"type": kind, "status": status, "reason": reason, "message": message,
                            "lastProbeTime": now, "lastTransitionTime": now});
            }
            None if on => conditions.push(json!({"type": kind, "status": status, "reason": reason,
                "message": message, "lastProbeTime": now, "lastTransitionTime": now})),
            None => {}
        }
    };
    let deadline_passed = || {
        let (Some(deadline), Some(start)) = (
            job.pointer("/spec/activeDeadlineSeconds")
                .and_then(Value::as_i64),
            start_time.as_ref().and_then(Value::as_str),
        ) else {
            return false;
        };
        chrono::DateTime::parse_from_rfc3339(start)
            .is_ok_and(|s| s.timestamp() + deadline <= now_seconds)
    };
    let mut ended = finished(job).is_some();
    if ended {
        delete_active(&mut actions);
    } else if succeeded >= completions {
        set_condition(&mut conditions, "Complete", true, "", "");
        status["completionTime"] = json!(now);
        ended = true;
        delete_active(&mut actions);
    } else if failed > backoff_limit {
        set_condition(
            &mut conditions,
            "Failed",
            true,
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        );
        ended = true;
        delete_active(&mut actions);
    } else if deadline_passed() {
        set_condition(
            &mut conditions,
            "Failed",
            true,
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        );
        ended = true;
        delete_active(&mut actions);
    } else if suspended {
        set_condition(
            &mut conditions,
            "Suspended",
            true,
            "JobSuspended",
            "Job suspended",
        );
        delete_active(&mut actions);
    } else {
        set_condition(
            &mut conditions,
            "Suspended",
            false,
            "JobResumed",
            "Job resumed",
        );
        let want = parallelism.min(completions - succeeded) - active.len() as i64;
        for _ in 0..want.max(0) {
            let pod_name = loop {
                *seq += 1;
                let candidate = format!("{}-{}", name_of(job), suffix(uid_of(job), *seq));
                if !pods.iter().any(|p| name_of(p) == candidate) {
                    break candidate;
                }
            };
            let uid = uid_of(job).to_string();
            actions.push(Action::Create {
                kind: Kind::Pod,
                object: pod_from_template(
                    Kind::Job,
                    job,
                    &pod_name,
                    &[
                        ("batch.kubernetes.io/job-name", name_of(job).to_string()),
                        ("job-name", name_of(job).to_string()),
                        ("batch.kubernetes.io/controller-uid", uid.clone()),
                        ("controller-uid", uid),
                    ],
                    &[],
                ),
            });
        }
        if start_time.is_none() {
            status["startTime"] = json!(now);
        }
    }
    let running = if ended || suspended {
        0
    } else {
        active.len() as i64
    };
    let mut fields = Map::new();
    fields.insert("active".into(), json!(running));
    fields.insert(
        "ready".into(),
        json!(if running == 0 {
            0
        } else {
            active.iter().filter(|p| is_ready(p)).count()
        }),
    );
    fields.insert("succeeded".into(), json!(succeeded));
    fields.insert("failed".into(), json!(failed));
    fields.insert("conditions".into(), json!(conditions));
    if let Value::Object(map) = &mut status {
        map.extend(fields);
        if conditions.is_empty() {
            map.shift_remove("conditions");
        }
    }
    actions.extend(status_action(Kind::Job, job, status));
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(kind: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": kind,
               "metadata": {"name": name, "namespace": "w", "uid": format!("uid-{name}"), "generation": 1},
               "spec": spec})
    }

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "main", "image": "img"}]}})
    }

    fn created(actions: &[Action]) -> Vec<Value> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Create { object, .. } => Some(object.clone()),
                _ => None,
            })
            .collect()
    }

    fn ready(mut pod: Value) -> Value {
        pod["status"] =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        pod
    }

    #[test]
    fn stateful_set_pods_are_ordinal_and_ordered() {
        let sts = workload(
            "StatefulSet",
            "actor",
            json!({"replicas": 2, "serviceName": "actor", "template": template()}),
        );
        let first = created(&stateful_set(&sts, &[]));
        assert_eq!(first.len(), 1, "one at a time");
        let pod0 = &first[0];
        assert_eq!(pod0["metadata"]["name"], "actor-0");
        assert_eq!(pod0["metadata"]["labels"]["app"], "a");
        assert_eq!(
            pod0["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
            "actor-0"
        );
        assert_eq!(pod0["metadata"]["ownerReferences"][0]["uid"], "uid-actor");
        assert_eq!(pod0["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            (
                pod0["spec"]["hostname"].as_str(),
                pod0["spec"]["subdomain"].as_str()
            ),
            (Some("actor-0"), Some("actor"))
        );
        // Pod 1 waits for pod 0 to be ready.
        assert!(created(&stateful_set(&sts, std::slice::from_ref(pod0))).is_empty());
        let next = created(&stateful_set(&sts, &[ready(pod0.clone())]));
        assert_eq!(next[0]["metadata"]["name"], "actor-1");
        // Scale to 0: the highest ordinal goes first.
        let scaled = workload(
            "StatefulSet",
            "actor",
            json!({"replicas": 0, "template": template()}),
        );
        let pods = [ready(pod0.clone()), ready(next[0].clone())];
        let deletes: Vec<Action> = stateful_set(&scaled, &pods)
            .into_iter()
            .filter(|a| matches!(a, Action::Delete { .. }))
            .collect();
        assert_eq!(
            deletes,
            [Action::Delete {
                kind: Kind::Pod,
                name: "actor-1".into()
            }]
        );
    }

    #[test]
    fn deployment_makes_a_replica_set_that_makes_pods() {
        let deploy = workload(
            "Deployment",
            "rollout",
            json!({"replicas": 3, "selector": {"matchLabels": {"app": "a"}}, "template": template()}),
        );
        let actions = deployment(&deploy, &[], "t");
        let rs = created(&actions).remove(0);
        let hash = template_hash(&template());
        assert_eq!(rs["metadata"]["name"], format!("rollout-{hash}"));
        assert_eq!(
            rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"],
            hash
        );
        assert_eq!(
            rs["spec"]["selector"]["matchLabels"],
            json!({"app": "a", "pod-template-hash": hash})
        );
        let mut rs = rs;
        rs["metadata"]["uid"] = json!("uid-rs");
        let mut seq = 0;
        let pods = created(&replica_set(&rs, &[], &mut seq));
        assert_eq!(pods.len(), 3);
        for pod in &pods {
            let name = pod["metadata"]["name"].as_str().unwrap();
            let tail = name.strip_prefix(&format!("rollout-{hash}-")).unwrap();
            assert_eq!(tail.len(), 5, "{name}");
            assert!(tail.bytes().all(|b| ALPHABET.contains(&b)), "{name}");
        }
        // A changed template: a new ReplicaSet, the old one scaled to 0.
        let mut changed = deploy.clone();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("img:2");
        let actions = deployment(&changed, &[rs.clone()], "t");
        assert!(actions.contains(&Action::Patch {
            kind: Kind::ReplicaSet,
            name: format!("rollout-{hash}"),
            patch: json!({"spec": {"replicas": 0}})
        }));
        assert_eq!(created(&actions).len(), 1);
    }

    #[test]
    fn job_completes_fails_and_suspends() {
        let spec = json!({"backoffLimit": 0, "template": template()});
        let job_object = workload("Job", "train", spec);
        let mut seq = 0;
        let pods = created(&job(&job_object, &[], "t", 0, &mut seq));
        assert_eq!(pods.len(), 1);
        let pod = &pods[0];
        assert_eq!(
            pod["metadata"]["labels"]["batch.kubernetes.io/job-name"],
            "train"
        );
        assert!(
            pod["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("train-")
        );
        let mut done = pod.clone();
        done["status"] = json!({"phase": "Succeeded"});
        let status = job(&job_object, &[done.clone()], "t", 0, &mut seq)
            .into_iter()
            .find_map(|a| match a {
                Action::Status { status, .. } => Some(status),
                _ => None,
            })
            .unwrap();
        assert_eq!(status["succeeded"], 1);
        assert_eq!(status["conditions"][0]["type"], "Complete");
        let mut failed = pod.clone();
        failed["status"] = json!({"phase": "Failed"});
        let status = job(&job_object, &[failed], "t", 0, &mut seq)
            .into_iter()
            .find_map(|a| match a {
                Action::Status { status, .. } => Some(status),
                _ => None,
            })
            .unwrap();
        assert_eq!(status["failed"], 1);
        assert_eq!(status["conditions"][0]["reason"], "BackoffLimitExceeded");
        let mut suspended = job_object.clone();
        suspended["spec"]["suspend"] = json!(true);
        let actions = job(&suspended, std::slice::from_ref(pod), "t", 0, &mut seq);
        assert!(actions.contains(&Action::Delete {
            kind: Kind::Pod,
            name: pod["metadata"]["name"].as_str().unwrap().into()
        }));
        assert!(created(&actions).is_empty());
        // The deadline counts from startTime.
        let mut timed = job_object.clone();
        timed["spec"]["activeDeadlineSeconds"] = json!(10);
        timed["status"] = json!({"startTime": "2026-01-01T00:00:00Z"});
        let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .timestamp();
        let status = |now: i64| {
            job(&timed, std::slice::from_ref(pod), "t", now, &mut 0)
                .into_iter()
                .find_map(|a| match a {
                    Action::Status { status, .. } => Some(status),
                    _ => None,
                })
                .unwrap()
        };
        assert!(status(start + 5).get("conditions").is_none());
        assert_eq!(
            status(start + 10)["conditions"][0]["reason"],
            "DeadlineExceeded"
        );
    }

    #[test]
    fn daemon_set_puts_one_pod_on_each_matching_node() {
        let mut template = template();
        template["spec"]["nodeSelector"] = json!({"gpu": "yes"});
        let ds = workload("DaemonSet", "agent", json!({"template": template}));
        let nodes = [
            json!({"metadata": {"name": "a", "labels": {"gpu": "yes"}}}),
            json!({"metadata": {"name": "b", "labels": {}}}),
        ];
        let pods = created(&daemon_set(&ds, &[], &nodes, &mut 0));
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["spec"]["nodeName"], "a");
    }
}
