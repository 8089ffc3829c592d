//! Fuzz target bodies over the server's untrusted-input paths, as plain functions: the
//! cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) call them, and so does a stable,
//! deterministic mutation driver ([`drive`]) that `cargo test` runs for a bounded number of
//! iterations. Not an API: compiled for tests and with the `fuzzing` feature only.
//!
//! Every target asserts the contract of the path it drives — never a panic; a refusal is a
//! 4xx `Status` with a reason and a message; what is accepted is well-formed — and returns
//! whether the input was accepted (so a driver can check that mutations still reach deep).
// A fuzz target states its invariants as panics: that is how the fuzzer reports them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};

use crate::body::{self, Decoded};
use crate::error::ApiError;
use crate::fieldvalidation::FieldValidation;
use crate::lifecycle;
use crate::output;
use crate::registry::{Registry, ResourceType};

/// The media types the body decoder is driven with; the first input byte picks one.
const MEDIA_TYPES: [&str; 5] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "text/yaml",
    "application/cbor",
];

/// [`Registry::builtin`], built once (it generates the CRD schemas).
pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Registry::builtin)
}

/// A refusal is a client error with a reason and a message, and renders as a `Status`.
fn check_refusal(error: &ApiError) {
    assert!(
        (400..500).contains(&error.code),
        "input must be refused with a 4xx, got {} {}",
        error.code,
        error.message
    );
    assert!(!error.reason.is_empty() && !error.message.is_empty());
    let status = error.status();
    assert_eq!(status["code"], json!(error.code));
}

/// Fuzz target: a request body as the server decodes it. `data[0]` picks the media type,
/// the rest is the body. An accepted body is a JSON object whose duplicate keys are named,
/// and re-decoding its JSON gives the same value.
pub fn request_body(data: &[u8]) -> bool {
    let Some((&selector, bytes)) = data.split_first() else {
        return false;
    };
    let media_type = MEDIA_TYPES[usize::from(selector) % MEDIA_TYPES.len()];
    match body::decode_object(bytes, media_type) {
        Ok(Decoded { value, duplicates }) => {
            assert!(value.is_object());
            assert!(duplicates.iter().all(|path| !path.is_empty()));
            let again = body::decode_json(value.to_string().as_bytes())
                .expect("the decoder reads back what it produced");
            assert_eq!(again.value, value);
            assert!(again.duplicates.is_empty());
            true
        }
        Err(error) => {
            check_refusal(&error);
            false
        }
    }
}

/// Fuzz target: admission of a new object of every served kind. `data[0]` picks the kind
/// (every resource type of [`Registry::builtin`]), `data[1]` the `fieldValidation`
/// directive, the rest is a JSON body. The body goes through the create path without the
/// store: decode, type meta, schema walk with pruning, the directive, metadata checks and
/// the kind's validator ([`admit`]).
pub fn admission(data: &[u8]) -> bool {
    let [kind, directive, bytes @ ..] = data else {
        return false;
    };
    let types = registry().all();
    let rt = &types[usize::from(*kind) % types.len()];
    let directive = match directive % 3 {
        0 => FieldValidation::Warn,
        1 => FieldValidation::Strict,
        _ => FieldValidation::Ignore,
    };
    let decoded = match body::decode_object(bytes, "application/json") {
        Ok(decoded) => decoded,
        Err(error) => {
            check_refusal(&error);
            return false;
        }
    };
    match admit(rt, decoded, directive) {
        Ok(warnings) => {
            let capped = output::capped_warnings(&warnings);
            assert!(capped.len() <= output::MAX_WARNINGS + 1);
            true
        }
        Err(error) => {
            check_refusal(&error);
            false
        }
    }
}

