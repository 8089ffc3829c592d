//! Checks of a Workflow: its job templates and their dependencies (which must form a DAG).

use std::collections::{HashMap, HashSet};

use super::FieldError;
use super::checks::{NameRule, check_metadata, check_name};
use super::job::job_spec_errors;
use crate::names;
use crate::types::Workflow;

/// The first dependency cycle found (depth-first, in template and dependency order), as
/// template names with the first repeated at the end; `None` for a DAG. `deps[i]` lists the
/// indices template `i` depends on.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    fn visit(
        node: usize,
        deps: &[Vec<usize>],
        marks: &mut [Mark],
        stack: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        marks[node] = Mark::OnStack;
        stack.push(node);
        for &next in &deps[node] {
            match marks[next] {
                Mark::OnStack => {
                    let start = stack.iter().position(|&n| n == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next);
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, deps, marks, stack) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks[node] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; deps.len()];
    let mut stack = Vec::new();
    (0..deps.len()).find_map(|start| {
        if marks[start] == Mark::New {
            visit(start, deps, &mut marks, &mut stack)
        } else {
            None
        }
    })
}

pub(super) fn workflow_errors(workflow: &Workflow) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_metadata(&mut errs, &workflow.metadata, NameRule::Label);
    let wf_name = workflow.metadata.name.as_deref().unwrap_or_default();
    let templates = &workflow.spec.job_templates;
    if templates.is_empty() {
        errs.push(FieldError::required(
            "spec.jobTemplates",
            "at least one job template is required",
        ));
    }

    // Index of the first template of each name.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in templates.iter().enumerate() {
        let field = format!("spec.jobTemplates[{i}].name");
        if t.name.is_empty() {
            errs.push(FieldError::required(field, ""));
            continue;
        }
        check_name(&mut errs, &field, &t.name, NameRule::Label);
        if index.contains_key(t.name.as_str()) {
            errs.push(FieldError::duplicate(&field, &t.name));
        } else {
            index.insert(&t.name, i);
        }
        if !wf_name.is_empty() {
            let child = names::workflow_job_name(wf_name, &t.name);
            if child.len() > names::DNS1123_LABEL_MAX_LENGTH {
                errs.push(FieldError::too_long(
                    &field,
                    format!(
                        "the Job name {child:?} (<workflow>-<template>) may not be more than {} characters",
                        names::DNS1123_LABEL_MAX_LENGTH
                    ),
                ));
            }
        }
    }

    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); templates.len()];
    for (i, t) in templates.iter().enumerate() {
        let mut seen = HashSet::new();
        for (j, dep) in t.dependencies.iter().enumerate() {
            let field = format!("spec.jobTemplates[{i}].dependencies[{j}]");
            if !seen.insert(dep.as_str()) {
                errs.push(FieldError::duplicate(field, dep));
                continue;
            }
            if dep == &t.name {
                errs.push(FieldError::invalid(
                    field,
                    format!("{dep:?}: a job template may not depend on itself"),
                ));
                continue;
            }
            match index.get(dep.as_str()) {
                Some(&target) => deps[i].push(target),
                None => errs.push(FieldError::invalid(
                    field,
                    format!("{dep:?}: no job template of this workflow has this name"),
                )),
            }
        }
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle.iter().map(|&i| templates[i].name.as_str()).collect();
        errs.push(FieldError::invalid(
            "spec.jobTemplates",
            format!("dependency cycle: {}", names.join(" -> ")),
        ));
    }

    for (i, t) in templates.iter().enumerate() {
        let job_name = if wf_name.is_empty() || t.name.is_empty() {
            String::new()
        } else {
            names::workflow_job_name(wf_name, &t.name)
        };
        job_spec_errors(
            &mut errs,
            &format!("spec.jobTemplates[{i}].spec"),
            &job_name,
            &t.spec,
        );
    }
    errs
}
