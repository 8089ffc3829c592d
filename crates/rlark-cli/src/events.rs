//! `rlark events [KIND/NAME | KIND NAME | --for KIND/NAME] [-n NS]`: the core Events, as
//! `kubectl events` prints them (LAST SEEN, TYPE, REASON, OBJECT, MESSAGE; oldest first).
//!
//! Without an object: every Event, across namespaces unless `-n` is given (rlark records
//! the Events of a cluster's objects in its agent namespace). With one: the Events about
//! that object, found as `get` finds it (see `names`).

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::ClientArgs;
use super::client::Session;
use super::describe::{age, events_about, last_seen, text};
use super::discovery::Catalog;
use super::names;
use super::table::align;

#[derive(Debug, Args)]
pub(crate) struct EventsArgs {
    /// The object whose Events to print: KIND/NAME, or KIND followed by NAME (default:
    /// all Events).
    pub target: Option<String>,
    /// The name, when TARGET is only the kind (`rlark events task NAME`).
    pub name: Option<String>,
    /// The object as KIND/NAME (kubectl's flag; same as TARGET).
    #[arg(long = "for", value_name = "KIND/NAME", conflicts_with = "target")]
    pub for_object: Option<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

pub(crate) async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let target = match (&args.for_object, &args.target) {
        (Some(object), _) => Some(object.clone()),
        (None, Some(first)) => Some(names::join_target(first, args.name.as_deref())?),
        (None, None) => None,
    };
    let session = Session::connect(&args.client).await?;
    let explicit = session
        .namespace_explicit
        .then_some(session.namespace.as_str());
    let (events, all_namespaces) = match target {
        Some(target) => {
            let Some((kind, name)) = target.split_once('/') else {
                bail!("name the object as KIND/NAME or KIND NAME (e.g. `rlark events task t1`)");
            };
            let catalog = Catalog::discover(&session.client).await?;
            let info = catalog.resolve(kind)?;
            let namespace = match info.namespaced {
                true => Some(names::locate(&session.client, info, name, explicit).await?),
                false => None,
            };
            let events = events_about(&session.client, info, name, namespace.as_deref()).await?;
            (events, false)
        }
        None => (
            all_events(&session.client, explicit).await?,
            explicit.is_none(),
        ),
    };
    if events.is_empty() {
        match explicit {
            Some(ns) => eprintln!("No events found in {ns} namespace."),
            None => eprintln!("No events found."),
        }
        return Ok(());
    }
    print!("{}", render(&events, all_namespaces, Utc::now()));
    Ok(())
}

/// Every Event in `namespace` (all namespaces when `None`), oldest first.
async fn all_events(client: &kube::Client, namespace: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let resource = kube::core::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
    };
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let list = api
        .list(&ListParams::default())
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

/// kubectl's `events` table (pure, for tests).
pub(crate) fn render(events: &[Value], with_namespace: bool, now: DateTime<Utc>) -> String {
    let mut header: Vec<String> = Vec::new();
    if with_namespace {
        header.push("NAMESPACE".into());
    }
    header.extend(["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"].map(String::from));
    let mut lines = vec![header];
    for event in events {
        let mut line = Vec::new();
        if with_namespace {
            line.push(text(&event["metadata"]["namespace"]));
        }
        let object = &event["involvedObject"];
        line.extend([
            age(now, last_seen(event)),
            text(&event["type"]),
            text(&event["reason"]),
            format!(
                "{}/{}",
                object["kind"].as_str().unwrap_or_default().to_lowercase(),
                object["name"].as_str().unwrap_or_default()
            ),
            text(&event["message"]),
        ]);
        lines.push(line);
    }
    align(&lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_print_as_kubectl_events_does() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:10:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = json!({
            "metadata": {"name": "e1", "namespace": "rlark-a"},
            "involvedObject": {"kind": "Task", "name": "t1", "namespace": "rlark-a"},
            "type": "Warning", "reason": "Unschedulable", "message": "no node fits",
            "lastTimestamp": "2026-01-01T00:05:00Z",
        });
        let table = render(std::slice::from_ref(&event), true, now);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        let words: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "NAMESPACE",
                "LAST",
                "SEEN",
                "TYPE",
                "REASON",
                "OBJECT",
                "MESSAGE"
            ]
        );
        let words: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "rlark-a",
                "5m",
                "Warning",
                "Unschedulable",
                "task/t1",
                "no",
                "node",
                "fits"
            ]
        );
        let table = render(&[event], false, now);
        assert!(table.starts_with("LAST SEEN"), "{table}");
    }
}
