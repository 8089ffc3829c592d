//! The Domain controller (with the Job controller placing Tasks) and the pod network's
//! admission against a real in-process API server, with hand-written Nodes. Every wait
//! polls with a deadline.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use rlark_api::labels;
use rlark_api::types::{Domain, DomainPeer, Job, Node, Task};
use rlark_controllers::{Context, ControllerConfig, domain, job};
use rlark_testkit::TestServer;
use rlark_testkit::wait::{eventually, matching};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn node(
    client: &Client,
    cluster: &str,
    name: &str,
    direct: Option<&str>,
) -> anyhow::Result<()> {
    let namespace = format!("rlark-{cluster}");
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let api: Api<Node> = Api::namespaced(client.clone(), &namespace);
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Node",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {labels::CLUSTER_ID: cluster}},
        "spec": {"agentType": "Raw"},
    }))?;
    api.create(&PostParams::default(), &node).await?;
    let mut status =
        json!({"phase": "Online", "allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}});
    if let Some(address) = direct {
        status["network"] = json!({"mode": "kernel", "directAddress": address});
    }
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}

async fn create<K>(client: &Client, body: Value) -> Result<K, kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("object");
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
}

fn template(name: &str, replicas: i32, cluster: &str) -> Value {
    json!({"name": name, "agentType": "Raw", "role": "Actor",
           "nodeSelector": {labels::CLUSTER_ID: cluster},
           "raw": {"entrypoint": ["x"], "replicas": replicas}})
}

fn job(name: &str, domain: &str, tasks: Vec<Value>) -> Value {
    json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
           "metadata": {"name": name, "labels": {"team": "rl"}},
           "spec": {"domain": domain, "tasks": tasks}})
}

