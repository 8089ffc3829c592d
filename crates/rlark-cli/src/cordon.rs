//! `rlark cordon NODE` and `rlark uncordon NODE`: set or clear `spec.unschedulable` of a
//! Node, so the scheduler places no new Task on it (running Tasks are not touched).
//!
//! A Node is named `NAMESPACE/NAME` (`rlark-<cluster>/gpu-0`), `NAME -n NAMESPACE`, or just
//! `NAME` (also as `node/NAME` or `node NAME`, as the other commands name objects): then it
//! is looked up across namespaces, and an ambiguous or unknown name is an error that lists
//! what exists.

use anyhow::{Context as _, bail};
use clap::Args;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use rlark_api::types::Node;
use serde_json::json;

use super::ClientArgs;
use super::client::Session;

#[derive(Debug, Args)]
pub(crate) struct CordonArgs {
    /// The Node: `NAME`, `NAMESPACE/NAME` (e.g. `rlark-gpu/gpu-0`), `node/NAME`, or `node`
    /// followed by NAME.
    pub node: String,
    /// The name, when NODE is the kind (`rlark cordon node NAME`).
    pub name: Option<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

/// Where a Node was given as.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NodeRef {
    pub namespace: Option<String>,
    pub name: String,
}

/// What names the Node kind on the command line (`node/NAME`, `node NAME`).
fn is_node_kind(word: &str) -> bool {
    matches!(
        word.to_ascii_lowercase().as_str(),
        "node" | "nodes" | "no" | "node.rlinf.io" | "nodes.rlinf.io"
    )
}

/// `cordon NODE [NAME]`: `node NAME` and `node/NAME` are `NAME`; anything else is NODE.
pub(crate) fn node_arg(node: &str, name: Option<&str>) -> anyhow::Result<String> {
    match name {
        Some(name) if is_node_kind(node) => Ok(name.to_string()),
        Some(_) => bail!("{node:?} is not a node kind: use `node NAME`, `node/NAME` or NAME"),
        None => match node.split_once('/') {
            Some((kind, name)) if is_node_kind(kind) => Ok(name.to_string()),
            _ => Ok(node.to_string()),
        },
    }
}

/// Parse `NAMESPACE/NAME` or `NAME`, with `-n` (which must agree with an explicit
/// namespace).
pub(crate) fn parse_node(node: &str, namespace: Option<&str>) -> anyhow::Result<NodeRef> {
    let (from_arg, name) = match node.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, node),
    };
    if name.is_empty() || from_arg.is_some_and(str::is_empty) || name.contains('/') {
        bail!("invalid node {node:?}: expected NAME or NAMESPACE/NAME");
    }
    let namespace = match (from_arg, namespace) {
        (Some(a), Some(b)) if a != b => {
            bail!("node {node:?} names namespace {a:?} but -n says {b:?}")
        }
        (Some(a), _) => Some(a.to_string()),
        (None, b) => b.map(str::to_string),
    };
    Ok(NodeRef {
        namespace,
        name: name.to_string(),
    })
}

/// The namespace of the Node: given, or the only namespace with a Node of that name.
async fn locate(client: &kube::Client, node: &NodeRef) -> anyhow::Result<String> {
    if let Some(ns) = &node.namespace {
        return Ok(ns.clone());
    }
    let all: Api<Node> = Api::all(client.clone());
    let found = all
        .list(&ListParams::default().fields(&format!("metadata.name={}", node.name)))
        .await
        .context("list nodes")?;
    let mut namespaces: Vec<String> = found.items.iter().filter_map(|n| n.namespace()).collect();
    namespaces.sort();
    match namespaces.as_slice() {
        [] => bail!(
            "node {:?} not found in any namespace (list them with `rlark get nodes.rlinf.io -A`)",
            node.name
        ),
        [one] => Ok(one.clone()),
        many => bail!(
            "node name {:?} is ambiguous: it exists in {}; name one as NAMESPACE/NAME or pass -n",
            node.name,
            many.iter()
                .map(|ns| format!("{ns}/{}", node.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `rlark cordon` (`unschedulable = true`) and `rlark uncordon` (`false`).
pub(crate) async fn cordon(args: CordonArgs, unschedulable: bool) -> anyhow::Result<()> {
    let node = parse_node(
        &node_arg(&args.node, args.name.as_deref())?,
        args.client.namespace.as_deref(),
    )?;
    let session = Session::connect(&args.client).await?;
    let namespace = locate(&session.client, &node).await?;
    let api: Api<Node> = Api::namespaced(session.client.clone(), &namespace);
    let current = api
        .get(&node.name)
        .await
        .with_context(|| format!("get node {namespace}/{}", node.name))?;
    let verb = if unschedulable {
        "cordoned"
    } else {
        "uncordoned"
    };
    if current.spec.unschedulable == unschedulable {
        println!(
            "node.rlinf.io/{} already {verb} (namespace {namespace})",
            node.name
        );
        return Ok(());
    }
    let patch = json!({"spec": {"unschedulable": unschedulable}});
    api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patch node {namespace}/{}", node.name))?;
    println!("node.rlinf.io/{} {verb} (namespace {namespace})", node.name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_kind_may_come_first() {
        assert_eq!(node_arg("node", Some("n1")).unwrap(), "n1");
        assert_eq!(node_arg("node/n1", None).unwrap(), "n1");
        assert_eq!(node_arg("nodes.rlinf.io/n1", None).unwrap(), "n1");
        assert_eq!(node_arg("rlark-c1/n1", None).unwrap(), "rlark-c1/n1");
        assert!(node_arg("task", Some("n1")).is_err());
    }

    #[test]
    fn node_names() {
        assert_eq!(
            parse_node("rlark-c1/n1", None).unwrap(),
            NodeRef {
                namespace: Some("rlark-c1".into()),
                name: "n1".into()
            }
        );
        assert_eq!(
            parse_node("n1", Some("rlark-c1")).unwrap(),
            NodeRef {
                namespace: Some("rlark-c1".into()),
                name: "n1".into()
            }
        );
        assert_eq!(parse_node("n1", None).unwrap().namespace, None);
        assert!(parse_node("rlark-c1/n1", Some("rlark-c1")).is_ok());
        assert!(parse_node("rlark-c1/n1", Some("rlark-c2")).is_err());
        assert!(parse_node("/n1", None).is_err());
        assert!(parse_node("a/", None).is_err());
        assert!(parse_node("a/b/c", None).is_err());
    }
}
