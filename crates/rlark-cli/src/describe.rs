//! `rlark describe KIND NAME | KIND/NAME [-n NS]`: an object for humans, like `kubectl describe`:
//! metadata, spec, status, conditions, and the Events recorded about it (newest last), so
//! one sees why a Job waits or a Task failed.

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::ClientArgs;
use super::client::Session;
use super::discovery::{Catalog, ResourceInfo};
use super::names;
use super::output::{DataFormat, print_data};
use super::table::{align, human_duration};

mod domain;
mod reward;
mod task;

#[derive(Debug, Args)]
pub(crate) struct DescribeArgs {
    /// Resource type (jobs, job, tasks, nodes.rlinf.io, ns, ...), or KIND/NAME.
    pub kind: String,
    /// Name of the object (unless given as KIND/NAME). Without -n, a namespaced object is
    /// found in whichever namespace holds it.
    pub name: Option<String>,
    /// Print the object alone, as `rlark get KIND NAME -o json|yaml` prints it (no
    /// Events), instead of the description.
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<DataFormat>,
    #[arg(skip)]
    pub client: ClientArgs,
}

/// Width of the `Label:` column.
const LABEL_WIDTH: usize = 15;

/// Annotations not worth printing.
const HIDDEN_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

pub(crate) async fn describe(args: DescribeArgs) -> anyhow::Result<()> {
    let (kind, name) = match names::join_target(&args.kind, args.name.as_deref())?.split_once('/') {
        Some((kind, name)) => (kind.to_string(), name.to_string()),
        None => bail!("describe needs KIND NAME or KIND/NAME (e.g. `rlark describe task t1`)"),
    };
    let session = Session::connect(&args.client).await?;
    let catalog = Catalog::discover(&session.client).await?;
    let info = catalog.resolve(&kind)?;
    let namespace = match info.namespaced {
        true => Some(
            names::locate(
                &session.client,
                info,
                &name,
                session
                    .namespace_explicit
                    .then_some(session.namespace.as_str()),
            )
            .await?,
        ),
        false => None,
    };
    let request = kube::core::Request::new(info.collection_path(namespace.as_deref()))
        .get(&name, &Default::default())?;
    let object: Value = session
        .client
        .request(request)
        .await
        .with_context(|| format!("get {} {}", info.qualified_kind(), name))?;
    if let Some(format) = args.output {
        return print_data(&object, format);
    }
    let events = events_about(&session.client, info, &name, namespace.as_deref()).await;
    let events = match events {
        Ok(events) => Some(events),
        Err(error) => {
            // An old server without Events: describe the object anyway.
            tracing::warn!(error = %format!("{error:#}"), "listing events failed");
            None
        }
    };
    if info.ar.group == "rlinf.io" && info.ar.kind == "Domain" {
        let peers = match domain_peers(&session.client, &name).await {
            Ok(peers) => Some(peers),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "listing domainpeers failed");
                None
            }
        };
        let sections = domain::sections(&object, peers.as_deref());
        let mut shown = object.clone();
        // Shown as the Members table instead.
        if let Some(status) = shown["status"].as_object_mut() {
            status.remove("ipAllocations");
        }
        print!(
            "{}",
            render_with(info, &shown, &sections, events.as_deref(), Utc::now())
        );
        return Ok(());
    }
    if info.ar.group == "rlinf.io" && info.ar.kind == "Task" {
        let pods = match task_pods(&session.client, namespace.as_deref(), &name).await {
            Ok(pods) => pods,
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "listing the task's pods failed");
                Vec::new()
            }
        };
        let mut shown = object.clone();
        let sections = reward::section(&object, &mut shown, LABEL_WIDTH)
            + &task::sections(&session.server, &object, &pods);
        print!(
            "{}",
            render_with(info, &shown, &sections, events.as_deref(), Utc::now())
        );
        return Ok(());
    }
    if info.ar.group == "rlinf.io" && info.ar.kind == "Job" {
        let mut shown = object.clone();
        let sections = reward::section(&object, &mut shown, LABEL_WIDTH);
        print!(
            "{}",
            render_with(info, &shown, &sections, events.as_deref(), Utc::now())
        );
        return Ok(());
    }
    print!("{}", render(info, &object, events.as_deref(), Utc::now()));
    Ok(())
}

