//! Events the Kubernetes runtime writes on Tasks (core `v1/Event` in the agent
//! namespace, which the agent may create: the API server fills in and checks the
//! reporting fields; written by [`warn_task`], shared with the raw runtime).

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

pub use crate::task_events::warn_task;

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
