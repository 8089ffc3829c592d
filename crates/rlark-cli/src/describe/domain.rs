//! The Domain part of `rlark describe domain NAME`: its CIDR and selector, its members
//! (address, Job, Task, Pod, cluster, released), and per DomainPeer (agent namespace) the
//! paths its members' connections took (`status.paths` the agents report).

use serde_json::Value;

use super::{indent, text};
use crate::table::align;

/// Width of the `Label:` column (as in [`super`]).
const LABEL_WIDTH: usize = 15;

fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        other => {
            let t = text(other);
            if t.is_empty() { "-".into() } else { t }
        }
    }
}

/// A label selector as `kubectl` prints one (`team=rl,tier in (gpu)`), `<all Jobs>` when
/// absent or empty.
fn selector(value: &Value) -> String {
    let mut parts: Vec<String> = value["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect();
    for req in value["matchExpressions"].as_array().into_iter().flatten() {
        let key = text(&req["key"]);
        let values: Vec<String> = req["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let values = values.join(",");
        parts.push(match req["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key,
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({values})"),
        });
    }
    if parts.is_empty() {
        "<all Jobs>".into()
    } else {
        parts.join(",")
    }
}

/// The Domain's sections (pure, for tests). `peers`: its DomainPeers, `None` when they
/// could not be listed.
pub(crate) fn sections(domain: &Value, peers: Option<&[Value]>) -> String {
    let mut out = String::new();
    let mut field = |label: &str, value: &str| {
        out.push_str(&format!("{:<LABEL_WIDTH$}{value}\n", format!("{label}:")));
    };
    field("CIDR", &cell(&domain["spec"]["cidr"]));
    field("Job Selector", &selector(&domain["spec"]["jobSelector"]));
    let status = &domain["status"];
    field(
        "Addresses",
        &format!(
            "{} allocated of {} usable",
            status["allocated"].as_i64().unwrap_or(0),
            status["capacity"].as_str().unwrap_or("?")
        ),
    );
    let allocations = status["ipAllocations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if allocations.is_empty() {
        field("Members", "<none>");
    } else {
        out.push_str("Members:\n");
        let mut lines = vec![
            ["IP", "Job", "Task", "Pod", "Cluster", "Released"]
                .map(String::from)
                .to_vec(),
        ];
        for a in &allocations {
            lines.push(vec![
                cell(&a["ip"]),
                cell(&a["job"]),
                cell(&a["task"]),
                cell(&a["pod"]),
                cell(&a["cluster"]),
                cell(&a["releasedAt"]),
            ]);
        }
        out.push_str(&indent(&align(&lines)));
    }
    match peers {
        None => out.push_str(&format!("{:<LABEL_WIDTH$}<unavailable>\n", "Peers:")),
        Some([]) => out.push_str(&format!("{:<LABEL_WIDTH$}<none>\n", "Peers:")),
        Some(peers) => {
            out.push_str("Peers:\n");
            let mut lines = vec![
                ["Namespace", "Members", "Pending"]
                    .map(String::from)
                    .to_vec(),
            ];
            let mut paths = vec![
                [
                    "From",
                    "Peer",
                    "Path",
                    "Connections",
                    "Active",
                    "Bytes",
                    "Failures",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for peer in peers {
                let namespace = cell(&peer["metadata"]["namespace"]);
                let pending: Vec<String> = peer["spec"]["pending"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{} ({})", text(&p["name"]), text(&p["reason"])))
                    .collect();
                lines.push(vec![
                    namespace.clone(),
                    peer["spec"]["pods"]
                        .as_array()
                        .map_or(0, Vec::len)
                        .to_string(),
                    if pending.is_empty() {
                        "-".into()
                    } else {
                        pending.join(", ")
                    },
                ]);
                for path in peer["status"]["paths"].as_array().into_iter().flatten() {
                    let number = |key: &str| path[key].as_u64().unwrap_or(0).to_string();
                    paths.push(vec![
                        namespace.clone(),
                        cell(&path["peer"]),
                        cell(&path["path"]),
                        number("connections"),
                        number("active"),
                        number("bytes"),
                        number("failures"),
                    ]);
                }
            }
            out.push_str(&indent(&align(&lines)));
            if paths.len() > 1 {
                out.push_str("Paths:\n");
                out.push_str(&indent(&align(&paths)));
            } else {
                out.push_str(&format!("{:<LABEL_WIDTH$}<none reported>\n", "Paths:"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::describe::render_with;
    use crate::discovery::tests::catalog;

    fn domain() -> Value {
        json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
            "metadata": {"name": "net", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {"cidr": "10.88.0.0/30",
                     "jobSelector": {"matchLabels": {"team": "rl"},
                                     "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}},
            "status": {"allocated": 2, "capacity": "2", "ipAllocations": [
                {"ip": "10.88.0.1", "job": "ppo", "task": "ppo-head", "index": 0, "cluster": "a", "pod": "rlark-a/ppo-head-0"},
                {"ip": "10.88.0.2", "job": "ppo", "task": "ppo-worker", "index": 0, "cluster": "b", "pod": "rlark-b/ppo-worker-0",
                 "releasedAt": "2026-01-01T10:05:00Z"}
            ]}
        })
    }

    fn peers() -> Vec<Value> {
        vec![
            json!({"metadata": {"name": "net", "namespace": "rlark-a"},
            "spec": {"domain": "net", "prefixLen": 30, "pods": [{"ip": "10.88.0.1"}]},
            "status": {"paths": [
                {"peer": "b", "path": "relay", "connections": 12, "active": 1, "bytes": 4096, "failures": 0},
                {"peer": "b", "path": "direct", "connections": 3, "active": 0, "bytes": 100, "failures": 2}
            ]}}),
            json!({"metadata": {"name": "net", "namespace": "rlark-c"},
                   "spec": {"domain": "net", "prefixLen": 30, "pods": [{"ip": "10.88.0.1"}],
                            "pending": [{"name": "ppo-late-0", "reason": "NoDomainIP"}]}}),
        ]
    }

    fn row(text: &str, starts: &str) -> Vec<String> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(starts))
            .unwrap_or_else(|| panic!("no line starting {starts:?} in\n{text}"));
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn members_peers_and_paths_are_tables() {
        let text = sections(&domain(), Some(&peers()));
        assert!(text.starts_with("CIDR:          10.88.0.0/30\n"), "{text}");
        assert!(
            text.contains("Job Selector:  team=rl,tier in (gpu,cpu)\n"),
            "{text}"
        );
        assert!(
            text.contains("Addresses:     2 allocated of 2 usable\n"),
            "{text}"
        );
        assert_eq!(
            row(&text, "IP"),
            ["IP", "Job", "Task", "Pod", "Cluster", "Released"]
        );
        assert_eq!(
            row(&text, "10.88.0.1"),
            [
                "10.88.0.1",
                "ppo",
                "ppo-head",
                "rlark-a/ppo-head-0",
                "a",
                "-"
            ]
        );
        assert_eq!(
            row(&text, "10.88.0.2"),
            [
                "10.88.0.2",
                "ppo",
                "ppo-worker",
                "rlark-b/ppo-worker-0",
                "b",
                "2026-01-01T10:05:00Z"
            ]
        );
        assert_eq!(
            row(&text, "rlark-c"),
            ["rlark-c", "1", "ppo-late-0", "(NoDomainIP)"]
        );
        assert_eq!(
            row(&text, "From"),
            [
                "From",
                "Peer",
                "Path",
                "Connections",
                "Active",
                "Bytes",
                "Failures"
            ]
        );
        let relay: Vec<String> = text
            .lines()
            .filter(|l| l.contains("relay"))
            .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect();
        assert_eq!(relay, ["rlark-a", "b", "relay", "12", "1", "4096", "0"]);
        assert!(text.contains(" direct "), "{text}");
    }

    #[test]
    fn an_empty_domain_says_so() {
        let bare = json!({"metadata": {"name": "net"}, "spec": {"cidr": "fd00::/64"}});
        let text = sections(&bare, Some(&[]));
        assert!(text.contains("Job Selector:  <all Jobs>\n"), "{text}");
        assert!(
            text.contains("Addresses:     0 allocated of ? usable\n"),
            "{text}"
        );
        assert!(text.contains("Members:       <none>\n"), "{text}");
        assert!(text.contains("Peers:         <none>\n"), "{text}");
        let text = sections(&bare, None);
        assert!(text.contains("Peers:         <unavailable>\n"), "{text}");
        let quiet = [json!({"metadata": {"namespace": "rlark-a"}, "spec": {"pods": []}})];
        assert!(sections(&bare, Some(&quiet)).contains("Paths:         <none reported>\n"));
    }

    #[test]
    fn the_sections_come_before_the_events() {
        let catalog = catalog();
        // Any kind: only the order of the parts is looked at.
        let info = catalog.resolve("jobs").unwrap();
        let text = render_with(
            info,
            &domain(),
            &sections(&domain(), Some(&peers())),
            Some(&[]),
            chrono::Utc::now(),
        );
        let members = text.find("Members:").unwrap();
        let events = text.find("Events:").unwrap();
        assert!(members < events, "{text}");
    }
}
