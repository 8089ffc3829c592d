use super::build::*;
use super::decide::*;
use super::expectations::*;
use super::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::types::{
    Job, JobPhase, JobStatus, JobTaskStatus, JobTaskTemplate, RewardSummary, Task, TaskPhase,
};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::scheduler::TaskPlacementDecision;

use rlark_api::types::{JobSpec, TaskPlacement};

fn obs(phase: Option<JobPhase>, tasks: Vec<Option<ObservedTask>>) -> Observation {
    Observation {
        phase,
        stopped: false,
        restart: None,
        templates: (0..tasks.len()).map(|i| format!("t{i}")).collect(),
        tasks,
    }
}

fn t(phase: Option<TaskPhase>) -> Option<ObservedTask> {
    Some(ObservedTask {
        phase,
        ..Default::default()
    })
}

fn stopped_t(phase: Option<TaskPhase>) -> Option<ObservedTask> {
    Some(ObservedTask {
        phase,
        stopped: true,
        ..Default::default()
    })
}

use JobPhase as J;
use TaskPhase as T;

#[test]
fn new_job_goes_pending_and_places() {
    let d = decide(&obs(None, vec![None, None]));
    assert_eq!(d.phase, J::Pending);
    assert!(d.place_missing);
    assert_eq!(d.reason, "Pending");
    // Partially created (killed mid-way): place the rest.
    let d = decide(&obs(Some(J::Pending), vec![t(None), None]));
    assert_eq!(d.phase, J::Pending);
    assert!(d.place_missing);
    let d = decide(&obs(Some(J::Pending), vec![t(None), t(Some(T::Pending))]));
    assert!(!d.place_missing);
    assert_eq!(d.phase, J::Pending);
}

#[test]
fn progress_from_task_phases() {
    let cases = [
        (
            J::Pending,
            vec![Some(T::Running), Some(T::Pending)],
            J::Running,
        ),
        (
            J::Pending,
            vec![Some(T::Succeeded), Some(T::Pending)],
            J::Running,
        ),
        (
            J::Pending,
            vec![Some(T::Succeeded), Some(T::Succeeded)],
            J::Succeeded,
        ),
        (
            J::Running,
            vec![Some(T::Succeeded), Some(T::Succeeded)],
            J::Succeeded,
        ),
        (
            J::Running,
            vec![Some(T::Failed), Some(T::Running)],
            J::Failed,
        ),
        (J::Pending, vec![Some(T::Failed), None], J::Failed),
        // Running never goes back to Pending.
        (
            J::Running,
            vec![Some(T::Pending), Some(T::Pending)],
            J::Running,
        ),
        // A Stopped Task of a running Job is being resumed: pending.
        (
            J::Pending,
            vec![Some(T::Stopped), Some(T::Pending)],
            J::Pending,
        ),
        // Terminal phases stay.
        (
            J::Succeeded,
            vec![Some(T::Failed), Some(T::Running)],
            J::Succeeded,
        ),
        (
            J::Failed,
            vec![Some(T::Succeeded), Some(T::Succeeded)],
            J::Failed,
        ),
    ];
    for (from, phases, to) in cases {
        let d = decide(&obs(Some(from), phases.iter().map(|p| t(*p)).collect()));
        assert_eq!(d.phase, to, "{from:?} with {phases:?}");
    }
    let empty = decide(&obs(Some(J::Pending), vec![]));
    assert_eq!(
        empty.phase,
        J::Pending,
        "a Job without tasks never completes"
    );
}

#[test]
fn failure_stops_the_rest_and_explains() {
    let mut o = obs(
        Some(J::Running),
        vec![
            Some(ObservedTask {
                phase: Some(T::Failed),
                message: Some("exit code 3".into()),
                ..Default::default()
            }),
            t(Some(T::Running)),
            t(Some(T::Succeeded)),
            stopped_t(Some(T::Running)),
        ],
    );
    o.templates = vec!["actor".into(), "rollout".into(), "env".into(), "x".into()];
    let d = decide(&o);
    assert_eq!(d.phase, J::Failed);
    assert_eq!(d.reason, "Failed");
    assert_eq!(d.message, "task \"actor\" failed: exit code 3");
    assert_eq!(d.stop, vec![1], "only unfinished, not yet stopped tasks");
    assert!(!d.place_missing);
}

