//! The benchmark object: a valid `rlinf.io/v1alpha1` Job padded to a fixed JSON size.

use serde_json::{Value, json};

/// API group/version of the benchmarked resource.
pub const API_VERSION: &str = "rlinf.io/v1alpha1";
/// Collection path of the benchmarked resource (Jobs are cluster-scoped).
pub const JOBS_PATH: &str = "/apis/rlinf.io/v1alpha1/jobs";
/// Store resource name of Jobs (what the API server uses as `ObjectKey::resource`).
pub const JOBS_RESOURCE: &str = "jobs.rlinf.io";
/// Size of one request body in bytes (the stored object is a little larger: the server adds
/// uid, creationTimestamp, resourceVersion and generation).
pub const OBJECT_BYTES: usize = 1024;

/// Characters repeated to pad the object (incompressible-looking, JSON-safe).
const PAD_PATTERN: &str = "0123456789abcdef";

/// A Job named `name` whose compact JSON is exactly [`OBJECT_BYTES`] long (or the unpadded
/// size if that is larger, which only happens for names over ~400 characters). `phase` goes
/// into a label so the objects of each benchmark phase can be told apart.
pub fn job(name: &str, phase: &str) -> Value {
    let unpadded = template(name, phase, "");
    let len = serde_json::to_vec(&unpadded).map_or(0, |v| v.len());
    let pad_len = OBJECT_BYTES.saturating_sub(len);
    if pad_len == 0 {
        return unpadded;
    }
    let pad: String = PAD_PATTERN.chars().cycle().take(pad_len).collect();
    template(name, phase, &pad)
}

/// [`job`] serialized.
pub fn job_bytes(name: &str, phase: &str) -> Vec<u8> {
    // Serializing a `Value` cannot fail (string keys only).
    serde_json::to_vec(&job(name, phase)).unwrap_or_default()
}

fn template(name: &str, phase: &str, pad: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "rlark-bench",
                "rlark.io/bench-phase": phase,
                "team": "rl-infra",
                "tier": "benchmark",
            },
        },
        "spec": {
            "tasks": [{
                "name": "rollout",
                "agentType": "Raw",
                "role": "Rollout",
                "nodeSelector": {"rlark.io/node-category": "edge"},
                "raw": {
                    "entrypoint": ["python3", "-m", "rollout", "--steps", "100"],
                    "replicas": 2,
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "512Mi"},
                    },
                    "environment": [
                        {"name": "ROLLOUT_STEPS", "value": "100"},
                        {"name": "BENCH_PADDING", "value": pad},
                    ],
                },
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_is_valid_and_one_kib() {
        for name in ["bench-c1-000000", "bench-fill-009999", "x"] {
            let object = job(name, "create-64");
            assert_eq!(job_bytes(name, "create-64").len(), OBJECT_BYTES, "{name}");
            if let Err(errors) = rlark_api::validation::validate("Job", &object) {
                panic!("{name}: {errors:?}");
            }
            assert_eq!(object["metadata"]["name"], name);
        }
    }
}
