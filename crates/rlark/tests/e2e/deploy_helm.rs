//! The Helm charts in `deploy/helm`, linted and rendered by Helm's own Go engine
//! (`scripts/helm_check.py`, through helm-python-sdk: Debian has no helm package and no
//! other download is reachable), then every rendered object decoded into its k8s-openapi type
//! and encoded again: a field the type does not know is lost on the way and fails the test
//! (unknown fields denied; kubeconform is not installable here). The two custom resources the
//! server chart may render (Prometheus Operator's ServiceMonitor, Gateway API's TLSRoute) are
//! decoded into local structs that deny unknown fields. The config files the charts carry are
//! parsed by the server's and the runtime's own parsers.
//!
//! Without helm-python-sdk the test skips with a message, or fails under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1` (`tests/support/missing_tool.rs`).

use crate::missing_tool;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Render every case of `scripts/helm_check.py` into a temporary directory: case → objects.
fn render() -> Option<BTreeMap<String, Vec<Value>>> {
    let probe = Command::new("python3")
        .args(["-c", "import helm_python"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        missing_tool::skip_or_fail(
            "helm-python-sdk (python3 -m pip install helm-python-sdk) is not installed",
        );
        return None;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let run = Command::new("python3")
        .arg(root().join("scripts/helm_check.py"))
        .arg(out.path())
        .output()
        .expect("run scripts/helm_check.py");
    assert!(
        run.status.success(),
        "helm lint/template failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let cases: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("cases.json")).expect("cases.json"),
    )
    .expect("cases");
    let mut rendered = BTreeMap::new();
    for case in cases {
        let text = std::fs::read_to_string(out.path().join(format!("{case}.yaml"))).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{case}: rendered YAML does not parse: {e}\n{text}"));
        rendered.insert(case, docs.into_iter().filter(|d| !d.is_null()).collect());
    }
    Some(rendered)
}

/// Where `back` (the object decoded and encoded again) differs from `doc`: the paths that
/// were dropped (unknown fields) or changed.
fn differences(path: &str, doc: &Value, back: &Value, out: &mut Vec<String>) {
    match (doc, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                match b.get(key) {
                    Some(other) => differences(&format!("{path}.{key}"), value, other, out),
                    None => out.push(format!("{path}.{key}: unknown field")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a == b => {}
        // YAML scalars that k8s-openapi types as strings (quantities) or numbers.
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n))
            if n.to_string() == *s => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut diffs = Vec::new();
    differences("", doc, &back, &mut diffs);
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("; "))
    }
}

/// monitoring.coreos.com/v1 ServiceMonitor, the fields the chart uses.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitor {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: ServiceMonitorSpec,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceMonitorSpec {
    selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    endpoints: Vec<MonitorEndpoint>,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorEndpoint {
    port: String,
    scheme: String,
    path: String,
    interval: String,
    bearer_token_secret: k8s_openapi::api::core::v1::SecretKeySelector,
    tls_config: MonitorTls,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MonitorTls {
    server_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    insecure_skip_verify: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<MonitorCa>,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct MonitorCa {
    secret: k8s_openapi::api::core::v1::SecretKeySelector,
}

/// gateway.networking.k8s.io/v1alpha2 TLSRoute, the fields the chart uses.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TlsRoute {
    api_version: String,
    kind: String,
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: TlsRouteSpec,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TlsRouteSpec {
    parent_refs: Vec<ParentRef>,
    hostnames: Vec<String>,
    rules: Vec<TlsRouteRule>,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ParentRef {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    section_name: Option<String>,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TlsRouteRule {
    backend_refs: Vec<BackendRef>,
}
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct BackendRef {
    name: String,
    port: u16,
}

fn check_object(doc: &Value) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "ConfigMap") => strict::<ConfigMap>(doc),
        ("v1", "Secret") => strict::<Secret>(doc),
        ("v1", "Service") => strict::<Service>(doc),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(doc),
        ("v1", "PersistentVolumeClaim") => strict::<PersistentVolumeClaim>(doc),
        ("v1", "Namespace") => strict::<Namespace>(doc),
        ("apps/v1", "Deployment") => strict::<Deployment>(doc),
        ("apps/v1", "DaemonSet") => strict::<DaemonSet>(doc),
        ("apps/v1", "StatefulSet") => strict::<StatefulSet>(doc),
        ("networking.k8s.io/v1", "Ingress") => strict::<Ingress>(doc),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict::<ClusterRoleBinding>(doc),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(doc),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => strict::<ServiceMonitor>(doc),
        ("gateway.networking.k8s.io/v1alpha2", "TLSRoute") => strict::<TlsRoute>(doc),
        _ => Err(format!("no schema for {api_version} {kind}")),
    }
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = find(docs, kind);
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

fn args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

#[test]
fn helm_charts_lint_render_and_decode_strictly() {
    let Some(rendered) = render() else { return };
    assert!(rendered.len() >= 5, "cases: {:?}", rendered.keys());
    let mut failures = Vec::new();
    for (case, docs) in &rendered {
        assert!(!docs.is_empty(), "{case}: nothing rendered");
        for doc in docs {
            if let Err(error) = check_object(doc) {
                failures.push(format!(
                    "{case}: {} {}: {error}",
                    doc["kind"], doc["metadata"]["name"]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The server chart: its server.yaml is one the server accepts (unknown fields are
    // refused by its parser), the tunnel is routed and advertised through the Ingress, the
    // store URL comes from a Secret.
    for case in ["rlark-default", "rlark-full", "rlark-postgres-no-volume"] {
        let docs = &rendered[case];
        let config = one(docs, "ConfigMap")["data"]["server.yaml"]
            .as_str()
            .expect("server.yaml");
        let parsed: rlark_server::ServerConfigFile = serde_saphyr::from_str(config)
            .unwrap_or_else(|e| panic!("{case}: server.yaml: {e}\n{config}"));
        assert!(parsed.tunnel.is_some(), "{case}: advertiseURL set");
        let deployment = one(docs, "Deployment");
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        let args = args(deployment);
        assert_eq!(args[0], "server");
        assert!(
            args.contains(&"--listen=0.0.0.0:8443".to_string()),
            "{args:?}"
        );
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
            true
        );
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert!(find(docs, "Role").is_empty() && find(docs, "ClusterRole").is_empty());
    }
    let full = &rendered["rlark-full"];
    let ingress = one(full, "Ingress");
    let paths = &ingress["spec"]["rules"][0]["http"]["paths"];
    assert_eq!(paths[0]["path"], "/api/connect");
    assert_eq!(
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"],
        "true"
    );
    assert!(args(one(full, "Deployment")).contains(&"--tls-san=rlark.example.com".to_string()));
    assert!(
        one(full, "ConfigMap")["data"]["server.yaml"]
            .as_str()
            .unwrap()
            .contains("advertiseURL: https://rlark.example.com:443")
    );
    let env = &one(full, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"][0];
    assert_eq!(env["name"], "RLARK_STORE");
    assert!(env["valueFrom"]["secretKeyRef"]["name"].is_string());
    assert_eq!(one(full, "Secret")["type"], "Opaque");
    assert_eq!(
        one(full, "Deployment")["spec"]["template"]["spec"]["initContainers"][0]["name"],
        "ca"
    );
    // Task web apps on a host of their own: the listener, its Service port, its Ingress rule.
    let full_args = args(one(full, "Deployment"));
    assert!(
        full_args.contains(&"--proxy-url=https://apps.example.net".to_string()),
        "{full_args:?}"
    );
    assert!(full_args.contains(&"--proxy-listen=0.0.0.0:8444".to_string()));
    let service = one(full, "Service");
    assert_eq!(service["spec"]["ports"][1]["name"], "apps");
    assert_eq!(ingress["spec"]["rules"][1]["host"], "apps.example.net");
    assert_eq!(
        ingress["spec"]["rules"][1]["http"]["paths"][0]["backend"]["service"]["port"]["name"],
        "apps"
    );
    assert!(
        !args(one(&rendered["rlark-default"], "Deployment"))
            .iter()
            .any(|a| a.starts_with("--proxy-")),
        "no task-apps listener unless proxy.enabled"
    );
    one(full, "ServiceMonitor");
    one(full, "TLSRoute");
    one(full, "PodDisruptionBudget");
    assert!(
        find(&rendered["rlark-default"], "Secret").is_empty(),
        "no CA or store Secret unless supplied"
    );
    assert!(find(&rendered["rlark-default"], "Ingress").is_empty());

    // Several replicas: a StatefulSet on PostgreSQL, each pod with its own volume and DNS
    // name (the peer URL), the CAs from the store under the sealing secret.
    let replicas = &rendered["rlark-replicas"];
    assert!(find(replicas, "Deployment").is_empty());
    assert!(
        find(replicas, "PersistentVolumeClaim").is_empty(),
        "volumes come from volumeClaimTemplates"
    );
    let set = one(replicas, "StatefulSet");
    assert_eq!(set["spec"]["replicas"], 3);
    assert_eq!(set["spec"]["podManagementPolicy"], "Parallel");
    assert_eq!(
        set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    let peers = find(replicas, "Service")
        .into_iter()
        .find(|s| s["spec"]["clusterIP"] == "None")
        .expect("headless Service");
    assert_eq!(set["spec"]["serviceName"], peers["metadata"]["name"]);
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    let set_args = args(set);
    let peer = format!(
        "--peer-url=https://$(POD_NAME).{}.rlark.svc:8443",
        peers["metadata"]["name"].as_str().unwrap()
    );
    assert!(set_args.contains(&peer), "{set_args:?}");
    assert!(
        set_args.contains(&"--ca-secret-file=/etc/rlark-ca-secret/secret".to_string()),
        "{set_args:?}"
    );
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["env"][0]["name"], "POD_NAME");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert!(
        set["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "data"),
        "the data volume is per pod"
    );

    // The agent chart: least privilege (no wildcard, no cluster-wide secrets or writes
    // beyond cordoning nodes), the token from a Secret, the node runtime only when enabled.
    for case in ["rlark-agent-default", "rlark-agent-full"] {
        let docs = &rendered[case];
        let cluster_role = one(docs, "ClusterRole");
        for rule in cluster_role["rules"].as_array().unwrap() {
            let text = rule.to_string();
            assert!(!text.contains('*'), "{case}: wildcard in {text}");
            assert!(
                !text.contains("secrets"),
                "{case}: cluster-wide secrets in {text}"
            );
            for verb in rule["verbs"].as_array().unwrap() {
                let verb = verb.as_str().unwrap();
                assert!(
                    ["get", "list", "watch"].contains(&verb)
                        || (verb == "patch" && rule["resources"][0] == "nodes"),
                    "{case}: cluster-wide {verb} in {text}"
                );
            }
        }
        let role = one(docs, "Role");
        let namespace = role["metadata"]["namespace"].as_str().unwrap();
        assert_eq!(one(docs, "RoleBinding")["metadata"]["namespace"], namespace);
        assert!(
            !role.to_string().contains('*'),
            "{case}: wildcard in the Role"
        );
        let deployment = one(docs, "Deployment");
        let args = args(deployment);
        assert_eq!(args[0], "agent");
        assert!(args.contains(&"--agent-type=kubernetes".to_string()));
        assert!(args.contains(&format!("--member-namespace={namespace}")));
        let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"][0];
        assert_eq!(env["name"], "RLARK_JOIN_TOKEN");
    }
    assert!(find(&rendered["rlark-agent-default"], "DaemonSet").is_empty());
    let full = &rendered["rlark-agent-full"];
    assert!(
        find(full, "Namespace").is_empty(),
        "workloadNamespace.create=false"
    );
    let daemonset = one(full, "DaemonSet");
    assert_eq!(daemonset["spec"]["template"]["spec"]["hostPID"], true);
    let caps =
        &daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    assert_eq!(caps["add"], serde_json::json!(["NET_ADMIN", "SYS_ADMIN"]));
    let node_config = find(full, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["embodied.yaml"].as_str())
        .expect("embodied.yaml");
    rlark_embodied::EmbodiedConfig::from_yaml(node_config)
        .unwrap_or_else(|e| panic!("the node runtime's config is refused: {e}\n{node_config}"));
}

#[test]
fn unknown_fields_are_caught_by_the_round_trip() {
    let doc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 1, "targetPortt": "https"}]},
    });
    let error = strict::<Service>(&doc).expect_err("a misspelt field is refused");
    assert!(
        error.contains(".spec.ports[0].targetPortt: unknown field"),
        "{error}"
    );
    let monitor = serde_json::json!({"apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor", "metadata": {}, "spec": {"selector": {}, "endpoints": [],
        "jobLabel": "x"}});
    assert!(check_object(&monitor).is_err());
    assert!(check_object(&serde_json::json!({"apiVersion": "v9", "kind": "Thing"})).is_err());
}

/// The rendered container args with the in-pod paths and addresses swapped for local ones.
fn localized(args: &[String], swaps: &[(&str, String)]) -> Vec<String> {
    args.iter()
        .map(|arg| {
            swaps
                .iter()
                .find(|(prefix, _)| arg.starts_with(prefix))
                .map_or_else(|| arg.clone(), |(_, to)| to.clone())
        })
        .collect()
}

/// Run `rlark ARGS` until a line of its output contains `ready` (60 s at most), then kill it.
fn starts(rlark: &str, args: &[String], ready: &str) {
    starts_with_env(rlark, args, ready, &[]);
}

/// [`starts`] with environment variables.
fn starts_with_env(rlark: &str, args: &[String], ready: &str, env: &[(&str, &str)]) {
    let mut child = Command::new(rlark)
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rlark");
    let (tx, rx) = std::sync::mpsc::channel();
    let streams: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(child.stderr.take().unwrap()),
        Box::new(child.stdout.take().unwrap()),
    ];
    for stream in streams {
        let tx = tx.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
    }
    // Only the readers hold senders now: a process that exits ends the wait.
    drop(tx);
    let mut seen = Vec::new();
    let started = loop {
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(line) if line.contains(ready) => break true,
            Ok(line) => seen.push(line),
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        started,
        "rlark {args:?} did not start:\n{}",
        seen.join("\n")
    );
}

/// The replicated chart's StatefulSet: two pods' args (`$(POD_NAME)` expanded as the kubelet
/// does), started at once on one PostgreSQL database with the sealing secret, come up and end
/// with one CA and one SSH CA between them.
#[test]
fn the_replicated_charts_pods_start_together_and_share_the_cas() {
    let Some(rendered) = render() else { return };
    let Some(bin) = rlark_testkit::postgres::find_bin() else {
        missing_tool::skip_or_fail(
            "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
        );
        return;
    };
    let cluster = rlark_testkit::postgres::PgCluster::start(&bin);
    cluster.create_database("rlark");
    let rlark = env!("CARGO_BIN_EXE_rlark");
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = &rendered["rlark-replicas"];
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        one(docs, "ConfigMap")["data"]["server.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let secret = dir.path().join("sealing-secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef-chart-test\n").unwrap();
    let set_args = args(one(docs, "StatefulSet"));
    let pods: Vec<(PathBuf, Vec<String>)> = (0..2)
        .map(|i| {
            let data = dir.path().join(format!("rlark-{i}"));
            let expanded: Vec<String> = set_args
                .iter()
                .map(|a| a.replace("$(POD_NAME)", &format!("rlark-{i}")))
                .collect();
            let args = localized(
                &expanded,
                &[
                    ("--config=", format!("--config={}", config.display())),
                    ("--data-dir=", format!("--data-dir={}", data.display())),
                    ("--listen=", "--listen=127.0.0.1:0".to_string()),
                    (
                        "--ca-secret-file=",
                        format!("--ca-secret-file={}", secret.display()),
                    ),
                ],
            );
            (data, args)
        })
        .collect();
    let url = cluster.url("rlark");
    std::thread::scope(|scope| {
        for (_, args) in &pods {
            let url = url.clone();
            scope
                .spawn(move || starts_with_env(rlark, args, "listening", &[("RLARK_STORE", &url)]));
        }
    });
    for file in ["pki/ca.crt", "pki/ssh_ca.pub"] {
        let read = |data: &Path| std::fs::read_to_string(data.join(file)).expect(file);
        assert_eq!(read(&pods[0].0), read(&pods[1].0), "{file} differs");
    }
}

#[test]
fn the_charts_args_and_config_are_ones_the_binary_runs() {
    let Some(rendered) = render() else { return };
    let rlark = env!("CARGO_BIN_EXE_rlark");
    let dir = tempfile::tempdir().expect("tempdir");

    // The server chart's Deployment: its args and server.yaml start a server (on loopback).
    let docs = &rendered["rlark-default"];
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        one(docs, "ConfigMap")["data"]["server.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let server_args = localized(
        &args(one(docs, "Deployment")),
        &[
            ("--config=", format!("--config={}", config.display())),
            (
                "--data-dir=",
                format!("--data-dir={}", dir.path().join("data").display()),
            ),
            ("--listen=", "--listen=127.0.0.1:0".to_string()),
        ],
    );
    starts(rlark, &server_args, "listening");
    // With the full case's task-apps listener (on a free loopback port here).
    let mut with_proxy = server_args.clone();
    with_proxy.extend(
        args(one(&rendered["rlark-full"], "Deployment"))
            .into_iter()
            .filter(|a| a.starts_with("--proxy-"))
            .map(|a| {
                if a.starts_with("--proxy-listen=") {
                    "--proxy-listen=127.0.0.1:0".to_string()
                } else {
                    a
                }
            }),
    );
    assert_eq!(with_proxy.len(), server_args.len() + 2, "{with_proxy:?}");
    starts(rlark, &with_proxy, "listening");

    // The agent chart's Deployment: the args pass the CLI and the agent's configuration
    // checks, and the agent gets as far as its member cluster (none here).
    for case in ["rlark-agent-default", "rlark-agent-full"] {
        let agent_args = localized(
            &args(one(&rendered[case], "Deployment")),
            &[
                ("--server=", "--server=https://127.0.0.1:1".to_string()),
                (
                    "--data-dir=",
                    format!("--data-dir={}", dir.path().join(case).display()),
                ),
            ],
        );
        // The chart's metrics address with port 0 (a free one): the address is what the
        // agent checks.
        let agent_args: Vec<String> = agent_args
            .into_iter()
            .map(|arg| match arg.strip_prefix("--metrics-listen=") {
                Some(addr) => {
                    let addr: std::net::SocketAddr = addr.parse().expect("metrics address");
                    format!(
                        "--metrics-listen={}",
                        std::net::SocketAddr::new(addr.ip(), 0)
                    )
                }
                None => arg,
            })
            .collect();
        let out = Command::new(rlark)
            .args(&agent_args)
            .env("RLARK_JOIN_TOKEN", "abcdef.0123456789abcdef")
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", "1")
            .output()
            .expect("run rlark agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case}: {stderr}");
        assert!(
            stderr.contains("member cluster") && !stderr.contains("invalid agent configuration"),
            "{case}: rlark {agent_args:?} stopped before its member cluster:\n{stderr}"
        );
    }

    // The node runtime's DaemonSet: its args and config start `rlark embodied` (sockets in
    // a temporary directory; no kubelet here, which the device plugin retries).
    let full = &rendered["rlark-agent-full"];
    let config = dir.path().join("embodied.yaml");
    let text = find(full, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["embodied.yaml"].as_str())
        .unwrap();
    std::fs::write(&config, text).unwrap();
    let runtime_args = localized(
        &args(one(full, "DaemonSet")),
        &[
            ("--config=", format!("--config={}", config.display())),
            (
                "--socket-dir=",
                format!("--socket-dir={}", dir.path().join("run").display()),
            ),
            (
                "--metrics-listen=",
                "--metrics-listen=127.0.0.1:0".to_string(),
            ),
        ],
    );
    starts(rlark, &runtime_args, "serving");
}
