//! The Kubernetes built-in kinds a member cluster serves to a workload runtime (`apps/v1`
//! Deployment, StatefulSet, DaemonSet, ReplicaSet; `batch/v1` Job; core `v1` Pod, Service,
//! ConfigMap, Secret, PersistentVolumeClaim, Node), described for rlark's API server: the
//! simulated member cluster serves them as extra kinds
//! ([`ApiServerOptions::extra_kinds`](rlark_apiserver::ApiServerOptions::extra_kinds)), its
//! core Pods replacing the replicas' view.
//!
//! This is a **test harness**, not a kube-apiserver: nothing in the server acts on these
//! objects (no workload controller, scheduler or kubelet: [`super::KubeSim`] plays them),
//! the schemas keep unknown fields rather than validate the Kubernetes types, and writes are
//! checked for a subset of kube-apiserver's rules only, refused with its wording. A Secret's
//! `stringData` is folded into `data` on every write, as kube-apiserver does
//! ([`ResourceType::prepare`]).

use std::sync::Arc;

use rlark_api::validation::FieldError;
use rlark_apiserver::registry::{PrinterColumn, ResourceType, column, object_schema};
use serde_json::{Value, json};

/// The member kinds in the order a member cluster lists them (core kinds first, then
/// `apps`, then `batch`), as [`ApiServerOptions::extra_kinds`](rlark_apiserver::ApiServerOptions::extra_kinds)
/// takes them.
pub fn kinds() -> Vec<Arc<ResourceType>> {
    let mut kinds = vec![
        pod(),
        service(),
        config_map(),
        secret(),
        persistent_volume_claim(),
        node(),
        workload("Deployment", "deployments", &["deploy"], true),
        workload("StatefulSet", "statefulsets", &["sts"], true),
        workload("DaemonSet", "daemonsets", &["ds"], false),
        workload("ReplicaSet", "replicasets", &["rs"], true),
        job(),
    ];
    for rt in &mut kinds {
        let kind = rt.kind.clone();
        rt.validator = match kind.as_str() {
            "Pod" => Some(Arc::new(|object: &Value| {
                errors(pod_spec_errors(object.get("spec"), "spec", None))
            })),
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
                Some(Arc::new(move |object: &Value| {
                    errors(workload_errors(&kind, object))
                }))
            }
            _ => None,
        };
    }
    kinds.into_iter().map(Arc::new).collect()
}

/// OpenKruise's CloneSet (`apps.kruise.io/v1alpha1`), as a member cluster with OpenKruise
/// installed serves it (its CRD; [`super::KubeSim`] plays its controller when started with
/// [`super::Extras::openkruise`]). Checked as an `apps/v1` workload is.
pub fn openkruise_clone_set() -> Arc<ResourceType> {
    let mut rt = ResourceType::new(
        "apps.kruise.io",
        "v1alpha1",
        "CloneSet",
        "clonesets",
        true,
        permissive(
            "CloneSet is OpenKruise's Deployment-like workload.",
            &["spec", "status"],
        ),
    );
    rt.short_names = vec!["clone".into()];
    rt.status_subresource = true;
    rt.scale_subresource = true;
    rt.printer_columns = vec![
        column("Desired", "integer", ".spec.replicas"),
        column("Ready", "integer", ".status.readyReplicas"),
        age(),
    ];
    rt.validator = Some(Arc::new(|object: &Value| {
        errors(workload_errors("CloneSet", object))
    }));
    Arc::new(rt)
}

fn errors(found: Vec<FieldError>) -> Result<(), Vec<FieldError>> {
    if found.is_empty() { Ok(()) } else { Err(found) }
}

