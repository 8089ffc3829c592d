//! Checks of the pod network that need other objects: a Domain against the other
//! Domains and its stored self, a Job (or a Workflow's job templates) against the Domains
//! it names, a Domain's deletion
//! against the Jobs that use it. Pure: the API server reads the objects and turns the
//! [`FieldError`]s into a 422 (or the users into a 409).

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::{FieldError, FieldErrorKind, usable_addresses};
use crate::labels;
use crate::types::{Domain, Job, Workflow};

/// The Domain each template of `job` joins (`spec.domain` of the Job, else the template's
/// own), with the field that says so, by template index.
pub fn job_domains(job: &Job) -> Vec<(usize, String, String)> {
    job.spec
        .tasks
        .iter()
        .enumerate()
        .filter_map(
            |(i, template)| match (&job.spec.domain, &template.spec.domain) {
                (Some(d), _) if !d.is_empty() => Some((i, d.clone(), "spec.domain".to_string())),
                (_, Some(d)) if !d.is_empty() => {
                    Some((i, d.clone(), format!("spec.tasks[{i}].domain")))
                }
                _ => None,
            },
        )
        .collect()
}

/// Whether two networks share an address.
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// `spec.cidr` of `domain` against the `others` (every stored Domain; `domain` itself, by
/// name, is skipped): no two Domains may share an address, since an address must name
/// one member wherever it is dialled.
pub fn domain_overlap_errors(domain: &Domain, others: &[Domain]) -> Vec<FieldError> {
    let Ok(net) = domain.spec.cidr.parse::<IpNet>() else {
        // The Domain's own validation reports it.
        return Vec::new();
    };
    let name = domain.metadata.name.as_deref().unwrap_or("");
    others
        .iter()
        .filter(|o| o.metadata.name.as_deref() != Some(name))
        .filter_map(|o| {
            let other: IpNet = o.spec.cidr.parse().ok()?;
            overlap(&net, &other).then(|| {
                FieldError::invalid(
                    "spec.cidr",
                    format!(
                        "{:?}: overlaps Domain {:?} ({})",
                        domain.spec.cidr,
                        o.metadata.name.as_deref().unwrap_or(""),
                        o.spec.cidr
                    ),
                )
            })
        })
        .collect()
}

/// An update of `old` to `new`: `spec.cidr` may not change while addresses of the old
/// CIDR are held by live replicas (they would keep addresses outside the new one).
pub fn domain_update_errors(new: &Domain, old: &Domain) -> Vec<FieldError> {
    if new.spec.cidr == old.spec.cidr {
        return Vec::new();
    }
    let live: Vec<&str> = old
        .status
        .iter()
        .flat_map(|s| &s.ip_allocations)
        .filter(|a| a.released_at.is_none())
        .map(|a| a.ip.as_str())
        .collect();
    if live.is_empty() {
        return Vec::new();
    }
    vec![FieldError::forbidden(
        "spec.cidr",
        format!(
            "may not change from {:?} while {} of its addresses are allocated (first: {}); stop or delete the Jobs that use the Domain first",
            old.spec.cidr,
            live.len(),
            live[0]
        ),
    )]
}

/// A Job against the Domains it names (`domains`: every stored Domain, by name): each
/// must exist, select the Job by its `jobSelector`, and hold the replicas of the Job's
/// templates that join it.
pub fn job_domain_errors(job: &Job, domains: &BTreeMap<String, Domain>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut replicas: BTreeMap<&str, (i64, String)> = BTreeMap::new();
    let per_template = job_domains(job);
    let job_labels = job.metadata.labels.clone().unwrap_or_default();
    let mut reported: Vec<(String, String)> = Vec::new();
    for (i, name, field) in &per_template {
        let count = i64::from(job.spec.tasks[*i].spec.replicas().max(0));
        let entry = replicas
            .entry(name.as_str())
            .or_insert_with(|| (0, field.clone()));
        entry.0 += count;
        if reported.contains(&(name.clone(), field.clone())) {
            continue;
        }
        reported.push((name.clone(), field.clone()));
        let Some(domain) = domains.get(name) else {
            errs.push(FieldError::new(
                field.clone(),
                FieldErrorKind::NotFound,
                format!("{name:?}: no Domain of that name exists; create it first"),
            ));
            continue;
        };
        if domain.metadata.deletion_timestamp.is_some() {
            errs.push(FieldError::forbidden(
                field.clone(),
                format!("Domain {name:?} is being deleted"),
            ));
            continue;
        }
        if let Some(selector) = &domain.spec.job_selector
            && !labels::selector_matches(selector, &job_labels)
        {
            errs.push(FieldError::forbidden(
                field.clone(),
                format!(
                    "Domain {name:?} admits only Jobs whose labels match its spec.jobSelector ({}); this Job's labels do not",
                    describe_selector(selector)
                ),
            ));
        }
    }
    for (name, (count, field)) in replicas {
        let Some(net) = domains
            .get(name)
            .and_then(|d| d.spec.cidr.parse::<IpNet>().ok())
        else {
            continue;
        };
        let usable = usable_addresses(&net);
        if u128::try_from(count).unwrap_or(0) > usable {
            errs.push(FieldError::invalid(
                field,
                format!(
                    "{name:?}: the Job's tasks in this Domain have {count} replicas in all, and its CIDR {net} holds {usable} usable addresses"
                ),
            ));
        }
    }
    errs
}