/// What the create path decides about `decoded` as a new `rt` (in the namespace `fuzz` when
/// namespaced) before it reaches the store: `Ok` with the warnings to send, or the error.
pub(crate) fn admit(
    rt: &ResourceType,
    decoded: Decoded,
    directive: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let mut object = decoded.value;
    lifecycle::check_type_meta(rt, &mut object)?;
    lifecycle::check_namespace(rt, &mut object, rt.namespaced.then_some("fuzz"))?;
    let (warnings, causes) =
        lifecycle::field_check(rt, &mut object, &decoded.duplicates, directive)?;
    if rt.status_subresource
        && let Some(map) = object.as_object_mut()
    {
        map.shift_remove("status");
    }
    crate::admission::admit(rt, &object, causes)?;
    Ok(warnings)
}

/// The resource types admission is fuzzed over, in the order `data[0]` selects them.
pub fn kinds() -> Vec<String> {
    registry().all().iter().map(|rt| rt.kind.clone()).collect()
}

/// A valid object of each kind (in [`kinds`] order) that admission accepts: the seeds the
/// mutations start from, so they reach the validators and not only the JSON parser.
pub fn admission_seeds() -> Vec<Vec<u8>> {
    let raw = json!({"name": "actor", "role": "Actor", "agentType": "Raw",
        "raw": {"entrypoint": ["python3", "-c", "print(1)"], "replicas": 2,
                "activeDeadlineSeconds": 3600, "terminationGracePeriodSeconds": 30}});
    let k8s = json!({"name": "rollout", "role": "Rollout", "agentType": "Kubernetes",
        "kubernetes": {"workload": {"kind": "Deployment", "replicas": 3, "template": {
            "spec": {"activeDeadlineSeconds": 60, "containers": [{"name": "main",
                "image": "busybox", "ports": [{"containerPort": 8080, "hostPort": 80}]}]}}}}});
    let task_spec = |t: &Value| {
        let mut spec = t.clone();
        if let Some(map) = spec.as_object_mut() {
            map.remove("name");
        }
        spec
    };
    let meta = |name: &str| json!({"name": name, "labels": {"app": "x"}});
    let mut seeds = Vec::new();
    for (i, rt) in registry().all().iter().enumerate() {
        let object = match rt.kind.as_str() {
            "Namespace" => json!({"metadata": meta("ns")}),
            "Lease" => json!({"metadata": meta("l"), "spec": {"holderIdentity": "a",
                "leaseDurationSeconds": 15, "leaseTransitions": 1}}),
            "Event" => json!({"metadata": meta("e"), "involvedObject": {"kind": "Task",
                "name": "t"}, "reason": "Started", "message": "m", "count": 1, "type": "Normal"}),
            "Job" => json!({"metadata": meta("job"), "spec": {"tasks": [raw, k8s]}}),
            "Task" => json!({"metadata": meta("task"), "spec": task_spec(&raw)}),
            "Workflow" => json!({"metadata": meta("wf"), "spec": {"jobTemplates": [
                {"name": "a", "spec": {"tasks": [raw]}},
                {"name": "b", "dependencies": ["a"], "spec": {"tasks": [k8s]}}]}}),
            "Domain" => json!({"metadata": meta("d"), "spec": {"cidr": "10.88.0.0/16"}}),
            "DomainPeer" => json!({"metadata": meta("p"), "spec": {"domain": "d",
                "prefixLen": 16, "pods": [{"ip": "10.88.0.2"}]}}),
            "Node" => json!({"metadata": meta("n"), "spec": {"agentType": "Raw"},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi"}}}),
            "Pod" => json!({"metadata": meta("pod"), "spec": {"taskName": "t",
                "replicaIndex": 0}}),
            _ => json!({"metadata": meta("x")}),
        };
        let mut bytes = vec![u8::try_from(i).unwrap_or(0), 0];
        bytes.extend_from_slice(object.to_string().as_bytes());
        seeds.push(bytes);
    }
    seeds
}

/// Seeds for [`request_body`]: each admission seed in each media type's selector, plus
/// YAML and protobuf bodies.
pub fn request_body_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = admission_seeds()
        .into_iter()
        .map(|mut seed| {
            seed.remove(0);
            seed[0] = 0;
            seed
        })
        .collect();
    seeds.push(b"\x01kind: Job\nspec:\n  tasks: [{name: a, raw: {entrypoint: [x]}}]\n".to_vec());
    seeds.push(b"\x00{\"a\": 1, \"a\": {\"b\": [1, 2.5, -3, null, true]}}".to_vec());
    let mut protobuf = vec![2];
    protobuf.extend_from_slice(
        b"k8s\x00\x0a\x0f\x0a\x02v1\x12\x09Namespace\x12\x07\x0a\x05\x0a\x03abc",
    );
    seeds.push(protobuf);
    seeds
}

/// Deterministic mutation driver (xorshift64*; no dependency): `iterations` inputs, each a
/// seed with one to four byte-level mutations — bit flips, byte sets, truncation, random
/// extension, insertion of an "interesting" token (extreme numbers, quotes, brackets) — or
/// a splice of another seed. Returns how many inputs `target` accepted.
pub fn drive(target: fn(&[u8]) -> bool, seeds: &[Vec<u8>], iterations: usize, seed: u64) -> usize {
    const TOKENS: [&[u8]; 14] = [
        b"9223372036854775807",
        b"-9223372036854775808",
        b"18446744073709551615",
        b"1e308",
        b"-1",
        b"0",
        b"null",
        b"\"\"",
        b"{}",
        b"[]",
        b"\"x\":1,",
        b"\"",
        b"\\u0000",
        b"4294967296",
    ];
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut accepted = 0;
    for round in 0..iterations {
        let mut input = seeds[round % seeds.len()].clone();
        let below = |n: usize, r: u64| (r % n.max(1) as u64) as usize;
        for _ in 0..1 + below(4, next()) {
            // Mutations keep the first (selector) bytes mostly intact.
            let body_start = 2.min(input.len());
            let at = |r: u64, len: usize| body_start + below(len - body_start + 1, r);
            match below(7, next()) {
                0 if input.len() > body_start => {
                    let i = at(next(), input.len() - 1);
                    input[i] ^= 1 << below(8, next());
                }
                1 if input.len() > body_start => {
                    let i = at(next(), input.len() - 1);
                    input[i] = next() as u8;
                }
                2 => input.truncate(at(next(), input.len())),
                3 => {
                    for _ in 0..below(9, next()) {
                        input.push(next() as u8);
                    }
                }
                4 | 5 => {
                    // Replace a number (or insert) with an extreme token.
                    let token = TOKENS[below(TOKENS.len(), next())];
                    let i = at(next(), input.len());
                    let end = (i..input.len())
                        .find(|&j| !input[j].is_ascii_digit())
                        .unwrap_or(input.len());
                    input.splice(i..end, token.iter().copied());
                }
                _ => {
                    let other = &seeds[below(seeds.len(), next())];
                    let from = below(other.len() + 1, next());
                    let i = at(next(), input.len());
                    input.splice(i..i, other[from..].iter().copied());
                }
            }
        }
        if target(&input) {
            accepted += 1;
        }
    }
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed is accepted as it is: the mutations start from valid objects of every kind.
    #[test]
    fn seeds_are_accepted() {
        for seed in admission_seeds() {
            let rt = &registry().all()[usize::from(seed[0])];
            let decoded = body::decode_object(&seed[2..], "application/json").expect("json");
            if let Err(error) = admit(rt, decoded, FieldValidation::Strict) {
                panic!("{}: {}", rt.kind, error.status());
            }
            assert!(admission(&seed));
        }
        for seed in request_body_seeds() {
            assert!(request_body(&seed), "{}", String::from_utf8_lossy(&seed));
        }
    }

    /// The stable run of the `request_body` fuzz target (bounded; deterministic).
    #[test]
    fn request_body_target_survives_mutations() {
        let accepted = drive(request_body, &request_body_seeds(), 6_000, 0x5eed_b0d1);
        assert!(accepted > 300, "mutations should still decode: {accepted}");
    }

    /// The stable run of the `admission` fuzz target over every kind.
    #[test]
    fn admission_target_survives_mutations() {
        let accepted = drive(admission, &admission_seeds(), 8_000, 0xad_0155_1011);
        assert!(
            accepted > 300,
            "mutations should still be admitted: {accepted}"
        );
    }
}