/// The 422/409 of a refused write: (code, message).
fn refusal(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn domain_where(
    client: &Client,
    name: &str,
    what: &str,
    pred: impl Fn(&Domain) -> bool,
) -> anyhow::Result<Domain> {
    let api: Api<Domain> = Api::all(client.clone());
    let pred = &pred;
    eventually(what, || {
        let api = api.clone();
        async move {
            let domain = api.get(name).await?;
            Ok(matching(domain, |d| pred(d)))
        }
    })
    .await
}

/// (ip, task, index, cluster, released) of each allocation.
fn allocations(domain: &Domain) -> Vec<(String, String, i32, String, bool)> {
    domain
        .status
        .iter()
        .flat_map(|s| &s.ip_allocations)
        .map(|a| {
            (
                a.ip.clone(),
                a.task.clone().unwrap_or_default(),
                a.index.unwrap_or(-1),
                a.cluster.clone().unwrap_or_default(),
                a.released_at.is_some(),
            )
        })
        .collect()
}

async fn peers(client: &Client, name: &str) -> anyhow::Result<BTreeMap<String, DomainPeer>> {
    let list = Api::<DomainPeer>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.name_any() == name)
        .map(|p| (p.namespace().unwrap_or_default(), p))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_get_stable_addresses_and_peers_and_bad_input_is_refused() -> anyhow::Result<()> {
    rlark_testkit::init_tracing();
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let ctx = Arc::new(Context::new(client.clone(), ControllerConfig::default()));
    let shutdown = CancellationToken::new();
    let controllers = [
        tokio::spawn(job::run(ctx.clone(), shutdown.clone())),
        tokio::spawn(domain::run(ctx.clone(), shutdown.clone())),
    ];
    node(&client, "a", "a1", Some("192.0.2.1:7443")).await?;
    node(&client, "b", "b1", None).await?;

    // Bad input first: nothing of it is stored.
    let (code, message) =
        refusal(create::<Job>(&client, job("early", "net", vec![template("head", 1, "a")])).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(r#"spec.domain: Not found: "net": no Domain of that name exists"#),
        "{message}"
    );
    create::<Domain>(
        &client,
        json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
               "metadata": {"name": "net"},
               "spec": {"cidr": "10.77.0.0/29", "jobSelector": {"matchLabels": {"team": "rl"}}}}),
    )
    .await?;
    let (code, message) = refusal(
        create::<Domain>(
            &client,
            json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
                   "metadata": {"name": "other"}, "spec": {"cidr": "10.77.0.4/30"}}),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(
            r#"spec.cidr: Invalid value: "10.77.0.4/30": overlaps Domain "net" (10.77.0.0/29)"#
        ),
        "{message}"
    );
    let (code, message) =
        refusal(create::<Job>(&client, job("huge", "net", vec![template("w", 7, "b")])).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("7 replicas in all, and its CIDR 10.77.0.0/29 holds 6 usable addresses"),
        "{message}"
    );
    let mut stranger = job("stranger", "net", vec![template("w", 1, "b")]);
    stranger["metadata"]["labels"] = json!({"team": "cv"});
    let (code, message) = refusal(create::<Job>(&client, stranger).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.jobSelector (team=rl)"), "{message}");
    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    assert!(jobs.items.is_empty(), "nothing half-written");

    // A head in cluster a, two workers in b: addresses in key order, peers in both.
    create::<Job>(
        &client,
        job(
            "ppo",
            "net",
            vec![template("head", 1, "a"), template("worker", 2, "b")],
        ),
    )
    .await?;
    let placed = domain_where(&client, "net", "three members", |d| {
        d.status.as_ref().and_then(|s| s.allocated) == Some(3)
    })
    .await?;
    // The Job controller creates the Tasks one by one: addresses go in the order the
    // Domain controller sees them, the lowest free first.
    let mut members = allocations(&placed);
    let mut ips: Vec<String> = members.iter().map(|a| a.0.clone()).collect();
    ips.sort();
    assert_eq!(ips, ["10.77.0.1", "10.77.0.2", "10.77.0.3"]);
    members.sort_by(|x, y| (&x.1, x.2).cmp(&(&y.1, y.2)));
    let keys: Vec<(&str, i32, &str, bool)> = members
        .iter()
        .map(|a| (a.1.as_str(), a.2, a.3.as_str(), a.4))
        .collect();
    assert_eq!(
        keys,
        [
            ("ppo-head", 0, "a", false),
            ("ppo-worker", 0, "b", false),
            ("ppo-worker", 1, "b", false)
        ]
    );
    let ip_of = |task: &str, index: i32| {
        members
            .iter()
            .find(|a| a.1 == task && a.2 == index)
            .map(|a| a.0.clone())
            .unwrap_or_default()
    };
    let (head_ip, worker_ips) = (
        ip_of("ppo-head", 0),
        [ip_of("ppo-worker", 0), ip_of("ppo-worker", 1)],
    );
    let status = placed.status.clone().unwrap_or_default();
    assert_eq!(status.capacity.as_deref(), Some("6"));
    let head_entry = status
        .ip_allocations
        .iter()
        .find(|a| a.task.as_deref() == Some("ppo-head"))
        .expect("head allocated");
    assert_eq!(head_entry.job.as_deref(), Some("ppo"));
    assert_eq!(head_entry.pod.as_deref(), Some("rlark-a/ppo-head-0"));
    let by_ns = eventually("peers in a and b", || {
        let client = client.clone();
        async move {
            let p = peers(&client, "net").await?;
            Ok(matching(p, |p| {
                p.len() == 2 && p.values().all(|p| p.spec.pods.len() == 3)
            }))
        }
    })
    .await?;
    let a = &by_ns["rlark-a"].spec;
    assert_eq!((a.cidr.as_str(), a.prefix_len), ("10.77.0.0/29", 29));
    let head = a
        .pods
        .iter()
        .find(|p| p.name == "ppo-head-0")
        .expect("head listed");
    assert_eq!(head.ip, head_ip);
    assert_eq!(head.cluster, "a");
    assert_eq!(head.global_namespace, "rlark-a");
    assert_eq!(head.node.as_deref(), Some("a1"));
    assert_eq!(head.agent_address.as_deref(), Some("192.0.2.1:7443"));
    let worker = a
        .pods
        .iter()
        .find(|p| p.name == "ppo-worker-1")
        .expect("worker listed");
    assert_eq!(worker.agent_address, None, "b1 announced no direct address");
    assert_eq!(by_ns["rlark-b"].spec.pods, a.pods);
    assert!(
        by_ns
            .values()
            .all(|p| p.owner_references().iter().any(|o| o.kind == "Domain"))
    );
    assert_eq!(ctx.metrics.domain_allocated("net"), 3);

    // In use: the CIDR is fixed and the Domain is not deleted.
    let (code, message) = refusal(
        Api::<Domain>::all(client.clone())
            .patch(
                "net",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"cidr": "10.78.0.0/29"}})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.cidr: Forbidden: may not change"),
        "{message}"
    );
    let (code, message) = refusal(
        Api::<Domain>::all(client.clone())
            .delete("net", &DeleteParams::default())
            .await
            .map(|_| ()),
    );
    assert_eq!(code, 409);
    assert!(message.contains(r#"in use by Job "ppo""#), "{message}");

    // The pool is full for a second Job: its replicas wait, and everyone is told why.
    create::<Job>(&client, job("late", "net", vec![template("z", 4, "a")])).await?;
    let full = domain_where(&client, "net", "pool full", |d| {
        d.status.as_ref().and_then(|s| s.allocated) == Some(6)
    })
    .await?;
    // Replicas of one Task get addresses in index order: index 3 is left over.
    let late: Vec<i32> = allocations(&full)
        .iter()
        .filter(|a| a.1 == "late-z")
        .map(|a| a.2)
        .collect();
    assert_eq!(late.len(), 3, "{:?}", allocations(&full));
    assert!(!late.contains(&3), "{late:?}");
    let task: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
    let waiting = eventually("late-z told why", || {
        let task = task.clone();
        async move {
            let t = task.get_opt("late-z").await?;
            Ok(t.and_then(|t| t.status?.message)
                .filter(|m| m.starts_with("NoDomainIP")))
        }
    })
    .await?;
    assert!(
        waiting.starts_with("NoDomainIP: replica 3 without an address")
            && waiting.contains("all 6 usable addresses of 10.77.0.0/29 are held"),
        "{waiting}"
    );
    let pending = eventually("pending in rlark-a", || {
        let client = client.clone();
        async move {
            let p = peers(&client, "net").await?;
            Ok(p.get("rlark-a")
                .map(|p| p.spec.pending.clone())
                .filter(|p| !p.is_empty()))
        }
    })
    .await?;
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].name.as_str(), pending[0].reason.as_str()),
        ("late-z-3", "NoDomainIP")
    );
    let events = eventually("NoDomainIP event on the Job", || {
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        async move {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=late"))
                .await?;
            Ok(Some(list.items)
                .filter(|l| l.iter().any(|e| e.reason.as_deref() == Some("NoDomainIP"))))
        }
    })
    .await?;
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("NoDomainIP"))
        .unwrap();
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning.message.as_deref().unwrap_or("").contains("late-z"),
        "{warning:?}"
    );

    // Re-placed on another cluster: same address, new cluster.
    let tasks: Api<Task> = Api::namespaced(client.clone(), "rlark-b");
    tasks
        .patch(
            "ppo-worker",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"placement": {"clusterID": "c", "nodes": ["c1", "c1"]}}}),
            ),
        )
        .await?;
    let moved = domain_where(&client, "net", "worker on cluster c", |d| {
        allocations(d)
            .iter()
            .any(|a| a.1 == "ppo-worker" && a.3 == "c")
    })
    .await?;
    let worker: Vec<_> = allocations(&moved)
        .into_iter()
        .filter(|a| a.1 == "ppo-worker")
        .collect();
    let mut worker: Vec<(String, i32, String)> =
        worker.into_iter().map(|a| (a.0, a.2, a.3)).collect();
    worker.sort_by_key(|a| a.1);
    assert_eq!(
        worker,
        [
            (worker_ips[0].clone(), 0, "c".to_string()),
            (worker_ips[1].clone(), 1, "c".to_string()),
        ],
        "same addresses, new cluster"
    );

    // Job ppo deleted: its Tasks go, its addresses are released (kept), and the waiting
    // replica takes the longest-released one.
    Api::<Job>::all(client.clone())
        .delete("ppo", &DeleteParams::default())
        .await?;
    for name in ["ppo-head"] {
        let api: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    let _ = tasks.delete("ppo-worker", &DeleteParams::default()).await;
    let after = domain_where(&client, "net", "late-z placed in a released address", |d| {
        allocations(d)
            .iter()
            .any(|a| a.1 == "late-z" && a.2 == 3 && !a.4)
    })
    .await?;
    let late_z = allocations(&after)
        .into_iter()
        .find(|a| a.1 == "late-z" && a.2 == 3)
        .unwrap();
    assert!(
        ["10.77.0.1", "10.77.0.2", "10.77.0.3"].contains(&late_z.0.as_str()),
        "{late_z:?}"
    );
    assert_eq!(
        allocations(&after).iter().filter(|a| a.4).count(),
        2,
        "the other two stay reserved: {:?}",
        allocations(&after)
    );
    eventually("task message cleared", || {
        let task = task.clone();
        async move {
            let t = task.get("late-z").await?;
            Ok(!t
                .status
                .and_then(|s| s.message)
                .is_some_and(|m| m.starts_with("NoDomainIP")))
        }
    })
    .await?;

    // RLark's key material in a DomainPeer is accepted, not stored.
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "rlark-b",
        &kube::core::ApiResource::erase::<DomainPeer>(&()),
    );
    let legacy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "DomainPeer",
        "metadata": {"name": "legacy", "namespace": "rlark-b"},
        "spec": {"domain": "legacy", "prefixLen": 24, "cert": "ssh-rsa-cert AAAA", "key": "-----BEGIN RSA PRIVATE KEY-----"}
    }))?;
    let stored = raw.create(&PostParams::default(), &legacy).await?;
    let spec = serde_json::to_value(&stored)?["spec"].clone();
    assert_eq!(spec, json!({"domain": "legacy", "prefixLen": 24}));

    shutdown.cancel();
    for handle in controllers {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), handle).await;
    }
    server.stop().await?;
    Ok(())
}
