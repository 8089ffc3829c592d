//! Events the Kubernetes runtime writes on Tasks (core `v1/Event` in the agent
//! namespace, which the agent may create: the API server fills in and checks the
//! reporting fields).

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::types::Task;

/// Reason of the Warning written when rlark replaced fields the Task's template set.
pub const REASON_FIELDS_CORRECTED: &str = "FieldsCorrected";

/// Longest message (the API server's default `maxEventMessageBytes`).
const MAX_MESSAGE_BYTES: usize = 1024;

/// The message of a [`REASON_FIELDS_CORRECTED`] event listing `fields`.
pub fn corrected_message(fields: &[String]) -> String {
    let mut message = format!(
        "rlark forces these fields and replaced what the template set: {}",
        fields.join(", ")
    );
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrected_message_lists_fields_and_is_bounded() {
        let message = corrected_message(&["spec.backoffLimit".into(), "x".into()]);
        assert!(message.ends_with("spec.backoffLimit, x"), "{message}");
        let long = corrected_message(&vec!["é".repeat(50); 40]);
        assert!(long.len() <= MAX_MESSAGE_BYTES && long.ends_with("..."));
    }
}
