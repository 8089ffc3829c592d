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
