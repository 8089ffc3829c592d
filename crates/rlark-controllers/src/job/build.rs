//! The Tasks a Job's templates become: their spec, fingerprint, owner reference and RLark's
//! Ray annotations; matching existing Tasks to templates; the status patch. Pure.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource as _, ResourceExt as _};
use rlark_api::labels;
use rlark_api::names::task_name;
use rlark_api::types::{Job, JobPhase, JobTaskTemplate, Task, TaskSpec};
use serde_json::{Value, json};
// Expectation and assumption TTLs follow tokio's clock, which tests may pause and advance.

use crate::error::Error;
use crate::scheduler::TaskPlacementDecision;

use super::condition;
use super::decide::condition_is_true;

/// RLark's Ray annotations for every template, in template order:
/// `rlark.io/ray-total-nodes` = Σ replicas over all templates, `rlark.io/ray-node-rank-start`
/// = Σ replicas of the templates before, `rlark.io/ray-role` = `head` | `worker`,
/// `rlark.io/ray-head-task-name` = `<job>-<first head template>` (absent without a head).
///
/// Replicas are [`TaskSpec::replicas`]: `kubernetes.workload.replicas` (1 when unset) and
/// 1 for `docker`, exactly as RLark counts; rlark's `raw` tasks (which RLark lacks) count
/// `raw.replicas`, since each raw replica is one Ray node. Negative counts count 0.
pub fn ray_annotations(
    job_name: &str,
    templates: &[JobTaskTemplate],
) -> Vec<BTreeMap<String, String>> {
    let replicas = |t: &JobTaskTemplate| i64::from(t.spec.replicas().max(0));
    let total: i64 = templates.iter().map(replicas).sum();
    let head = templates
        .iter()
        .find(|t| t.head)
        .map(|t| task_name(job_name, &t.name));
    let mut start = 0i64;
    templates
        .iter()
        .map(|t| {
            let mut a = BTreeMap::new();
            a.insert(labels::RAY_TOTAL_NODES.to_string(), total.to_string());
            a.insert(labels::RAY_NODE_RANK_START.to_string(), start.to_string());
            let role = if t.head {
                labels::RAY_ROLE_HEAD
            } else {
                labels::RAY_ROLE_WORKER
            };
            a.insert(labels::RAY_ROLE.to_string(), role.to_string());
            if let Some(head) = &head {
                a.insert(labels::RAY_HEAD_TASK_NAME.to_string(), head.clone());
            }
            start += replicas(t);
            a
        })
        .collect()
}

/// The Task spec template `index` of `job` asks for, without placement and not stopped:
/// the template with the Job's `domain` and `sshPublicKey` (when the Job sets them).
pub fn desired_spec(job: &Job, template: &JobTaskTemplate) -> TaskSpec {
    let mut spec = template.spec.clone();
    if job.spec.domain.is_some() {
        spec.domain = job.spec.domain.clone();
    }
    if job.spec.ssh_public_key.is_some() {
        spec.ssh_public_key = job.spec.ssh_public_key.clone();
    }
    spec.placement = None;
    spec.stopped = false;
    spec
}

/// Stable fingerprint (FNV-1a 64, hex) of a desired spec, stored in the
/// `rlark.io/template-hash` annotation to notice template changes without comparing specs
/// the server may have normalized.
pub fn spec_fingerprint(spec: &TaskSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The Task to create for template `index` of `job`, placed as `decision` says.
///
/// `Err` when the Job has no name or uid (not read from the API server).
pub fn build_task(
    job: &Job,
    index: usize,
    decision: &TaskPlacementDecision,
    ray: &BTreeMap<String, String>,
) -> Result<Task, Error> {
    let template = job
        .spec
        .tasks
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("job has no task template #{index}")))?;
    let job_name = job
        .metadata
        .name
        .clone()
        .ok_or_else(|| Error::MissingName("Job".into()))?;
    let mut owner = job
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Invalid(format!("job {job_name} has no uid")))?;
    owner.block_owner_deletion = Some(true);
    let mut spec = desired_spec(job, template);
    let mut annotations = ray.clone();
    annotations.insert(labels::TEMPLATE_HASH.to_string(), spec_fingerprint(&spec));
    spec.placement = Some(decision.placement.clone());
    spec.stopped = job.spec.stopped;
    Ok(Task {
        metadata: ObjectMeta {
            name: Some(task_name(&job_name, &template.name)),
            namespace: Some(decision.namespace.clone()),
            labels: Some([(labels::JOB.to_string(), job_name.clone())].into()),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

/// Whether `task`'s controller ownerReference is the object with `uid`.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Splits the Tasks listed for `job` into one per template (by name `<job>-<template>`,
/// controlled by this Job's uid; with several, the oldest, then by namespace) and the
/// rest it controls, which must go (duplicates, removed templates). Tasks controlled by
/// something else are ignored.
pub fn match_tasks(job: &Job, tasks: Vec<Task>) -> (Vec<Option<Task>>, Vec<Task>) {
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let job_name = job.name_any();
    let mut owned: Vec<Task> = tasks
        .into_iter()
        .filter(|t| controlled_by(&t.metadata, &uid))
        .collect();
    owned.sort_by(|a, b| {
        let key = |t: &Task| {
            (
                t.metadata.creation_timestamp.clone().map(|t| t.0),
                t.namespace().unwrap_or_default(),
                t.name_any(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut per_template: Vec<Option<Task>> = vec![None; job.spec.tasks.len()];
    let index: HashMap<String, usize> = job
        .spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (task_name(&job_name, &t.name), i))
        .collect();
    let mut extra = Vec::new();
    for task in owned {
        match index.get(&task.name_any()) {
            Some(&i) if per_template[i].is_none() => per_template[i] = Some(task),
            _ => extra.push(task),
        }
    }
    (per_template, extra)
}

/// `actor → cluster "a" (a1, a2); rollout → cluster "b" (b1)`.
pub fn describe_placements(decisions: &[TaskPlacementDecision]) -> String {
    decisions
        .iter()
        .map(|d| {
            format!(
                "{} → cluster {:?} ({})",
                d.template,
                d.placement.cluster_id,
                if d.placement.nodes.is_empty() {
                    "no replicas".to_string()
                } else {
                    d.placement.nodes.join(", ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Job is waiting for capacity: not stopped, `Pending` (or new), not yet fully placed.
pub fn waiting_for_capacity(job: &Job) -> bool {
    let status = job.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    !job.spec.stopped
        && matches!(phase, None | Some(JobPhase::Pending))
        && !status.is_some_and(|s| condition_is_true(&s.conditions, condition::SCHEDULED))
}

/// The merge patch turning `old` into `new` (every field of `new`, `null` for the fields
/// it dropped), preconditioned on `resource_version`.
pub(crate) fn status_patch<S: serde::Serialize>(
    old: &S,
    new: &S,
    resource_version: Option<&str>,
) -> Result<Value, Error> {
    let encode = |s: &S| {
        serde_json::to_value(s).map_err(|source| Error::Decode {
            what: "status".into(),
            source,
        })
    };
    let (old, mut new) = (encode(old)?, encode(new)?);
    if let (Some(old), Some(new)) = (old.as_object(), new.as_object_mut()) {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    let mut patch = json!({ "status": new });
    if let Some(rv) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Ok(patch)
}
