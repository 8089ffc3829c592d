//! Resource discovery: which resources the server serves, and resolving what a user typed
//! (`jobs`, `job`, `rljob`, `Job`, `jobs.rlinf.io`, `ns`) or what a manifest names
//! (`apiVersion` + `kind`) to one of them.
//!
//! kube's own `Discovery` drops short names, so this reads the `APIResourceList`s directly.

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::core::{ApiResource, DynamicObject, Resource as _};

/// rlark's own API group.
const RLARK_GROUP: &str = "rlinf.io";

/// One served resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResourceInfo {
    pub ar: ApiResource,
    pub namespaced: bool,
    /// Lower-case singular name (falls back to the lower-cased kind).
    pub singular: String,
    pub short_names: Vec<String>,
    pub verbs: Vec<String>,
}

impl ResourceInfo {
    /// `plural.group` (just `plural` for the core group), as kubectl names resource types.
    pub fn qualified_plural(&self) -> String {
        if self.ar.group.is_empty() {
            self.ar.plural.clone()
        } else {
            format!("{}.{}", self.ar.plural, self.ar.group)
        }
    }

    /// `kind.group` in lower case (`job.rlinf.io`, `namespace`), as kubectl prints objects.
    pub fn qualified_kind(&self) -> String {
        let kind = self.ar.kind.to_lowercase();
        if self.ar.group.is_empty() {
            kind
        } else {
            format!("{kind}.{}", self.ar.group)
        }
    }

    /// URL path of the collection, in `namespace` when the resource is namespaced and a
    /// namespace is given (`None` = all namespaces).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        let namespace = if self.namespaced { namespace } else { None };
        DynamicObject::url_path(&self.ar, namespace)
    }
}

/// Every resource the server serves, preferred versions first.
#[derive(Clone, Debug, Default)]
pub(crate) struct Catalog {
    pub resources: Vec<ResourceInfo>,
}

impl Catalog {
    /// Ask the server: `/api/v1`, then every version of every group under `/apis`
    /// (preferred version first).
    pub async fn discover(client: &kube::Client) -> anyhow::Result<Catalog> {
        let mut lists = Vec::new();
        let core = client
            .list_core_api_resources("v1")
            .await
            .context("discover core API resources (/api/v1)")?;
        lists.push(core);
        let groups = client
            .list_api_groups()
            .await
            .context("discover API groups (/apis)")?;
        for group in groups.groups {
            let preferred = group
                .preferred_version
                .as_ref()
                .map(|v| v.group_version.clone());
            let mut versions: Vec<String> = preferred.iter().cloned().collect();
            for v in &group.versions {
                if !versions.contains(&v.group_version) {
                    versions.push(v.group_version.clone());
                }
            }
            for gv in versions {
                let list = client
                    .list_api_group_resources(&gv)
                    .await
                    .with_context(|| format!("discover resources of {gv}"))?;
                lists.push(list);
            }
        }
        Ok(Catalog::from_lists(lists))
    }

