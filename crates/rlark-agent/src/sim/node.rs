//! A simulated machine: the Node the simulated agent registers for it and the status it
//! reports.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rlark_api::labels;
use rlark_api::types::{
    AgentType, Node, NodeCategory, NodeInfo, NodeSpec, NodeStatus, ResourceList,
};

/// Label every Node carries with its machine name (as kubelet's).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

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

    /// Every label the Node carries for cluster `cluster_id`.
    pub fn all_labels(&self, cluster_id: &str) -> BTreeMap<String, String> {
        let mut all = self.labels.clone();
        all.insert(labels::CLUSTER_ID.into(), cluster_id.into());
        all.insert(HOSTNAME_LABEL.into(), self.name.clone());
        all.insert(labels::NODE_CATEGORY.into(), self.category.as_str().into());
        all.insert(labels::AGENT_TYPE.into(), AgentType::Raw.as_str().into());
        all
    }

    /// The Node object (metadata and spec; status see [`SimNode::status`]).
    pub fn to_node(&self, cluster_id: &str) -> Node {
        let mut node = Node::new(
            &self.name,
            NodeSpec {
                agent_type: AgentType::Raw,
                unschedulable: false,
            },
        );
        node.metadata.namespace = Some(rlark_api::names::agent_namespace(cluster_id));
        node.metadata.labels = Some(self.all_labels(cluster_id));
        node
    }

    /// The status the agent reports: `Online`, resources, heartbeat `now`.
    pub fn status(&self, now: Timestamp) -> NodeStatus {
        NodeStatus {
            phase: Some(rlark_api::types::NodePhase::Online),
            reason: Some("AgentReady".into()),
            node_info: Some(NodeInfo {
                architecture: Some(std::env::consts::ARCH.into()),
                agent_version: Some(format!("sim-{}", env!("CARGO_PKG_VERSION"))),
                operating_system: Some(std::env::consts::OS.into()),
                kernel_version: None,
            }),
            capacity: self.capacity.clone(),
            allocatable: self.allocatable_resources().clone(),
            heartbeat_time: Some(Time(now)),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt as _;

    #[test]
    fn nodes_carry_protocol_labels_and_resources() {
        let node = SimNode::new("gpu-0")
            .category(NodeCategory::Edge)
            .label("zone", "lab")
            .resource("nvidia.com/gpu", "2")
            .resource("cpu", "8");
        let object = node.to_node("c1");
        assert_eq!(object.namespace().as_deref(), Some("rlark-c1"));
        let l = object.labels();
        assert_eq!(l[labels::CLUSTER_ID], "c1");
        assert_eq!(l[HOSTNAME_LABEL], "gpu-0");
        assert_eq!(l[labels::NODE_CATEGORY], "edge");
        assert_eq!(l["zone"], "lab");
        assert_eq!(object.spec.agent_type, AgentType::Raw);
        let status = node.status(Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase, Some(rlark_api::types::NodePhase::Online));
        assert_eq!(status.allocatable["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(status.capacity, status.allocatable);
        let less = node.allocatable(ResourceList::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("1".into()),
        )]));
        assert_eq!(less.status(Timestamp::UNIX_EPOCH).allocatable.len(), 1);
        assert_eq!(less.status(Timestamp::UNIX_EPOCH).capacity.len(), 2);
    }
}
