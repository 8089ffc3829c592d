//! Kubernetes naming rules, with Kubernetes' exact error messages.
//!
//! Every check comes in two forms: `*_errors` returns every message Kubernetes would report
//! (empty = valid), and the `Result` form joins them with `"; "`. The messages are those of
//! `k8s.io/apimachinery/pkg/util/validation` so clients see what they would see from a real
//! apiserver (including its double space in `'my-name',  or '123-abc'`).

/// Longest DNS-1123 label (RFC 1123).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Longest DNS-1123 subdomain (RFC 1123).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Longest name part of a qualified name (label key).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Kubernetes' `MaxLenError`.
fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// Kubernetes' `RegexError`: message, examples, and the regex.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = String::from(msg);
    if examples.is_empty() {
        out.push_str(" (regex used for validation is '");
    } else {
        out.push_str(" (e.g. ");
        for (i, example) in examples.iter().enumerate() {
            if i > 0 {
                out.push_str(" or ");
            }
            out.push('\'');
            out.push_str(example);
            out.push_str("', ");
        }
        out.push_str("regex used for validation is '");
    }
    out.push_str(fmt);
    out.push_str("')");
    out
}

fn join(errors: Vec<String>) -> Result<(), String> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, any length.
fn matches_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// `^label(\.label)*$`, any length.
fn matches_subdomain(s: &str) -> bool {
    s.split('.').all(matches_label)
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`, any length.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_alnum(first)
                && is_alnum(last)
                && b.iter()
                    .all(|&c| is_alnum(c) || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// Every message Kubernetes' `IsDNS1123Label` reports for `value` (empty when valid).
pub fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_label(value) {
        if matches_subdomain(value) {
            // A valid subdomain but not a label: length was checked above, so it is the dots.
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Checks that `value` is a DNS-1123 label (at most 63 characters of `[a-z0-9-]`, starting
/// and ending alphanumeric). `Err` carries Kubernetes' message(s), joined with `"; "`.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    join(dns1123_label_errors(value))
}

/// Every message Kubernetes' `IsDNS1123Subdomain` reports for `value` (empty when valid).
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Checks that `value` is a DNS-1123 subdomain (at most 253 characters; dot-separated
/// DNS-1123 labels). `Err` carries Kubernetes' message(s), joined with `"; "`.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    join(dns1123_subdomain_errors(value))
}

/// Every message Kubernetes' `IsQualifiedName` reports for `value` (a label or annotation
/// key: optional DNS-subdomain prefix and `/`, then a name of at most 63 characters).
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// Checks that `value` is a qualified name (a valid label key). `Err` carries Kubernetes'
/// message(s), joined with `"; "`.
pub fn qualified_name(value: &str) -> Result<(), String> {
    join(qualified_name_errors(value))
}

/// Every message Kubernetes' `IsValidLabelValue` reports for `value` (empty when valid).
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !(value.is_empty() || matches_qualified_name(value)) {
        errs.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Checks that `value` is a valid label value (empty, or at most 63 characters of
/// `[-A-Za-z0-9_.]` starting and ending alphanumeric). `Err` carries Kubernetes' message(s).
pub fn label_value(value: &str) -> Result<(), String> {
    join(label_value_errors(value))
}

/// Name of the Task a Job creates for one of its task templates: `<job>-<task>`.
pub fn task_name(job: &str, task: &str) -> String {
    format!("{job}-{task}")
}

/// Name of the Job a Workflow creates for one of its job templates: `<workflow>-<template>`.
pub fn workflow_job_name(workflow: &str, template: &str) -> String {
    format!("{workflow}-{template}")
}

/// Namespace of the agent of cluster `cluster_id`: `rlark-<clusterID>`.
pub fn agent_namespace(cluster_id: &str) -> String {
    format!("rlark-{cluster_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

    #[test]
    fn labels_accepted() {
        for ok in ["a", "0", "my-name", "123-abc", "a-b-c", &"a".repeat(63)] {
            assert_eq!(dns1123_label(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn labels_rejected_with_kubernetes_messages() {
        for bad in ["", "-a", "a-", "A", "a_b", "a b", "ä"] {
            assert_eq!(dns1123_label(bad), Err(LABEL_MSG.to_string()), "{bad:?}");
        }
        assert_eq!(
            dns1123_label("a.b"),
            Err("must not contain dots".to_string())
        );
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            Err("must be no more than 63 characters".to_string())
        );
        assert_eq!(
            dns1123_label_errors(&"A".repeat(64)),
            vec![
                "must be no more than 63 characters".to_string(),
                LABEL_MSG.to_string()
            ]
        );
    }

    #[test]
    fn subdomains() {
        for ok in ["a", "example.com", "a-b.c-d.e", &"a".repeat(253)] {
            assert_eq!(dns1123_subdomain(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "A.com", "a_b", "-a.b", "a.b-"] {
            assert_eq!(
                dns1123_subdomain(bad),
                Err(SUBDOMAIN_MSG.to_string()),
                "{bad:?}"
            );
        }
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            Err("must be no more than 253 characters".to_string())
        );
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "a",
            "rlark.io/node-category",
            "kubernetes.io/hostname",
            "My_Name.x",
        ] {
            assert_eq!(qualified_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            qualified_name("/a"),
            Err("prefix part must be non-empty".to_string())
        );
        assert!(
            qualified_name("a/b/c")
                .unwrap_err()
                .starts_with("a qualified name must consist of")
        );
        assert!(
            qualified_name("Foo.io/a")
                .unwrap_err()
                .starts_with("prefix part a lowercase RFC 1123 subdomain")
        );
        assert!(
            qualified_name("a/-b")
                .unwrap_err()
                .starts_with("name part must consist of alphanumeric characters")
        );
        assert!(
            qualified_name("a/")
                .unwrap_err()
                .contains("name part must be non-empty")
        );
        assert!(
            qualified_name(&"a".repeat(64))
                .unwrap_err()
                .starts_with("name part must be no more than 63 characters")
        );
    }

    #[test]
    fn label_values() {
        for ok in ["", "edge", "My_Value-1.2"] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            label_value("-x"),
            Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string())
        );
        assert!(label_value(&"a".repeat(64)).is_err());
    }

    #[test]
    fn child_names() {
        assert_eq!(task_name("ppo-train", "actor"), "ppo-train-actor");
        assert_eq!(
            workflow_job_name("train-eval", "eval-a"),
            "train-eval-eval-a"
        );
        assert_eq!(agent_namespace("c1"), "rlark-c1");
    }
}