/// The Job that template `index` of `workflow` becomes, as far as Domain checks look at it:
/// the template's spec and the labels the Workflow controller gives its Jobs
/// ([`labels::workflow_job_labels`]).
fn workflow_job(workflow: &Workflow, index: usize) -> Option<Job> {
    let template = workflow.spec.job_templates.get(index)?;
    let name = workflow.metadata.name.as_deref().unwrap_or("");
    Some(Job {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("{name}-{}", template.name)),
            labels: Some(labels::workflow_job_labels(name)),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

/// What Domain checks look at in a Workflow, per job template: the Domain and replicas of
/// each of its task templates (the Jobs' labels depend only on the Workflow's name). Equal
/// fingerprints: an update that cannot change the outcome of [`workflow_domain_errors`].
pub fn workflow_domain_fingerprint(workflow: &Workflow) -> Vec<Vec<(String, i32)>> {
    (0..workflow.spec.job_templates.len())
        .filter_map(|i| workflow_job(workflow, i))
        .map(|job| {
            job_domains(&job)
                .into_iter()
                .map(|(t, d, _)| (d, job.spec.tasks[t].spec.replicas()))
                .collect()
        })
        .collect()
}

/// [`job_domain_errors`] of the Job each template of `workflow` becomes, so a Workflow is
/// refused at apply as its Jobs would be when the controller creates them; fields are
/// named within the Workflow (`spec.jobTemplates[2].spec.domain`).
pub fn workflow_domain_errors(
    workflow: &Workflow,
    domains: &BTreeMap<String, Domain>,
) -> Vec<FieldError> {
    (0..workflow.spec.job_templates.len())
        .filter_map(|i| Some((i, workflow_job(workflow, i)?)))
        .flat_map(|(i, job)| {
            job_domain_errors(&job, domains)
                .into_iter()
                .map(move |mut error| {
                    error.field = format!("spec.jobTemplates[{i}].{}", error.field);
                    error
                })
        })
        .collect()
}

/// A selector as `kubectl` prints one: `team=rl,tier in (gpu),!x`.
pub fn describe_selector(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.clone().unwrap_or_default().join(",");
        parts.push(match req.operator.as_str() {
            "In" => format!("{} in ({values})", req.key),
            "NotIn" => format!("{} notin ({values})", req.key),
            "Exists" => req.key.clone(),
            "DoesNotExist" => format!("!{}", req.key),
            other => format!("{} {other} ({values})", req.key),
        });
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

/// The names of the Jobs (not being deleted) that join Domain `domain`, sorted.
pub fn jobs_using(domain: &str, jobs: &[Job]) -> Vec<String> {
    let mut names: Vec<String> = jobs
        .iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .filter(|j| job_domains(j).iter().any(|(_, d, _)| d == domain))
        .filter_map(|j| j.metadata.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn domain(name: &str, cidr: &str) -> Domain {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"cidr": cidr}})).unwrap()
    }

    fn job(domain: Option<&str>, templates: serde_json::Value) -> Job {
        let mut job: Job = serde_json::from_value(json!({
            "metadata": {"name": "j", "labels": {"team": "rl"}},
            "spec": {"tasks": templates}
        }))
        .unwrap();
        job.spec.domain = domain.map(str::to_string);
        job
    }

    fn template(name: &str, replicas: i32) -> serde_json::Value {
        json!({"name": name, "agentType": "Raw", "role": "Actor",
               "raw": {"entrypoint": ["x"], "replicas": replicas}})
    }

    fn rendered(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn overlapping_domains_are_named() {
        let others = [
            domain("a", "10.0.0.0/16"),
            domain("b", "10.1.0.0/24"),
            domain("v6", "fd00::/64"),
            domain("broken", "nonsense"),
        ];
        // (cidr, overlapping domains)
        let cases: &[(&str, &[&str])] = &[
            ("10.2.0.0/16", &[]),
            ("10.0.5.0/24", &["a"]),
            ("10.0.0.0/8", &["a", "b"]),
            ("10.1.0.128/25", &["b"]),
            ("fd00::1:0/112", &["v6"]),
            ("fd01::/64", &[]),
        ];
        for (cidr, want) in cases {
            let errs = domain_overlap_errors(&domain("new", cidr), &others);
            let named: Vec<String> = errs.iter().map(|e| e.message.clone()).collect();
            assert_eq!(errs.len(), want.len(), "{cidr}: {named:?}");
            for (e, w) in errs.iter().zip(want.iter()) {
                assert_eq!(e.field, "spec.cidr");
                assert!(
                    e.message.contains(&format!("overlaps Domain {w:?}")),
                    "{}",
                    e.message
                );
            }
        }
        // Itself (an update) is not an overlap.
        assert!(domain_overlap_errors(&domain("a", "10.0.0.0/16"), &others).is_empty());
        assert_eq!(
            rendered(&domain_overlap_errors(&domain("n", "10.0.1.0/24"), &others)),
            [r#"spec.cidr: Invalid value: "10.0.1.0/24": overlaps Domain "a" (10.0.0.0/16)"#]
        );
    }

    #[test]
    fn the_cidr_is_fixed_while_addresses_are_held() {
        let mut old = domain("d", "10.0.0.0/24");
        let new = domain("d", "10.9.0.0/24");
        assert!(domain_update_errors(&new, &old).is_empty());
        old.status = Some(
            serde_json::from_value(json!({"ipAllocations": [
                {"ip": "10.0.0.3", "job": "j", "task": "j-a", "index": 0,
                 "releasedAt": "2026-01-01T00:00:00Z"}
            ]}))
            .unwrap(),
        );
        // Only released reservations: may change.
        assert!(domain_update_errors(&new, &old).is_empty());
        old.status.as_mut().unwrap().ip_allocations.push(
            serde_json::from_value(
                json!({"ip": "10.0.0.1", "job": "j", "task": "j-a", "index": 1}),
            )
            .unwrap(),
        );
        assert_eq!(
            rendered(&domain_update_errors(&new, &old)),
            [
                r#"spec.cidr: Forbidden: may not change from "10.0.0.0/24" while 1 of its addresses are allocated (first: 10.0.0.1); stop or delete the Jobs that use the Domain first"#
            ]
        );
        assert!(domain_update_errors(&old.clone(), &old).is_empty());
    }

    #[test]
    fn jobs_must_name_existing_domains_that_admit_and_hold_them() {
        let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
        domains.insert("small".into(), domain("small", "10.0.0.0/30"));
        let mut picky = domain("picky", "10.1.0.0/24");
        picky.spec.job_selector =
            Some(serde_json::from_value(json!({"matchLabels": {"team": "cv"}})).unwrap());
        domains.insert("picky".into(), picky);
        domains.insert("open".into(), domain("open", "10.2.0.0/24"));

        // No domain anywhere: nothing to check.
        assert!(job_domain_errors(&job(None, json!([template("a", 5)])), &domains).is_empty());
        // Fits: 2 replicas in a /30.
        assert!(
            job_domain_errors(
                &job(Some("small"), json!([template("a", 1), template("b", 1)])),
                &domains
            )
            .is_empty()
        );
        assert_eq!(
            rendered(&job_domain_errors(
                &job(Some("small"), json!([template("a", 2), template("b", 1)])),
                &domains
            )),
            [
                r#"spec.domain: Invalid value: "small": the Job's tasks in this Domain have 3 replicas in all, and its CIDR 10.0.0.0/30 holds 2 usable addresses"#
            ]
        );
        assert_eq!(
            rendered(&job_domain_errors(
                &job(Some("nope"), json!([template("a", 1)])),
                &domains
            )),
            [r#"spec.domain: Not found: "nope": no Domain of that name exists; create it first"#]
        );
        assert_eq!(
            rendered(&job_domain_errors(
                &job(Some("picky"), json!([template("a", 1)])),
                &domains
            )),
            [
                r#"spec.domain: Forbidden: Domain "picky" admits only Jobs whose labels match its spec.jobSelector (team=cv); this Job's labels do not"#
            ]
        );
        // Template-level domains are checked where they are written.
        let mut t = template("b", 1);
        t["domain"] = json!("nope");
        let errs = job_domain_errors(&job(None, json!([template("a", 1), t])), &domains);
        assert_eq!(
            rendered(&errs),
            [
                r#"spec.tasks[1].domain: Not found: "nope": no Domain of that name exists; create it first"#
            ]
        );
        let mut deleting = domain("open", "10.2.0.0/24");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        domains.insert("open".into(), deleting);
        assert_eq!(
            rendered(&job_domain_errors(
                &job(Some("open"), json!([template("a", 1)])),
                &domains
            )),
            [r#"spec.domain: Forbidden: Domain "open" is being deleted"#]
        );
    }

    #[test]
    fn workflow_job_templates_are_checked_as_the_jobs_they_become() {
        let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
        domains.insert("open".into(), domain("open", "10.2.0.0/24"));
        let mut picky = domain("picky", "10.1.0.0/24");
        picky.spec.job_selector = Some(
            serde_json::from_value(json!({"matchLabels": {"rlinf.io/workflow": "wf"}})).unwrap(),
        );
        domains.insert("picky".into(), picky);
        let mut deleting = domain("going", "10.3.0.0/24");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        domains.insert("going".into(), deleting);
        let workflow = |name: &str, templates: serde_json::Value| -> Workflow {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"team": "rl"}},
                "spec": {"jobTemplates": templates}
            }))
            .unwrap()
        };
        let tasks = |domain: Option<&str>| {
            let mut t = template("a", 1);
            if let Some(d) = domain {
                t["domain"] = json!(d);
            }
            json!([t])
        };
        let wf = workflow(
            "wf",
            json!([
                {"name": "a", "spec": {"domain": "open", "tasks": tasks(None)}},
                {"name": "b", "spec": {"domain": "picky", "tasks": tasks(None)}},
                {"name": "c", "spec": {"domain": "nope", "tasks": tasks(None)}},
                {"name": "d", "spec": {"tasks": tasks(Some("going"))}},
                {"name": "e", "spec": {"tasks": tasks(None)}}
            ]),
        );
        // The Job of template "b" carries rlinf.io/workflow=wf, which "picky" admits.
        assert_eq!(
            rendered(&workflow_domain_errors(&wf, &domains)),
            [
                r#"spec.jobTemplates[2].spec.domain: Not found: "nope": no Domain of that name exists; create it first"#,
                r#"spec.jobTemplates[3].spec.tasks[0].domain: Forbidden: Domain "going" is being deleted"#,
            ]
        );
        // Another Workflow's Jobs carry another name: "picky" refuses them, whatever the
        // Workflow's own labels.
        let other = workflow(
            "other",
            json!([{"name": "b", "spec": {"domain": "picky", "tasks": tasks(None)}}]),
        );
        assert_eq!(
            rendered(&workflow_domain_errors(&other, &domains)),
            [
                r#"spec.jobTemplates[0].spec.domain: Forbidden: Domain "picky" admits only Jobs whose labels match its spec.jobSelector (rlinf.io/workflow=wf); this Job's labels do not"#
            ]
        );
        assert_eq!(
            workflow_domain_fingerprint(&other),
            [[("picky".to_string(), 1)]]
        );
        assert!(
            workflow_domain_fingerprint(&workflow(
                "x",
                json!([{"name": "e", "spec": {"tasks": tasks(None)}}])
            ))[0]
                .is_empty()
        );
    }

    #[test]
    fn the_users_of_a_domain_are_its_jobs() {
        let mut j2 = job(None, json!([template("a", 1)]));
        j2.metadata.name = Some("j2".into());
        j2.spec.tasks[0].spec.domain = Some("d".into());
        let mut gone = job(Some("d"), json!([template("a", 1)]));
        gone.metadata.name = Some("gone".into());
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        let jobs = [
            job(Some("d"), json!([template("a", 1)])),
            j2,
            gone,
            job(Some("e"), json!([])),
        ];
        assert_eq!(jobs_using("d", &jobs), ["j", "j2"]);
        assert!(jobs_using("x", &jobs).is_empty());
        assert_eq!(
            describe_selector(
                &serde_json::from_value(json!({"matchLabels": {"a": "b"},
                    "matchExpressions": [{"key": "t", "operator": "In", "values": ["x", "y"]},
                                         {"key": "u", "operator": "DoesNotExist"}]}))
                .unwrap()
            ),
            "a=b,t in (x,y),!u"
        );
    }
}