#[test]
fn stop_and_resume() {
    let mut o = obs(
        Some(J::Running),
        vec![t(Some(T::Running)), t(Some(T::Succeeded)), t(None)],
    );
    o.stopped = true;
    let d = decide(&o);
    assert_eq!(d.phase, J::Running, "stays Running while a task runs");
    assert_eq!(d.reason, "Stopping");
    assert_eq!(d.stop, vec![0, 2]);
    // Tasks acknowledged: none running any more.
    let mut o = obs(
        Some(J::Running),
        vec![
            stopped_t(Some(T::Stopped)),
            t(Some(T::Succeeded)),
            stopped_t(Some(T::Pending)),
        ],
    );
    o.stopped = true;
    let d = decide(&o);
    assert_eq!(d.phase, J::Stopped);
    assert!(d.stop.is_empty());
    // Pending without tasks (unschedulable): stopped at once, nothing placed.
    let mut o = obs(Some(J::Pending), vec![None]);
    o.stopped = true;
    let d = decide(&o);
    assert_eq!(d.phase, J::Stopped);
    assert!(!d.place_missing);
    // A new Job created stopped.
    let mut o = obs(None, vec![None]);
    o.stopped = true;
    assert_eq!(decide(&o).phase, J::Stopped);
    // Failed → Stopped.
    let mut o = obs(Some(J::Failed), vec![t(Some(T::Failed))]);
    o.stopped = true;
    assert_eq!(decide(&o).phase, J::Stopped);
    // Succeeded stays.
    let mut o = obs(Some(J::Succeeded), vec![t(Some(T::Succeeded))]);
    o.stopped = true;
    assert_eq!(decide(&o).phase, J::Succeeded);

    // Resume: clear stopped, place what is missing.
    let o = obs(Some(J::Stopped), vec![stopped_t(Some(T::Stopped)), None]);
    let d = decide(&o);
    assert_eq!(d.phase, J::Pending);
    assert_eq!(d.reason, "Resumed");
    assert_eq!(d.resume, vec![0]);
    assert!(d.place_missing);
    // Resume of a Job whose task failed: Failed again, nothing restarted.
    let o = obs(
        Some(J::Stopped),
        vec![stopped_t(Some(T::Failed)), stopped_t(Some(T::Stopped))],
    );
    let d = decide(&o);
    assert_eq!(d.phase, J::Failed);
    assert!(d.resume.is_empty());
}

#[test]
fn restart_deletes_then_resets() {
    for from in [J::Succeeded, J::Failed, J::Stopped] {
        let mut o = obs(Some(from), vec![t(Some(T::Succeeded)), t(Some(T::Failed))]);
        o.restart = Some("2026-01-01T00:00:00Z".into());
        let d = decide(&o);
        assert_eq!(d.phase, from, "phase kept while deleting");
        assert!(d.delete_all);
        assert_eq!(d.restart, Restart::Deleting);
        assert!(!d.place_missing);

        let mut o = obs(Some(from), vec![None, None]);
        o.restart = Some("2026-01-01T00:00:00Z".into());
        let d = decide(&o);
        assert_eq!(d.phase, J::Pending);
        assert_eq!(d.reason, "Restarted");
        assert_eq!(d.restart, Restart::Done("2026-01-01T00:00:00Z".into()));
        assert!(
            !d.place_missing,
            "placed by the next pass, on the reset status"
        );
    }
    // Restart of a Job still stopped: tasks go, it stays Stopped.
    let mut o = obs(Some(J::Stopped), vec![None]);
    o.restart = Some("r".into());
    o.stopped = true;
    assert_eq!(decide(&o).phase, J::Stopped);
    // Active Job: ignored (recorded).
    let mut o = obs(Some(J::Running), vec![t(Some(T::Running))]);
    o.restart = Some("r".into());
    let d = decide(&o);
    assert_eq!(d.restart, Restart::Ignored("r".into()));
    assert_eq!(d.phase, J::Running);
    assert!(!d.delete_all);
    // New Job with the annotation: adopted.
    let mut o = obs(None, vec![None]);
    o.restart = Some("r".into());
    let d = decide(&o);
    assert_eq!(d.restart, Restart::Adopted("r".into()));
    assert!(d.place_missing);
}