/// The replica Pods of Task `name` in `namespace` (label `rlark.io/task-name`).
async fn task_pods(
    client: &kube::Client,
    namespace: Option<&str>,
    name: &str,
) -> anyhow::Result<Vec<Value>> {
    let resource = kube::core::ApiResource {
        group: "rlinf.io".into(),
        version: "v1alpha1".into(),
        api_version: "rlinf.io/v1alpha1".into(),
        kind: "Pod".into(),
        plural: "pods".into(),
    };
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let list = api
        .list(&ListParams::default().labels(&format!("{}={name}", rlark_api::labels::TASK_NAME)))
        .await
        .context("list the task's pods")?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .filter(|p| p["spec"]["taskName"].as_str() == Some(name))
        .collect())
}

/// The DomainPeers of Domain `name` (named after it, in every namespace).
async fn domain_peers(client: &kube::Client, name: &str) -> anyhow::Result<Vec<Value>> {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::core::ApiResource {
            group: "rlinf.io".into(),
            version: "v1alpha1".into(),
            api_version: "rlinf.io/v1alpha1".into(),
            kind: "DomainPeer".into(),
            plural: "domainpeers".into(),
        },
    );
    let list = api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .context("list domainpeers")?;
    let mut peers: Vec<Value> = list
        .items
        .into_iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .collect();
    peers.sort_by_key(|p| p["metadata"]["namespace"].as_str().map(str::to_string));
    Ok(peers)
}

/// Events whose `involvedObject` is this object (by kind, name and namespace; Events of
/// cluster-scoped objects live in `default`), oldest first.
pub(crate) async fn events_about(
    client: &kube::Client,
    info: &ResourceInfo,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<Value>> {
    let mut selector = format!(
        "involvedObject.name={name},involvedObject.kind={}",
        info.ar.kind
    );
    if let Some(ns) = namespace {
        selector.push_str(&format!(",involvedObject.namespace={ns}"));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace.unwrap_or("default"),
        &kube::core::ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Event".into(),
            plural: "events".into(),
        },
    );
    let list = api
        .list(&ListParams::default().fields(&selector))
        .await
        .context("list events")?;
    let mut events: Vec<Value> = list
        .items
        .into_iter()
        .filter_map(|e| serde_json::to_value(e).ok())
        .collect();
    events.sort_by_key(|e| {
        (
            last_seen(e),
            e["metadata"]["name"].as_str().map(str::to_string),
        )
    });
    Ok(events)
}

