//! Field checks every kind uses: DNS-1123 names and object metadata, integer ranges,
//! references, environment variables, resource lists, IP addresses.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::FieldError;
use crate::names;
use crate::quantity::{QuantityValue, parse_quantity};
use crate::types::{EnvVar, ResourceList, ResourceRequirements};

/// Which DNS-1123 rule a name follows.
#[derive(Clone, Copy)]
pub(super) enum NameRule {
    Label,
    Subdomain,
}

fn name_errors(value: &str, rule: NameRule) -> Vec<String> {
    match rule {
        NameRule::Label => names::dns1123_label_errors(value),
        NameRule::Subdomain => names::dns1123_subdomain_errors(value),
    }
}

pub(super) fn check_name(errs: &mut Vec<FieldError>, field: &str, value: &str, rule: NameRule) {
    for msg in name_errors(value, rule) {
        errs.push(FieldError::invalid(field, format!("{value:?}: {msg}")));
    }
}

/// `metadata.name` (required; `rule`), `metadata.namespace` (a label when set).
pub(super) fn check_metadata(errs: &mut Vec<FieldError>, meta: &ObjectMeta, rule: NameRule) {
    match meta.name.as_deref() {
        None | Some("") => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => check_name(errs, "metadata.name", name, rule),
    }
    if let Some(ns) = meta.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        check_name(errs, "metadata.namespace", ns, NameRule::Label);
    }
}

/// `value` must lie in `min..=max`; the error names both ends, as Kubernetes' `InclusiveRange`
/// does, or only the broken one when the other is the type's natural bound.
pub(super) fn check_range(errs: &mut Vec<FieldError>, field: &str, value: i64, min: i64, max: i64) {
    if value < min {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be greater than or equal to {min}"),
        ));
    } else if value > max {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be less than or equal to {max}"),
        ));
    }
}

pub(super) fn check_non_negative(errs: &mut Vec<FieldError>, field: &str, value: i64) {
    if value < 0 {
        errs.push(FieldError::invalid(
            field,
            format!("{value}: must be greater than or equal to 0"),
        ));
    }
}

/// An optional reference to another object by name: when set and non-empty, a subdomain.
pub(super) fn check_ref(errs: &mut Vec<FieldError>, field: &str, value: Option<&str>) {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        check_name(errs, field, v, NameRule::Subdomain);
    }
}

pub(super) fn check_env(errs: &mut Vec<FieldError>, path: &str, env: &[EnvVar]) {
    for (i, var) in env.iter().enumerate() {
        let field = format!("{path}[{i}].name");
        if var.name.is_empty() {
            errs.push(FieldError::required(field, ""));
        } else if !var
            .name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'=')
        {
            errs.push(FieldError::invalid(
                field,
                format!(
                    "{:?}: a valid environment variable name must consist only of printable ASCII characters other than '='",
                    var.name
                ),
            ));
        }
    }
}

/// Every quantity parses and is non-negative. Returns the parsed values by name.
pub(super) fn check_resource_list(
    errs: &mut Vec<FieldError>,
    path: &str,
    list: &ResourceList,
) -> BTreeMap<String, QuantityValue> {
    let mut parsed = BTreeMap::new();
    for (name, quantity) in list {
        for msg in names::qualified_name_errors(name) {
            errs.push(FieldError::invalid(path, format!("{name:?}: {msg}")));
        }
        let field = format!("{path}[{name}]");
        match parse_quantity(&quantity.0) {
            Err(e) => errs.push(FieldError::invalid(field, format!("{:?}: {e}", quantity.0))),
            Ok(v) if v.is_negative() => errs.push(FieldError::invalid(
                field,
                format!("{:?}: must be greater than or equal to 0", quantity.0),
            )),
            Ok(v) => {
                parsed.insert(name.clone(), v);
            }
        }
    }
    parsed
}

/// Requests and limits are valid quantities, and no request exceeds its limit.
pub(super) fn check_resources(errs: &mut Vec<FieldError>, path: &str, res: &ResourceRequirements) {
    let requests = check_resource_list(errs, &format!("{path}.requests"), &res.requests);
    let limits = check_resource_list(errs, &format!("{path}.limits"), &res.limits);
    for (name, request) in &requests {
        if let Some(limit) = limits.get(name)
            && request > limit
        {
            errs.push(FieldError::invalid(
                format!("{path}.requests[{name}]"),
                format!(
                    "{:?}: must be less than or equal to {name} limit of {}",
                    res.requests[name].0, res.limits[name].0
                ),
            ));
        }
    }
}
pub(super) fn check_ip(errs: &mut Vec<FieldError>, field: &str, value: Option<&str>) {
    if let Some(ip) = value.filter(|v| !v.is_empty())
        && IpAddr::from_str(ip).is_err()
    {
        errs.push(FieldError::invalid(
            field,
            format!("{ip:?}: must be a valid IP address"),
        ));
    }
}
