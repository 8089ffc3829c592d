//! The Task part of `rlark describe task NAME`: where its TensorBoard is (the task proxy's
//! URL of each replica's, from the Pods' `status.tensorBoard` the agent reports), or why
//! none runs. Printed only for a Task that sets `tensorBoardDir`.

use serde_json::Value;

use super::text;

/// The `TensorBoard:` section of Task `task`, whose replica Pods are `pods`, on the server
/// at `server` (`https://host:port`). Empty when the Task sets no `tensorBoardDir`.
pub(crate) fn sections(server: &str, task: &Value, pods: &[Value]) -> String {
    let spec = &task["spec"];
    let Some(dir) = spec["tensorBoardDir"].as_str().filter(|d| !d.is_empty()) else {
        return String::new();
    };
    let namespace = task["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = task["metadata"]["name"].as_str().unwrap_or_default();
    let mut pods: Vec<&Value> = pods.iter().collect();
    pods.sort_by_key(|p| p["spec"]["replicaIndex"].as_i64().unwrap_or(i64::MAX));
    if pods.is_empty() {
        return format!("TensorBoard:    not running: no replica of the task runs ({dir})\n");
    }
    let mut out = String::from("TensorBoard:\n");
    for pod in pods {
        let index = pod["spec"]["replicaIndex"].as_i64().unwrap_or(0);
        let board = &pod["status"]["tensorBoard"];
        let line = match (board["port"].as_i64(), board["message"].as_str()) {
            (Some(port), _) => {
                let replica = match index {
                    0 => String::new(),
                    i => format!("/replicas/{i}"),
                };
                let url = format!(
                    "{server}/rlark/v1/namespaces/{namespace}/tasks/{name}{replica}/proxy/{port}/"
                );
                match board["logDir"].as_str() {
                    Some(log_dir) => format!("{url}  (logdir {log_dir})"),
                    None => url,
                }
            }
            (None, Some(message)) => message.to_string(),
            (None, None) => {
                let phase = text(&pod["status"]["phase"]);
                let phase = if phase.is_empty() { "Pending" } else { &phase };
                format!("not running (the replica is {phase})")
            }
        };
        out.push_str(&format!("  replica {index}: {line}\n"));
    }
    // The URLs answer tokens and certificates (kubectl, curl); a browser is refused there (a
    // task's pages never run on the console's origin) and opens them from the console.
    out.push_str(
        "  (with a kubeconfig or a token; in a browser, open it from the task's page in the web \
         console)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(agent_type: &str, dir: Option<&str>) -> Value {
        json!({"metadata": {"name": "ppo-actor", "namespace": "rlark-a"},
               "spec": {"agentType": agent_type, "tensorBoardDir": dir}})
    }

    fn pod(index: i64, status: Value) -> Value {
        json!({"spec": {"replicaIndex": index}, "status": status})
    }

    #[test]
    fn each_replica_has_its_link_or_why_not() {
        let pods = [
            pod(
                2,
                json!({"phase": "Running", "tensorBoard": {"message": "TensorBoard was not started: no executable \"tensorboard\" in PATH (/bin)"}}),
            ),
            pod(
                0,
                json!({"phase": "Running", "tensorBoard": {"port": 41234, "logDir": "/d/work/runs"}}),
            ),
            pod(1, json!({"phase": "Succeeded"})),
            pod(
                3,
                json!({"phase": "Running", "tensorBoard": {"port": 41235}}),
            ),
        ];
        assert_eq!(
            sections("https://cp:6443", &task("Raw", Some("runs")), &pods),
            "TensorBoard:\n  replica 0: https://cp:6443/rlark/v1/namespaces/rlark-a/tasks/ppo-actor/proxy/41234/  (logdir /d/work/runs)\n  replica 1: not running (the replica is Succeeded)\n  replica 2: TensorBoard was not started: no executable \"tensorboard\" in PATH (/bin)\n  replica 3: https://cp:6443/rlark/v1/namespaces/rlark-a/tasks/ppo-actor/replicas/3/proxy/41235/\n  (with a kubeconfig or a token; in a browser, open it from the task's page in the web console)\n"
        );
    }

    #[test]
    fn nothing_without_tensorboard_dir_and_why_not_elsewhere() {
        assert_eq!(sections("https://cp", &task("Raw", None), &[]), "");
        assert_eq!(sections("https://cp", &task("Raw", Some("")), &[]), "");
        assert!(
            sections("https://cp", &task("Raw", Some("runs")), &[])
                .contains("not running: no replica of the task runs")
        );
        // Every runtime starts one now: a Docker task's section is its replicas'.
        let docker = sections("https://cp", &task("Docker", Some("/logs")), &[]);
        assert!(
            docker.contains("not running: no replica of the task runs"),
            "{docker}"
        );
    }
}
