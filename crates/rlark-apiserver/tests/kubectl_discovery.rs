//! Discovery, OpenAPI and Table rendering checked with the real kubectl. Each test serves
//! `discovery::router` + `openapi::router` (plus a tiny table-only stand-in for
//! `GET …/jobs`) over plain HTTP on a loopback port and runs kubectl with a throwaway HOME,
//! KUBECONFIG and cache directory.
//!
//! `/usr/bin/kubectl` on our images is Google Cloud SDK's version *dispatcher* (it reports
//! `v1.32.4-dispatcher`): it asks the server for `/version` and execs the bundled
//! `kubectl.1.<minor>` closest to it, so against our 1.33 server it runs kubectl 1.33. Every
//! test therefore runs twice: through the dispatcher, and with the bundled `kubectl.1.32`
//! directly (the oldest client we promise to support).
//!
//! Without kubectl the tests skip with a message, or fail under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1` (`tests/support/missing_tool.rs`).

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rlark_apiserver::auth::{ADMIN_GROUP, Identity};
use rlark_apiserver::error::ApiError;
use rlark_apiserver::registry::Registry;
use rlark_apiserver::{discovery, openapi, table};
use serde_json::json;

const KUBECTL: &str = "/usr/bin/kubectl";
const KUBECTL_1_32: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

/// The kubectl binaries to test with (see the module docs); empty when none is installed.
fn kubectls() -> Vec<PathBuf> {
    let found: Vec<PathBuf> = [KUBECTL, KUBECTL_1_32]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    if found.is_empty() {
        missing_tool::skip_or_fail(&format!("{KUBECTL} is not installed"));
    }
    found
}

