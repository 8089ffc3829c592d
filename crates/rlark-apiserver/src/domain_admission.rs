//! Admission of the pod network that reads other stored objects (the pure rules are
//! [`rlark_api::validation::network`]):
//!
//! | write | refused when | answer |
//! |---|---|---|
//! | Domain create/update | `spec.cidr` overlaps another Domain's | 422, `spec.cidr`, naming the other Domain |
//! | Domain update | `spec.cidr` changes while live replicas hold addresses | 422, `spec.cidr` |
//! | Domain delete | a Job (not being deleted) joins it | 409, naming the Jobs |
//! | Job create/update | a Domain it names does not exist, is being deleted, its `jobSelector` does not match the Job's labels, or its CIDR holds fewer addresses than the Job's replicas in it | 422, `spec.domain` or `spec.tasks[i].domain` |
//! | Workflow create/update | the Job a `spec.jobTemplates[i]` becomes would be refused so (its labels are the ones the Workflow controller gives it: only `rlinf.io/workflow=<workflow>`) | 422, `spec.jobTemplates[i].spec.domain` or `spec.jobTemplates[i].spec.tasks[k].domain` |
//! | DomainPeer create/update | RLark's `spec.cert` / `spec.key` are present | accepted, the fields dropped before storing, a `Warning` header |
//!
//! These writes are serialized by one lock held from the check to the store write, so two
//! concurrent writes cannot both pass a check the pair breaks (two overlapping Domains, a
//! Job joining a Domain being deleted). A Job update that changes neither its labels nor
//! which Domains its templates join (and how many replicas) is not checked again: a Job
//! admitted once stays writable (e.g. stopped) whatever happened to its Domain since; so
//! does a Workflow update that changes neither its name nor its templates' Domains and
//! replicas.

use std::collections::BTreeMap;

use rlark_api::types::{Domain, Job, Workflow};
use rlark_api::validation::network;
use rlark_store::ListOptions;
use serde_json::Value;
use tokio::sync::MutexGuard;

use crate::Inner;
use crate::error::{ApiError, Cause};
use crate::object::meta_str;
use crate::registry::ResourceType;

/// RLark's key material in a DomainPeer's spec, which rlark never stores.
const DOMAIN_PEER_SECRETS: &[&str] = &["cert", "key"];

fn is_rlinf(rt: &ResourceType, plural: &str) -> bool {
    rt.group == "rlinf.io" && rt.plural == plural
}

/// Drop RLark's `spec.cert` / `spec.key` from a DomainPeer about to be written; the
/// `Warning` to send when there were any.
pub(crate) fn strip_domain_peer_secrets(rt: &ResourceType, object: &mut Value) -> Option<String> {
    if !is_rlinf(rt, "domainpeers") {
        return None;
    }
    let spec = object.get_mut("spec")?.as_object_mut()?;
    let dropped: Vec<&str> = DOMAIN_PEER_SECRETS
        .iter()
        .copied()
        .filter(|field| spec.shift_remove(*field).is_some())
        .collect();
    if dropped.is_empty() {
        return None;
    }
    let fields: Vec<String> = dropped.iter().map(|f| format!("spec.{f}")).collect();
    Some(format!(
        "{} ignored and not stored: rlark's DomainPeers carry no key material (agents authenticate with their own certificates)",
        fields.join(" and ")
    ))
}

fn decode<T: serde::de::DeserializeOwned>(value: &Value) -> Option<T> {
    serde_json::from_value(value.clone()).ok()
}

/// What about a Job its Domain checks look at: labels and, per template, the Domain and
/// replicas.
type JobFingerprint = (Option<BTreeMap<String, String>>, Vec<(String, i32)>);

fn job_fingerprint(job: &Job) -> JobFingerprint {
    let domains = network::job_domains(job)
        .into_iter()
        .map(|(i, d, _)| (d, job.spec.tasks[i].spec.replicas()))
        .collect();
    (job.metadata.labels.clone(), domains)
}

impl Inner {
    async fn list_all<T: serde::de::DeserializeOwned>(
        &self,
        rt: &ResourceType,
    ) -> Result<Vec<T>, ApiError> {
        let listed = self
            .store
            .list(&rt.store_resource(), &ListOptions::default())
            .await
            .map_err(|e| ApiError::from_store(e, rt, ""))?;
        Ok(listed.items.iter().filter_map(|v| decode(v)).collect())
    }

    fn network_rt(&self, plural: &str) -> Result<std::sync::Arc<ResourceType>, ApiError> {
        self.registry
            .get("rlinf.io", "v1alpha1", plural)
            .ok_or_else(|| {
                ApiError::new(
                    500,
                    "InternalError",
                    format!("resource {plural}.rlinf.io is not registered"),
                )
            })
    }

    /// Every stored Domain, by name.
    async fn domains_by_name(&self) -> Result<BTreeMap<String, Domain>, ApiError> {
        Ok(self
            .list_all::<Domain>(&*self.network_rt("domains")?)
            .await?
            .into_iter()
            .filter_map(|d| Some((d.metadata.name.clone()?, d)))
            .collect())
    }