fn parse_time(value: &Value) -> Option<DateTime<Utc>> {
    value
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// When an Event last happened: `lastTimestamp`, else `eventTime`, `firstTimestamp`,
/// creation.
pub(crate) fn last_seen(event: &Value) -> Option<DateTime<Utc>> {
    parse_time(&event["lastTimestamp"])
        .or_else(|| parse_time(&event["series"]["lastObservedTime"]))
        .or_else(|| parse_time(&event["eventTime"]))
        .or_else(|| parse_time(&event["firstTimestamp"]))
        .or_else(|| parse_time(&event["metadata"]["creationTimestamp"]))
}

pub(crate) fn age(now: DateTime<Utc>, then: Option<DateTime<Utc>>) -> String {
    match then {
        Some(t) => human_duration((now - t).num_seconds()),
        None => "<unknown>".into(),
    }
}

/// The whole description (pure, for tests).
pub(crate) fn render(
    info: &ResourceInfo,
    object: &Value,
    events: Option<&[Value]>,
    now: DateTime<Utc>,
) -> String {
    render_with(info, object, "", events, now)
}

/// [`render`] with `sections` (a kind's own, already formatted) before the Events.
pub(crate) fn render_with(
    info: &ResourceInfo,
    object: &Value,
    sections: &str,
    events: Option<&[Value]>,
    now: DateTime<Utc>,
) -> String {
    let meta = &object["metadata"];
    let mut out = String::new();
    let mut field = |label: &str, value: &str| {
        out.push_str(&format!("{:<LABEL_WIDTH$}{value}\n", format!("{label}:")));
    };
    field("Name", meta["name"].as_str().unwrap_or_default());
    if info.namespaced {
        field("Namespace", meta["namespace"].as_str().unwrap_or_default());
    }
    field(
        "Kind",
        &format!("{} ({})", info.ar.kind, info.ar.api_version),
    );
    field("Labels", &map_lines(&meta["labels"], "=", &[]));
    field(
        "Annotations",
        &map_lines(&meta["annotations"], ": ", HIDDEN_ANNOTATIONS),
    );
    let created = parse_time(&meta["creationTimestamp"]);
    field(
        "Created",
        &match created {
            Some(t) => format!("{} ({} ago)", t.to_rfc3339(), age(now, Some(t))),
            None => "<unknown>".into(),
        },
    );
    if let Some(owners) = meta["ownerReferences"].as_array().filter(|o| !o.is_empty()) {
        let owners: Vec<String> = owners
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["name"].as_str().unwrap_or_default()
                )
            })
            .collect();
        field("Controlled By", &owners.join(", "));
    }
    if meta["deletionTimestamp"].is_string() {
        field("Deleting", "yes (deletionTimestamp set)");
    }
    for (section, key) in [("Spec", "spec"), ("Status", "status")] {
        let mut value = object[key].clone();
        if let Some(map) = value.as_object_mut() {
            map.remove("conditions");
        }
        if value.as_object().is_some_and(|m| !m.is_empty()) || value.is_array() {
            out.push_str(&format!("{section}:\n{}", indented_yaml(&value)));
        }
    }
    // Data-only kinds (Lease, Event) keep their fields at the top level.
    if object.get("spec").is_none() && object.get("status").is_none() {
        let mut rest = object.clone();
        if let Some(map) = rest.as_object_mut() {
            for key in ["apiVersion", "kind", "metadata"] {
                map.remove(key);
            }
        }
        if rest.as_object().is_some_and(|m| !m.is_empty()) {
            out.push_str(&format!("Data:\n{}", indented_yaml(&rest)));
        }
    }
    if let Some(conditions) = object["status"]["conditions"]
        .as_array()
        .filter(|c| !c.is_empty())
    {
        out.push_str("Conditions:\n");
        let mut lines = vec![vec![
            "Type".to_string(),
            "Status".into(),
            "Reason".into(),
            "Age".into(),
            "Message".into(),
        ]];
        for c in conditions {
            lines.push(vec![
                text(&c["type"]),
                text(&c["status"]),
                text(&c["reason"]),
                age(now, parse_time(&c["lastTransitionTime"])),
                text(&c["message"]),
            ]);
        }
        out.push_str(&indent(&align(&lines)));
    }
    out.push_str(sections);
    match events {
        None => out.push_str(&format!("{:<LABEL_WIDTH$}<unavailable>\n", "Events:")),
        Some([]) => out.push_str(&format!("{:<LABEL_WIDTH$}<none>\n", "Events:")),
        Some(events) => {
            out.push_str("Events:\n");
            let mut lines = vec![vec![
                "Type".to_string(),
                "Reason".into(),
                "Age".into(),
                "From".into(),
                "Message".into(),
            ]];
            lines.push(lines[0].iter().map(|h| "-".repeat(h.len())).collect());
            for e in events {
                let count = e["count"].as_i64().unwrap_or(1);
                let last = last_seen(e);
                let age = if count > 1 {
                    let first = parse_time(&e["firstTimestamp"]).or(last);
                    format!("{} (x{count} over {})", age(now, last), age(now, first))
                } else {
                    age(now, last)
                };
                let from = e["source"]["component"]
                    .as_str()
                    .or(e["reportingComponent"].as_str())
                    .unwrap_or_default();
                lines.push(vec![
                    text(&e["type"]),
                    text(&e["reason"]),
                    age,
                    from.to_string(),
                    text(&e["message"]),
                ]);
            }
            out.push_str(&indent(&align(&lines)));
        }
    }
    out
}

pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.replace('\n', " "),
        other => other.to_string(),
    }
}

/// `k=v` pairs, one per line, continuation lines aligned under the first; `<none>`.
fn map_lines(map: &Value, separator: &str, hidden: &[&str]) -> String {
    let Some(map) = map.as_object() else {
        return "<none>".into();
    };
    let pairs: Vec<String> = map
        .iter()
        .filter(|(k, _)| !hidden.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}{separator}{}", text(v)))
        .collect();
    if pairs.is_empty() {
        "<none>".into()
    } else {
        pairs.join(&format!("\n{:LABEL_WIDTH$}", ""))
    }
}