struct Server {
    kubectl: PathBuf,
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    home: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stand-in for the CRUD handlers: answers `GET /apis/rlinf.io/v1alpha1/jobs` as a Table
/// (two jobs, created 5 minutes and 3 days before now) so `kubectl get` can be checked;
/// everything else is a 404 Status.
async fn fallback(registry: Arc<Registry>, request: Request) -> Response {
    let rt = registry.get("rlinf.io", "v1alpha1", "jobs");
    match rt {
        Some(rt)
            if request.uri().path() == "/apis/rlinf.io/v1alpha1/jobs"
                && table::wants_table(request.headers()) =>
        {
            let ago = |seconds: i64| {
                (chrono::Utc::now() - chrono::TimeDelta::seconds(seconds)).to_rfc3339()
            };
            let objects = vec![
                Arc::new(json!({
                    "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
                    "metadata": {"name": "train", "creationTimestamp": ago(300), "resourceVersion": "5"},
                    "spec": {"tasks": []}, "status": {"phase": "Running"}
                })),
                Arc::new(json!({
                    "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
                    "metadata": {"name": "pending-one", "creationTimestamp": ago(3 * 86400 + 60), "resourceVersion": "6"},
                    "spec": {"tasks": []}
                })),
            ];
            let body = table::to_table(&rt, &objects, json!({"resourceVersion": "6"}), true);
            (
                [(http::header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response()
        }
        _ => ApiError::path_not_found("the server could not find the requested resource")
            .into_response(),
    }
}

async fn start(kubectl: &Path) -> Server {
    let registry = Arc::new(Registry::builtin());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let log = requests.clone();
    let fallback_registry = registry.clone();
    let app = Router::new()
        .merge(discovery::router(registry.clone()))
        .merge(openapi::router(registry))
        .fallback(move |request: Request| fallback(fallback_registry.clone(), request))
        .layer(axum::Extension(Identity {
            user: "admin".into(),
            groups: vec![ADMIN_GROUP.into()],
        }))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let log = log.clone();
            async move {
                let accept = request
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let line = format!("{} {} accept={accept}", request.method(), request.uri());
                log.lock().unwrap().push(line);
                next.run(request).await
            }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        kubectl: kubectl.to_path_buf(),
        url,
        requests,
        home: tempfile::tempdir().unwrap(),
        task,
    }
}

impl Server {
    async fn kubectl(&self, args: &[&str]) -> Output {
        let home = self.home.path();
        let mut command = tokio::process::Command::new(&self.kubectl);
        command
            .args(["--server", &self.url, "--cache-dir"])
            .arg(home.join("cache"))
            .args(args)
            .env_clear()
            .env("HOME", home)
            .env("KUBECONFIG", home.join("kubeconfig"))
            .current_dir(home)
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .expect("kubectl timed out")
            .expect("kubectl runs");
        eprintln!(
            "$ {} {}\n{}{}",
            self.kubectl.display(),
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    async fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args).await;
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Table rows split into whitespace-separated cells.
fn rows(output: &str) -> Vec<Vec<&str>> {
    output
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_resources_and_versions() {
    for kubectl in kubectls() {
        api_resources_and_versions_with(&start(&kubectl).await).await;
    }
}

async fn api_resources_and_versions_with(server: &Server) {
    let output = server
        .kubectl_ok(&["api-resources", "--api-group=rlinf.io"])
        .await;
    let table = rows(&output);
    assert_eq!(
        table[0],
        ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    );
    let registry = Registry::builtin();
    let rlinf: Vec<_> = registry
        .all()
        .iter()
        .filter(|t| t.group == "rlinf.io")
        .collect();
    assert_eq!(table.len() - 1, rlinf.len(), "{output}");
    for rt in rlinf {
        let row = table
            .iter()
            .find(|r| r[0] == rt.plural)
            .unwrap_or_else(|| panic!("{} missing", rt.plural));
        let expected: Vec<String> = [rt.plural.clone()]
            .into_iter()
            .chain((!rt.short_names.is_empty()).then(|| rt.short_names.join(",")))
            .chain([rt.api_version(), rt.namespaced.to_string(), rt.kind.clone()])
            .collect();
        assert_eq!(row, &expected, "{output}");
    }

    let output = server.kubectl_ok(&["api-resources", "--api-group="]).await;
    assert!(
        rows(&output).contains(&vec!["namespaces", "ns", "v1", "false", "Namespace"]),
        "{output}"
    );

    let output = server.kubectl_ok(&["api-versions"]).await;
    let versions: Vec<&str> = output.lines().collect();
    for expected in ["v1", "rlinf.io/v1alpha1", "coordination.k8s.io/v1"] {
        assert!(versions.contains(&expected), "{output}");
    }

    // kubectl used aggregated discovery: no per-group-version requests.
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /apis?") || r.starts_with("GET /apis ")),
        "{requests:#?}"
    );
    assert!(
        !requests
            .iter()
            .any(|r| r.contains("/apis/rlinf.io/v1alpha1 ")),
        "{requests:#?}"
    );

    let output = server.kubectl(&["version"]).await;
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("Server Version: v1.33.0+rlark-"), "{text}");
    assert!(!text.to_lowercase().contains("warning"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_uses_openapi_v3() {
    for kubectl in kubectls() {
        explain_uses_openapi_v3_with(&start(&kubectl).await).await;
    }
}

async fn explain_uses_openapi_v3_with(server: &Server) {
    let output = server.kubectl_ok(&["explain", "job.spec.tasks"]).await;
    assert!(output.contains("GROUP:      rlinf.io"), "{output}");
    assert!(output.contains("KIND:       Job"), "{output}");
    assert!(output.contains("VERSION:    v1alpha1"), "{output}");
    assert!(output.contains("FIELD: tasks <[]Object>"), "{output}");
    assert!(output.contains("FIELDS:"), "{output}");
    assert!(
        output.contains("role\t<string> -required-") || output.contains("role\t<string>"),
        "{output}"
    );

    let output = server.kubectl_ok(&["explain", "jobs"]).await;
    assert!(output.contains("metadata\t<ObjectMeta>"), "{output}");
    assert!(output.contains("apiVersion\t<string>"), "{output}");

    let output = server
        .kubectl_ok(&["explain", "rljob.metadata.ownerReferences"])
        .await;
    assert!(
        output.contains("FIELD: ownerReferences <[]OwnerReference>"),
        "{output}"
    );
    assert!(output.contains("uid\t<string> -required-"), "{output}");

    let output = server
        .kubectl_ok(&["explain", "namespace.status.phase"])
        .await;
    assert!(output.contains("KIND:       Namespace"), "{output}");
    assert!(output.contains("FIELD: phase <string>"), "{output}");

    let output = server
        .kubectl_ok(&["explain", "lease.spec.holderIdentity"])
        .await;
    assert!(
        output.contains("GROUP:      coordination.k8s.io"),
        "{output}"
    );
    assert!(
        output.contains("FIELD: holderIdentity <string>"),
        "{output}"
    );

    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /openapi/v3/apis/rlinf.io/v1alpha1?hash=")),
        "{requests:#?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains("/openapi/v2")),
        "explain must not need v2: {requests:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_validation_trusts_server_side_field_validation() {
    for kubectl in kubectls() {
        apply_validation_trusts_server_side_field_validation_with(&start(&kubectl).await).await;
    }
}

async fn apply_validation_trusts_server_side_field_validation_with(server: &Server) {
    let manifest = server.home.path().join("job.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata:\n  name: demo\nspec:\n  tasks:\n  - role: actor\n    notAField: 1\n",
    )
    .unwrap();
    let namespace = server.home.path().join("ns.yaml");
    std::fs::write(
        &namespace,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n",
    )
    .unwrap();

    for file in [&manifest, &namespace] {
        let file = file.to_str().unwrap();
        let output = server
            .kubectl_ok(&["apply", "--dry-run=client", "--validate=strict", "-f", file])
            .await;
        assert!(output.contains("created (dry run)"), "{output}");
        let output = server
            .kubectl_ok(&[
                "create",
                "--dry-run=client",
                "--validate=strict",
                "-f",
                file,
            ])
            .await;
        assert!(output.contains("created (dry run)"), "{output}");
    }

    let requests = server.requests();
    // The field-validation check read the v3 documents (PATCH declares fieldValidation), so
    // kubectl left validation to the server and never needed OpenAPI v2.
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /openapi/v3/apis/rlinf.io/v1alpha1?hash=")),
        "{requests:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("GET /openapi/v3/api/v1?hash=")),
        "{requests:#?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains("/openapi/v2")),
        "{requests:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_server_side_tables() {
    for kubectl in kubectls() {
        get_prints_server_side_tables_with(&start(&kubectl).await).await;
    }
}

async fn get_prints_server_side_tables_with(server: &Server) {
    let output = server.kubectl_ok(&["get", "jobs"]).await;
    let table = rows(&output);
    assert_eq!(table[0], ["NAME", "PHASE", "AGE"], "{output}");
    assert_eq!(table[1], ["train", "Running", "5m"], "{output}");
    assert_eq!(table[2], ["pending-one", "3d"], "{output}");

    let output = server
        .kubectl_ok(&["get", "rljob", "--show-kind", "--show-labels"])
        .await;
    let table = rows(&output);
    assert_eq!(table[0], ["NAME", "PHASE", "AGE", "LABELS"], "{output}");
    assert_eq!(
        table[1],
        ["job.rlinf.io/train", "Running", "5m", "<none>"],
        "{output}"
    );

    let requests = server.requests();
    let get = requests
        .iter()
        .find(|r| r.starts_with("GET /apis/rlinf.io/v1alpha1/jobs"))
        .unwrap();
    assert!(get.contains("as=Table;v=v1;g=meta.k8s.io"), "{get}");
}
