//! A small Docker Engine API client over the engine's unix socket: hyper's HTTP/1 client
//! connection on a [`tokio::net::UnixStream`], one connection per request.
//!
//! Why not `bollard`: it is not in the tree, its generated models (`bollard-stubs`) are a
//! large compile on the 2-core builders, and the agent needs about fifteen endpoints, all
//! plain JSON plus two streams (logs, the exec hijack), which hyper (already here) speaks.
//! Only `unix://` hosts are supported: the agent runs beside its engine.
//!
//! Paths are unversioned (`/containers/...`): the engine answers them with its own API
//! version, and every field used here exists since API 1.25.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::Value;

/// `DOCKER_HOST` when unset.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";
/// Longest wait for an ordinary (non-streaming) request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed engine request.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The host is not a `unix://` address.
    #[error("docker host {0:?} is not supported: use unix:///path/to/docker.sock")]
    UnsupportedHost(String),
    /// The socket cannot be reached.
    #[error("cannot reach the Docker engine at {}: {source}", socket.display())]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("Docker engine request {what}: {source}")]
    Http {
        /// `METHOD path`.
        what: String,
        /// Why.
        source: hyper::Error,
    },
    /// The engine did not answer in time.
    #[error("Docker engine request {0}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout(String),
    /// The engine answered with an error status.
    #[error("Docker engine: {what}: {status}: {message}")]
    Api {
        /// `METHOD path`.
        what: String,
        /// HTTP status.
        status: u16,
        /// The engine's `message`.
        message: String,
    },
    /// The answer is not what the API documents.
    #[error("Docker engine request {what}: unexpected answer: {message}")]
    Decode {
        /// `METHOD path`.
        what: String,
        /// What is wrong.
        message: String,
    },
}

impl DockerError {
    /// The HTTP status of an [`DockerError::Api`] error.
    pub fn status(&self) -> Option<u16> {
        match self {
            DockerError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one engine.
#[derive(Clone, Debug)]
pub struct DockerClient {
    socket: PathBuf,
}

/// What `GET /containers/{id}/json` says (the fields the runtime uses).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerInspect {
    /// Full id.
    pub id: String,
    /// `/name`.
    #[serde(default)]
    pub name: String,
    /// Its state.
    #[serde(default)]
    pub state: ContainerState,
    /// Its labels (from `Config.Labels`).
    #[serde(default)]
    pub config: ContainerConfig,
}

/// `Config` of an inspected container.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfig {
    /// Labels.
    #[serde(default)]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

/// `State` of an inspected container.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerState {
    /// `created`, `running`, `paused`, `restarting`, `removing`, `exited`, `dead`.
    #[serde(default)]
    pub status: String,
    /// Whether it runs.
    #[serde(default)]
    pub running: bool,
    /// Host pid of its main process (0 when not running).
    #[serde(default)]
    pub pid: u32,
    /// Exit code of the last run.
    #[serde(default)]
    pub exit_code: i64,
    /// Killed by the kernel's OOM killer.
    #[serde(rename = "OOMKilled", default)]
    pub oom_killed: bool,
    /// The engine's error about its start, if any.
    #[serde(default)]
    pub error: String,
    /// RFC 3339 start time.
    #[serde(default)]
    pub started_at: String,
    /// RFC 3339 end time (`0001-01-01T00:00:00Z` while it runs).
    #[serde(default)]
    pub finished_at: String,
}

/// One entry of `GET /containers/json`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerSummary {
    /// Full id.
    pub id: String,
    /// `/name`s.
    #[serde(default)]
    pub names: Vec<String>,
    /// Labels.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// `running`, `exited`, ...
    #[serde(default)]
    pub state: String,
}

/// What `GET /exec/{id}/json` says.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExecInspect {
    /// Whether it still runs.
    #[serde(default)]
    pub running: bool,
    /// Its exit code, once ended.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Host pid of the exec'd process.
    #[serde(default)]
    pub pid: u32,
}