    /// Build from `APIResourceList`s in priority order. Subresources are skipped.
    pub fn from_lists(lists: Vec<APIResourceList>) -> Catalog {
        let mut resources = Vec::new();
        for list in lists {
            let (group, version) = match list.group_version.split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (String::new(), list.group_version.clone()),
            };
            for r in list.resources {
                if r.name.contains('/') {
                    continue;
                }
                let group = r.group.clone().unwrap_or_else(|| group.clone());
                let version = r.version.clone().unwrap_or_else(|| version.clone());
                let api_version = if group.is_empty() {
                    version.clone()
                } else {
                    format!("{group}/{version}")
                };
                let singular = if r.singular_name.is_empty() {
                    r.kind.to_lowercase()
                } else {
                    r.singular_name.to_lowercase()
                };
                resources.push(ResourceInfo {
                    ar: ApiResource {
                        group,
                        version,
                        api_version,
                        kind: r.kind,
                        plural: r.name,
                    },
                    namespaced: r.namespaced,
                    singular,
                    short_names: r.short_names.unwrap_or_default(),
                    verbs: r.verbs,
                });
            }
        }
        Catalog { resources }
    }

    /// Resolve a resource type as typed on the command line, case-insensitively: plural,
    /// singular or kind, optionally qualified as `NAME.GROUP` or `NAME.VERSION.GROUP`; then
    /// short names. An unqualified name that rlark's own group (`rlinf.io`) serves is
    /// rlark's: `pods` is `pods.rlinf.io` here, although the server also serves core `v1`
    /// Pods (a read-only view of the same replicas for kubectl, which resolves `pods` to
    /// the core kind). Otherwise the first match in catalog order wins (core, then groups
    /// as the server lists them, preferred versions first).
    pub fn resolve(&self, typed: &str) -> anyhow::Result<&ResourceInfo> {
        if !typed.contains('.')
            && let Ok(own) = self.resolve(&format!("{typed}.{RLARK_GROUP}"))
        {
            return Ok(own);
        }
        let typed = typed.to_lowercase();
        let (name, qualifier) = match typed.split_once('.') {
            Some((n, q)) => (n, Some(q)),
            None => (typed.as_str(), None),
        };
        let qualifies = |r: &ResourceInfo| match qualifier {
            None => true,
            Some(q) => q == r.ar.group || q == format!("{}.{}", r.ar.version, r.ar.group).as_str(),
        };
        let by_name = self.resources.iter().find(|r| {
            qualifies(r)
                && (r.ar.plural == name || r.singular == name || r.ar.kind.to_lowercase() == name)
        });
        let found = by_name.or_else(|| {
            self.resources
                .iter()
                .find(|r| qualifies(r) && r.short_names.iter().any(|s| s.to_lowercase() == name))
        });
        found.ok_or_else(|| anyhow::anyhow!("the server doesn't have a resource type {typed:?}"))
    }

    /// The resource a manifest's `apiVersion` + `kind` denote.
    pub fn resolve_kind(&self, api_version: &str, kind: &str) -> anyhow::Result<&ResourceInfo> {
        self.resources
            .iter()
            .find(|r| r.ar.api_version == api_version && r.ar.kind == kind)
            .ok_or_else(|| {
                anyhow::anyhow!("no matches for kind {kind:?} in version {api_version:?}")
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What rlark's server announces (trimmed).
    pub(crate) fn catalog() -> Catalog {
        let core: APIResourceList = serde_json::from_value(serde_json::json!({
            "groupVersion": "v1",
            "resources": [
                {"name": "namespaces", "singularName": "", "namespaced": false, "kind": "Namespace",
                 "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": ["ns"]},
                {"name": "namespaces/status", "singularName": "", "namespaced": false, "kind": "Namespace", "verbs": ["get"]}
            ]
        }))
        .expect("core");
        let rlinf: APIResourceList = serde_json::from_value(serde_json::json!({
            "groupVersion": "rlinf.io/v1alpha1",
            "resources": [
                {"name": "jobs", "singularName": "job", "namespaced": false, "kind": "Job",
                 "verbs": ["get", "list"], "shortNames": ["rljob"]},
                {"name": "jobs/status", "singularName": "", "namespaced": false, "kind": "Job", "verbs": ["get"]},
                {"name": "tasks", "singularName": "task", "namespaced": true, "kind": "Task",
                 "verbs": ["get", "list"], "shortNames": ["rltask"]}
            ]
        }))
        .expect("rlinf");
        let leases: APIResourceList = serde_json::from_value(serde_json::json!({
            "groupVersion": "coordination.k8s.io/v1",
            "resources": [
                {"name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease", "verbs": ["get"]}
            ]
        }))
        .expect("leases");
        Catalog::from_lists(vec![core, rlinf, leases])
    }

    #[test]
    fn resolves_plural_singular_kind_short_and_qualified_names() {
        let catalog = catalog();
        for (typed, plural) in [
            ("jobs", "jobs"),
            ("job", "jobs"),
            ("Job", "jobs"),
            ("rljob", "jobs"),
            ("jobs.rlinf.io", "jobs"),
            ("job.v1alpha1.rlinf.io", "jobs"),
            ("tasks", "tasks"),
            ("ns", "namespaces"),
            ("namespace", "namespaces"),
            ("NAMESPACES", "namespaces"),
            ("leases", "leases"),
            ("lease.coordination.k8s.io", "leases"),
        ] {
            let found = catalog
                .resolve(typed)
                .unwrap_or_else(|e| panic!("{typed}: {e}"));
            assert_eq!(found.ar.plural, plural, "{typed}");
        }
        let err = catalog.resolve("pods").expect_err("pods are not served");
        assert!(err.to_string().contains("\"pods\""), "{err}");
        assert!(catalog.resolve("jobs.batch").is_err());
    }

    /// The server serves core Pods (kubectl's `pods`) beside `pods.rlinf.io`: the rlark CLI
    /// reads `pods` as rlark's kind and `po` (a short name only the core kind has) as the core one.
    #[test]
    fn rlarks_own_kind_wins_an_unqualified_name() {
        let list = |group_version: &str, short: &str| -> APIResourceList {
            serde_json::from_value(serde_json::json!({
                "groupVersion": group_version,
                "resources": [{"name": "pods", "singularName": "pod", "namespaced": true,
                               "kind": "Pod", "verbs": ["get", "list"], "shortNames": [short]}]
            }))
            .expect("pods")
        };
        let catalog =
            Catalog::from_lists(vec![list("v1", "po"), list("rlinf.io/v1alpha1", "rlpod")]);
        for (typed, api_version) in [
            ("pods", "rlinf.io/v1alpha1"),
            ("pod", "rlinf.io/v1alpha1"),
            ("Pod", "rlinf.io/v1alpha1"),
            ("rlpod", "rlinf.io/v1alpha1"),
            ("pods.rlinf.io", "rlinf.io/v1alpha1"),
            ("po", "v1"),
        ] {
            let found = catalog
                .resolve(typed)
                .unwrap_or_else(|e| panic!("{typed}: {e}"));
            assert_eq!(found.ar.api_version, api_version, "{typed}");
        }
    }

    #[test]
    fn subresources_are_skipped_and_scope_and_names_are_kept() {
        let catalog = catalog();
        assert_eq!(catalog.resources.len(), 4);
        let job = catalog.resolve("jobs").expect("jobs");
        assert!(!job.namespaced);
        assert_eq!(job.ar.api_version, "rlinf.io/v1alpha1");
        assert_eq!(job.qualified_kind(), "job.rlinf.io");
        assert_eq!(job.qualified_plural(), "jobs.rlinf.io");
        assert_eq!(
            job.collection_path(Some("x")),
            "/apis/rlinf.io/v1alpha1/jobs"
        );
        let task = catalog.resolve("tasks").expect("tasks");
        assert_eq!(
            task.collection_path(Some("ns1")),
            "/apis/rlinf.io/v1alpha1/namespaces/ns1/tasks"
        );
        assert_eq!(task.collection_path(None), "/apis/rlinf.io/v1alpha1/tasks");
        let ns = catalog.resolve("ns").expect("ns");
        assert_eq!(ns.qualified_kind(), "namespace");
        assert_eq!(ns.singular, "namespace");
        assert_eq!(ns.collection_path(None), "/api/v1/namespaces");
    }

    #[test]
    fn manifests_resolve_by_api_version_and_kind() {
        let catalog = catalog();
        let found = catalog
            .resolve_kind("rlinf.io/v1alpha1", "Task")
            .expect("task");
        assert_eq!(found.ar.plural, "tasks");
        assert!(catalog.resolve_kind("v1", "Namespace").is_ok());
        let err = catalog
            .resolve_kind("batch/v1", "Job")
            .expect_err("batch jobs are not served");
        assert!(err.to_string().contains("batch/v1"), "{err}");
    }
}
