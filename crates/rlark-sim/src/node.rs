//! A simulated machine: the Node the simulated agent registers for it and the status it
//! reports.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rlark_api::agent::NodeDescription;
use rlark_api::types::{NodeCategory, NodeInfo, ResourceList};

/// One simulated machine.
#[derive(Clone, Debug, PartialEq)]
pub struct SimNode {
    /// Node name (also its `kubernetes.io/hostname`).
    pub name: String,
    /// `rlark.io/node-category`.
    pub category: NodeCategory,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Total resources.
    pub capacity: ResourceList,
    /// Resources for tasks; `None` = the capacity.
    pub allocatable: Option<ResourceList>,
}

impl SimNode {
    /// A `cloud` node with no resources and no extra labels.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            category: NodeCategory::Cloud,
            labels: BTreeMap::new(),
            capacity: ResourceList::new(),
            allocatable: None,
        }
    }

    /// Set `rlark.io/node-category`.
    pub fn category(mut self, category: NodeCategory) -> Self {
        self.category = category;
        self
    }

    /// Add a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Add a resource to the capacity (Kubernetes quantity syntax: `"8"`, `"500m"`, `"64Gi"`).
    pub fn resource(mut self, name: impl Into<String>, quantity: impl Into<String>) -> Self {
        self.capacity.insert(name.into(), Quantity(quantity.into()));
        self
    }

    /// Make allocatable differ from capacity.
    pub fn allocatable(mut self, allocatable: ResourceList) -> Self {
        self.allocatable = Some(allocatable);
        self
    }

    /// The resources available to tasks.
    pub fn allocatable_resources(&self) -> &ResourceList {
        self.allocatable.as_ref().unwrap_or(&self.capacity)
    }

    /// The machine as the agent protocol describes it: what the simulated agent registers
    /// (`to_node`) and reports (`status`), as a real agent does. No addresses; `nodeInfo`
    /// names this host's OS and architecture and agent version `sim-<version>`.
    pub fn description(&self) -> NodeDescription {
        NodeDescription {
            name: self.name.clone(),
            category: self.category,
            labels: self.labels.clone(),
            capacity: self.capacity.clone(),
            allocatable: self.allocatable_resources().clone(),
            node_info: NodeInfo {
                architecture: Some(std::env::consts::ARCH.into()),
                agent_version: Some(format!("sim-{}", env!("CARGO_PKG_VERSION"))),
                operating_system: Some(std::env::consts::OS.into()),
                kernel_version: None,
            },
            addresses: Vec::new(),
            network: None,
            agent_type: rlark_api::types::AgentType::Raw,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use kube::ResourceExt as _;
    use rlark_api::labels;
    use rlark_api::types::AgentType;

    #[test]
    fn nodes_carry_protocol_labels_and_resources() {
        let node = SimNode::new("gpu-0")
            .category(NodeCategory::Edge)
            .label("zone", "lab")
            .resource("nvidia.com/gpu", "2")
            .resource("cpu", "8");
        let object = node.description().to_node("c1");
        assert_eq!(object.namespace().as_deref(), Some("rlark-c1"));
        let l = object.labels();
        assert_eq!(l[labels::CLUSTER_ID], "c1");
        assert_eq!(l[labels::HOSTNAME], "gpu-0");
        assert_eq!(l[labels::NODE_CATEGORY], "edge");
        assert_eq!(l["zone"], "lab");
        assert_eq!(object.spec.agent_type, AgentType::Raw);
        let status = node.description().status(Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase, Some(rlark_api::types::NodePhase::Online));
        assert_eq!(status.allocatable["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(status.capacity, status.allocatable);
        let less = node.allocatable(ResourceList::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("1".into()),
        )]));
        assert_eq!(
            less.description()
                .status(Timestamp::UNIX_EPOCH)
                .allocatable
                .len(),
            1
        );
        assert_eq!(
            less.description()
                .status(Timestamp::UNIX_EPOCH)
                .capacity
                .len(),
            2
        );
    }
}
