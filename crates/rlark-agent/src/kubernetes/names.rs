//! Names and label values of the objects the Kubernetes runtime creates on a member
//! cluster, derived from the Task.
//!
//! A Task name is a DNS-1123 subdomain (up to 253 characters, dots allowed); the objects
//! derived from it need DNS-1123 labels (63 characters, no dots) and label values (63
//! characters). A name that does not fit is shortened deterministically: the valid part
//! of it, cut, then `-` and the first [`HASH_LEN`] hex digits of the SHA-256 of the whole
//! original. The same Task always gives the same names (adoption after an agent restart
//! finds its objects by them), and two Tasks that differ only beyond the cut do not clash.

use rlark_api::names::{DNS1123_LABEL_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH};
use rlark_api::types::KubernetesWorkloadKind;
use sha2::{Digest, Sha256};

/// Hex digits of the hash suffix of a shortened name.
pub const HASH_LEN: usize = 10;

/// Longest StatefulSet name: its Pods carry the label `controller-revision-hash` =
/// `<name>-<hash of up to 10 characters>`, which must stay a valid label value.
pub const STATEFULSET_NAME_MAX_LENGTH: usize = 52;

/// Suffix of the Ray head Service's name.
pub const HEAD_SERVICE_SUFFIX: &str = "-ray-head";

/// The `<hash>` of a shortened name: the first [`HASH_LEN`] hex digits of SHA-256(`value`).
fn hash_suffix(value: &str) -> String {
    let digest = hex::encode(Sha256::digest(value.as_bytes()));
    digest[..HASH_LEN].to_string()
}

/// `prefix` cut to `max - 1 - HASH_LEN` bytes, its invalid end trimmed, then
/// `-<hash of original>`; the hash alone when nothing of the prefix is left.
fn with_hash(prefix: &str, original: &str, max: usize, keep_end: impl Fn(char) -> bool) -> String {
    let hash = hash_suffix(original);
    let room = max.saturating_sub(1 + HASH_LEN);
    // The prefix is ASCII (sanitized), so a byte cut is a character cut.
    let cut = &prefix[..prefix.len().min(room)];
    let cut = cut.trim_end_matches(|c: char| !keep_end(c));
    if cut.is_empty() {
        hash
    } else {
        format!("{cut}-{hash}")
    }
}

/// `value` as a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`) of at most `max`
/// characters: `value` itself when it already is one, else its lower-cased valid part
/// (other characters, dots included, become `-`) shortened with a hash suffix.
pub fn dns_label(value: &str, max: usize) -> String {
    let max = max.min(DNS1123_LABEL_MAX_LENGTH);
    let sanitized: String = value
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = sanitized.trim_matches('-');
    if trimmed == value && !value.is_empty() && value.len() <= max {
        return value.to_string();
    }
    with_hash(trimmed, value, max, |c| c.is_ascii_alphanumeric())
}

/// `value` as a DNS-1035 label (a DNS-1123 label that starts with a letter, what a Service
/// name must be) of at most 63 characters: [`dns_label`], prefixed with `r-` (before
/// shortening) when it would start with a digit.
pub fn dns1035_label(value: &str) -> String {
    let label = dns_label(value, DNS1123_LABEL_MAX_LENGTH);
    if label.starts_with(|c: char| c.is_ascii_lowercase()) {
        label
    } else {
        dns_label(&format!("r-{value}"), DNS1123_LABEL_MAX_LENGTH)
    }
}

/// `value` as a label value (empty, or `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?` of at
/// most 63 characters): `value` itself when it already is one, else its valid part
/// (other characters become `-`) shortened with a hash suffix.
pub fn label_value(value: &str) -> String {
    if rlark_api::names::label_value(value).is_ok() {
        return value.to_string();
    }
    let sanitized: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = sanitized.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    with_hash(trimmed, value, LABEL_VALUE_MAX_LENGTH, |c| {
        c.is_ascii_alphanumeric()
    })
}

/// Name of the workload (Deployment, StatefulSet, DaemonSet or Job) of Task `task`: the
/// Task's name, as a DNS-1123 label of at most 63 characters
/// ([`STATEFULSET_NAME_MAX_LENGTH`] for a StatefulSet).
pub fn workload_name(task: &str, kind: KubernetesWorkloadKind) -> String {
    let max = match kind {
        KubernetesWorkloadKind::StatefulSet => STATEFULSET_NAME_MAX_LENGTH,
        _ => DNS1123_LABEL_MAX_LENGTH,
    };
    dns_label(task, max)
}

