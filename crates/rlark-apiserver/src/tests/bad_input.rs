//! Bad requests: each is refused with the right code and reason, and writes nothing.

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;

struct Case {
    name: &'static str,
    method: Method,
    uri: String,
    content_type: &'static str,
    body: Bytes,
    code: u16,
    reason: &'static str,
    /// Text the Status message must contain.
    message: &'static str,
    /// (field, reason) pairs `details.causes` must contain.
    causes: Vec<(&'static str, &'static str)>,
}

fn case(
    name: &'static str,
    uri: &str,
    body: Value,
    code: u16,
    reason: &'static str,
    message: &'static str,
) -> Case {
    Case {
        name,
        method: Method::POST,
        uri: uri.to_string(),
        content_type: "application/json",
        body: Bytes::from(body.to_string()),
        code,
        reason,
        message,
        causes: Vec::new(),
    }
}

fn with_causes(mut case: Case, causes: &[(&'static str, &'static str)]) -> Case {
    case.causes = causes.to_vec();
    case
}

#[tokio::test]
async fn bad_input_is_refused_and_writes_nothing() {
    let h = Harness::with_options(crate::ApiServerOptions {
        max_request_bytes: 64 * 1024,
        ..fast_options()
    })
    .await;
    let existing = h.create(JOBS, &job("existing")).await;

    let mut unknown = job("unknown");
    unknown["spec"]["foo"] = json!(1);
    unknown["spec"]["bar"] = json!(2);
    let mut bad_role = job("bad-role");
    bad_role["spec"]["tasks"][0]["role"] = json!("Boss");
    let mut bad_name = job("Bad_Name");
    bad_name["metadata"]["name"] = json!("Bad_Name");
    let domain = json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Domain", "metadata": {"name": "net"}, "spec": {"cidr": "10.0.0.0/33"}});
    let mut cycle = workflow("cycle");
    cycle["spec"]["jobTemplates"][1]["dependencies"] = json!(["eval"]);
    let mut stale = existing.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    stale["spec"]["stopped"] = json!(true);
    let mut wrong_kind = job("wrong-kind");
    wrong_kind["kind"] = json!("Workflow");
    let mut wrong_version = job("wrong-version");
    wrong_version["apiVersion"] = json!("rlinf.io/v1");
    let mut wrong_type = job("wrong-type");
    wrong_type["spec"]["stopped"] = json!("yes");
    let big = Bytes::from(format!(
        "{{\"metadata\": {{\"name\": \"big\"}}, \"pad\": \"{}\"}}",
        "x".repeat(70 * 1024)
    ));

    let mut cases = vec![
        Case {
            body: Bytes::from_static(b"{\"kind\": \"Job\",\n \"spec\": }"),
            ..case(
                "malformed JSON",
                JOBS,
                json!(null),
                400,
                "BadRequest",
                "line 2 column",
            )
        },
        Case {
            content_type: "application/yaml",
            body: Bytes::from_static(b"kind: Job\nmetadata:\n  name: [x\n"),
            ..case(
                "malformed YAML",
                JOBS,
                json!(null),
                400,
                "BadRequest",
                "error converting YAML to JSON",
            )
        },
        case(
            "unknown fields, strict",
            &format!("{JOBS}?fieldValidation=Strict"),
            unknown.clone(),
            400,
            "BadRequest",
            "strict decoding error: unknown field \"spec.foo\", unknown field \"spec.bar\"",
        ),
        Case {
            body: Bytes::from(
                r#"{"apiVersion": "rlinf.io/v1alpha1", "kind": "Job", "metadata": {"name": "dup", "name": "dup2"}, "spec": {"tasks": []}}"#,
            ),
            ..case(
                "duplicate field, strict",
                &format!("{JOBS}?fieldValidation=Strict"),
                json!(null),
                400,
                "BadRequest",
                "duplicate field \"metadata.name\"",
            )
        },
        case(
            "unknown fieldValidation",
            &format!("{JOBS}?fieldValidation=Lax"),
            job("x"),
            400,
            "BadRequest",
            "fieldValidation",
        ),
        with_causes(
            case(
                "wrong enum value",
                JOBS,
                bad_role,
                422,
                "Invalid",
                "Unsupported value: \"Boss\"",
            ),
            &[("spec.tasks[0].role", "FieldValueNotSupported")],
        ),
        with_causes(
            case(
                "wrong type",
                JOBS,
                wrong_type,
                422,
                "Invalid",
                "must be of type boolean",
            ),
            &[("spec.stopped", "FieldValueTypeInvalid")],
        ),
        with_causes(
            case(
                "invalid name",
                JOBS,
                bad_name,
                422,
                "Invalid",
                "Job.rlinf.io \"Bad_Name\" is invalid",
            ),
            &[("metadata.name", "FieldValueInvalid")],
        ),
        with_causes(
            case("bad CIDR", DOMAINS, domain, 422, "Invalid", "spec.cidr"),
            &[("spec.cidr", "FieldValueInvalid")],
        ),
        with_causes(
            case(
                "dependency cycle",
                WORKFLOWS,
                cycle,
                422,
                "Invalid",
                "dependency cycle: ",
            ),
            &[("spec.jobTemplates", "FieldValueInvalid")],
        ),
        Case {
            method: Method::PUT,
            ..case(
                "stale resourceVersion",
                &format!("{JOBS}/existing"),
                stale,
                409,
                "Conflict",
                "the object has been modified",
            )
        },
        Case {
            body: big,
            ..case(
                "oversized body",
                JOBS,
                json!(null),
                413,
                "RequestEntityTooLarge",
                "limit is 65536 bytes",
            )
        },
        case(
            "unknown resource",
            "/apis/rlinf.io/v1alpha1/gadgets",
            job("x"),
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
        case(
            "unknown group",
            "/apis/example.com/v1/jobs",
            job("x"),
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
        case(
            "wrong scope",
            "/apis/rlinf.io/v1alpha1/namespaces/default/jobs",
            job("x"),
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
        case(
            "wrong kind in body",
            JOBS,
            wrong_kind,
            400,
            "BadRequest",
            "the kind in the data (Workflow) does not match the expected kind (Job)",
        ),
        case(
            "wrong apiVersion in body",
            JOBS,
            wrong_version,
            400,
            "BadRequest",
            "(rlinf.io/v1) does not match the expected API version (rlinf.io/v1alpha1)",
        ),
        case(
            "resourceVersion on create",
            JOBS,
            existing.clone(),
            400,
            "BadRequest",
            "resourceVersion should not be set",
        ),
        Case {
            content_type: "application/cbor",
            ..case(
                "unknown media type",
                JOBS,
                job("x"),
                415,
                "UnsupportedMediaType",
                "application/json",
            )
        },
        Case {
            content_type: "application/vnd.kubernetes.protobuf",
            ..case(
                "protobuf without envelope",
                JOBS,
                job("x"),
                400,
                "BadRequest",
                "envelope",
            )
        },
        Case {
            method: Method::PUT,
            ..case(
                "PUT on a collection",
                JOBS,
                job("x"),
                405,
                "MethodNotAllowed",
                "does not allow this method",
            )
        },
        case(
            "body not an object",
            JOBS,
            json!([1, 2]),
            400,
            "BadRequest",
            "must be a JSON object",
        ),
    ];
    // Missing namespace for a namespaced create.
    cases.push(case(
        "missing namespace",
        &leases("nowhere"),
        lease("nowhere", "l"),
        404,
        "NotFound",
        "namespaces \"nowhere\" not found",
    ));

    for case in cases {
        let before = h.revision();
        let response = h
            .send(
                case.method.clone(),
                &case.uri,
                case.content_type,
                None,
                case.body.clone(),
            )
            .await;
        let answer = Harness::answer(response).await;
        assert_eq!(
            answer.status.as_u16(),
            case.code,
            "{}: {}",
            case.name,
            answer.body
        );
        assert_eq!(answer.body["kind"], "Status", "{}", case.name);
        assert_eq!(answer.body["code"], case.code, "{}", case.name);
        assert_eq!(
            answer.reason(),
            case.reason,
            "{}: {}",
            case.name,
            answer.body
        );
        assert!(
            answer.message().contains(case.message),
            "{}: {:?} lacks {:?}",
            case.name,
            answer.message(),
            case.message
        );
        let causes = answer.causes();
        for (field, reason) in &case.causes {
            assert!(
                causes.contains(&(field.to_string(), reason.to_string())),
                "{}: {causes:?}",
                case.name
            );
        }
        assert_eq!(
            h.revision(),
            before,
            "{}: nothing may be written",
            case.name
        );
    }
    assert_eq!(
        h.get(&format!("{JOBS}/existing")).await.body,
        existing,
        "the existing job is untouched"
    );
}

#[tokio::test]
async fn unknown_fields_are_warned_about_or_ignored() {
    let h = Harness::new().await;
    let mut body = job("warned");
    body["spec"]["foo"] = json!(1);
    body["metadata"]["bogus"] = json!(true);
    let answer = h.post(JOBS, &body).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(
        answer.warnings(),
        vec![
            r#"299 - "unknown field \"metadata.bogus\"""#,
            r#"299 - "unknown field \"spec.foo\"""#
        ]
    );
    assert!(answer.body["spec"].get("foo").is_none(), "pruned");
    assert!(
        h.get(&format!("{JOBS}/warned")).await.body["spec"]
            .get("foo")
            .is_none(),
        "stored pruned"
    );

    let mut body = job("ignored");
    body["spec"]["foo"] = json!(1);
    let answer = h
        .post(&format!("{JOBS}?fieldValidation=Ignore"), &body)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(answer.warnings().is_empty());
    assert!(answer.body["spec"].get("foo").is_none());

    // Patches are checked too.
    let answer = h
        .patch(
            &format!("{JOBS}/ignored?fieldValidation=Strict"),
            crate::patch::MERGE_PATCH,
            &json!({"spec": {"foo": 1}}),
        )
        .await;
    assert_eq!(
        (answer.status, answer.message()),
        (
            StatusCode::BAD_REQUEST,
            "strict decoding error: unknown field \"spec.foo\""
        )
    );
}

/// Regression (issue 14): a body with 100,000 duplicate keys was answered 201 with 100,003
/// `Warning` headers (5.8 MB of headers, which HTTP/2 clients refuse although the object
/// was written). The object is still created, with a small bounded set of warnings; strict
/// mode refuses it with a bounded message.
#[tokio::test]
async fn a_flood_of_duplicate_keys_gets_a_bounded_set_of_warnings() {
    use crate::output::{MAX_WARNING_BYTES, MAX_WARNINGS};
    let h = Harness::new().await;
    // 50,000 distinct unknown keys, each twice, plus one key 50,000 times: 100,000
    // duplicates, 50,001 unknown fields.
    let mut body = String::from(
        r#"{"apiVersion":"rlinf.io/v1alpha1","kind":"Job","metadata":{"name":"dups"},"spec":"#,
    );
    body.push_str(&job_spec().to_string());
    for i in 0..50_000 {
        body.push_str(&format!(r#","x{i}":0,"x{i}":0,"same":0"#));
    }
    body.push('}');
    let response = h
        .send(
            Method::POST,
            JOBS,
            "application/json",
            None,
            Bytes::from(body.clone()),
        )
        .await;
    let answer = Harness::answer(response).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let warnings = answer.warnings();
    assert!(warnings.len() <= MAX_WARNINGS + 1, "{}", warnings.len());
    assert!(
        warnings.last().unwrap().contains("more warnings omitted"),
        "{warnings:?}"
    );
    let header_bytes: usize = answer
        .headers
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.len())
        .sum();
    assert!(
        header_bytes <= MAX_WARNING_BYTES + 16 * 1024,
        "{header_bytes}"
    );

    // Strict mode: a 400 whose message names the first problems and counts the rest (a
    // smaller flood shows it as well and keeps the test quick in debug builds).
    let mut strict_body = String::from(
        r#"{"apiVersion":"rlinf.io/v1alpha1","kind":"Job","metadata":{"name":"strict"},"spec":"#,
    );
    strict_body.push_str(&job_spec().to_string());
    for i in 0..5_000 {
        strict_body.push_str(&format!(r#","x{i}":0,"x{i}":0"#));
    }
    strict_body.push('}');
    let strict = h
        .send(
            Method::POST,
            &format!("{JOBS}?fieldValidation=Strict"),
            "application/json",
            None,
            Bytes::from(strict_body),
        )
        .await;
    let answer = Harness::answer(strict).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(
        answer.message().len() < 32 * 1024,
        "{}",
        answer.message().len()
    );
    assert!(answer.message().contains("more"), "{}", answer.message());
}

/// Issue 14: duration and count fields have upper bounds at admission; the 422 names the
/// field and the maximum (before, `activeDeadlineSeconds: 9223372036854775807` was stored
/// and panicked the agent).
#[tokio::test]
async fn out_of_range_durations_and_counts_are_refused_naming_the_bound() {
    let h = Harness::new().await;
    let cases = [
        (
            json!({"activeDeadlineSeconds": i64::MAX}),
            "spec.tasks[0].raw.activeDeadlineSeconds",
            "must be less than or equal to 31536000",
        ),
        (
            json!({"terminationGracePeriodSeconds": i64::MAX}),
            "spec.tasks[0].raw.terminationGracePeriodSeconds",
            "must be less than or equal to 86400",
        ),
        (
            json!({"replicas": i32::MAX}),
            "spec.tasks[0].raw.replicas",
            "must be less than or equal to 10000",
        ),
    ];
    for (i, (extra, field, message)) in cases.into_iter().enumerate() {
        let mut job = job(&format!("bounded-{i}"));
        let raw = job["spec"]["tasks"][0]["raw"].as_object_mut().unwrap();
        raw.extend(extra.as_object().unwrap().clone());
        let answer = h.post(JOBS, &job).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            answer.body
        );
        let causes = answer.causes();
        assert!(
            causes.iter().any(|(f, _)| f == field) && answer.message().contains(message),
            "{causes:?} {}",
            answer.message()
        );
    }
}

/// Property test (issue 14): every integer and number field of every kind, found by
/// walking the kind's structural schema, set to each extreme value in turn, goes through
/// the create path's admission (decoder, schema walk, metadata checks, the kind's
/// validator) without a panic and is either admitted or refused with a 4xx and a reason.
/// Deterministic and bounded: (fields × extremes) admissions.
#[test]
fn extreme_numbers_in_every_field_of_every_kind_are_admitted_or_refused() {
    use crate::body;
    use crate::fieldvalidation::FieldValidation;
    use crate::fuzzing;

    /// Paths of numeric fields: property names, `*` for array items and map values.
    fn numeric_paths(schema: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if path.len() > 40 {
            return;
        }
        let numeric = matches!(
            schema.get("type").and_then(Value::as_str),
            Some("integer" | "number")
        ) || schema.get("x-kubernetes-int-or-string") == Some(&json!(true));
        if numeric {
            out.push(path.clone());
        }
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in properties {
                path.push(name.clone());
                numeric_paths(sub, path, out);
                path.pop();
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = schema.get(key).filter(|s| s.is_object()) {
                path.push("*".into());
                numeric_paths(sub, path, out);
                path.pop();
            }
        }
    }

    /// Set `leaf` at `path` in `object`, creating what is missing; at `*` the first element
    /// (or map value) that already has the next step is followed.
    fn set(object: &mut Value, path: &[String], leaf: Value) {
        let Some((step, rest)) = path.split_first() else {
            *object = leaf;
            return;
        };
        let next = rest.first().map(String::as_str);
        let has_next = |v: &Value| next.is_some_and(|n| v.get(n).is_some());
        let child = if step == "*" {
            match object {
                Value::Array(items) if !items.is_empty() => {
                    let i = items.iter().position(has_next).unwrap_or(0);
                    &mut items[i]
                }
                Value::Object(map) if !map.is_empty() => {
                    let key = map
                        .iter()
                        .find(|(_, v)| has_next(v))
                        .map_or_else(|| map.keys().next().unwrap().clone(), |(k, _)| k.clone());
                    map.get_mut(&key).unwrap()
                }
                _ => {
                    // Unknown whether a list or a map: a list (maps take a key below).
                    *object = json!([{}]);
                    &mut object[0]
                }
            }
        } else {
            if !object.is_object() {
                *object = json!({});
            }
            object
                .as_object_mut()
                .unwrap()
                .entry(step.clone())
                .or_insert(Value::Null)
        };
        set(child, rest, leaf);
    }

    let extremes = [
        json!(0),
        json!(-1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(1e308),
        json!("9".repeat(4096)),
    ];
    let registry = fuzzing::registry();
    let seeds = fuzzing::admission_seeds();
    let mut fields = 0;
    let mut outcomes = [0usize; 2];
    let mut all_paths = Vec::new();
    for (rt, seed) in registry.all().iter().zip(&seeds) {
        let seed: Value = serde_json::from_slice(&seed[2..]).unwrap();
        let mut paths = Vec::new();
        numeric_paths(&rt.schema, &mut Vec::new(), &mut paths);
        fields += paths.len();
        for path in &paths {
            all_paths.push(format!("{}:{}", rt.kind, path.join(".")));
            for extreme in &extremes {
                let mut object = seed.clone();
                set(&mut object, path, extreme.clone());
                let bytes = serde_json::to_vec(&object).unwrap();
                let outcome = body::decode_object(&bytes, "application/json")
                    .and_then(|decoded| fuzzing::admit(rt, decoded, FieldValidation::Warn));
                match outcome {
                    Ok(_) => outcomes[0] += 1,
                    Err(error) => {
                        assert!(
                            (400..500).contains(&error.code) && !error.message.is_empty(),
                            "{} {} = {extreme}: {} {}",
                            rt.kind,
                            path.join("."),
                            error.code,
                            error.message
                        );
                        outcomes[1] += 1;
                    }
                }
            }
        }
    }
    // The walk found the fields that matter, and both outcomes happened.
    for expected in [
        "Task:spec.raw.activeDeadlineSeconds",
        "Job:spec.tasks.*.raw.terminationGracePeriodSeconds",
        "Workflow:spec.jobTemplates.*.spec.tasks.*.raw.replicas",
        "Job:spec.tasks.*.kubernetes.workload.template.spec.containers.*.ports.*.containerPort",
        "DomainPeer:spec.prefixLen",
        "Lease:spec.leaseDurationSeconds",
    ] {
        assert!(
            all_paths.iter().any(|p| p == expected),
            "{expected} not among {} numeric fields",
            all_paths.len()
        );
    }
    eprintln!("{fields} numeric fields, {outcomes:?} admitted/refused");
    assert!(fields > 50, "{fields}");
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[tokio::test]
async fn workflow_job_templates_are_domain_checked_at_apply() {
    let h = Harness::new().await;
    h.create(
        DOMAINS,
        &json!({"apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
                "metadata": {"name": "picky"},
                "spec": {"cidr": "10.77.0.0/24",
                         "jobSelector": {"matchLabels": {"rlinf.io/workflow": "wf"}}}}),
    )
    .await;
    let with_domains = |name: &str, first: &str, second: &str| {
        let mut wf = workflow(name);
        wf["spec"]["jobTemplates"][0]["spec"]["domain"] = json!(first);
        wf["spec"]["jobTemplates"][1]["spec"]["tasks"][0]["domain"] = json!(second);
        wf
    };
    // Unknown Domain, and a Domain whose jobSelector the Jobs of "other" do not match.
    let refused = h
        .post(WORKFLOWS, &with_domains("other", "nope", "picky"))
        .await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        refused.body
    );
    assert_eq!(
        refused.causes(),
        [
            (
                "spec.jobTemplates[0].spec.domain".to_string(),
                "FieldValueNotFound".to_string()
            ),
            (
                "spec.jobTemplates[1].spec.tasks[0].domain".to_string(),
                "FieldValueForbidden".to_string()
            ),
        ]
    );
    assert!(
        refused.message().contains("no Domain of that name exists"),
        "{}",
        refused.message()
    );
    assert!(!h.exists(&format!("{WORKFLOWS}/other")).await);
    // The Jobs of "wf" carry rlinf.io/workflow=wf: admitted.
    let created = h
        .post(WORKFLOWS, &with_domains("wf", "picky", "picky"))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    // An update that names an unknown Domain is refused too.
    let mut update = created.body.clone();
    update["spec"]["jobTemplates"][1]["spec"]["tasks"][0]["domain"] = json!("nope");
    let refused = h.put(&format!("{WORKFLOWS}/wf"), &update).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        refused.body
    );
    assert_eq!(
        refused.causes(),
        [(
            "spec.jobTemplates[1].spec.tasks[0].domain".to_string(),
            "FieldValueNotFound".to_string()
        )]
    );
}

/// Issue 20: the pod network's admission lock serialized every Job create (one write per
/// SQLite commit under 64 clients). A Job that names no Domain must not wait for it; one
/// that names a Domain still does, so that a concurrent Domain delete sees it.
#[tokio::test]
async fn jobs_without_a_domain_do_not_wait_for_the_network_lock() {
    let h = Harness::new().await;
    // Another network write (a Domain being admitted) holds the lock.
    let held = h.server.inner.network.lock().await;
    let created = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        h.post(JOBS, &job("free")),
    )
    .await
    .expect("a Job without a Domain waited for the network lock");
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);

    let mut bound = job("bound");
    bound["spec"]["domain"] = json!("net");
    let pending = h.post(JOBS, &bound);
    tokio::pin!(pending);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), &mut pending)
            .await
            .is_err(),
        "a Job naming a Domain must wait for the network lock"
    );
    drop(held);
    let answer = pending.await;
    // Admitted under the lock: the Domain does not exist.
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        answer.body
    );
}
