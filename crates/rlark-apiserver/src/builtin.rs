//! The kinds every server serves: [`Registry::builtin`], and with a program's extra kinds,
//! [`Registry::with_extra_kinds`]. Its own module because it gathers kinds defined in
//! several (the registry's core kinds, the core Pod view of the replicas), which must not
//! depend on each other.

use std::sync::Arc;

use crate::registry::{Registry, ResourceType};

impl Registry {
    /// rlark's `rlinf.io/v1alpha1` kinds plus core Namespace, Event and Lease, and core
    /// Pods as a read-only view of the replicas ([`crate::replicas::core_pods`]).
    pub fn builtin() -> Self {
        Self::with_extra_kinds(&[])
    }

    /// [`Self::builtin`] with `extra` kinds served too
    /// ([`ApiServerOptions::extra_kinds`](crate::ApiServerOptions::extra_kinds)). An extra
    /// kind with the group, version and plural of a built-in one replaces it (a core `v1`
    /// Pod kind of its own replaces the replicas' view). Order: the core Namespace, Lease,
    /// Event and (unless replaced) Pod view, then the extra kinds as given, then rlark's
    /// `rlinf.io` kinds, as kube-apiserver lists its built-in groups before CRD groups; so
    /// kubectl resolves a plural both an extra kind and rlark's use (`pods`, `nodes`,
    /// `jobs`) to the extra kind, and the `rl` short names still name rlark's.
    pub fn with_extra_kinds(extra: &[Arc<ResourceType>]) -> Self {
        let replaced = |rt: &ResourceType| {
            extra
                .iter()
                .any(|e| e.is_served_as(&rt.group, &rt.version, &rt.plural))
        };
        let mut rlark = Self::default();
        rlark.add_rlark_kinds();
        let mut registry = Self::default();
        let core = [
            ResourceType::namespace(),
            ResourceType::lease(),
            ResourceType::event(),
            crate::replicas::core_pods(),
        ];
        for rt in core.into_iter().filter(|rt| !replaced(rt)) {
            registry.add(rt);
        }
        for rt in extra {
            registry.add_shared(Arc::clone(rt));
        }
        for rt in rlark.all().iter().filter(|rt| !replaced(rt)) {
            registry.add_shared(Arc::clone(rt));
        }
        registry
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn extra_kinds_come_before_rlarks_and_replace_a_builtin_of_the_same_name() {
        let widget = Arc::new(ResourceType::new(
            "example.com",
            "v1",
            "Widget",
            "widgets",
            true,
            json!({}),
        ));
        let pods = Arc::new(ResourceType::new("", "v1", "Pod", "pods", true, json!({})));
        let registry = Registry::with_extra_kinds(&[Arc::clone(&widget), Arc::clone(&pods)]);
        let names: Vec<String> = registry
            .all()
            .iter()
            .map(|rt| rt.qualified_name())
            .collect();
        assert_eq!(
            names[..5],
            [
                "namespaces",
                "leases.coordination.k8s.io",
                "events",
                "widgets.example.com",
                "pods"
            ]
        );
        let served = registry.get("", "v1", "pods").unwrap();
        assert!(Arc::ptr_eq(&served, &pods) && served.projection.is_none());
        assert_eq!(names.iter().filter(|n| *n == "pods").count(), 1);
        // Everything else is still served, rlark's kinds after the extra ones.
        let builtin = Registry::builtin();
        assert_eq!(registry.all().len(), builtin.all().len() + 1);
        assert!(names[5..].iter().all(|n| n.ends_with(".rlinf.io")));
        assert!(builtin.get("", "v1", "pods").unwrap().projection.is_some());
    }
}
