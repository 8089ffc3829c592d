use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use rlark_api::labels;
use rlark_api::types::TaskPlacement;

/// Job `j` (uid `uid-j`) with one template per `(name, domain)`; `job_domain` is the
/// Job's own `spec.domain`.
fn jobs(job_domain: Option<&str>, templates: &[(&str, Option<&str>)]) -> HashMap<String, Arc<Job>> {
    let tasks: Vec<serde_json::Value> = templates
        .iter()
        .map(|(name, domain)| {
            let mut t = json!({"name": name, "agentType": "Raw", "role": "Actor",
                               "raw": {"entrypoint": ["x"], "replicas": 1}});
            if let Some(d) = domain {
                t["domain"] = json!(d);
            }
            t
        })
        .collect();
    let mut job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": "j", "uid": "uid-j"},
        "spec": {"tasks": tasks}
    }))
    .unwrap();
    job.spec.domain = job_domain.map(str::to_string);
    [("j".to_string(), Arc::new(job))].into()
}

fn all_in_d() -> HashMap<String, Arc<Job>> {
    jobs(
        Some("d"),
        &[
            ("head", None),
            ("worker", None),
            ("late", None),
            ("gone", None),
        ],
    )
}

fn task(namespace: &str, name: &str, domain: Option<&str>, replicas: i32) -> Arc<Task> {
    let mut task = Task::new(
        name,
        serde_json::from_value(json!({
            "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": ["x"], "replicas": replicas}
        }))
        .unwrap(),
    );
    task.metadata.namespace = Some(namespace.into());
    task.metadata.labels = Some([(labels::JOB.to_string(), "j".to_string())].into());
    task.metadata.owner_references = Some(vec![OwnerReference {
        api_version: rlark_api::API_VERSION.into(),
        kind: "Job".into(),
        name: "j".into(),
        uid: "uid-j".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    task.spec.domain = domain.map(str::to_string);
    task.spec.placement = Some(TaskPlacement {
        cluster_id: namespace.trim_start_matches("rlark-").into(),
        nodes: (0..replicas).map(|i| format!("n{i}")).collect(),
    });
    Arc::new(task)
}

fn locate(member: &Member<'_>, pod: &str) -> Placement {
    Placement {
        uid: format!("uid-{pod}"),
        pod_namespace: member.namespace.clone(),
        node: Some(format!("n{}", member.index)),
        agent_address: (member.namespace == "rlark-a").then(|| "10.1.0.1:7443".to_string()),
    }
}

#[test]
fn members_are_the_replicas_of_the_domains_tasks() {
    let mut deleting = (*task("rlark-a", "j-gone", Some("d"), 1)).clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    let tasks = vec![
        task("rlark-a", "j-head", Some("d"), 1),
        task("rlark-b", "j-worker", Some("d"), 2),
        task("rlark-b", "j-other", Some("e"), 1),
        task("rlark-b", "j-none", None, 1),
        Arc::new(deleting),
    ];
    let (replicas, by_key) = members("d", &tasks, &all_in_d());
    let got: Vec<(String, String, i32, String, String)> = replicas
        .iter()
        .map(|r| {
            (
                r.key.job.clone(),
                r.key.task.clone(),
                r.key.index,
                r.cluster.clone(),
                r.pod.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "j".into(),
                "j-head".into(),
                0,
                "a".into(),
                "rlark-a/j-head-0".into()
            ),
            (
                "j".into(),
                "j-worker".into(),
                0,
                "b".into(),
                "rlark-b/j-worker-0".into()
            ),
            (
                "j".into(),
                "j-worker".into(),
                1,
                "b".into(),
                "rlark-b/j-worker-1".into()
            ),
        ]
    );
    assert_eq!(by_key.len(), 3);
}

#[test]
fn only_tasks_a_live_job_declares_in_the_domain_are_members() {
    let head = task("rlark-a", "j-head", Some("d"), 1);
    let count =
        |tasks: &[Arc<Task>], jobs: &HashMap<String, Arc<Job>>| members("d", tasks, jobs).0.len();
    let tasks = vec![head.clone()];
    assert_eq!(count(&tasks, &all_in_d()), 1);
    // The template's own domain counts when the Job names none.
    assert_eq!(count(&tasks, &jobs(None, &[("head", Some("d"))])), 1);
    // The Job puts that template elsewhere, or has no such template.
    assert_eq!(count(&tasks, &jobs(None, &[("head", Some("e"))])), 0);
    assert_eq!(count(&tasks, &jobs(Some("e"), &[("head", Some("d"))])), 0);
    assert_eq!(count(&tasks, &jobs(Some("d"), &[("other", None)])), 0);
    // No Job at all, or one of another uid (recreated under the same name).
    assert_eq!(count(&tasks, &HashMap::new()), 0);
    let mut other_uid = (*all_in_d()["j"]).clone();
    other_uid.metadata.uid = Some("uid-new".into());
    assert_eq!(
        count(&tasks, &[("j".to_string(), Arc::new(other_uid))].into()),
        0
    );
    // A Task without the Job's controller ownerReference (written by an agent).
    let mut forged = (*head).clone();
    forged.metadata.owner_references = None;
    assert_eq!(count(&[Arc::new(forged)], &all_in_d()), 0);
    // Two Tasks claiming one key: the older one is the member.
    let mut older = (*task("rlark-b", "j-head", Some("d"), 1)).clone();
    older.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    let mut newer = (*head).clone();
    newer.metadata.creation_timestamp = Some(Time(Timestamp::from_second(2).unwrap()));
    let tasks = vec![Arc::new(newer), Arc::new(older)];
    let (replicas, _) = members("d", &tasks, &all_in_d());
    assert_eq!(replicas.len(), 1);
    assert_eq!(replicas[0].cluster, "b");
}

#[test]
fn each_namespace_with_a_member_gets_every_member_and_only_its_pending() {
    let net: IpNet = "10.0.0.0/30".parse().unwrap();
    let tasks = vec![
        task("rlark-a", "j-head", Some("d"), 1),
        task("rlark-b", "j-worker", Some("d"), 1),
        task("rlark-c", "j-late", Some("d"), 1),
    ];
    let (replicas, by_key) = members("d", &tasks, &all_in_d());
    let outcome = ipam::allocate(&net, &[], &replicas, Timestamp::from_second(100).unwrap());
    assert_eq!(outcome.unallocated.len(), 1);
    let specs = peer_specs(
        "d",
        &net,
        &outcome.allocations,
        &outcome.unallocated,
        &by_key,
        locate,
    );
    assert_eq!(
        specs.keys().collect::<Vec<_>>(),
        ["rlark-a", "rlark-b", "rlark-c"]
    );
    let a = &specs["rlark-a"];
    assert_eq!(
        (a.domain.as_str(), a.cidr.as_str(), a.prefix_len),
        ("d", "10.0.0.0/30", 30)
    );
    let pods: Vec<(&str, &str, &str, &str, Option<&str>)> = a
        .pods
        .iter()
        .map(|p| {
            (
                p.global_namespace.as_str(),
                p.name.as_str(),
                p.ip.as_str(),
                p.cluster.as_str(),
                p.agent_address.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        pods,
        [
            (
                "rlark-a",
                "j-head-0",
                "10.0.0.1",
                "a",
                Some("10.1.0.1:7443")
            ),
            // Key order: j-late before j-worker, which is left without an address.
            ("rlark-c", "j-late-0", "10.0.0.2", "c", None),
        ]
    );
    assert_eq!(a.pods[0].uid, "uid-j-head-0");
    assert_eq!(a.pods[0].node.as_deref(), Some("n0"));
    assert_eq!(a.pods[0].task.as_deref(), Some("j-head"));
    assert!(a.pending.is_empty());
    assert_eq!(specs["rlark-c"].pods, a.pods);
    assert!(specs["rlark-c"].pending.is_empty());
    let b = &specs["rlark-b"];
    assert_eq!(b.pods, a.pods);
    assert_eq!(b.pending.len(), 1);
    assert_eq!(b.pending[0].name, "j-worker-0");
    assert_eq!(b.pending[0].reason, NO_DOMAIN_IP);
    assert_eq!(
        b.pending[0].message,
        "Domain \"d\" has no free address: all 2 usable addresses of 10.0.0.0/30 are held"
    );
}

#[test]
fn released_members_are_listed_nowhere() {
    let net: IpNet = "10.0.0.0/24".parse().unwrap();
    let tasks = vec![task("rlark-a", "j-head", Some("d"), 2)];
    let (replicas, by_key) = members("d", &tasks, &all_in_d());
    let first = ipam::allocate(&net, &[], &replicas, Timestamp::from_second(100).unwrap());
    // Shrunk to one replica: index 1 released, its namespace still has index 0.
    let tasks = vec![task("rlark-a", "j-head", Some("d"), 1)];
    let (replicas, by_key2) = members("d", &tasks, &all_in_d());
    let second = ipam::allocate(
        &net,
        &first.allocations,
        &replicas,
        Timestamp::from_second(200).unwrap(),
    );
    assert_eq!(second.allocations.len(), 2);
    let specs = peer_specs("d", &net, &second.allocations, &[], &by_key2, locate);
    assert_eq!(specs["rlark-a"].pods.len(), 1);
    // Every replica gone: no DomainPeer at all.
    let (_, none) = members("d", &[], &all_in_d());
    let third = ipam::allocate(
        &net,
        &second.allocations,
        &[],
        Timestamp::from_second(300).unwrap(),
    );
    assert!(peer_specs("d", &net, &third.allocations, &[], &none, locate).is_empty());
    drop(by_key);
}

#[test]
fn task_messages_and_expiry() {
    let net: IpNet = "fd00::/127".parse().unwrap();
    assert_eq!(
        task_message("d", &net, &[2]),
        "NoDomainIP: replica 2 without an address: Domain \"d\" has no free address: all 2 usable addresses of fd00::/127 are held"
    );
    assert!(task_message("d", &net, &[1, 3]).starts_with("NoDomainIP: replicas 1, 3 without"));
    let now = Timestamp::from_second(10_000).unwrap();
    let released = |secs: i64| DomainIpAllocation {
        ip: "fd00::1".into(),
        released_at: Some(Time(Timestamp::from_second(secs).unwrap())),
        ..Default::default()
    };
    assert_eq!(next_expiry(&[], now), None);
    assert_eq!(
        next_expiry(&[released(9_000), released(8_000)], now),
        Some(Duration::from_secs(1_600))
    );
    // Already due: soon, not never.
    assert_eq!(
        next_expiry(&[released(1)], now),
        Some(Duration::from_secs(1))
    );
}

fn a_domain(name: &str) -> Domain {
    Domain::new(
        name,
        rlark_api::types::DomainSpec {
            cidr: "10.8.0.0/24".into(),
            job_selector: None,
        },
    )
}

fn encoded(metrics: &crate::context::Metrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[test]
fn deleted_domains_leave_the_gauges() {
    let metrics = crate::context::Metrics::default();
    let (store, mut writer) = reflector::store::<Domain>();
    for name in ["d", "e", "f"] {
        let event = watcher::Event::Apply(a_domain(name));
        writer.apply_watcher_event(&event);
        forget_deleted(&metrics, &event, &store);
        metrics.set_domain(name, 2, 254);
    }
    let text = encoded(&metrics);
    for name in ["d", "e", "f"] {
        assert!(
            text.contains(&format!(
                "rlark_domain_allocated_addresses{{domain=\"{name}\"}} 2"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "rlark_domain_capacity_addresses{{domain=\"{name}\"}} 254"
            )),
            "{text}"
        );
    }

    // A deletion the watch sees.
    let event = watcher::Event::Delete(a_domain("d"));
    writer.apply_watcher_event(&event);
    forget_deleted(&metrics, &event, &store);
    let text = encoded(&metrics);
    assert!(!text.contains("domain=\"d\""), "{text}");
    assert!(text.contains("domain=\"e\""), "{text}");

    // A deletion the watch missed: the relist no longer holds "e".
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(a_domain("f")),
        watcher::Event::InitDone,
    ] {
        writer.apply_watcher_event(&event);
        forget_deleted(&metrics, &event, &store);
    }
    let text = encoded(&metrics);
    assert!(!text.contains("domain=\"e\""), "{text}");
    assert!(
        text.contains("rlark_domain_allocated_addresses{domain=\"f\"} 2"),
        "{text}"
    );
}