fn job_with(templates: serde_json::Value) -> Job {
    let mut job = Job::new(
        "train",
        JobSpec {
            tasks: serde_json::from_value(templates).unwrap(),
            domain: Some("d1".into()),
            ssh_public_key: Some("ssh-ed25519 AAAA".into()),
            stopped: false,
            access: Vec::new(),
        },
    );
    job.metadata.uid = Some("job-uid".into());
    job.metadata.generation = Some(3);
    job
}

fn three_templates() -> Job {
    job_with(json!([
        {"name": "actor", "head": true, "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["a"], "replicas": 2}},
        {"name": "rollout", "agentType": "Kubernetes", "role": "Rollout", "kubernetes": {"workload": {"kind": "Deployment", "replicas": 3, "template": {}}}},
        {"name": "env", "agentType": "Docker", "role": "Env", "docker": {"containers": []}},
        {"name": "sim", "agentType": "Kubernetes", "role": "Env", "kubernetes": {"workload": {"kind": "Job", "template": {}}}},
    ]))
}

#[test]
fn ray_annotations_like_rlark() {
    let job = three_templates();
    let a = ray_annotations("train", &job.spec.tasks);
    let get = |i: usize, k: &str| a[i].get(k).cloned().unwrap_or_default();
    // 2 (raw) + 3 (k8s) + 1 (docker) + 1 (k8s without replicas).
    for i in 0..4 {
        assert_eq!(get(i, labels::RAY_TOTAL_NODES), "7");
        assert_eq!(get(i, labels::RAY_HEAD_TASK_NAME), "train-actor");
    }
    assert_eq!(get(0, labels::RAY_NODE_RANK_START), "0");
    assert_eq!(get(1, labels::RAY_NODE_RANK_START), "2");
    assert_eq!(get(2, labels::RAY_NODE_RANK_START), "5");
    assert_eq!(get(3, labels::RAY_NODE_RANK_START), "6");
    assert_eq!(get(0, labels::RAY_ROLE), "head");
    assert_eq!(get(1, labels::RAY_ROLE), "worker");
    // No head: no head task name.
    let mut no_head = job.spec.tasks.clone();
    no_head[0].head = false;
    assert!(!ray_annotations("train", &no_head)[0].contains_key(labels::RAY_HEAD_TASK_NAME));
}

#[test]
fn built_task_carries_input_and_env_from() {
    let mut job = three_templates();
    let template: JobTaskTemplate = serde_json::from_value(serde_json::json!({
        "name": "rollout", "agentType": "Raw", "role": "Rollout",
        "raw": {"entrypoint": ["x"]},
        "input": {"question": "2+2", "samples": [1, 2]},
        "envFrom": {"input": [{"name": "QUESTION", "path": "$.question"}]},
    }))
    .unwrap();
    job.spec.tasks[1] = template.clone();
    let spec = desired_spec(&job, &job.spec.tasks[1]);
    assert_eq!(spec.input, template.spec.input);
    assert_eq!(spec.env_from, template.spec.env_from);
    assert_eq!(
        spec.input_env().0,
        [("QUESTION".to_string(), "2+2".to_string())]
    );
}

#[test]
fn built_task_carries_everything() {
    let job = three_templates();
    let decision = TaskPlacementDecision {
        template: "actor".into(),
        namespace: "rlark-a".into(),
        placement: TaskPlacement {
            cluster_id: "a".into(),
            nodes: vec!["n1".into(), "n2".into()],
        },
    };
    let ray = ray_annotations("train", &job.spec.tasks);
    let task = build_task(&job, 0, &decision, &ray[0]).unwrap();
    assert_eq!(task.name_any(), "train-actor");
    assert_eq!(task.namespace().as_deref(), Some("rlark-a"));
    assert_eq!(
        task.labels().get(labels::JOB).map(String::as_str),
        Some("train")
    );
    assert_eq!(
        task.annotations().get(labels::RAY_ROLE).map(String::as_str),
        Some("head")
    );
    assert!(task.annotations().contains_key(labels::TEMPLATE_HASH));
    let owner = &task.owner_references()[0];
    assert_eq!(owner.kind, "Job");
    assert_eq!(owner.name, "train");
    assert_eq!(owner.uid, "job-uid");
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(task.spec.domain.as_deref(), Some("d1"));
    assert_eq!(
        task.spec.ssh_public_key.as_deref(),
        Some("ssh-ed25519 AAAA")
    );
    assert_eq!(task.spec.placement, Some(decision.placement.clone()));
    assert!(!task.spec.stopped);
    // The fingerprint ignores placement and stopped, follows the template.
    let mut spec = task.spec.clone();
    spec.placement = None;
    assert_eq!(
        spec_fingerprint(&spec),
        task.annotations()[labels::TEMPLATE_HASH]
    );
    let mut changed = job.clone();
    changed.spec.tasks[0].spec.raw.as_mut().unwrap().entrypoint = vec!["b".into()];
    assert_ne!(
        spec_fingerprint(&desired_spec(&changed, &changed.spec.tasks[0])),
        task.annotations()[labels::TEMPLATE_HASH]
    );
    // No uid: refused.
    let mut anonymous = job.clone();
    anonymous.metadata.uid = None;
    assert!(build_task(&anonymous, 0, &decision, &ray[0]).is_err());
}

#[test]
fn tasks_matched_to_templates() {
    let job = three_templates();
    let decision = |ns: &str| TaskPlacementDecision {
        template: "actor".into(),
        namespace: ns.into(),
        placement: TaskPlacement::default(),
    };
    let ray = BTreeMap::new();
    let mut a_old = build_task(&job, 0, &decision("rlark-a"), &ray).unwrap();
    a_old.metadata.creation_timestamp =
        Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()));
    let mut a_dup = build_task(&job, 0, &decision("rlark-b"), &ray).unwrap();
    a_dup.metadata.creation_timestamp =
        Some(Time(k8s_openapi::jiff::Timestamp::from_second(2).unwrap()));
    let env = build_task(&job, 2, &decision("rlark-a"), &ray).unwrap();
    let mut foreign = build_task(&job, 1, &decision("rlark-a"), &ray).unwrap();
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
    let mut removed = env.clone();
    removed.metadata.name = Some("train-gone".into());
    let (per, extra) = match_tasks(
        &job,
        vec![a_dup.clone(), foreign, env.clone(), a_old.clone(), removed],
    );
    assert_eq!(
        per[0].as_ref().and_then(|t| t.namespace()).as_deref(),
        Some("rlark-a")
    );
    assert!(per[1].is_none(), "a task of another owner is not ours");
    assert_eq!(
        per[2].as_ref().map(|t| t.name_any()).as_deref(),
        Some("train-env")
    );
    assert!(per[3].is_none());
    let extra: Vec<String> = extra
        .iter()
        .map(|t| format!("{}/{}", t.namespace().unwrap(), t.name_any()))
        .collect();
    assert_eq!(extra, vec!["rlark-a/train-gone", "rlark-b/train-actor"]);
}

