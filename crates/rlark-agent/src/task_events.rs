//! The event part of a replica's environment: a task-scoped token minted by the control
//! plane (`POST /rlark/v1/namespaces/{ns}/tasks/{name}/token`, allowed for the agent owning
//! the namespace), the URL to post events to, and the CA bundle to trust.
//!
//! The token is minted once per Task run (cached by Task UID; every replica and every
//! restart of the run on this agent shares it) and is valid only while that run goes on.
//! Minting never blocks a task: when it fails the replica starts without these variables
//! and a warning is logged (the next start of a replica of the run tries again).

use std::collections::HashMap;
use std::time::Duration;

use kube::ResourceExt as _;
use rlark_api::types::Task;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::tasks::TaskContext;

/// Longest wait for the token.
const MINT_TIMEOUT: Duration = Duration::from_secs(10);
/// Tokens cached before the cache is emptied (tokens of finished runs are useless anyway).
const MAX_CACHED: usize = 1024;

/// Task tokens by Task UID.
#[derive(Default)]
pub(crate) struct TaskTokens {
    by_uid: Mutex<HashMap<String, String>>,
}

impl TaskTokens {
    /// `RLARK_EVENT_URL`, `RLARK_TOKEN` and `RLARK_CA_FILE` for a replica of `task`; empty
    /// when no token could be minted.
    pub(crate) async fn env(
        &self,
        client: &kube::Client,
        ctx: &TaskContext,
        task: &Task,
    ) -> Vec<(String, String)> {
        let namespace = task.namespace().unwrap_or_default();
        let name = task.name_any();
        let Some(uid) = task.uid() else {
            return Vec::new();
        };
        // Held while minting, so replicas starting together mint one token.
        let mut cache = self.by_uid.lock().await;
        let token = match cache.get(&uid) {
            Some(token) => token.clone(),
            None => match mint(client, &namespace, &name).await {
                Ok(token) => {
                    if cache.len() >= MAX_CACHED {
                        cache.clear();
                    }
                    cache.insert(uid, token.clone());
                    token
                }
                Err(error) => {
                    tracing::warn!(
                        task = %format!("{namespace}/{name}"),
                        %error,
                        "could not mint a task token; starting without RLARK_EVENT_URL and RLARK_TOKEN"
                    );
                    return Vec::new();
                }
            },
        };
        drop(cache);
        vec![
            (
                "RLARK_EVENT_URL".to_string(),
                event_url(&ctx.server_url, &namespace, &name),
            ),
            ("RLARK_TOKEN".to_string(), token),
            (
                "RLARK_CA_FILE".to_string(),
                ctx.ca_file.display().to_string(),
            ),
        ]
    }
}

/// Where replicas of `namespace/task` post events.
pub(crate) fn event_url(server_url: &str, namespace: &str, task: &str) -> String {
    format!(
        "{}/rlark/v1/namespaces/{namespace}/tasks/{task}/events",
        server_url.trim_end_matches('/')
    )
}

async fn mint(client: &kube::Client, namespace: &str, name: &str) -> Result<String, String> {
    let request = http::Request::post(format!(
        "/rlark/v1/namespaces/{namespace}/tasks/{name}/token"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(b"{}".to_vec())
    .map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(MINT_TIMEOUT, client.request::<Value>(request))
        .await
        .map_err(|_| format!("no answer within {MINT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    answer
        .get("token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| "the answer has no token".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_url_names_the_task() {
        assert_eq!(
            event_url("https://cp:6443/", "rlark-c", "j-a"),
            "https://cp:6443/rlark/v1/namespaces/rlark-c/tasks/j-a/events"
        );
    }
}
