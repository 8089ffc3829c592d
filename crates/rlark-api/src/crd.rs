//! CustomResourceDefinitions of every kind, for `deploy/crds/` and `rlark crds`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

use crate::types::{Domain, DomainPeer, Job, Node, Pod, Task, Workflow};

/// The CRDs of every kind, in [`crate::types::KINDS`] order, as kube-derive generates them
/// (structural schemas, `status` subresource, printer columns, short names, category
/// `rlark`).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Domain::crd(),
        DomainPeer::crd(),
        Node::crd(),
        Job::crd(),
        Task::crd(),
        Workflow::crd(),
        Pod::crd(),
    ]
}

/// Renders one CRD as a YAML document (no leading `---`, ends with a newline).
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    // A CRD is a tree of maps with string keys, strings, numbers, bools and lists, all of
    // which YAML represents; serializing it cannot fail.
    serde_saphyr::to_string(crd).expect("a CRD always serializes to YAML")
}

/// `(file name, YAML)` for every CRD: `<plural>.rlinf.io.yaml` (e.g. `jobs.rlinf.io.yaml`),
/// in [`crds`] order. These are the files checked in under `deploy/crds/`.
pub fn crd_files() -> Vec<(String, String)> {
    crds()
        .iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            (format!("{name}.yaml"), crd_yaml(crd))
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream, documents separated by `---` lines
/// (what `rlark crds` prints, ready for `kubectl apply -f -`).
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(crd_yaml)
        .collect::<Vec<_>>()
        .join("---\n")
}
