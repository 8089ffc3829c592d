//! The report part of a replica's environment: a task-scoped token minted by the control
//! plane (`POST /rlark/v1/namespaces/{ns}/tasks/{name}/token`, allowed for the agent owning
//! the namespace), the URL to post reports to, and the CA bundle to trust.
//!
//! The token is minted once per Task run (cached by Task UID; every replica and every
//! restart of the run on this agent shares it) and is valid only while that run goes on.
//! Minting never blocks a task: when it fails the replica starts without these variables
//! and a warning is logged (the next start of a replica of the run tries again).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt as _;
use rlark_api::types::Task;
use serde_json::Value;
use tokio::sync::OnceCell;

/// Longest wait for the token.
const MINT_TIMEOUT: Duration = Duration::from_secs(10);
/// Tokens cached before the cache is emptied (tokens of finished runs are useless anyway).
const MAX_CACHED: usize = 1024;

/// Task tokens by Task UID.
#[derive(Default)]
pub(crate) struct TaskTokens {
    /// One cell per run: replicas of one run starting together mint one token, while
    /// different runs mint in parallel (a single lock held across the mint serialized a
    /// burst of 50 new Tasks behind 50 round trips).
    by_uid: std::sync::Mutex<HashMap<String, Arc<OnceCell<String>>>>,
}

impl TaskTokens {
    /// `RLARK_REPORT_URL`, `RLARK_TOKEN` and `RLARK_CA_FILE` for a replica of `task`; empty
    /// when no token could be minted.
    pub(crate) async fn env(
        &self,
        client: &kube::Client,
        server_url: &str,
        ca_file: &Path,
        task: &Task,
    ) -> Vec<(String, String)> {
        let namespace = task.namespace().unwrap_or_default();
        let name = task.name_any();
        let Some(uid) = task.uid() else {
            return Vec::new();
        };
        let cell = {
            let mut cache = self
                .by_uid
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if cache.len() >= MAX_CACHED && !cache.contains_key(&uid) {
                cache.clear();
            }
            Arc::clone(cache.entry(uid).or_default())
        };
        let token = match cell
            .get_or_try_init(|| mint(client, &namespace, &name))
            .await
        {
            Ok(token) => token.clone(),
            Err(error) => {
                tracing::warn!(
                    task = %format!("{namespace}/{name}"),
                    %error,
                    "could not mint a task token; starting without RLARK_REPORT_URL and RLARK_TOKEN"
                );
                return Vec::new();
            }
        };
        vec![
            (
                "RLARK_REPORT_URL".to_string(),
                report_url(server_url, &namespace, &name),
            ),
            ("RLARK_TOKEN".to_string(), token),
            ("RLARK_CA_FILE".to_string(), ca_file.display().to_string()),
        ]
    }
}

/// Where replicas of `namespace/task` post reports.
pub(crate) fn report_url(server_url: &str, namespace: &str, task: &str) -> String {
    format!(
        "{}/rlark/v1/namespaces/{namespace}/tasks/{task}/reports",
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

    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A kube client whose every request takes 100 ms and answers a token; counts requests
    /// and the most in flight at once.
    fn slow_token_server(requests: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> kube::Client {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let service = tower::service_fn(move |_request: http::Request<kube::client::Body>| {
            let (requests, peak, in_flight) = (requests.clone(), peak.clone(), in_flight.clone());
            async move {
                requests.fetch_add(1, Ordering::SeqCst);
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(br#"{"token":"rlk-x.y"}"#.to_vec()))
                        .expect("response"),
                )
            }
        });
        kube::Client::new(service, "rlark-c")
    }

    fn task(name: &str, uid: &str) -> Task {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
            "metadata": {"name": name, "namespace": "rlark-c", "uid": uid},
            "spec": {"agentType": "Raw", "role": "Actor"},
        }))
        .expect("task")
    }

    const SERVER: &str = "https://cp:6443";
    const CA: &str = "/tmp/ca.crt";

    #[tokio::test]
    async fn runs_mint_in_parallel_and_replicas_of_a_run_share_one_token() {
        let (requests, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let client = slow_token_server(requests.clone(), peak.clone());
        let tokens = TaskTokens::default();
        let tasks: Vec<Task> = (0..5)
            .map(|i| task(&format!("t{i}"), &format!("u{i}")))
            .collect();
        let envs = futures::future::join_all(
            tasks
                .iter()
                .map(|t| tokens.env(&client, SERVER, Path::new(CA), t)),
        )
        .await;
        assert!(envs.iter().all(|env| {
            env.iter()
                .any(|(k, v)| k == "RLARK_TOKEN" && v == "rlk-x.y")
        }));
        assert_eq!(requests.load(Ordering::SeqCst), 5);
        assert_eq!(
            peak.load(Ordering::SeqCst),
            5,
            "five runs mint at once, not one by one"
        );

        // Four replicas of one new run starting together: one mint.
        let run = task("r", "u-r");
        futures::future::join_all((0..4).map(|_| tokens.env(&client, SERVER, Path::new(CA), &run)))
            .await;
        assert_eq!(requests.load(Ordering::SeqCst), 6);
        // Cached afterwards.
        tokens.env(&client, SERVER, Path::new(CA), &run).await;
        assert_eq!(requests.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn the_report_url_names_the_task() {
        assert_eq!(
            report_url("https://cp:6443/", "rlark-c", "j-a"),
            "https://cp:6443/rlark/v1/namespaces/rlark-c/tasks/j-a/reports"
        );
    }
}
