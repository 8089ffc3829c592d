//! Checks of a Job: its spec (domain, task templates, access entries) and metadata.

use std::collections::HashSet;

use super::FieldError;
use super::checks::{NameRule, check_metadata, check_name, check_ref};
use super::task::task_spec_errors;
use crate::names;
use crate::types::{Job, JobSpec};

/// Checks a [`JobSpec`] at `path` for a Job named `job_name` (empty when unknown).
pub(super) fn job_spec_errors(
    errs: &mut Vec<FieldError>,
    path: &str,
    job_name: &str,
    spec: &JobSpec,
) {
    check_ref(errs, &format!("{path}.domain"), spec.domain.as_deref());
    if spec.tasks.is_empty() {
        errs.push(FieldError::required(
            format!("{path}.tasks"),
            "at least one task is required",
        ));
    }
    let mut seen = HashSet::new();
    let mut head: Option<&str> = None;
    for (i, template) in spec.tasks.iter().enumerate() {
        let tp = format!("{path}.tasks[{i}]");
        let name_field = format!("{tp}.name");
        if template.name.is_empty() {
            errs.push(FieldError::required(&name_field, ""));
        } else {
            check_name(errs, &name_field, &template.name, NameRule::Label);
            if !seen.insert(template.name.as_str()) {
                errs.push(FieldError::duplicate(&name_field, &template.name));
            }
            if !job_name.is_empty() {
                let child = names::task_name(job_name, &template.name);
                if child.len() > names::DNS1123_LABEL_MAX_LENGTH {
                    errs.push(FieldError::too_long(
                        &name_field,
                        format!(
                            "the Task name {child:?} (<job>-<task>) may not be more than {} characters",
                            names::DNS1123_LABEL_MAX_LENGTH
                        ),
                    ));
                }
            }
        }
        if template.head {
            match head {
                Some(first) => errs.push(FieldError::invalid(
                    format!("{tp}.head"),
                    format!("true: at most one task may be the head, and {first:?} already is"),
                )),
                None => head = Some(template.name.as_str()),
            }
        }
        task_spec_errors(errs, &tp, &template.spec);
    }
    job_access_errors(errs, &format!("{path}.access"), &spec.access);
}

/// Longest user or group name of a [`JobSpec::access`] entry (a certificate subject's).
const MAX_ACCESS_NAME: usize = 253;

/// Checks `spec.access`: at most [`crate::types::MAX_JOB_ACCESS_ENTRIES`] entries, each with
/// exactly one of `user` and `group`, a name of 1..=253 characters without whitespace or
/// control characters.
fn job_access_errors(errs: &mut Vec<FieldError>, path: &str, access: &[crate::types::JobAccess]) {
    if access.len() > crate::types::MAX_JOB_ACCESS_ENTRIES {
        errs.push(FieldError::too_long(
            path,
            format!(
                "{} entries: at most {} are allowed",
                access.len(),
                crate::types::MAX_JOB_ACCESS_ENTRIES
            ),
        ));
        return;
    }
    for (i, entry) in access.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let (field, name) = match (entry.user.as_deref(), entry.group.as_deref()) {
            (Some(user), None) => ("user", user),
            (None, Some(group)) => ("group", group),
            (Some(_), Some(_)) => {
                errs.push(FieldError::invalid(
                    &at,
                    "names both a user and a group: give exactly one of user and group per entry",
                ));
                continue;
            }
            (None, None) => {
                errs.push(FieldError::required(
                    &at,
                    "give exactly one of user and group",
                ));
                continue;
            }
        };
        let field_path = format!("{at}.{field}");
        if name.is_empty() || name.len() > MAX_ACCESS_NAME {
            errs.push(FieldError::invalid(
                &field_path,
                format!("{name:?}: must be 1 to {MAX_ACCESS_NAME} characters"),
            ));
        } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            errs.push(FieldError::invalid(
                &field_path,
                format!("{name:?}: may not contain whitespace or control characters"),
            ));
        }
    }
}

pub(super) fn job_errors(job: &Job) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &job.metadata, NameRule::Label);
    let name = job.metadata.name.as_deref().unwrap_or_default();
    job_spec_errors(&mut errs, "spec", name, &job.spec);
    errs
}
