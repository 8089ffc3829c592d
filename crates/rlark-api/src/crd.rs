//! CustomResourceDefinitions of every kind, for `deploy/crds/` and `rlark crds`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube_core::CustomResourceExt;

use crate::types::{Domain, DomainPeer, Job, Node, Pod, Task, Workflow};

/// The CRDs of every kind, in [`crate::types::KINDS`] order, as kube-derive generates them
/// (structural schemas, `status` subresource, printer columns, short names, category
/// `rlark`).
///
/// Schema descriptions come from the types' rustdoc; their intra-doc links are rewritten
/// to plain names ([`crate::doc_text::plain`]) since `kubectl explain` shows them as text.
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
    .into_iter()
    .map(plain_descriptions)
    .collect()
}

/// `crd` with every schema `description` passed through [`crate::doc_text::plain`].
fn plain_descriptions(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            plain_schema(schema);
        }
    }
    crd
}

fn plain_schema(schema: &mut JSONSchemaProps) {
    if let Some(description) = schema.description.as_mut() {
        *description = crate::doc_text::plain(description);
    }
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(
            schema
                .pattern_properties
                .iter_mut()
                .flat_map(|p| p.values_mut()),
        )
        .chain(schema.definitions.iter_mut().flat_map(|p| p.values_mut()))
        .chain(schema.all_of.iter_mut().flatten())
        .chain(schema.any_of.iter_mut().flatten())
        .chain(schema.one_of.iter_mut().flatten())
        .chain(schema.not.as_deref_mut());
    for child in children {
        plain_schema(child);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => plain_schema(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().for_each(plain_schema),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(extra)) = schema.additional_properties.as_mut() {
        plain_schema(extra);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(extra)) = schema.additional_items.as_mut() {
        plain_schema(extra);
    }
}

/// Renders one CRD as a YAML document (no leading `---`, ends with a newline).
#[allow(
    clippy::expect_used,
    reason = "a CRD is maps, strings, numbers, bools and lists, all of which YAML represents"
)]
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
