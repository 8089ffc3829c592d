//! Checks of a Domain (its pod network, label selectors) and of a DomainPeer.

use std::str::FromStr;

use ipnet::IpNet;

use super::FieldError;
use super::checks::{NameRule, check_ip, check_metadata, check_name};
use crate::names;
use crate::types::{Domain, DomainPeer};

/// Number of addresses of `net` that rlark's IPAM hands out: IPv4 excludes the network and
/// broadcast addresses (except in /31 and /32), IPv6 excludes the subnet-router anycast
/// address (except in /127 and /128). Saturates at `u128::MAX` for `::/0`.
pub fn usable_addresses(net: &IpNet) -> u128 {
    let (bits, prefix) = match net {
        IpNet::V4(n) => (32u32, u32::from(n.prefix_len())),
        IpNet::V6(n) => (128u32, u32::from(n.prefix_len())),
    };
    let host_bits = bits - prefix;
    let total = if host_bits >= 128 {
        u128::MAX
    } else {
        1u128 << host_bits
    };
    match (net, host_bits) {
        (_, 0 | 1) => total,
        (IpNet::V4(_), _) => total - 2,
        (IpNet::V6(_), _) => total - 1,
    }
}

pub(super) fn domain_errors(domain: &Domain) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &domain.metadata, NameRule::Subdomain);
    let cidr = domain.spec.cidr.as_str();
    if cidr.is_empty() {
        errs.push(FieldError::required("spec.cidr", ""));
        return errs;
    }
    let net = match IpNet::from_str(cidr) {
        Ok(net) => net,
        Err(_) => {
            errs.push(FieldError::invalid(
                "spec.cidr",
                format!(
                    "{cidr:?}: must be a valid IPv4 or IPv6 CIDR (e.g. '10.88.0.0/16' or 'fd00:88::/64')"
                ),
            ));
            return errs;
        }
    };
    if net.addr() != net.network() {
        errs.push(FieldError::invalid(
            "spec.cidr",
            format!(
                "{cidr:?}: host bits must be zero; did you mean {:?}?",
                net.trunc().to_string()
            ),
        ));
    }
    if let Some(selector) = &domain.spec.job_selector {
        check_label_selector(&mut errs, "spec.jobSelector", selector);
    }
    let usable = usable_addresses(&net);
    if usable < 2 {
        errs.push(FieldError::invalid(
            "spec.cidr",
            format!(
                "{cidr:?}: a /{} network has {usable} usable address; at least 2 are needed",
                net.prefix_len()
            ),
        ));
    }
    errs
}

/// A label selector: label keys and values well-formed, operators known, `values` given
/// exactly for `In`/`NotIn`.
fn check_label_selector(
    errs: &mut Vec<FieldError>,
    path: &str,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) {
    for (key, value) in selector.match_labels.iter().flatten() {
        for problem in names::qualified_name_errors(key) {
            errs.push(FieldError::invalid(
                format!("{path}.matchLabels"),
                format!("{key:?}: {problem}"),
            ));
        }
        for problem in names::label_value_errors(value) {
            errs.push(FieldError::invalid(
                format!("{path}.matchLabels[{key}]"),
                format!("{value:?}: {problem}"),
            ));
        }
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        for problem in names::qualified_name_errors(&req.key) {
            errs.push(FieldError::invalid(
                format!("{at}.key"),
                format!("{:?}: {problem}", req.key),
            ));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                format!("{at}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
                format!("{at}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(FieldError::not_supported(
                format!("{at}.operator"),
                other,
                crate::labels::SELECTOR_OPERATORS,
            )),
        }
    }
}
pub(super) fn domain_peer_errors(peer: &DomainPeer) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &peer.metadata, NameRule::Subdomain);
    if peer.spec.domain.is_empty() {
        errs.push(FieldError::required("spec.domain", ""));
    } else {
        check_name(
            &mut errs,
            "spec.domain",
            &peer.spec.domain,
            NameRule::Subdomain,
        );
    }
    if !(0..=128).contains(&peer.spec.prefix_len) {
        errs.push(FieldError::invalid(
            "spec.prefixLen",
            format!(
                "{}: must be between 0 and 128, inclusive",
                peer.spec.prefix_len
            ),
        ));
    }
    for (i, pod) in peer.spec.pods.iter().enumerate() {
        let pp = format!("spec.pods[{i}]");
        if pod.ip.is_empty() {
            errs.push(FieldError::required(format!("{pp}.ip"), ""));
        } else {
            check_ip(&mut errs, &format!("{pp}.ip"), Some(&pod.ip));
        }
        check_ip(&mut errs, &format!("{pp}.localIP"), pod.local_ip.as_deref());
    }
    errs
}