impl DockerClient {
    /// A client of the engine at `host` (`unix:///var/run/docker.sock`, or a bare path).
    pub fn new(host: &str) -> Result<Self, DockerError> {
        let socket = match host.strip_prefix("unix://") {
            Some(path) if path.starts_with('/') => PathBuf::from(path),
            None if host.starts_with('/') => PathBuf::from(host),
            _ => return Err(DockerError::UnsupportedHost(host.to_string())),
        };
        Ok(Self { socket })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn connect(
        &self,
        upgrades: bool,
    ) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, DockerError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| DockerError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| DockerError::Http {
                what: "handshake".to_string(),
                source,
            })?;
        if upgrades {
            tokio::spawn(async move {
                if let Err(error) = connection.with_upgrades().await {
                    tracing::debug!(%error, "docker connection");
                }
            });
        } else {
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "docker connection");
                }
            });
        }
        Ok(sender)
    }

    fn build(
        method: http::Method,
        path: &str,
        body: Option<&Value>,
        upgrade: bool,
    ) -> http::Request<Full<Bytes>> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "docker");
        let body = match body {
            Some(body) => {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(body.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        if upgrade {
            builder = builder
                .header(http::header::CONNECTION, "Upgrade")
                .header(http::header::UPGRADE, "tcp");
        }
        // The parts are valid by construction (a path built by this module, fixed headers).
        builder.body(body).unwrap_or_else(|_| {
            let mut request = http::Request::new(Full::new(Bytes::new()));
            *request.uri_mut() = http::Uri::from_static("/_ping");
            request
        })
    }

    /// Send a request and return the response with its body unread.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<http::Response<Incoming>, DockerError> {
        let what = format!("{method} {path}");
        let mut sender = self.connect(false).await?;
        let request = Self::build(method, path, body, false);
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| DockerError::Http {
                what: what.clone(),
                source,
            })?;
        check_status(&what, response).await
    }

    /// A request whose whole answer is read (at most [`REQUEST_TIMEOUT`]).
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Bytes, DockerError> {
        let what = format!("{method} {path}");
        let exchange = async {
            let response = self.send(method, path, body).await?;
            read_body(&what, response.into_body()).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| DockerError::Timeout(what.clone()))?
    }

    async fn call_json<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, DockerError> {
        let what = format!("{method} {path}");
        let bytes = self.call(method, path, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| DockerError::Decode {
            what,
            message: e.to_string(),
        })
    }

    /// `GET /version`: the engine's version, also a check that it answers.
    pub async fn version(&self) -> Result<String, DockerError> {
        let version: Value = self.call_json(http::Method::GET, "/version", None).await?;
        Ok(format!(
            "{} (API {})",
            version["Version"].as_str().unwrap_or("unknown"),
            version["ApiVersion"].as_str().unwrap_or("unknown")
        ))
    }

    /// Whether image `image` exists locally (`GET /images/{name}/json`).
    pub async fn image_exists(&self, image: &str) -> Result<bool, DockerError> {
        match self
            .call(
                http::Method::GET,
                &format!("/images/{}/json", encode(image)),
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if error.status() == Some(404) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// `POST /containers/create?name=NAME` with `config`; returns the id.
    pub async fn create_container(
        &self,
        name: &str,
        config: &Value,
    ) -> Result<String, DockerError> {
        let path = format!("/containers/create?name={}", encode(name));
        let created: Value = self
            .call_json(http::Method::POST, &path, Some(config))
            .await?;
        created["Id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| DockerError::Decode {
                what: format!("POST {path}"),
                message: "no Id in the answer".to_string(),
            })
    }

    /// `POST /containers/{id}/start` (an already started container is fine).
    pub async fn start_container(&self, id: &str) -> Result<(), DockerError> {
        match self
            .call(http::Method::POST, &format!("/containers/{id}/start"), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if error.status() == Some(304) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `GET /containers/{id}/json`; `None` when there is no such container.
    pub async fn inspect(&self, id: &str) -> Result<Option<ContainerInspect>, DockerError> {
        match self
            .call_json(http::Method::GET, &format!("/containers/{id}/json"), None)
            .await
        {
            Ok(inspect) => Ok(Some(inspect)),
            Err(error) if error.status() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `POST /containers/{id}/wait?condition=not-running`: returns once it does not run
    /// (at once when it does not); no timeout. Its exit code.
    pub async fn wait_not_running(&self, id: &str) -> Result<i64, DockerError> {
        let path = format!("/containers/{id}/wait?condition=not-running");
        let what = format!("POST {path}");
        let response = self.send(http::Method::POST, &path, None).await?;
        let bytes = read_body(&what, response.into_body()).await?;
        let answer: Value = serde_json::from_slice(&bytes).map_err(|e| DockerError::Decode {
            what: what.clone(),
            message: e.to_string(),
        })?;
        answer["StatusCode"]
            .as_i64()
            .ok_or_else(|| DockerError::Decode {
                what,
                message: format!("no StatusCode in {answer}"),
            })
    }

    /// `POST /containers/{id}/kill?signal=SIG` (a container that does not run is fine).
    pub async fn kill(&self, id: &str, signal: &str) -> Result<(), DockerError> {
        match self
            .call(
                http::Method::POST,
                &format!("/containers/{id}/kill?signal={signal}"),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            // 409: not running; 404: gone.
            Err(error) if matches!(error.status(), Some(409 | 404)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `DELETE /containers/{id}?force=true&v=true` (a missing container is fine).
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        match self
            .call(
                http::Method::DELETE,
                &format!("/containers/{id}?force=true&v=true"),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if error.status() == Some(404) => Ok(()),
            // 409 "removal already in progress".
            Err(error) if error.status() == Some(409) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `GET /containers/json?all=true&filters={"label":[labels]}`: every container (any
    /// state) carrying all of `labels` (`key=value` each).
    pub async fn list(&self, labels: &[String]) -> Result<Vec<ContainerSummary>, DockerError> {
        let filters = serde_json::json!({ "label": labels }).to_string();
        let path = format!("/containers/json?all=true&filters={}", encode(&filters));
        self.call_json(http::Method::GET, &path, None).await
    }

    /// `GET /containers/{id}/logs?follow=true&stdout&stderr&timestamps=true[&since=S]`:
    /// the raw (multiplexed, see [`super::logs::Demux`]) stream, to be read until it ends.
    pub async fn logs(&self, id: &str, since: Option<&str>) -> Result<Incoming, DockerError> {
        let mut path =
            format!("/containers/{id}/logs?follow=true&stdout=true&stderr=true&timestamps=true");
        if let Some(since) = since {
            path.push_str("&since=");
            path.push_str(&encode(since));
        }
        Ok(self.send(http::Method::GET, &path, None).await?.into_body())
    }

    /// `POST /containers/{id}/exec`; returns the exec id.
    pub async fn exec_create(
        &self,
        id: &str,
        command: &[String],
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> Result<String, DockerError> {
        let mut body = serde_json::json!({
            "Cmd": command,
            "AttachStdin": stdin,
            "AttachStdout": stdout,
            "AttachStderr": stderr,
            "Tty": tty,
        });
        if tty {
            body["Env"] = serde_json::json!(["TERM=xterm"]);
        }
        let path = format!("/containers/{id}/exec");
        let created: Value = self
            .call_json(http::Method::POST, &path, Some(&body))
            .await?;
        created["Id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| DockerError::Decode {
                what: format!("POST {path}"),
                message: "no Id in the answer".to_string(),
            })
    }

    /// `POST /exec/{id}/start` with the connection hijacked: the returned stream carries
    /// the process's input and its output (raw with a TTY, multiplexed without).
    pub async fn exec_start(
        &self,
        exec: &str,
        tty: bool,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, DockerError> {
        let path = format!("/exec/{exec}/start");
        let what = format!("POST {path}");
        let mut sender = self.connect(true).await?;
        let body = serde_json::json!({ "Detach": false, "Tty": tty });
        let request = Self::build(http::Method::POST, &path, Some(&body), true);
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| DockerError::Http {
                what: what.clone(),
                source,
            })?;
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            check_status(&what, response).await?;
            return Err(DockerError::Decode {
                what,
                message: "the engine did not switch protocols".to_string(),
            });
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|source| DockerError::Http { what, source })?;
        Ok(TokioIo::new(upgraded))
    }

    /// `POST /exec/{id}/resize?h=H&w=W`.
    pub async fn exec_resize(
        &self,
        exec: &str,
        height: u16,
        width: u16,
    ) -> Result<(), DockerError> {
        self.call(
            http::Method::POST,
            &format!("/exec/{exec}/resize?h={height}&w={width}"),
            None,
        )
        .await
        .map(|_| ())
    }

    /// `GET /exec/{id}/json`.
    pub async fn exec_inspect(&self, exec: &str) -> Result<ExecInspect, DockerError> {
        self.call_json(http::Method::GET, &format!("/exec/{exec}/json"), None)
            .await
    }
}

/// A response with a success status, or the engine's error (its `message`).
async fn check_status(
    what: &str,
    response: http::Response<Incoming>,
) -> Result<http::Response<Incoming>, DockerError> {
    let status = response.status();
    if status.is_success() || status == http::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(response);
    }
    let bytes = read_body(what, response.into_body())
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).trim().to_string());
    Err(DockerError::Api {
        what: what.to_string(),
        status: status.as_u16(),
        message,
    })
}

async fn read_body(what: &str, body: Incoming) -> Result<Bytes, DockerError> {
    body.collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|source| DockerError::Http {
            what: what.to_string(),
            source,
        })
}

/// Percent-encode a path segment or query value (everything but unreserved characters).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(byte));
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_encoding() {
        assert_eq!(
            DockerClient::new("unix:///var/run/docker.sock")
                .expect("unix")
                .socket(),
            Path::new("/var/run/docker.sock")
        );
        assert!(DockerClient::new("/run/d.sock").is_ok());
        let error = DockerClient::new("tcp://10.0.0.1:2375").expect_err("tcp");
        assert!(error.to_string().contains("tcp://10.0.0.1:2375"), "{error}");
        assert!(DockerClient::new("unix://relative").is_err());
        assert_eq!(encode("rlark-test/busybox:1"), "rlark-test%2Fbusybox%3A1");
        assert_eq!(
            encode(r#"{"a":["b=c"]}"#),
            "%7B%22a%22%3A%5B%22b%3Dc%22%5D%7D"
        );
    }
}