fn now(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
}

fn cond<'a>(s: &'a JobStatus, t: &str) -> Option<&'a Condition> {
    s.conditions.iter().find(|c| c.type_ == t)
}

#[test]
fn status_times_conditions_and_tasks() {
    let mut job = job_with(json!([
        {"name": "a", "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["a"]}},
    ]));
    // New → Pending, placement fails.
    let o = Observation::of(&job, &[None]);
    let d = decide(&o);
    let s = next_status(
        &job,
        &o,
        &d,
        &PlacementOutcome::Unschedulable("no room".into()),
        &now(0),
    );
    assert_eq!(s.phase, Some(J::Pending));
    assert_eq!(s.start_time, None);
    assert_eq!(
        s.tasks,
        vec![JobTaskStatus {
            name: "a".into(),
            phase: None,
            message: None,
            reward: None,
        }]
    );
    let u = cond(&s, condition::UNSCHEDULABLE).unwrap();
    assert_eq!((u.status.as_str(), u.message.as_str()), ("True", "no room"));
    assert_eq!(cond(&s, condition::SCHEDULED).unwrap().status, "False");
    assert!(cond(&s, condition::RUNNING).is_none());
    assert_eq!(u.observed_generation, Some(3));
    job.status = Some(s);
    assert!(waiting_for_capacity(&job));

    // Placed.
    let o = Observation::of(&job, &[None]);
    let d = decide(&o);
    let s = next_status(
        &job,
        &o,
        &d,
        &PlacementOutcome::Placed("placed".into()),
        &now(1),
    );
    assert_eq!(cond(&s, condition::UNSCHEDULABLE).unwrap().status, "False");
    let sched = cond(&s, condition::SCHEDULED).unwrap();
    assert_eq!(sched.status, "True");
    assert_eq!(sched.last_transition_time, now(1));
    job.status = Some(s);
    assert!(!waiting_for_capacity(&job));

    // Running: start time.
    let mut task = Task::new("train-a", job.spec.tasks[0].spec.clone());
    task.status = Some(rlark_api::types::TaskStatus {
        phase: Some(T::Running),
        message: Some("2/2 ready".into()),
        ..Default::default()
    });
    let o = Observation::of(&job, &[Some(task.clone())]);
    let d = decide(&o);
    let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(2));
    assert_eq!(s.phase, Some(J::Running));
    assert_eq!(s.start_time, Some(now(2)));
    assert_eq!(s.tasks[0].phase, Some(T::Running));
    assert_eq!(s.tasks[0].message.as_deref(), Some("2/2 ready"));
    assert_eq!(cond(&s, condition::RUNNING).unwrap().status, "True");
    assert_eq!(
        cond(&s, condition::SCHEDULED).unwrap().last_transition_time,
        now(1)
    );
    job.status = Some(s);

    // Succeeded: end time, Complete, Running false.
    task.status.as_mut().unwrap().phase = Some(T::Succeeded);
    let o = Observation::of(&job, &[Some(task.clone())]);
    let d = decide(&o);
    let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(3));
    assert_eq!(s.phase, Some(J::Succeeded));
    assert_eq!(s.start_time, Some(now(2)));
    assert_eq!(s.end_time, Some(now(3)));
    assert_eq!(cond(&s, condition::COMPLETE).unwrap().status, "True");
    assert_eq!(cond(&s, condition::RUNNING).unwrap().status, "False");
    assert!(cond(&s, condition::FAILED).is_none());
    job.status = Some(s.clone());
    // Steady: same status again (no write).
    let o = Observation::of(&job, &[Some(task.clone())]);
    let d = decide(&o);
    assert_eq!(
        next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(9)),
        s
    );

    // Restart: annotation; tasks gone → reset.
    job.annotations_mut()
        .insert(labels::RESTARTED_AT.into(), "r1".into());
    let o = Observation::of(&job, &[None]);
    assert_eq!(o.restart.as_deref(), Some("r1"));
    let d = decide(&o);
    let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(10));
    assert_eq!(s.phase, Some(J::Pending));
    assert_eq!(s.start_time, None);
    assert_eq!(s.end_time, None);
    assert!(s.conditions.is_empty());
    assert_eq!(s.observed_restarted_at.as_deref(), Some("r1"));
    job.status = Some(s);
    assert_eq!(Observation::of(&job, &[None]).restart, None, "handled once");
}