fn indented_yaml(value: &Value) -> String {
    let yaml = serde_saphyr::to_string(value).unwrap_or_else(|_| value.to_string());
    indent(yaml.trim_start_matches("---\n"))
}

pub(crate) fn indent(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("  {l}\n")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::catalog;
    use serde_json::json;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn describes_metadata_spec_status_conditions_and_events() {
        let catalog = catalog();
        let info = catalog.resolve("jobs").unwrap();
        let job = json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
            "metadata": {"name": "ppo", "creationTimestamp": "2026-01-01T10:00:00Z",
                         "labels": {"team": "rl", "tier": "gpu"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"tasks": [{"name": "actor", "agentType": "Raw"}]},
            "status": {"phase": "Pending",
                       "conditions": [{"type": "Unschedulable", "status": "True", "reason": "InsufficientResources",
                                        "message": "task actor needs 3 nvidia.com/gpu", "lastTransitionTime": "2026-01-01T10:00:30Z"}]}
        });
        let events = [
            json!({"type": "Normal", "reason": "Pending", "message": "accepted", "count": 1,
                   "lastTimestamp": "2026-01-01T10:00:01Z", "source": {"component": "rlark-server"}}),
            json!({"type": "Warning", "reason": "FailedScheduling", "message": "task actor needs 3 nvidia.com/gpu\nmore",
                   "count": 4, "firstTimestamp": "2026-01-01T10:00:02Z", "lastTimestamp": "2026-01-01T10:00:50Z",
                   "reportingComponent": "rlark-controller-manager"}),
        ];
        let text = render(info, &job, Some(&events), at("2026-01-01T10:01:00Z"));
        assert!(
            text.starts_with("Name:          ppo\nKind:          Job (rlinf.io/v1alpha1)\n"),
            "{text}"
        );
        assert!(
            text.contains("Labels:        team=rl\n               tier=gpu\n"),
            "{text}"
        );
        assert!(text.contains("Annotations:   <none>\n"), "{text}");
        assert!(
            text.contains("Created:       2026-01-01T10:00:00+00:00 (60s ago)"),
            "{text}"
        );
        assert!(text.contains("Spec:\n  tasks:\n"), "{text}");
        assert!(text.contains("Status:\n  phase: Pending\n"), "{text}");
        assert!(!text.contains("  conditions:"), "{text}");
        assert!(text.contains("Conditions:\n  Type"), "{text}");
        assert!(text.contains("InsufficientResources"), "{text}");
        assert!(text.contains("Events:\n  Type"), "{text}");
        let warning = text
            .lines()
            .find(|l| l.contains("FailedScheduling"))
            .unwrap();
        assert!(warning.contains("10s (x4 over 58s)"), "{warning}");
        assert!(warning.contains("rlark-controller-manager"), "{warning}");
        assert!(
            warning.ends_with("task actor needs 3 nvidia.com/gpu more"),
            "{warning}"
        );
        let normal = text.lines().position(|l| l.contains("accepted")).unwrap();
        let later = text
            .lines()
            .position(|l| l.contains("FailedScheduling"))
            .unwrap();
        assert!(normal < later, "events oldest first");

        let text = render(info, &job, Some(&[]), at("2026-01-01T10:01:00Z"));
        assert!(text.ends_with("Events:        <none>\n"), "{text}");
    }

    #[test]
    fn namespaced_objects_show_their_namespace_and_owner() {
        let catalog = catalog();
        let info = catalog.resolve("tasks").unwrap();
        let task = json!({
            "metadata": {"name": "ppo-actor", "namespace": "rlark-c1",
                         "ownerReferences": [{"kind": "Job", "name": "ppo", "apiVersion": "rlinf.io/v1alpha1", "uid": "u"}]},
            "spec": {}, "status": {}
        });
        let text = render(info, &task, None, Utc::now());
        assert!(text.contains("Namespace:     rlark-c1\n"), "{text}");
        assert!(text.contains("Controlled By: Job/ppo\n"), "{text}");
        assert!(text.contains("Events:        <unavailable>"), "{text}");
        assert!(!text.contains("Spec:"), "{text}");
    }
}
