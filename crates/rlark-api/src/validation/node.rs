//! Checks of the objects agents report: a Node (its resource lists, bounded) and a Pod.

use super::checks::{
    NameRule, check_ip, check_metadata, check_name, check_non_negative, check_range, check_ref,
    check_resource_list,
};
use super::{FieldError, FieldErrorKind, MAX_REPLICAS};
use crate::quantity::parse_quantity;
use crate::types::{Node, Pod, ResourceList};

/// Most resource names one of a Node's resource lists (`capacity`, `allocatable`, `used`)
/// may hold.
pub const MAX_NODE_RESOURCE_NAMES: usize = 64;
/// Largest `cpu` a Node may report (cores).
pub const MAX_NODE_CPU: &str = "65536";
/// Largest `memory` (and `hugepages-*`) a Node may report: 1 PiB.
pub const MAX_NODE_MEMORY: &str = "1Pi";
/// Largest `ephemeral-storage` a Node may report: 1 EiB.
pub const MAX_NODE_STORAGE: &str = "1Ei";
/// Largest amount of any other resource a Node may report (GPUs, devices, extended
/// resources are counts).
pub const MAX_NODE_DEVICES: &str = "65536";

/// The largest amount of resource `name` a Node may report (see [`MAX_NODE_CPU`] and the
/// constants after it). Reported resources are what the scheduler trusts, so an agent
/// cannot attract every Job with an absurd capacity.
pub fn max_node_resource(name: &str) -> &'static str {
    match name {
        "cpu" => MAX_NODE_CPU,
        "memory" => MAX_NODE_MEMORY,
        "ephemeral-storage" => MAX_NODE_STORAGE,
        _ if name.starts_with("hugepages-") => MAX_NODE_MEMORY,
        _ => MAX_NODE_DEVICES,
    }
}

/// A Node's resource list: valid quantities, at most [`MAX_NODE_RESOURCE_NAMES`] names, each
/// amount at most [`max_node_resource`].
fn check_node_resources(errs: &mut Vec<FieldError>, path: &str, list: &ResourceList) {
    if list.len() > MAX_NODE_RESOURCE_NAMES {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooLong,
            format!(
                "may not have more than {MAX_NODE_RESOURCE_NAMES} resources, has {}",
                list.len()
            ),
        ));
    }
    for (name, value) in check_resource_list(errs, path, list) {
        let max = max_node_resource(&name);
        if parse_quantity(max).is_ok_and(|max| value > max) {
            errs.push(FieldError::invalid(
                format!("{path}[{name}]"),
                format!(
                    "{:?}: must be at most {max} (the largest amount of {name} a Node may report)",
                    list.get(&name).map(|q| q.0.as_str()).unwrap_or_default()
                ),
            ));
        }
    }
}

pub(super) fn node_errors(node: &Node) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &node.metadata, NameRule::Subdomain);
    if let Some(status) = &node.status {
        check_node_resources(&mut errs, "status.capacity", &status.capacity);
        check_node_resources(&mut errs, "status.allocatable", &status.allocatable);
        check_node_resources(&mut errs, "status.used", &status.used);
    }
    errs
}

pub(super) fn pod_errors(pod: &Pod) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &pod.metadata, NameRule::Subdomain);
    check_ref(&mut errs, "spec.domain", pod.spec.domain.as_deref());
    check_ref(&mut errs, "spec.taskName", pod.spec.task_name.as_deref());
    if let Some(ns) = pod.spec.task_namespace.as_deref().filter(|v| !v.is_empty()) {
        check_name(&mut errs, "spec.taskNamespace", ns, NameRule::Label);
    }
    if let Some(index) = pod.spec.replica_index {
        check_range(
            &mut errs,
            "spec.replicaIndex",
            index.into(),
            0,
            MAX_REPLICAS - 1,
        );
    }
    if let Some(status) = &pod.status {
        check_ip(&mut errs, "status.ip", status.ip.as_deref());
        if let Some(restarts) = status.restart_count {
            check_non_negative(&mut errs, "status.restartCount", restarts.into());
        }
    }
    errs
}