    /// Check a Domain, Job or Workflow write (`object` as it would be stored, `old` the stored one
    /// for an update; status writes are not checked). `Ok` holds the lock the caller keeps
    /// until its store write is done (`None`: nothing to serialize).
    ///
    /// Only writes that could race with another network write take the lock: every Domain
    /// write (CIDR overlap), and a Job or Workflow write that adds or changes a reference to
    /// a Domain (a concurrent Domain delete must see it). A Job or Workflow that names no
    /// Domain, or whose references are unchanged, takes no lock: holding one mutex across
    /// every Job create's store write serialized all of them (one write per SQLite commit
    /// under 64 clients; issue 20).
    pub(crate) async fn admit_network(
        &self,
        rt: &ResourceType,
        object: &Value,
        old: Option<&Value>,
        status_only: bool,
    ) -> Result<Option<MutexGuard<'_, ()>>, ApiError> {
        let is_domain = is_rlinf(rt, "domains");
        let is_job = is_rlinf(rt, "jobs");
        let is_workflow = is_rlinf(rt, "workflows");
        if status_only || !(is_domain || is_job || is_workflow) {
            return Ok(None);
        }
        let name = meta_str(object, "name").unwrap_or("").to_string();
        let (guard, errors) = if is_domain {
            let guard = self.network.lock().await;
            let Some(domain) = decode::<Domain>(object) else {
                return Ok(Some(guard));
            };
            let others: Vec<Domain> = self.list_all(rt).await?;
            let mut errors = network::domain_overlap_errors(&domain, &others);
            if let Some(old) = old.and_then(decode::<Domain>) {
                errors.extend(network::domain_update_errors(&domain, &old));
            }
            (guard, errors)
        } else if is_workflow {
            let Some(workflow) = decode::<Workflow>(object) else {
                return Ok(None);
            };
            let fingerprint = network::workflow_domain_fingerprint(&workflow);
            let unchanged = old.and_then(decode::<Workflow>).is_some_and(|o| {
                o.metadata.name == workflow.metadata.name
                    && network::workflow_domain_fingerprint(&o) == fingerprint
            });
            if unchanged || fingerprint.iter().all(Vec::is_empty) {
                return Ok(None);
            }
            let guard = self.network.lock().await;
            let domains = self.domains_by_name().await?;
            (guard, network::workflow_domain_errors(&workflow, &domains))
        } else {
            let Some(job) = decode::<Job>(object) else {
                return Ok(None);
            };
            let unchanged = old
                .and_then(decode::<Job>)
                .is_some_and(|o| job_fingerprint(&o) == job_fingerprint(&job));
            if unchanged || network::job_domains(&job).is_empty() {
                return Ok(None);
            }
            let guard = self.network.lock().await;
            let domains = self.domains_by_name().await?;
            (guard, network::job_domain_errors(&job, &domains))
        };
        if errors.is_empty() {
            return Ok(Some(guard));
        }
        tracing::info!(kind = %rt.kind, %name, problems = errors.len(), "pod network admission refused a write");
        Err(ApiError::invalid(
            rt,
            &name,
            errors.iter().map(Cause::from).collect(),
        ))
    }

    /// Check the deletion of a Domain: 409 while Jobs use it. `Ok` holds the lock until
    /// the caller's store write is done.
    pub(crate) async fn admit_network_delete(
        &self,
        rt: &ResourceType,
        name: &str,
    ) -> Result<Option<MutexGuard<'_, ()>>, ApiError> {
        if !is_rlinf(rt, "domains") {
            return Ok(None);
        }
        let guard = self.network.lock().await;
        let jobs: Vec<Job> = self.list_all(&*self.network_rt("jobs")?).await?;
        let users = network::jobs_using(name, &jobs);
        if users.is_empty() {
            return Ok(Some(guard));
        }
        const SHOWN: usize = 10;
        let mut named: Vec<String> = users.iter().take(SHOWN).map(|j| format!("{j:?}")).collect();
        if users.len() > SHOWN {
            named.push(format!("and {} more", users.len() - SHOWN));
        }
        let mut error = ApiError::conflict(
            rt,
            name,
            &format!(
                "the Domain is in use by Job{} {}; delete them or remove the Domain from their spec first",
                if users.len() == 1 { "" } else { "s" },
                named.join(", ")
            ),
        );
        error.causes.push(Cause {
            reason: "DomainInUse".into(),
            message: format!("used by {} Job(s)", users.len()),
            field: String::new(),
        });
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn domain_peer_key_material_is_dropped_with_a_warning() {
        let rt = crate::registry::Registry::builtin()
            .get("rlinf.io", "v1alpha1", "domainpeers")
            .unwrap();
        let mut peer = json!({"spec": {"domain": "d", "prefixLen": 24,
                                       "cert": "-----BEGIN", "key": "-----BEGIN RSA"}});
        let warning = strip_domain_peer_secrets(&rt, &mut peer).expect("a warning");
        assert_eq!(
            warning,
            "spec.cert and spec.key ignored and not stored: rlark's DomainPeers carry no key material (agents authenticate with their own certificates)"
        );
        assert_eq!(peer, json!({"spec": {"domain": "d", "prefixLen": 24}}));
        assert_eq!(strip_domain_peer_secrets(&rt, &mut peer), None);
        let mut only_key = json!({"spec": {"key": "x"}});
        assert!(
            strip_domain_peer_secrets(&rt, &mut only_key)
                .unwrap()
                .starts_with("spec.key ignored")
        );
        let other = crate::registry::Registry::builtin()
            .get("rlinf.io", "v1alpha1", "domains")
            .unwrap();
        let mut domain = json!({"spec": {"cert": "x"}});
        assert_eq!(strip_domain_peer_secrets(&other, &mut domain), None);
        assert_eq!(domain, json!({"spec": {"cert": "x"}}));
    }
}
