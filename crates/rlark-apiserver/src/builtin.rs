//! The kinds every server serves: [`Registry::builtin`]. Its own module because it gathers
//! kinds defined in several (the registry's core kinds, the core Pod view of the
//! replicas), which must not depend on each other.

use crate::registry::{Registry, ResourceType};

impl Registry {
    /// rlark's `rlinf.io/v1alpha1` kinds plus core Namespace, Event and Lease, and core
    /// Pods as a read-only view of the replicas ([`crate::replicas::core_pods`]).
    pub fn builtin() -> Self {
        let mut registry = Self::default();
        registry.add(ResourceType::namespace());
        registry.add(ResourceType::lease());
        registry.add(ResourceType::event());
        registry.add(crate::replicas::core_pods());
        registry.add_rlark_kinds();
        registry
    }
}
