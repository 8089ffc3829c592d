//! The agent's side of joining an installation and keeping its certificate fresh.
//!
//! **Join** ([`join`]): the agent holds a bootstrap token and the CA pin (`sha256:` of the
//! CA's public key), nothing else. It connects with [`ServerVerifier::pinned_ca`], so it
//! only talks to a server whose CA matches the pin; makes its key locally; sends the token
//! and a CSR to `POST /rlark/v1/join`; and writes the certificate it gets back, its key and
//! the CA bundle into its directory. The key never leaves the host.
//!
//! **Renewal** ([`Renewer`]): at 2/3 of the certificate's lifetime the agent makes a new key
//! and CSR and sends it to `POST /rlark/v1/renew`, authenticated by its current certificate.
//! The new credentials are written atomically and published on a `watch` channel; existing
//! connections keep working with the old certificate until they close on their own.
//!
//! Files in the agent directory (all mode 0600):
//!
//! | file | what |
//! |---|---|
//! | `agent.pem` | certificate followed by its private key (one file, replaced atomically) |
//! | `ca.crt` | the installation's CA bundle |
//! | `agent.json` | server URL and cluster ID |
//! | `agent.kubeconfig` | kubeconfig for the agent identity (namespace `rlark-<clusterID>`) |

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use rlark_pki::{
    CertInfo, ServerVerifier, generate_key_and_csr, write_private_file, write_public_file,
};

/// Credentials file (certificate + key).
pub const AGENT_PEM: &str = "agent.pem";
/// CA bundle file.
pub const AGENT_CA: &str = "ca.crt";
/// Server URL and cluster ID.
pub const AGENT_STATE: &str = "agent.json";
/// Kubeconfig of the agent identity.
pub const AGENT_KUBECONFIG: &str = "agent.kubeconfig";
/// Largest response body read from the server.
const MAX_RESPONSE: usize = 256 * 1024;
/// Requests to the server give up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Failures of join and renewal, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("server URL {0:?} must look like https://HOST:PORT")]
    BadUrl(String),
    #[error(transparent)]
    BadPin(#[from] rlark_pki::BadPin),
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP: {0}")]
    Http(String),
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    #[error("the server refused ({code}): {message}")]
    Refused { code: u16, message: String },
    #[error("unexpected response: {0}")]
    Response(String),
    #[error("agent directory {dir}: {reason}")]
    State { dir: PathBuf, reason: String },
    #[error(
        "the agent certificate {serial} expired at {not_after}; it can no longer renew itself: \
         join again with a new bootstrap token"
    )]
    Expired { serial: String, not_after: String },
    #[error(transparent)]
    Pki(#[from] rlark_pki::PkiError),
}

/// What [`join`] needs.
#[derive(Clone, Debug)]
pub struct JoinOptions {
    /// `https://HOST:PORT` of the server.
    pub server: String,
    /// The bootstrap token (`abcdef.0123456789abcdef`).
    pub token: String,
    /// `sha256:<hex>` of the CA's public key.
    pub ca_hash: String,
    /// The cluster ID to join as; `None` when the token is bound to one.
    pub cluster_id: Option<String>,
    /// Where to write the credentials (created with mode 0700).
    pub dir: PathBuf,
}

/// Saved next to the credentials: where the server is and who we are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    pub server: String,
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
}

/// The agent's current credentials, loaded from its directory.
#[derive(Clone)]
pub struct AgentCredentials {
    pub state: AgentState,
    /// Certificate PEM.
    pub cert_pem: String,
    /// Private key PEM. Secret.
    pub key_pem: String,
    /// CA bundle PEM.
    pub ca_pem: String,
    pub info: CertInfo,
}

impl std::fmt::Debug for AgentCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCredentials")
            .field("state", &self.state)
            .field("serial", &self.info.serial)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl AgentCredentials {
    /// Load from an agent directory written by [`join`].
    pub fn load(dir: &Path) -> Result<AgentCredentials, JoinError> {
        let state_err = |reason: String| JoinError::State {
            dir: dir.to_path_buf(),
            reason,
        };
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| {
                state_err(format!(
                    "read {name}: {e} (has this host joined? run `rlark join`)"
                ))
            })
        };
        let state: AgentState = serde_json::from_str(&read(AGENT_STATE)?)
            .map_err(|e| state_err(format!("{AGENT_STATE}: {e}")))?;
        let pem = read(AGENT_PEM)?;
        let (cert_pem, key_pem) = split_pem(&pem).ok_or_else(|| {
            state_err(format!(
                "{AGENT_PEM} must hold a CERTIFICATE and a PRIVATE KEY block"
            ))
        })?;
        let info = CertInfo::from_pem(&cert_pem)?;
        Ok(AgentCredentials {
            state,
            cert_pem,
            key_pem,
            ca_pem: read(AGENT_CA)?,
            info,
        })
    }

    /// A rustls client config that trusts the CA bundle and presents this certificate.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, JoinError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| JoinError::Response(format!("CA bundle: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| JoinError::Response(format!("CA bundle: {e}")))?;
        }
        let cert = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| JoinError::Response(format!("certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| JoinError::Response(format!("key: {e}")))?;
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rlark_pki::tls_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| JoinError::Http(e.to_string()))?
                .with_root_certificates(roots)
                .with_client_auth_cert(vec![cert], key)
                .map_err(|e| JoinError::Response(format!("client certificate: {e}")))?;
        Ok(Arc::new(config))
    }
}