/// What kube-apiserver refuses in a PodSpec at `path` (a subset: containers, their names
/// and images, the restart policy; `allowed` restricts the restart policy further, as
/// workloads do).
fn pod_spec_errors(spec: Option<&Value>, path: &str, allowed: Option<&[&str]>) -> Vec<FieldError> {
    let mut found = Vec::new();
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    match containers {
        None => found.push(FieldError::required(format!("{path}.containers"), "")),
        Some(containers) => {
            let mut names = std::collections::HashSet::new();
            for (i, container) in containers.iter().enumerate() {
                let at = format!("{path}.containers[{i}]");
                match container
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                {
                    None => found.push(FieldError::required(format!("{at}.name"), "")),
                    Some(name) if !names.insert(name) => {
                        found.push(FieldError::duplicate(format!("{at}.name"), name));
                    }
                    Some(_) => {}
                }
                if container
                    .get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    found.push(FieldError::required(format!("{at}.image"), ""));
                }
            }
        }
    }
    let policy = spec
        .and_then(|s| s.get("restartPolicy"))
        .and_then(Value::as_str)
        .unwrap_or("Always");
    let supported = allowed.unwrap_or(&["Always", "OnFailure", "Never"]);
    if !supported.contains(&policy) {
        found.push(FieldError::not_supported(
            format!("{path}.restartPolicy"),
            policy,
            supported,
        ));
    }
    found
}

/// What kube-apiserver refuses in a workload (a subset): its Pod template (as
/// [`pod_spec_errors`], with the restart policies the kind allows), negative replicas, and
/// for `apps/v1` kinds a missing selector or one the template's labels do not match.
fn workload_errors(kind: &str, object: &Value) -> Vec<FieldError> {
    let mut found = Vec::new();
    let allowed: &[&str] = if kind == "Job" {
        &["OnFailure", "Never"]
    } else {
        &["Always"]
    };
    found.extend(pod_spec_errors(
        object.pointer("/spec/template/spec"),
        "spec.template.spec",
        Some(allowed),
    ));
    if let Some(replicas) = object.pointer("/spec/replicas").and_then(Value::as_i64)
        && replicas < 0
    {
        found.push(FieldError::invalid(
            "spec.replicas",
            format!("{replicas}: must be greater than or equal to 0"),
        ));
    }
    if kind == "Job" {
        return found;
    }
    let Some(selector) = object.pointer("/spec/selector").filter(|s| s.is_object()) else {
        found.push(FieldError::required("spec.selector", ""));
        return found;
    };
    let labels = object.pointer("/spec/template/metadata/labels");
    let matches = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
    if !matches {
        found.push(FieldError::invalid(
            "spec.template.metadata.labels",
            format!(
                "{}: `selector` does not match template `labels`",
                labels.cloned().unwrap_or(Value::Null)
            ),
        ));
    }
    found
}