#[test]
fn the_job_reward_combines_its_tasks_rewards() {
    let job = three_templates();
    let reward = |values: &[f64]| {
        values
            .iter()
            .enumerate()
            .fold(None, |r: Option<RewardSummary>, (i, v)| {
                Some(RewardSummary::fold(r.as_ref(), *v, Some(i as i64)))
            })
    };
    let with = |values: &[f64]| {
        Some(ObservedTask {
            phase: Some(T::Running),
            reward: reward(values),
            ..Default::default()
        })
    };
    let mut o = obs(
        Some(J::Running),
        vec![with(&[1.0, 3.0]), with(&[]), with(&[5.0])],
    );
    o.templates = vec!["actor".into(), "rollout".into(), "env".into()];
    let d = decide(&o);
    let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(0));
    assert_eq!(s.tasks[0].reward, reward(&[1.0, 3.0]));
    assert_eq!(s.tasks[1].reward, None);
    let combined = s.reward.expect("a job reward");
    assert_eq!(
        (combined.last, combined.mean, combined.count),
        (4.0, 3.0, 3)
    );
    assert_eq!(combined.summary, "4/3");
    // No task reported: no job reward.
    let mut o = obs(Some(J::Running), vec![with(&[]), with(&[]), with(&[])]);
    o.templates = vec!["actor".into(), "rollout".into(), "env".into()];
    let s = next_status(
        &job,
        &o,
        &decide(&o),
        &PlacementOutcome::NotAttempted,
        &now(0),
    );
    assert_eq!(s.reward, None);
}