fn split_pem(pem: &str) -> Option<(String, String)> {
    let key_start = pem.find("-----BEGIN PRIVATE KEY-----")?;
    let cert = pem[..key_start].trim().to_string() + "\n";
    let key = pem[key_start..].trim().to_string() + "\n";
    cert.contains("-----BEGIN CERTIFICATE-----")
        .then_some((cert, key))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IssuedResponse {
    certificate: String,
    ca_bundle: String,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
}

/// Split `https://host:port[/]` into (host, port).
fn parse_server(url: &str) -> Result<(String, u16), JoinError> {
    let bad = || JoinError::BadUrl(url.to_string());
    let rest = url.strip_prefix("https://").ok_or_else(bad)?;
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') || rest.is_empty() {
        return Err(bad());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, port) = v6.split_once("]:").ok_or_else(bad)?;
        (host.to_string(), port)
    } else {
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        (host.to_string(), port)
    };
    let port = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// POST `body` as JSON to `path` on `server` over TLS with `tls`; the JSON answer, or
/// [`JoinError::Refused`] with the server's `Status` message.
async fn post_json(
    server: &str,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, JoinError> {
    tokio::time::timeout(REQUEST_TIMEOUT, post_json_inner(server, tls, path, body))
        .await
        .map_err(|_| JoinError::Timeout(REQUEST_TIMEOUT))?
}

async fn post_json_inner(
    server: &str,
    tls: Arc<rustls::ClientConfig>,
    path: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value, JoinError> {
    let (host, port) = parse_server(server)?;
    let addr = format!("{host}:{port}");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| JoinError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let name = ServerName::try_from(host.clone()).map_err(|_| JoinError::BadUrl(server.into()))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|source| JoinError::Tls {
            addr: addr.clone(),
            source,
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| JoinError::Http(e.to_string()))?;
    let driver = tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "join connection ended");
        }
    });
    let request = http::Request::post(path)
        .header(http::header::HOST, addr.as_str())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| JoinError::Http(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| JoinError::Http(e.to_string()))?;
    let status = response.status();
    let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| JoinError::Http(e.to_string()))?
        .to_bytes();
    driver.abort();
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        JoinError::Response(format!(
            "{status}: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })?;
    if !status.is_success() {
        let message = value
            .get("message")
            .and_then(|m| m.as_str())
            .unwrap_or("no message")
            .to_string();
        return Err(JoinError::Refused {
            code: status.as_u16(),
            message,
        });
    }
    Ok(value)
}

fn write_credentials(
    dir: &Path,
    state: &AgentState,
    issued: &IssuedResponse,
    key_pem: &str,
) -> Result<CertInfo, JoinError> {
    let info = CertInfo::from_pem(&issued.certificate)?;
    // Public: isolated replicas read it (RLARK_CA_FILE) as users of their own.
    write_public_file(&dir.join(AGENT_CA), issued.ca_bundle.as_bytes())?;
    write_private_file(
        &dir.join(AGENT_PEM),
        format!("{}{}", issued.certificate, key_pem).as_bytes(),
    )?;
    let state_json =
        serde_json::to_string_pretty(state).map_err(|e| JoinError::Response(e.to_string()))?;
    write_private_file(&dir.join(AGENT_STATE), state_json.as_bytes())?;
    let kubeconfig = rlark_pki::kubeconfig_yaml(
        &state.server,
        &issued.ca_bundle,
        &issued.certificate,
        key_pem,
        &info.common_name,
    );
    write_private_file(&dir.join(AGENT_KUBECONFIG), kubeconfig.as_bytes())?;
    Ok(info)
}

/// Join the installation at `options.server` (see the module docs). Returns the loaded
/// credentials. Nothing is written unless the server issued a certificate.
pub async fn join(options: &JoinOptions) -> Result<AgentCredentials, JoinError> {
    parse_server(&options.server)?;
    let verifier = Arc::new(ServerVerifier::pinned_ca(&options.ca_hash)?);
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rlark_pki::tls_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| JoinError::Http(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let key_and_csr = generate_key_and_csr(&format!(
        "join:{}",
        options.cluster_id.as_deref().unwrap_or("")
    ))?;
    let mut body = serde_json::json!({"token": options.token.trim(), "csr": key_and_csr.csr_pem});
    if let Some(id) = &options.cluster_id {
        body["clusterID"] = serde_json::json!(id);
    }
    let value = post_json(&options.server, Arc::new(tls), "/rlark/v1/join", &body).await?;
    let issued: IssuedResponse =
        serde_json::from_value(value).map_err(|e| JoinError::Response(e.to_string()))?;
    let cluster_id = issued
        .cluster_id
        .clone()
        .ok_or_else(|| JoinError::Response("join response has no clusterID".into()))?;
    rlark_pki::create_private_dir(&options.dir)?;
    let state = AgentState {
        server: options.server.trim_end_matches('/').to_string(),
        cluster_id,
    };
    write_credentials(&options.dir, &state, &issued, &key_and_csr.key_pem)?;
    tracing::info!(dir = %options.dir.display(), cluster = %state.cluster_id, "joined");
    AgentCredentials::load(&options.dir)
}

/// Renew now: new key, CSR, `POST /rlark/v1/renew` with the current certificate; writes and
/// returns the new credentials.
pub async fn renew(dir: &Path) -> Result<AgentCredentials, JoinError> {
    let current = AgentCredentials::load(dir)?;
    if current.info.not_after <= SystemTime::now() {
        return Err(JoinError::Expired {
            serial: current.info.serial.clone(),
            not_after: chrono::DateTime::<chrono::Utc>::from(current.info.not_after)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
    }
    let key_and_csr = generate_key_and_csr(&current.info.common_name)?;
    let value = post_json(
        &current.state.server,
        current.client_config()?,
        "/rlark/v1/renew",
        &serde_json::json!({"csr": key_and_csr.csr_pem}),
    )
    .await?;
    let issued: IssuedResponse =
        serde_json::from_value(value).map_err(|e| JoinError::Response(e.to_string()))?;
    let info = write_credentials(dir, &current.state, &issued, &key_and_csr.key_pem)?;
    tracing::info!(serial = %info.serial, not_after = ?info.not_after, "renewed certificate");
    AgentCredentials::load(dir)
}

/// Renews the agent's certificate at 2/3 of its lifetime, forever (until shutdown), and
/// publishes each new credential set. A failed renewal is retried with capped backoff
/// (1 s doubling to 60 s), but never later than the certificate's expiry allows.
#[derive(Debug)]
pub struct Renewer {
    dir: PathBuf,
    current: watch::Sender<Arc<AgentCredentials>>,
}

impl Renewer {
    /// Load the credentials in `dir`.
    pub fn new(dir: &Path) -> Result<Renewer, JoinError> {
        let credentials = AgentCredentials::load(dir)?;
        let (current, _) = watch::channel(Arc::new(credentials));
        Ok(Renewer {
            dir: dir.to_path_buf(),
            current,
        })
    }

    /// The current credentials; changes after each renewal. New connections should use the
    /// latest value; healthy connections need not reconnect.
    pub fn subscribe(&self) -> watch::Receiver<Arc<AgentCredentials>> {
        self.current.subscribe()
    }

    /// Run until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let renew_at = self.current.borrow().info.renew_at();
            let wait = renew_at
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tracing::debug!(wait_secs = wait.as_secs_f64(), "next certificate renewal");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            match renew(&self.dir).await {
                Ok(credentials) => {
                    backoff = Duration::from_secs(1);
                    self.current.send_replace(Arc::new(credentials));
                }
                Err(error) => {
                    tracing::warn!(%error, retry_secs = backoff.as_secs(), "certificate renewal failed");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_parse() {
        assert_eq!(
            parse_server("https://127.0.0.1:8443").unwrap(),
            ("127.0.0.1".to_string(), 8443)
        );
        assert_eq!(
            parse_server("https://[::1]:9/").unwrap(),
            ("::1".to_string(), 9)
        );
        for bad in [
            "http://h:1",
            "https://h",
            "https://:1",
            "https://h:x",
            "https://h:1/path",
            "",
        ] {
            assert!(
                matches!(parse_server(bad), Err(JoinError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn credential_files_split() {
        let cert = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nBB==\n-----END PRIVATE KEY-----\n";
        let (c, k) = split_pem(&format!("{cert}{key}")).unwrap();
        assert_eq!((c.as_str(), k.as_str()), (cert, key));
        assert!(split_pem(cert).is_none());
        assert!(split_pem(key).is_none());
    }
}
