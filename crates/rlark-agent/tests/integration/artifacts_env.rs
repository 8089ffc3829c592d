//! Artifacts over HTTP, the environment contract and `envFrom.input`, end to end: an
//! in-process server with its controllers, a real agent (`rlark_agent::start`), and an
//! HTTP server on 127.0.0.1 serving the artifacts (counting requests).
//!
//! Every wait is bounded by [`DEADLINE`].

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, ensure};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};
use rlark_agent::runtime::{CACHE_DIGEST_DIR, LOG_FILE};
use rlark_api::types::{Job, PodPhase, Task};
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// Serves fixed bodies on 127.0.0.1 (404 for other paths) and counts requests per path.
struct ArtifactServer {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
}

impl ArtifactServer {
    fn start(files: Vec<(&str, Vec<u8>)>) -> anyhow::Result<ArtifactServer> {
        let files: Arc<HashMap<String, Vec<u8>>> = Arc::new(
            files
                .into_iter()
                .map(|(path, body)| (path.to_string(), body))
                .collect(),
        );
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (hits, stop) = (Arc::clone(&hits), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (files, hits) = (Arc::clone(&files), Arc::clone(&hits));
                    std::thread::spawn(move || serve(stream, &files, &hits));
                }
            });
        }
        Ok(ArtifactServer { addr, hits, stop })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits
            .lock()
            .map(|h| h.get(path).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for ArtifactServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    stream: TcpStream,
    files: &HashMap<String, Vec<u8>>,
    hits: &Mutex<HashMap<String, usize>>,
) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(clone);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    for _ in 0..100 {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    if let Ok(mut hits) = hits.lock() {
        *hits.entry(path.clone()).or_insert(0) += 1;
    }
    let mut out = stream;
    let _ = match files.get(&path) {
        Some(body) => out
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .and_then(|()| out.write_all(body)),
        None => out
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    };
}

/// What the artifact's script prints: the variables under test, one per line.
const SCRIPT: &str = r#"#!/bin/sh
echo "QUESTION=$QUESTION"
echo "SAMPLE=$SAMPLE"
echo "N=$N"
echo "RANK=$RLARK_NODE_RANK TOTAL=$RLARK_TOTAL_NODES INDEX=$RLARK_REPLICA_INDEX"
echo "DOMAIN=${RLARK_DOMAIN-unset} HEAD=${RLARK_HEAD_ADDRESS-unset} RAY_ROLE=${RLARK_RAY_ROLE-unset}"
echo "DATA=$(cat data/answer.txt)"
"#;

/// `app.tar.gz`: `bin/run.sh` (mode 0755) printing [`SCRIPT`]'s lines, `data/answer.txt`.
fn app_tar_gz() -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, mode, body) in [
        ("bin/run.sh", 0o755, SCRIPT.as_bytes()),
        ("data/answer.txt", 0o644, b"42".as_slice()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_size(body.len() as u64);
        builder.append_data(&mut header, path, body)?;
    }
    Ok(builder.into_inner()?.finish()?)
}

