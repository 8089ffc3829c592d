//! Warning Events the agent writes about Tasks (core `v1/Event` in the agent namespace,
//! which the agent may create: the API server fills in and checks the reporting fields):
//! the Kubernetes runtime's (`member::events`) and the raw runtime's
//! `TensorBoardNotStarted` (`tasks::tensorboard`).

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::types::Task;

/// Write a Warning event `reason`/`message` about `task`. Failures are logged: an event
/// is worth one attempt, never a stuck reconciler.
pub async fn warn_task(client: &kube::Client, task: &Task, reason: &str, message: String) {
    let namespace = task.namespace().unwrap_or_default();
    let now = Time(Timestamp::now());
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", task.name_any())),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(Task::api_version(&()).to_string()),
            kind: Some(Task::kind(&()).to_string()),
            name: Some(task.name_any()),
            namespace: Some(namespace.clone()),
            uid: task.uid(),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(message),
        type_: Some("Warning".to_string()),
        count: Some(1),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    if let Err(error) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(%error, task = %task.name_any(), reason, "could not write the task event");
    }
}