#[test]
fn status_patch_nulls_dropped_fields() {
    let old = JobStatus {
        phase: Some(J::Succeeded),
        end_time: Some(now(1)),
        ..Default::default()
    };
    let new = JobStatus {
        phase: Some(J::Pending),
        ..Default::default()
    };
    let patch = status_patch(&old, &new, Some("42")).unwrap();
    assert_eq!(patch["status"]["phase"], "Pending");
    assert_eq!(patch["status"]["endTime"], Value::Null);
    assert!(patch["status"].as_object().unwrap().contains_key("endTime"));
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
}

#[test]
fn placement_description() {
    let d = vec![
        TaskPlacementDecision {
            template: "actor".into(),
            namespace: "rlark-a".into(),
            placement: TaskPlacement {
                cluster_id: "a".into(),
                nodes: vec!["a1".into(), "a2".into()],
            },
        },
        TaskPlacementDecision {
            template: "none".into(),
            namespace: "rlark-b".into(),
            placement: TaskPlacement {
                cluster_id: "b".into(),
                nodes: vec![],
            },
        },
    ];
    assert_eq!(
        describe_placements(&d),
        "actor → cluster \"a\" (a1, a2); none → cluster \"b\" (no replicas)"
    );
}

fn cached_task(uid: &str, rv: &str, deleting: bool) -> Arc<Task> {
    let job = three_templates();
    let mut task = Task::new(uid, job.spec.tasks[0].spec.clone());
    task.metadata.namespace = Some("rlark-a".into());
    task.metadata.uid = Some(uid.into());
    task.metadata.resource_version = Some(rv.into());
    if deleting {
        task.metadata.deletion_timestamp = Some(now(1));
    }
    Arc::new(task)
}

#[test]
fn expectations_hold_until_the_cache_shows_every_write() {
    let mut e = Expectations::default();
    assert!(!e.tasks_pending());
    e.created.insert("new".into());
    e.deleted.insert("old".into());
    e.updated.insert("kept".into(), 7);
    e.since = Some(Instant::now());
    assert!(e.tasks_pending());

    // The cache before any of the writes.
    let before = vec![
        cached_task("old", "3", false),
        cached_task("kept", "5", false),
    ];
    assert!(!e.tasks_met_by(&before));
    // Created and deleted seen, the update not yet.
    let partly = vec![
        cached_task("new", "6", false),
        cached_task("kept", "5", false),
    ];
    assert!(!e.tasks_met_by(&partly));
    // Everything seen; a deletion in progress counts as seen.
    let after = vec![
        cached_task("new", "6", false),
        cached_task("old", "8", true),
        cached_task("kept", "7", false),
    ];
    assert!(e.tasks_met_by(&after));
    // A resourceVersion that is not a number is never trusted.
    let opaque = vec![
        cached_task("new", "6", false),
        cached_task("kept", "x", false),
    ];
    assert!(!e.tasks_met_by(&opaque));

    assert!(!e.expired());
    e.since = Instant::now().checked_sub(EXPECTATION_TTL + Duration::from_secs(1));
    assert!(e.expired());
}
