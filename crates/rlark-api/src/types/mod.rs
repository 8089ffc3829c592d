//! Resource types of `rlinf.io/v1alpha1`, one module per kind.
//!
//! JSON names follow RLark's so its manifests apply unchanged. Phases, roles, runtimes and
//! workload kinds are enums, so the CRD schemas carry `enum:` and bad values are rejected.
//! Unknown fields are not rejected here: the API server prunes them using the schema.

mod common;
pub(crate) use common::quoted_list;
pub mod domain;
pub mod domain_peer;
pub mod job;
pub mod node;
pub mod pod;
pub mod reward;
pub mod task;
pub mod workflow;

pub use crate::labels;
pub use common::{
    AgentType, EnvVar, NodeEvent, PullProgress, ResourceList, ResourceRequirements, UnknownVariant,
};
pub use domain::{Domain, DomainIpAllocation, DomainSpec, DomainStatus};
pub use domain_peer::{
    DomainPathStats, DomainPeer, DomainPeerSpec, DomainPeerStatus, DomainPendingPod, DomainPodInfo,
};
pub use job::{
    Job, JobAccess, JobPhase, JobSpec, JobStatus, JobTaskStatus, JobTaskTemplate,
    MAX_JOB_ACCESS_ENTRIES,
};
pub use node::{
    Node, NodeCategory, NodeDevice, NodeInfo, NodeNetwork, NodePhase, NodeSpec, NodeStatus,
};
pub use pod::{Pod, PodPhase, PodSpec, PodStatus, PodTensorBoard};
pub use reward::{REWARD_REPORT_TYPE, RewardSummary};
pub use task::{
    DeviceUnhealthyPolicy, DockerContainerSpec, DockerTaskSpec, DockerVolumeRef,
    KubernetesTaskSpec, KubernetesWorkloadKind, KubernetesWorkloadSpec, NodeLostPolicy,
    RawTaskSpec, RestartPolicy, Task, TaskPhase, TaskPlacement, TaskRole, TaskSpec, TaskStatus,
};
pub use workflow::{
    Workflow, WorkflowJobStatus, WorkflowJobTemplate, WorkflowPhase, WorkflowSpec, WorkflowStatus,
};

/// The kinds of `rlinf.io/v1alpha1`, in a stable order.
pub const KINDS: &[&str] = &[
    "Domain",
    "DomainPeer",
    "Node",
    "Job",
    "Task",
    "Workflow",
    "Pod",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_spell_like_rlark() {
        assert_eq!(serde_json::to_value(TaskRole::Rollout).unwrap(), "Rollout");
        assert_eq!(serde_json::to_value(NodeCategory::Edge).unwrap(), "edge");
        assert_eq!(NodeCategory::Robot.as_str(), "robot");
        assert_eq!(AgentType::Kubernetes.to_string(), "Kubernetes");
        assert_eq!(AgentType::Docker.block_name(), "docker");
        assert_eq!("Raw".parse::<AgentType>(), Ok(AgentType::Raw));
        assert_eq!("cloud".parse::<NodeCategory>(), Ok(NodeCategory::Cloud));
        assert_eq!(RestartPolicy::default(), RestartPolicy::Never);
        assert_eq!(TaskPhase::ALL.len(), 5);
        assert_eq!(JobPhase::ALL.len(), 5);
        assert_eq!(WorkflowPhase::ALL.len(), 5);
        assert_eq!(PodPhase::ALL.len(), 4);
        assert_eq!(NodePhase::ALL.len(), 2);
        assert_eq!(KubernetesWorkloadKind::ALL.len(), 5);
        for phase in TaskPhase::ALL {
            let json = serde_json::to_value(phase).unwrap();
            assert_eq!(json, phase.as_str());
            assert_eq!(phase.as_str().parse::<TaskPhase>(), Ok(*phase));
        }
    }

    #[test]
    fn unknown_variant_reads_like_kubernetes() {
        let err = "Foo".parse::<TaskRole>().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"Unsupported value: "Foo": supported values: "Actor", "Rollout", "Env", "Head""#
        );
    }

    #[test]
    fn task_spec_helpers() {
        let mut spec: TaskSpec = serde_json::from_value(serde_json::json!({
            "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["x"], "replicas": 3}
        }))
        .unwrap();
        assert_eq!(spec.runtime_blocks(), ["raw"]);
        assert_eq!(spec.replicas(), 3);
        spec.raw = None;
        spec.docker = Some(DockerTaskSpec::default());
        assert_eq!(spec.runtime_blocks(), ["docker"]);
        assert_eq!(spec.replicas(), 1);
    }

    #[test]
    fn domain_peer_keeps_rlark_field_names() {
        let info = DomainPodInfo {
            local_ip: Some("172.17.0.2".into()),
            ..Default::default()
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["localIP"], "172.17.0.2");
    }

    #[test]
    fn kinds_are_listed() {
        assert_eq!(KINDS.len(), 7);
    }
}
