//! The Node an agent registers for its machine.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::REASON_AGENT_READY;
use crate::labels;
use crate::types::{
    AgentType, Node, NodeCategory, NodeInfo, NodeNetwork, NodePhase, NodeSpec, NodeStatus,
    ResourceList,
};

/// A machine as its Node reports it. The agent writes [`NodeDescription::to_node`] (the
/// Node `<name>` in `rlark-<clusterID>`), then [`NodeDescription::status`] by a merge patch
/// on the `status` subresource; heartbeats renew the Lease [`super::lease_name`] and
/// `status.phase`/`heartbeatTime`. `Offline` is the Node controller's: an agent never
/// writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDescription {
    /// Node name (also its `kubernetes.io/hostname` label).
    pub name: String,
    /// `rlark.io/node-category`.
    pub category: NodeCategory,
    /// Labels beyond the ones the agent sets itself.
    pub labels: BTreeMap<String, String>,
    /// Total resources.
    pub capacity: ResourceList,
    /// Resources for tasks.
    pub allocatable: ResourceList,
    /// Facts about the machine.
    pub node_info: NodeInfo,
    /// `Hostname`, and the `InternalIP` this host reaches the server from.
    pub addresses: Vec<NodeAddress>,
    /// The pod network on this node (`status.network`); `None`: not reported.
    pub network: Option<NodeNetwork>,
    /// The runtime of the node's agent (`spec.agentType` and the [`labels::AGENT_TYPE`]
    /// label): only Tasks of that agent type are placed on the Node.
    pub agent_type: AgentType,
}

impl NodeDescription {
    /// Every label the Node carries for cluster `cluster_id`: the configured ones, then
    /// (winning over them) [`labels::CLUSTER_ID`], [`labels::HOSTNAME`] (the node name),
    /// [`labels::NODE_CATEGORY`] and [`labels::AGENT_TYPE`] (the agent type).
    pub fn all_labels(&self, cluster_id: &str) -> BTreeMap<String, String> {
        let mut all = self.labels.clone();
        all.insert(labels::CLUSTER_ID.into(), cluster_id.into());
        all.insert(labels::HOSTNAME.into(), self.name.clone());
        all.insert(labels::NODE_CATEGORY.into(), self.category.as_str().into());
        all.insert(labels::AGENT_TYPE.into(), self.agent_type.as_str().into());
        all
    }

    /// The Node object (metadata and spec; status see [`NodeDescription::status`]).
    pub fn to_node(&self, cluster_id: &str) -> Node {
        let mut node = Node::new(
            &self.name,
            NodeSpec {
                agent_type: self.agent_type,
                unschedulable: false,
            },
        );
        node.metadata.namespace = Some(crate::names::agent_namespace(cluster_id));
        node.metadata.labels = Some(self.all_labels(cluster_id));
        node
    }

    /// The status the agent reports: `Online`, reason [`REASON_AGENT_READY`], facts,
    /// addresses, resources, heartbeat `now`.
    pub fn status(&self, now: Timestamp) -> NodeStatus {
        NodeStatus {
            phase: Some(NodePhase::Online),
            reason: Some(REASON_AGENT_READY.into()),
            node_info: Some(self.node_info.clone()),
            addresses: self.addresses.clone(),
            capacity: self.capacity.clone(),
            allocatable: self.allocatable.clone(),
            heartbeat_time: Some(Time(now)),
            network: self.network.clone(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_carry_the_protocol_labels_and_status() {
        let description = NodeDescription {
            name: "host-1".into(),
            category: NodeCategory::Edge,
            labels: BTreeMap::from([
                ("zone".to_string(), "a".to_string()),
                (labels::CLUSTER_ID.to_string(), "spoofed".to_string()),
            ]),
            capacity: ResourceList::new(),
            allocatable: ResourceList::new(),
            node_info: NodeInfo::default(),
            addresses: Vec::new(),
            network: None,
            agent_type: AgentType::Raw,
        };
        let docker = NodeDescription {
            agent_type: AgentType::Docker,
            ..description.clone()
        }
        .to_node("c1");
        assert_eq!(docker.spec.agent_type, AgentType::Docker);
        assert_eq!(
            docker
                .metadata
                .labels
                .as_ref()
                .map(|l| l[labels::AGENT_TYPE].clone()),
            Some("Docker".to_string())
        );
        let node = description.to_node("c1");
        assert_eq!(node.metadata.namespace.as_deref(), Some("rlark-c1"));
        assert_eq!(node.spec.agent_type, AgentType::Raw);
        let l = node.metadata.labels.expect("labels");
        assert_eq!(l[labels::CLUSTER_ID], "c1", "the agent's label wins");
        assert_eq!(l[labels::HOSTNAME], "host-1");
        assert_eq!(l[labels::NODE_CATEGORY], "edge");
        assert_eq!(l[labels::AGENT_TYPE], "Raw");
        assert_eq!(l["zone"], "a");
        let status = description.status(Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase, Some(NodePhase::Online));
        assert_eq!(status.reason.as_deref(), Some(REASON_AGENT_READY));
        assert_eq!(status.heartbeat_time, Some(Time(Timestamp::UNIX_EPOCH)));
    }
}