/// A schema that stores whatever it is given under `fields` (each an object).
fn permissive(description: &str, fields: &[&str]) -> Value {
    let mut extra = serde_json::Map::new();
    for field in fields {
        extra.insert(
            (*field).to_string(),
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
    }
    object_schema(description, Value::Object(extra))
}

#[allow(clippy::too_many_arguments)]
fn kind(
    group: &str,
    kind: &str,
    plural: &str,
    short_names: &[&str],
    namespaced: bool,
    status: bool,
    printer_columns: Vec<PrinterColumn>,
    schema: Value,
) -> ResourceType {
    let mut rt = ResourceType::new(group, "v1", kind, plural, namespaced, schema);
    rt.short_names = short_names.iter().map(|s| (*s).to_string()).collect();
    rt.status_subresource = status;
    rt.printer_columns = printer_columns;
    rt.strategic_merge_patch = true;
    rt
}

fn age() -> PrinterColumn {
    column("Age", "date", ".metadata.creationTimestamp")
}

fn pod() -> ResourceType {
    let mut rt = kind(
        "",
        "Pod",
        "pods",
        &["po"],
        true,
        true,
        vec![
            column("Status", "string", ".status.phase"),
            column(
                "Restarts",
                "integer",
                ".status.containerStatuses[0].restartCount",
            ),
            column("Node", "string", ".spec.nodeName"),
            age(),
        ],
        permissive(
            "Pod is a collection of containers that can run on a host.",
            &["spec", "status"],
        ),
    );
    rt.categories = vec!["all".into()];
    // kube-apiserver's Pod field selectors that workload runtimes use.
    rt.selectable_fields = vec!["spec.nodeName".into(), "status.phase".into()];
    rt.log_subresource = true;
    rt
}

fn service() -> ResourceType {
    let mut rt = kind(
        "",
        "Service",
        "services",
        &["svc"],
        true,
        true,
        vec![
            column("Type", "string", ".spec.type"),
            column("Cluster-IP", "string", ".spec.clusterIP"),
            age(),
        ],
        permissive(
            "Service is a named abstraction of software service.",
            &["spec", "status"],
        ),
    );
    rt.categories = vec!["all".into()];
    rt
}

fn config_map() -> ResourceType {
    kind(
        "",
        "ConfigMap",
        "configmaps",
        &["cm"],
        true,
        false,
        vec![age()],
        object_schema(
            "ConfigMap holds configuration data for pods to consume.",
            json!({
                "data": {"type": "object", "additionalProperties": {"type": "string"}},
                "binaryData": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
                "immutable": {"type": "boolean"}
            }),
        ),
    )
}

fn secret() -> ResourceType {
    let mut rt = kind(
        "",
        "Secret",
        "secrets",
        &[],
        true,
        false,
        vec![column("Type", "string", ".type"), age()],
        object_schema(
            "Secret holds secret data of a certain type.",
            json!({
                "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
                "stringData": {"type": "object", "additionalProperties": {"type": "string"}},
                "immutable": {"type": "boolean"},
                "type": {"type": "string"}
            }),
        ),
    );
    rt.prepare = Some(fold_string_data);
    rt
}

fn persistent_volume_claim() -> ResourceType {
    kind(
        "",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        &["pvc"],
        true,
        true,
        vec![column("Status", "string", ".status.phase"), age()],
        permissive(
            "PersistentVolumeClaim is a user's request for and claim to a persistent volume.",
            &["spec", "status"],
        ),
    )
}

fn node() -> ResourceType {
    kind(
        "",
        "Node",
        "nodes",
        &["no"],
        false,
        true,
        vec![age()],
        permissive("Node is a worker node in Kubernetes.", &["spec", "status"]),
    )
}

fn workload(kind_name: &str, plural: &str, short_names: &[&str], scale: bool) -> ResourceType {
    let mut rt = kind(
        "apps",
        kind_name,
        plural,
        short_names,
        true,
        true,
        vec![
            column("Ready", "integer", ".status.readyReplicas"),
            column("Replicas", "integer", ".spec.replicas"),
            age(),
        ],
        permissive(
            &format!("{kind_name} is an apps/v1 workload."),
            &["spec", "status"],
        ),
    );
    rt.categories = vec!["all".into()];
    rt.scale_subresource = scale;
    rt
}

fn job() -> ResourceType {
    let mut rt = kind(
        "batch",
        "Job",
        "jobs",
        &[],
        true,
        true,
        vec![
            column("Succeeded", "integer", ".status.succeeded"),
            column("Failed", "integer", ".status.failed"),
            age(),
        ],
        permissive(
            "Job represents the configuration of a single job.",
            &["spec", "status"],
        ),
    );
    rt.categories = vec!["all".into()];
    rt
}

/// A core Secret's `stringData` merged into `data` (base64), as kube-apiserver does on every
/// write: `stringData` is write-only and never stored. The Secret kind's
/// [`ResourceType::prepare`].
fn fold_string_data(object: &mut Value) {
    use base64::Engine as _;
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.shift_remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Value::Object(data) = data {
        for (key, value) in strings {
            let text = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            data.insert(
                key,
                json!(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    use rlark_apiserver::registry::Registry;

    fn registry() -> Registry {
        Registry::with_extra_kinds(&kinds())
    }

    #[test]
    fn short_names_and_plurals_never_collide_with_rlarks() {
        let registry = registry();
        let mut short = HashSet::new();
        for rt in registry.all() {
            for name in &rt.short_names {
                assert!(short.insert(name.clone()), "short name {name} used twice");
            }
        }
        // Same plural in two groups is allowed (as `jobs` in batch and a CRD group in a real
        // cluster); the Kubernetes one must come first.
        let first = |plural: &str| {
            registry
                .all()
                .iter()
                .find(|rt| rt.plural == plural)
                .map(|rt| rt.group.clone())
        };
        assert_eq!(first("pods").as_deref(), Some(""));
        assert_eq!(first("nodes").as_deref(), Some(""));
        assert_eq!(first("jobs").as_deref(), Some("batch"));
        assert!(registry.get("rlinf.io", "v1alpha1", "pods").is_some());
    }

    #[test]
    fn invalid_pods_and_workloads_are_refused_as_kube_apiserver_refuses_them() {
        let validate = |kind: &str, object: Value| -> Vec<String> {
            let rt = kinds().into_iter().find(|k| k.kind == kind).unwrap();
            match (rt.validator.as_ref().unwrap())(&object) {
                Ok(()) => vec![],
                Err(errors) => errors.iter().map(ToString::to_string).collect(),
            }
        };
        let container = json!({"name": "main", "image": "img"});
        assert!(validate("Pod", json!({"spec": {"containers": [container]}})).is_empty());
        assert_eq!(
            validate(
                "Pod",
                json!({"spec": {"containers": [{"name": "a"}, {"name": "a", "image": "i"}], "restartPolicy": "Sometimes"}})
            ),
            [
                "spec.containers[0].image: Required value",
                "spec.containers[1].name: Duplicate value: \"a\"",
                "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
            ]
        );
        assert_eq!(
            validate("Pod", json!({"spec": {}})),
            ["spec.containers: Required value"]
        );
        let template =
            json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [container]}});
        let sts =
            json!({"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template}});
        assert!(validate("StatefulSet", sts).is_empty());
        assert_eq!(
            validate(
                "Deployment",
                json!({"spec": {"replicas": -1, "selector": {"matchLabels": {"app": "b"}}, "template": template}})
            ),
            [
                "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
                "spec.template.metadata.labels: Invalid value: {\"app\":\"a\"}: `selector` does not match template `labels`",
            ]
        );
        assert_eq!(
            validate("DaemonSet", json!({"spec": {"template": template}})),
            ["spec.selector: Required value"]
        );
        // A Job's Pods may not restart always (the default).
        assert_eq!(
            validate("Job", json!({"spec": {"template": template}})),
            [
                "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
            ]
        );
        let mut never = template.clone();
        never["spec"]["restartPolicy"] = json!("Never");
        assert!(validate("Job", json!({"spec": {"template": never}})).is_empty());
    }

    #[test]
    fn secret_string_data_is_folded_into_data() {
        let secret = kinds().into_iter().find(|k| k.kind == "Secret").unwrap();
        let mut object = json!({"data": {"a": "eA=="}, "stringData": {"b": "token", "a": "y"}});
        (secret.prepare.unwrap())(&mut object);
        assert_eq!(object, json!({"data": {"a": "eQ==", "b": "dG9rZW4="}}));
        // No other kind rewrites what is written.
        for rt in kinds().iter().filter(|k| k.kind != "Secret") {
            assert!(rt.prepare.is_none(), "{}", rt.qualified_name());
        }
    }

    #[test]
    fn only_member_mode_serves_the_kubernetes_kinds() {
        let plain = Registry::builtin();
        let member = registry();
        for rt in kinds() {
            if rt.plural == "pods" {
                // Without the extra kinds, core Pods are the replicas' projection.
                let projected = plain.get(&rt.group, &rt.version, &rt.plural).unwrap();
                assert!(projected.projection.is_some());
                assert!(member.get("", "v1", "pods").unwrap().projection.is_none());
                continue;
            }
            assert!(
                plain.get(&rt.group, &rt.version, &rt.plural).is_none(),
                "{} served without the extra kinds",
                rt.qualified_name()
            );
            assert!(member.get(&rt.group, &rt.version, &rt.plural).is_some());
        }
    }
}