/// Create Job `name` of one raw head task `main` with `raw` and the extra task fields.
async fn create_job(h: &Harness, name: &str, raw: Value, extra: Value) -> anyhow::Result<()> {
    let mut task = json!({"name": "main", "head": true, "agentType": "Raw", "role": "Rollout",
                          "raw": raw});
    if let (Some(task), Some(extra)) = (task.as_object_mut(), extra.as_object()) {
        task.extend(extra.clone());
    }
    // A Job may only name a Domain that exists.
    let domain: rlark_api::types::Domain = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
        "metadata": {"name": "lab-net"}, "spec": {"cidr": "10.99.0.0/24"},
    }))?;
    match Api::<rlark_api::types::Domain>::all(h.admin.clone())
        .create(&PostParams::default(), &domain)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"domain": "lab-net", "tasks": [task]},
    }))?;
    Api::<Job>::all(h.admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// The log of replica `index` of `task`.
async fn log_of(h: &Harness, task: &str, index: usize) -> anyhow::Result<String> {
    let task = Api::<Task>::namespaced(h.admin.clone(), NAMESPACE)
        .get(task)
        .await?;
    let dir = rlark_agent::tasks::replica_dir(
        &h.agent_dir.path().join("tasks"),
        NAMESPACE,
        &task.name_any(),
        &task.uid().unwrap_or_default(),
        index,
    );
    let path: PathBuf = dir.join("logs").join(LOG_FILE);
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

fn reports_path(task: &str) -> String {
    format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/{task}/reports")
}

async fn request(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())?;
    tokio::time::timeout(DEADLINE, client.request::<Value>(request))
        .await
        .with_context(|| format!("{path} timed out"))?
        .with_context(|| path.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_artifact_runs_with_the_environment_contract_and_input() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    let archive = app_tar_gz()?;
    let digest = hex::encode(Sha256::digest(&archive));
    let server = ArtifactServer::start(vec![("/releases/app.tar.gz", archive)])?;
    let url = server.url("/releases/app.tar.gz");

    create_job(
        &h,
        "agl",
        json!({"entrypoint": ["./bin/run.sh"], "artifact": url, "artifactSha256": digest,
               "replicas": 2}),
        json!({
            "input": {"question": "what is 6*7?", "sample": {"ids": [1, 2], "lang": "en"}, "n": 4},
            "envFrom": {"input": [
                {"name": "QUESTION", "path": "$.question"},
                {"name": "SAMPLE", "path": "$.sample"},
                {"name": "N", "path": "$['n']"},
            ]},
        }),
    )
    .await?;
    for index in 0..2 {
        h.wait_pod(&format!("agl-main-{index}"), PodPhase::Succeeded)
            .await?;
    }
    for index in 0..2 {
        let log = log_of(&h, "agl-main", index).await?;
        let expected = [
            "QUESTION=what is 6*7?".to_string(),
            r#"SAMPLE={"ids":[1,2],"lang":"en"}"#.to_string(),
            "N=4".to_string(),
            format!("RANK={index} TOTAL=2 INDEX={index}"),
            "DOMAIN=lab-net HEAD=agl-main-0.lab-net RAY_ROLE=head".to_string(),
            "DATA=42".to_string(),
        ];
        for line in expected {
            ensure!(
                log.lines().any(|l| l == line),
                "replica {index}: {line:?} not in {log:?}"
            );
        }
    }
    // Both replicas used one download: the second found it in the agent's cache.
    ensure!(
        server.hits("/releases/app.tar.gz") == 1,
        "downloads: {}",
        server.hits("/releases/app.tar.gz")
    );
    let cached = h
        .agent_dir
        .path()
        .join("artifacts")
        .join(CACHE_DIGEST_DIR)
        .join(&digest);
    ensure!(cached.is_file(), "{} is not cached", cached.display());

    // Events are deleted with their Task (here: the Job's deletion takes the Task along).
    let posted = request(
        &h.admin,
        http::Method::POST,
        &reports_path("agl-main"),
        json!({"type": "reward", "value": 1}),
    )
    .await?;
    ensure!(posted["spec"]["seq"] == json!(1), "{posted}");
    Api::<Job>::all(h.admin.clone())
        .delete("agl", &DeleteParams::default())
        .await?;
    eventually("the task's events are deleted with it", || async {
        let tasks = Api::<Task>::namespaced(h.admin.clone(), NAMESPACE);
        if tasks.get_opt("agl-main").await?.is_some() {
            return Ok(None);
        }
        let listed = request(
            &h.admin,
            http::Method::GET,
            &reports_path("agl-main"),
            Value::Null,
        )
        .await?;
        Ok(listed["items"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .await?;
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checksum_mismatch_fails_the_replica_and_names_both_digests() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    let archive = app_tar_gz()?;
    let actual = hex::encode(Sha256::digest(&archive));
    let server = ArtifactServer::start(vec![("/app.tar.gz", archive)])?;
    let wrong = "ab".repeat(32);
    create_job(
        &h,
        "bad",
        json!({"entrypoint": ["./bin/run.sh"], "artifact": server.url("/app.tar.gz"),
               "artifactSha256": wrong}),
        json!({}),
    )
    .await?;
    let pod = h.wait_pod("bad-main-0", PodPhase::Failed).await?;
    let status = pod.status.context("status")?;
    ensure!(
        status.reason.as_deref() == Some("ArtifactChecksumMismatch"),
        "{status:?}"
    );
    let message = status.message.unwrap_or_default();
    ensure!(
        message.contains(&wrong) && message.contains(&actual) && message.contains("/app.tar.gz"),
        "{message}"
    );
    // Nothing was cached or unpacked.
    let digest_dir = h.agent_dir.path().join("artifacts").join(CACHE_DIGEST_DIR);
    let cached = std::fs::read_dir(&digest_dir)
        .map(|d| d.count())
        .unwrap_or(0);
    ensure!(cached == 0, "{cached} files in {}", digest_dir.display());

    // A 404 fails it too, with the status in the message; the agent keeps serving.
    create_job(
        &h,
        "gone",
        json!({"entrypoint": ["./bin/run.sh"], "artifact": server.url("/nothing.tar.gz")}),
        json!({}),
    )
    .await?;
    let pod = h.wait_pod("gone-main-0", PodPhase::Failed).await?;
    let status = pod.status.context("status")?;
    ensure!(
        status.reason.as_deref() == Some("ArtifactError"),
        "{status:?}"
    );
    let message = status.message.unwrap_or_default();
    ensure!(message.contains("HTTP 404 Not Found"), "{message}");
    h.stop().await
}