/// Name of the Ray head's headless Service of Task `task`: `<task>-ray-head`, as a
/// DNS-1035 label.
pub fn head_service_name(task: &str) -> String {
    dns1035_label(&format!("{task}{HEAD_SERVICE_SUFFIX}"))
}

/// Name of the Secret holding Task `task`'s token and CA bundle:
/// `<task>-rlark-token`, as a DNS-1123 label.
pub fn token_secret_name(task: &str) -> String {
    dns_label(&format!("{task}-rlark-token"), DNS1123_LABEL_MAX_LENGTH)
}

/// Name of the claim the agent creates for volume `volume` of Task `task` when the
/// volume names no claim: `pvc-<task>-<volume>`, as a DNS-1123 label.
pub fn claim_name(task: &str, volume: &str) -> String {
    dns_label(&format!("pvc-{task}-{volume}"), DNS1123_LABEL_MAX_LENGTH)
}

/// The label value that stands for a run key ([`rlark_api::agent::run_key`], which holds
/// `/` and `,`): the first 16 hex digits of its SHA-256.
pub fn run_label(run_key: &str) -> String {
    hex::encode(Sha256::digest(run_key.as_bytes()))[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_label(name: &str) -> bool {
        rlark_api::names::dns1123_label(name).is_ok()
    }

    #[test]
    fn names_that_fit_are_kept_and_longer_ones_get_a_hash_suffix() {
        let at_63 = "a".repeat(63);
        let at_64 = "a".repeat(64);
        let at_64_other = format!("{}b", "a".repeat(63));
        // (input, max, expected length, kept as is)
        let cases: &[(&str, usize, usize, bool)] = &[
            ("ppo-actor", 63, 9, true),
            (&at_63, 63, 63, true),
            (&at_64, 63, 63, false),
            ("ppo.actor", 63, 20, false),
            ("PPO-Actor", 63, 20, false),
            ("-", 63, HASH_LEN, false),
            (&at_63, 52, 52, false),
        ];
        for &(input, max, len, kept) in cases {
            let name = dns_label(input, max);
            assert!(valid_label(&name), "{input:?} -> {name:?}");
            assert_eq!(name.len(), len, "{input:?} -> {name:?}");
            assert_eq!(name == input, kept, "{input:?} -> {name:?}");
            assert_eq!(dns_label(input, max), name, "deterministic");
        }
        assert_ne!(
            dns_label(&at_64, 63),
            dns_label(&at_64_other, 63),
            "names that differ beyond the cut do not clash"
        );
        assert_ne!(
            dns_label("a.b", 63),
            dns_label("a-b", 63),
            "a dot is not silently the same name as a dash"
        );
        assert_eq!(
            dns_label(&at_64, 63),
            format!("{}-{}", "a".repeat(52), hash_suffix(&at_64))
        );
    }

    #[test]
    fn derived_object_names() {
        let long = format!("job-{}", "x".repeat(60));
        assert_eq!(
            workload_name("ppo-actor", KubernetesWorkloadKind::StatefulSet),
            "ppo-actor"
        );
        assert_eq!(
            workload_name(&long, KubernetesWorkloadKind::Deployment).len(),
            63
        );
        assert_eq!(
            workload_name(&long, KubernetesWorkloadKind::StatefulSet).len(),
            STATEFULSET_NAME_MAX_LENGTH
        );
        assert_eq!(head_service_name("ppo-actor"), "ppo-actor-ray-head");
        let svc = head_service_name(&long);
        assert!(valid_label(&svc) && svc.len() == 63, "{svc}");
        let digit = head_service_name("1st-actor");
        assert!(digit.starts_with("r-1st-actor"), "DNS-1035: {digit}");
        assert_eq!(claim_name("ppo-actor", "data"), "pvc-ppo-actor-data");
        assert!(valid_label(&claim_name(&long, "data")));
        assert_eq!(run_label("uid/ts/n1,n2").len(), 16);
    }

    #[test]
    fn label_values() {
        let at_63 = "A".repeat(63);
        let at_64 = "A".repeat(64);
        for (input, kept) in [
            ("ppo.actor_1", true),
            ("", true),
            (at_63.as_str(), true),
            (at_64.as_str(), false),
            ("uid/ts/n1", false),
            ("_x_", false),
        ] {
            let value = label_value(input);
            assert!(
                rlark_api::names::label_value(&value).is_ok(),
                "{input:?} -> {value:?}"
            );
            assert!(value.len() <= 63);
            assert_eq!(value == input, kept, "{input:?} -> {value:?}");
        }
    }
}
