//! `rlark token`, `rlark cert`, `rlark ca` and `rlark kubeconfig --user`: clients of the
//! server's security API under `/rlark/v1/` (admin credentials), and the offline CA
//! rotation of a data directory.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};

use super::client::{DEFAULT_KUBECONFIG, format_status};
use super::table::align;
use super::{ClientArgs, DEFAULT_DATA_DIR};

/// Bootstrap-token lifetime when `--ttl` is not given (the server's default too).
const DEFAULT_BOOTSTRAP_TTL_SECONDS: u64 = 3600;

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a bootstrap token and print the commands that join with it: a raw host
    /// (deploy/install.sh), a Docker host (docker run), a Kubernetes cluster (helm install)
    /// and `rlark join`; with `--user`, a bearer token of a user instead.
    Create(TokenCreateArgs),
    /// Print a one-time login link to the web console for the kubeconfig's user (admins):
    /// it logs a browser in once, within 15 minutes.
    LoginLink(LoginLinkArgs),
}

#[derive(Debug, Args)]
pub(crate) struct LoginLinkArgs {
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub(crate) struct TokenCreateArgs {
    /// How long the token is valid: `30s`, `10m`, `1h`, `2d` or plain seconds. Default: 1h
    /// for bootstrap tokens; user tokens stay valid until revoked.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    ttl: Option<u64>,
    /// The cluster that joins with the bootstrap token (required: a join token is bound to
    /// one cluster ID; the joining agent may omit --cluster-id).
    #[arg(
        long = "cluster-id",
        value_name = "ID",
        conflicts_with = "user",
        required_unless_present = "user"
    )]
    cluster_id: Option<String>,
    /// Let the token give a cluster that joined before (its agent's credentials were lost,
    /// or it was revoked with `rlark cert revoke --cluster-id`) a new identity; without it
    /// such a join is refused. Recorded on the token and in the audit log.
    #[arg(long, requires = "cluster_id", conflicts_with = "user")]
    rejoin: bool,
    /// Make a bearer token of this user (for `Authorization: Bearer`) instead of a bootstrap
    /// token; prints only the token (its id goes to stderr).
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Role of the user token [default: viewer].
    #[arg(long, value_enum, requires = "user")]
    role: Option<UserRole>,
    /// Print the server's response as JSON.
    #[arg(short = 'o', long, value_name = "FORMAT", value_enum)]
    output: Option<OutputFormat>,
    #[arg(skip)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertCommand {
    /// List the client certificates the server issued.
    List(CertListArgs),
    /// Revoke one certificate by serial, or every certificate of a user or a cluster's
    /// agent, or a bearer token.
    Revoke(CertRevokeArgs),
    /// Sign a certificate signing request (CSR) for a role; prints the certificate PEM.
    Sign(CertSignArgs),
    /// Sign an OpenSSH public key with the installation's SSH CA: role `ssh-guest` (a user's
    /// SSH logins to tasks) or `domain` (a cluster's pod-network forwards); prints the
    /// certificate line (save it as `KEY-cert.pub` beside the key).
    #[command(name = "sign-ssh")]
    SignSsh(CertSignSshArgs),
    /// List the revoked certificates.
    Revocations(CertListArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CertListArgs {
    /// Print the server's response as JSON instead of a table.
    #[arg(short = 'o', long, value_name = "FORMAT", value_enum)]
    output: Option<OutputFormat>,
    #[arg(skip)]
    client: ClientArgs,
}

#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("target")
        .required(true)
        .args(["serial", "cluster_id", "user", "token_id"])
))]
pub(crate) struct CertRevokeArgs {
    /// Serial number of the certificate, in hex (`0A:1B` and `0x0a1b` work too).
    #[arg(value_parser = parse_serial)]
    serial: Option<String>,
    /// Revoke every certificate of the agent of this cluster, and its `domain` SSH
    /// certificates.
    #[arg(long = "cluster-id", value_name = "ID")]
    cluster_id: Option<String>,
    /// Revoke every certificate and bearer token of this user.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Revoke the bearer token with this id (as `rlark token create --user` printed it).
    #[arg(long = "token-id", value_name = "ID")]
    token_id: Option<String>,
    /// Why; recorded with the revocation and in the audit log.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    #[arg(skip)]
    client: ClientArgs,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("subject").required(true).args(["name", "cluster_id"])))]
pub(crate) struct CertSignArgs {
    /// Role the certificate grants.
    #[arg(long, value_enum)]
    role: CertRole,
    /// User name (roles admin and viewer) or peer name (role peer).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Cluster ID (role agent).
    #[arg(long = "cluster-id", value_name = "ID")]
    cluster_id: Option<String>,
    /// PEM certificate signing request; `-` reads it from stdin.
    #[arg(long, value_name = "FILE")]
    csr: PathBuf,
    /// How long the certificate is valid: `30s`, `10m`, `1h`, `30d` or plain seconds
    /// [default: the server's].
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    validity: Option<u64>,
    /// Write the certificate to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[arg(skip)]
    client: ClientArgs,
}

#[derive(Debug, Args)]
pub(crate) struct CertSignSshArgs {
    /// Role the certificate grants.
    #[arg(long, value_enum)]
    role: SshRole,
    /// The OpenSSH public key to sign (an `id_*.pub` file); `-` reads it from stdin.
    #[arg(long = "public-key", value_name = "FILE")]
    public_key: PathBuf,
    /// User name (role ssh-guest).
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Domain name (role domain).
    #[arg(long, value_name = "NAME")]
    domain: Option<String>,
    /// Cluster ID whose members the certificate speaks for (role domain).
    #[arg(long = "cluster-id", value_name = "ID")]
    cluster_id: Option<String>,
    /// How long the certificate is valid: `30s`, `10m`, `1h`, `30d` or plain seconds
    /// [default: 24h].
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    validity: Option<u64>,
    /// Write the certificate to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[arg(skip)]
    client: ClientArgs,
}

/// Role of an OpenSSH certificate signed by `rlark cert sign-ssh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SshRole {
    /// A user's SSH access to tasks (`--user`).
    #[value(name = "ssh-guest")]
    SshGuest,
    /// A cluster's pod-network forwards in one Domain (`--domain`, `--cluster-id`).
    Domain,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CaCommand {
    /// Start a CA rotation in DIR/pki (offline; restart the server afterwards): a new CA
    /// signs from now on, the current one stays trusted until `rlark ca retire`.
    Rotate(CaArgs),
    /// Finish a CA rotation in DIR/pki (offline; restart the server afterwards): stop
    /// trusting the previous CA, whose certificates then stop working.
    Retire(CaArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CaArgs {
    /// Data directory of the server; the CA is in DIR/pki.
    #[arg(long, value_name = "DIR", env = "RLARK_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

/// Role of a user's certificate or bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum UserRole {
    /// Read-only access.
    Viewer,
    /// Full access.
    Admin,
}

impl UserRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UserRole::Viewer => "viewer",
            UserRole::Admin => "admin",
        }
    }
}

/// Role of a certificate signed by `rlark cert sign`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CertRole {
    /// A user with full access (`--name`).
    Admin,
    /// A read-only user (`--name`).
    Viewer,
    /// The agent of a cluster (`--cluster-id`).
    Agent,
    /// A peer server (`--name`).
    Peer,
}

impl CertRole {
    fn as_str(self) -> &'static str {
        match self {
            CertRole::Admin => "admin",
            CertRole::Viewer => "viewer",
            CertRole::Agent => "agent",
            CertRole::Peer => "peer",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    Json,
}

/// `30s`, `10m`, `1h`, `2d` or plain seconds, as a positive number of whole seconds.
pub(crate) fn parse_seconds(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| {
        format!("invalid duration {text:?}: expected e.g. 30s, 10m, 1h, 2d or plain seconds")
    })?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 24 * 3600,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {text:?}: use s, m, h or d"
            ));
        }
    };
    let seconds = value
        .checked_mul(factor)
        .ok_or_else(|| format!("duration {text:?} is too long"))?;
    if seconds == 0 {
        return Err(format!("duration {text:?} must be positive"));
    }
    Ok(seconds)
}

fn parse_serial(text: &str) -> Result<String, String> {
    rlark_pki::normalize_serial(text).ok_or_else(|| format!("serial {text:?} is not hexadecimal"))
}

/// An admin client of the `/rlark/v1` routes and the server URL of its kubeconfig.
pub(crate) struct SecurityClient {
    client: kube::Client,
    /// The `server:` of the kubeconfig's current cluster, without a trailing `/`.
    pub server_url: String,
}

impl SecurityClient {
    /// Connect with the kubeconfig of `args` (see [`super::client::kubeconfig_sources`]),
    /// `default` standing for `./.rlark/admin.kubeconfig`.
    pub(crate) async fn connect(
        args: &ClientArgs,
        default: &Path,
    ) -> anyhow::Result<SecurityClient> {
        let kubeconfig = super::client::load_kubeconfig(args, default)?;
        let config = super::client::kube_config(kubeconfig, args).await?;
        let server_url = server_url(&config.cluster_url);
        let client = super::client::build_client(config)?;
        Ok(SecurityClient { client, server_url })
    }

    /// Connect as the client commands do.
    pub(crate) async fn from_args(args: &ClientArgs) -> anyhow::Result<SecurityClient> {
        Self::connect(args, Path::new(DEFAULT_KUBECONFIG)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        let request = http::Request::delete(path)
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .context("build request")?;
        self.send("DELETE", path, request).await
    }

    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .context("build request")?;
        self.send("GET", path, request).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let request = http::Request::post(path)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body).context("encode request")?)
            .context("build request")?;
        self.send("POST", path, request).await
    }

    /// A non-2xx answer becomes an error whose text is kubectl's rendering of the Status
    /// (the Status stays in the chain for [`super::client::report`]).
    async fn send(
        &self,
        method: &str,
        path: &str,
        request: http::Request<Vec<u8>>,
    ) -> anyhow::Result<Value> {
        match self.client.request::<Value>(request).await {
            Ok(value) => Ok(value),
            Err(kube::Error::Api(status)) => {
                let text = format_status(&status);
                Err(anyhow::Error::new(kube::Error::Api(status)).context(text))
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("{method} {path}"))),
        }
    }
}

/// A server URL as written in kubeconfigs: `https://host:port`, no trailing `/`.
fn server_url(uri: &http::Uri) -> String {
    let text = uri.to_string();
    match text.strip_suffix('/') {
        Some(trimmed) if uri.path() == "/" => trimmed.to_string(),
        _ => text,
    }
}

/// A string of the response, or an error naming the missing field.
fn field<'a>(value: &'a Value, name: &str) -> anyhow::Result<&'a str> {
    value[name]
        .as_str()
        .with_context(|| format!("the server's response has no {name}: {value}"))
}

fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Quote a word for a POSIX shell when it needs it.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

pub(crate) async fn token(command: TokenCommand, client: ClientArgs) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create(mut args) => {
            args.client = client;
            token_create(args).await
        }
        TokenCommand::LoginLink(mut args) => {
            args.client = client;
            login_link(args).await
        }
    }
}

/// `rlark token login-link`: `POST /rlark/v1/console/links`, printed as a URL of the server.
async fn login_link(args: LoginLinkArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    let response = api
        .post("/rlark/v1/console/links", &serde_json::json!({}))
        .await?;
    let path = field(&response, "path")?;
    println!("{}{path}", api.server_url);
    let minutes = response["expiresInSeconds"].as_u64().unwrap_or(900) / 60;
    eprintln!("open it in a browser within {minutes} minutes; it works once");
    Ok(())
}

async fn token_create(args: TokenCreateArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    if let Some(user) = &args.user {
        let role = args.role.unwrap_or(UserRole::Viewer);
        let mut body = json!({"kind": "user", "user": user, "role": role.as_str()});
        if let Some(ttl) = args.ttl {
            body["ttlSeconds"] = json!(ttl);
        }
        let response = api.post("/rlark/v1/tokens", &body).await?;
        if args.output == Some(OutputFormat::Json) {
            return print_json(&response);
        }
        let token = field(&response, "token")?;
        let expires = response["expiresAt"].as_str().unwrap_or("revoked");
        eprintln!(
            "bearer token {id} of user {user} ({role}), valid until {expires}; revoke it with \
             `rlark cert revoke --token-id {id}`",
            id = response["id"].as_str().unwrap_or("?"),
            role = role.as_str(),
        );
        println!("{token}");
        return Ok(());
    }
    let ttl = args.ttl.unwrap_or(DEFAULT_BOOTSTRAP_TTL_SECONDS);
    // clap requires --cluster-id without --user.
    let cluster_id = args
        .cluster_id
        .as_deref()
        .context("--cluster-id is required: a join token is bound to one cluster")?;
    let mut body = json!({"kind": "bootstrap", "ttlSeconds": ttl, "clusterID": cluster_id});
    if args.rejoin {
        body["rejoin"] = json!(true);
    }
    let response = api.post("/rlark/v1/tokens", &body).await?;
    if args.output == Some(OutputFormat::Json) {
        return print_json(&response);
    }
    let token = field(&response, "token")?;
    let ca_hash = field(&response, "caHash")?;
    let commands = join_commands(&api.server_url, token, ca_hash, cluster_id);
    let scope = if args.rejoin {
        format!(
            "for cluster {cluster_id} only; it may give {cluster_id} a new identity even if it \
             joined before or was revoked"
        )
    } else {
        format!("for cluster {cluster_id} only")
    };
    println!(
        "Bootstrap token {id} ({scope}), valid until {expires}:\n{token}\n\n\
         Raw host (as root, in this release's source tree; installs the binary and the systemd \
         units, starts rlark-agent):\n{raw}\n\n\
         Docker host (image rlark:{version} built from deploy/docker/Dockerfile and loaded \
         there):\n{docker}\n\n\
         Kubernetes cluster (Helm, kubectl context of that cluster, in this release's source \
         tree):\n{helm}\n\n\
         Credentials only, into a directory (rlark join --help):\n{join}",
        id = response["id"].as_str().unwrap_or("?"),
        expires = response["expiresAt"].as_str().unwrap_or("?"),
        raw = commands.raw_host,
        docker = commands.docker_host,
        helm = commands.kubernetes,
        join = commands.join,
        version = env!("CARGO_PKG_VERSION"),
    );
    Ok(())
}

/// The commands that join a machine with a bootstrap token, one for each kind of target.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct JoinCommands {
    /// `deploy/install.sh agent ...`: binary, units, `/etc/rlark/agent.env`, started.
    pub raw_host: String,
    /// `docker run ... rlark:VERSION agent --agent-type docker ...`.
    pub docker_host: String,
    /// `helm install ... deploy/helm/rlark-agent ...`.
    pub kubernetes: String,
    /// `rlark join ...`: credentials only.
    pub join: String,
}

/// The join commands for `server`, `token` and `ca_hash`, for cluster `cluster_id` (the
/// one the token is bound to).
pub(crate) fn join_commands(
    server: &str,
    token: &str,
    ca_hash: &str,
    cluster_id: &str,
) -> JoinCommands {
    let (server, token, ca_hash) = (shell_word(server), shell_word(token), shell_word(ca_hash));
    let cluster = shell_word(cluster_id);
    let join = format!(
        "rlark join --server {server} --token {token} --ca-hash {ca_hash} --cluster-id {cluster}"
    );
    let version = env!("CARGO_PKG_VERSION");
    JoinCommands {
        raw_host: format!(
            "./deploy/install.sh agent --server {server} --cluster-id {cluster} --token {token} \
             --ca-hash {ca_hash}"
        ),
        docker_host: format!(
            "docker run -d --name rlark-agent --restart unless-stopped --network host \
             --group-add \"$(stat -c %g /var/run/docker.sock)\" \
             -v /var/run/docker.sock:/var/run/docker.sock -v rlark-agent:/var/lib/rlark-agent \
             -e RLARK_JOIN_TOKEN={token} rlark:{version} agent --agent-type docker \
             --server {server} --cluster-id {cluster} --data-dir /var/lib/rlark-agent \
             --ca-hash {ca_hash}"
        ),
        kubernetes: format!(
            "helm install rlark-agent ./deploy/helm/rlark-agent --namespace rlark-agent \
             --create-namespace --set server={server} --set clusterID={cluster} \
             --set caHash={ca_hash} --set joinToken={token}"
        ),
        join,
    }
}

pub(crate) async fn cert(command: CertCommand, client: ClientArgs) -> anyhow::Result<()> {
    match command {
        CertCommand::List(mut args) => {
            args.client = client;
            cert_list(args).await
        }
        CertCommand::Revoke(mut args) => {
            args.client = client;
            cert_revoke(args).await
        }
        CertCommand::Sign(mut args) => {
            args.client = client;
            cert_sign(args).await
        }
        CertCommand::SignSsh(mut args) => {
            args.client = client;
            cert_sign_ssh(args).await
        }
        CertCommand::Revocations(mut args) => {
            args.client = client;
            cert_revocations(args).await
        }
    }
}

fn items(response: &Value) -> &[Value] {
    response["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn cell(value: &Value, none: &str) -> String {
    match value {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::String(_) | Value::Null => none.to_string(),
        other => other.to_string(),
    }
}

async fn cert_list(args: CertListArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    let response = api.get("/rlark/v1/certificates").await?;
    if args.output == Some(OutputFormat::Json) {
        return print_json(&response);
    }
    let mut lines = vec![
        ["SERIAL", "USER", "ROLE", "CLUSTER", "NOT-AFTER", "REVOKED"]
            .map(String::from)
            .to_vec(),
    ];
    for item in items(&response) {
        lines.push(vec![
            cell(&item["serial"], ""),
            cell(&item["user"], ""),
            cell(&item["role"], ""),
            cell(&item["clusterId"], "<none>"),
            cell(&item["notAfter"], ""),
            cell(&item["revokedAt"], "no"),
        ]);
    }
    print!("{}", align(&lines));
    Ok(())
}

async fn cert_revocations(args: CertListArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    let response = api.get("/rlark/v1/revocations").await?;
    if args.output == Some(OutputFormat::Json) {
        return print_json(&response);
    }
    let mut lines = vec![
        ["SERIAL", "USER", "REASON", "REVOKED-BY", "REVOKED-AT"]
            .map(String::from)
            .to_vec(),
    ];
    for item in items(&response) {
        lines.push(vec![
            cell(&item["serial"], ""),
            cell(&item["user"], "<unknown>"),
            cell(&item["reason"], ""),
            cell(&item["revokedBy"], ""),
            cell(&item["revokedAt"], ""),
        ]);
    }
    print!("{}", align(&lines));
    Ok(())
}

async fn cert_revoke(args: CertRevokeArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    let mut body = json!({});
    if let Some(serial) = &args.serial {
        body["serial"] = json!(serial);
    }
    if let Some(user) = &args.user {
        body["user"] = json!(user);
    }
    if let Some(cluster_id) = &args.cluster_id {
        body["clusterID"] = json!(cluster_id);
    }
    if let Some(token_id) = &args.token_id {
        body["tokenID"] = json!(token_id);
    }
    if let Some(reason) = &args.reason {
        body["reason"] = json!(reason);
    }
    let response = api.post("/rlark/v1/revocations", &body).await?;
    let serials: Vec<&str> = response["revoked"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for serial in &serials {
        println!("revoked {serial}");
    }
    if serials.is_empty() {
        if let Some(token_id) = &args.token_id {
            println!("revoked token {token_id}");
        } else if let Some(user) = &args.user {
            println!("no certificates of {user}");
        } else if let Some(cluster_id) = &args.cluster_id {
            println!("no certificates of cluster {cluster_id}");
        }
    }
    Ok(())
}

fn read_input(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("read stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

async fn cert_sign(args: CertSignArgs) -> anyhow::Result<()> {
    match (args.role, &args.name, &args.cluster_id) {
        (CertRole::Agent, Some(_), _) => bail!("--role agent needs --cluster-id, not --name"),
        (role, _, Some(_)) if role != CertRole::Agent => {
            bail!("--role {} needs --name, not --cluster-id", role.as_str())
        }
        _ => {}
    }
    let csr = read_input(&args.csr)?;
    let api = SecurityClient::from_args(&args.client).await?;
    let mut body = json!({"role": args.role.as_str(), "csr": csr});
    if let Some(name) = &args.name {
        body["name"] = json!(name);
    }
    if let Some(cluster_id) = &args.cluster_id {
        body["clusterID"] = json!(cluster_id);
    }
    if let Some(validity) = args.validity {
        body["validitySeconds"] = json!(validity);
    }
    let response = api.post("/rlark/v1/certificates", &body).await?;
    let certificate = field(&response, "certificate")?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, certificate)
                .with_context(|| format!("write {}", path.display()))?;
            eprintln!(
                "wrote certificate {serial} of {user} (valid until {not_after}) to {path}",
                serial = response["serial"].as_str().unwrap_or("?"),
                user = response["user"].as_str().unwrap_or("?"),
                not_after = response["notAfter"].as_str().unwrap_or("?"),
                path = path.display(),
            );
        }
        None => print!("{certificate}"),
    }
    Ok(())
}

async fn cert_sign_ssh(args: CertSignSshArgs) -> anyhow::Result<()> {
    let mut body = match (args.role, &args.user, &args.domain, &args.cluster_id) {
        (SshRole::SshGuest, Some(user), None, None) => json!({"role": "ssh-guest", "user": user}),
        (SshRole::SshGuest, ..) => {
            bail!("--role ssh-guest needs --user, and neither --domain nor --cluster-id")
        }
        (SshRole::Domain, None, Some(domain), Some(cluster_id)) => {
            json!({"role": "domain", "domain": domain, "clusterID": cluster_id})
        }
        (SshRole::Domain, ..) => {
            bail!("--role domain needs --domain and --cluster-id, and not --user")
        }
    };
    body["publicKey"] = json!(read_input(&args.public_key)?.trim());
    if let Some(validity) = args.validity {
        body["validitySeconds"] = json!(validity);
    }
    let api = SecurityClient::from_args(&args.client).await?;
    let response = api.post("/rlark/v1/sshcertificates", &body).await?;
    let certificate = field(&response, "certificate")?;
    let line = if certificate.ends_with('\n') {
        certificate.to_string()
    } else {
        format!("{certificate}\n")
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, &line).with_context(|| format!("write {}", path.display()))?;
            eprintln!(
                "wrote SSH certificate {serial} ({key_id}) to {path}",
                serial = response["serialHex"].as_str().unwrap_or("?"),
                key_id = response["keyID"].as_str().unwrap_or("?"),
                path = path.display(),
            );
        }
        None => print!("{line}"),
    }
    Ok(())
}

pub(crate) fn ca(command: CaCommand) -> anyhow::Result<()> {
    match command {
        CaCommand::Rotate(args) => ca_rotate(&args),
        CaCommand::Retire(args) => ca_retire(&args),
    }
}

/// DIR/pki, after checking that it holds a CA (rotation must never create one).
fn pki_dir(args: &CaArgs) -> anyhow::Result<PathBuf> {
    let pki = args.data_dir.join(rlark_server::PKI_DIR);
    let ca_cert = pki.join(rlark_pki::CA_CERT_FILE);
    if !ca_cert.exists() {
        bail!(
            "no CA at {}: is --data-dir {} the server's data directory? (the server creates \
             its CA on first start)",
            ca_cert.display(),
            args.data_dir.display()
        );
    }
    Ok(pki)
}

fn ca_rotate(args: &CaArgs) -> anyhow::Result<()> {
    let pki = pki_dir(args)?;
    let rotation = rlark_pki::rotate_ca(&pki)
        .with_context(|| format!("rotate the CA in {}", pki.display()))?;
    let data_dir = shell_word(&args.data_dir.display().to_string());
    println!(
        "Rotated the CA in {pki}.\n\
         previous CA: {previous} (still trusted)\n\
         new CA:      {active}\n\n\
         Next steps:\n\
         1. Restart the server: it signs with the new CA and still accepts certificates of \
         the previous one.\n\
         2. Agents pick up the new bundle when they renew their certificates; new join \
         commands carry the new pin.\n\
         3. After every client has the new bundle, run `rlark ca retire --data-dir {data_dir}` \
         and restart the server.",
        pki = pki.display(),
        previous = rotation.previous_hash,
        active = rotation.active_hash,
    );
    Ok(())
}

fn ca_retire(args: &CaArgs) -> anyhow::Result<()> {
    let pki = pki_dir(args)?;
    let ca_cert = pki.join(rlark_pki::CA_CERT_FILE);
    let der = CertificateDer::from_pem_file(&ca_cert)
        .with_context(|| format!("read {}", ca_cert.display()))?;
    let active = rlark_pki::ca_cert_hash(der.as_ref())
        .with_context(|| format!("read {}", ca_cert.display()))?;
    let retired = rlark_pki::retire_previous_cas(&pki)
        .with_context(|| format!("retire the previous CA in {}", pki.display()))?;
    if retired.is_empty() {
        println!(
            "No CA rotation in progress in {}.\nactive CA: {active}",
            pki.display()
        );
        return Ok(());
    }
    for pin in &retired {
        println!("retired CA: {pin}");
    }
    println!(
        "active CA:  {active}\n\n\
         Restart the server: certificates issued by the retired CA stop working then."
    );
    Ok(())
}

/// `rlark kubeconfig --user NAME`: a new key made here, a certificate for it signed by the
/// server, and a kubeconfig with both; printed, or written to `output` with mode 0600.
pub(crate) async fn user_kubeconfig(
    api: &SecurityClient,
    user: &str,
    role: UserRole,
    validity: Option<u64>,
    output: Option<&Path>,
) -> anyhow::Result<()> {
    let key = rlark_pki::generate_key_and_csr(user).context("generate a key")?;
    let mut body = json!({"role": role.as_str(), "name": user, "csr": key.csr_pem});
    if let Some(validity) = validity {
        body["validitySeconds"] = json!(validity);
    }
    let response = api.post("/rlark/v1/certificates", &body).await?;
    let kubeconfig = rlark_pki::kubeconfig_yaml(
        &api.server_url,
        field(&response, "caBundle")?,
        field(&response, "certificate")?,
        &key.key_pem,
        user,
    );
    match output {
        Some(path) => {
            rlark_pki::write_private_file(path, kubeconfig.as_bytes())
                .with_context(|| format!("write {}", path.display()))?;
            eprintln!(
                "wrote the kubeconfig of {user} ({role}, certificate {serial}, valid until \
                 {not_after}) to {path}",
                role = role.as_str(),
                serial = response["serial"].as_str().unwrap_or("?"),
                not_after = response["notAfter"].as_str().unwrap_or("?"),
                path = path.display(),
            );
        }
        None => print!("{kubeconfig}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_to_seconds() {
        assert_eq!(parse_seconds("30s"), Ok(30));
        assert_eq!(parse_seconds("10m"), Ok(600));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        assert_eq!(parse_seconds("2d"), Ok(2 * 24 * 3600));
        assert_eq!(parse_seconds("45"), Ok(45));
        assert!(parse_seconds("0s").is_err());
        assert!(parse_seconds("abc").is_err());
        assert!(parse_seconds("1w").is_err());
        assert!(parse_seconds("1.5h").is_err());
        assert!(parse_seconds("").is_err());
        assert!(parse_seconds("99999999999999999999d").is_err());
    }

    #[test]
    fn security_commands_parse() {
        use crate::{Cli, Command};
        use clap::Parser as _;

        let cli = Cli::try_parse_from([
            "rlark",
            "token",
            "create",
            "--ttl",
            "2d",
            "--cluster-id",
            "c",
        ])
        .expect("parse");
        assert!(matches!(
            cli.command,
            Command::Token(TokenCommand::Create(ref a))
                if a.ttl == Some(172_800) && a.user.is_none() && !a.rejoin
        ));
        // A join token is bound to one cluster; --rejoin needs it, and is not for users.
        assert!(Cli::try_parse_from(["rlark", "token", "create", "--ttl", "2d"]).is_err());
        let cli =
            Cli::try_parse_from(["rlark", "token", "create", "--cluster-id", "c", "--rejoin"])
                .expect("parse");
        assert!(matches!(
            cli.command,
            Command::Token(TokenCommand::Create(ref a)) if a.rejoin
        ));
        assert!(Cli::try_parse_from(["rlark", "token", "create", "--rejoin"]).is_err());
        assert!(
            Cli::try_parse_from(["rlark", "token", "create", "--user", "a", "--rejoin"]).is_err()
        );
        assert!(Cli::try_parse_from(["rlark", "token", "create", "--user", "a"]).is_ok());
        assert!(Cli::try_parse_from(["rlark", "token", "create", "--ttl", "0s"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "token", "create", "--role", "admin"]).is_err());
        assert!(
            Cli::try_parse_from([
                "rlark",
                "token",
                "create",
                "--user",
                "a",
                "--cluster-id",
                "c"
            ])
            .is_err()
        );

        let cli = Cli::try_parse_from(["rlark", "cert", "revoke", "0A:1B"]).expect("parse");
        assert!(matches!(
            cli.command,
            Command::Cert(CertCommand::Revoke(ref a)) if a.serial.as_deref() == Some("a1b")
        ));
        assert!(Cli::try_parse_from(["rlark", "cert", "revoke"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "cert", "revoke", "ab", "--token-id", "t"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "cert", "revoke", "--user", "a"]).is_ok());

        let sign = ["rlark", "cert", "sign", "--role", "agent", "--csr", "f"];
        assert!(Cli::try_parse_from(sign).is_err());
        assert!(Cli::try_parse_from([&sign[..], &["--cluster-id", "c"]].concat()).is_ok());
        assert!(
            Cli::try_parse_from([&sign[..], &["--cluster-id", "c", "--name", "n"]].concat())
                .is_err()
        );

        assert!(Cli::try_parse_from(["rlark", "ca", "rotate"]).is_ok());
        assert!(Cli::try_parse_from(["rlark", "ca", "retire", "--data-dir", "d"]).is_ok());

        assert!(Cli::try_parse_from(["rlark", "kubeconfig", "--user", "a", "-o", "f"]).is_ok());
        assert!(Cli::try_parse_from(["rlark", "kubeconfig", "--role", "viewer"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "kubeconfig", "--user", "a", "--path"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "kubeconfig", "--validity", "1d"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "kubeconfig", "-o", "f"]).is_ok());
    }

    #[test]
    fn server_urls_lose_the_root_slash_only() {
        let uri: http::Uri = "https://127.0.0.1:8443".parse().expect("uri");
        assert_eq!(server_url(&uri), "https://127.0.0.1:8443");
        let uri: http::Uri = "https://example.com/prefix".parse().expect("uri");
        assert_eq!(server_url(&uri), "https://example.com/prefix");
    }

    #[test]
    fn join_commands_are_ones_the_cli_and_the_chart_accept() {
        use crate::{Cli, Command};
        use clap::Parser as _;
        let hash = format!("sha256:{}", "ab".repeat(32));
        let c = join_commands("https://cp.example:8443", "abc.def", &hash, "gpu-a");
        assert_eq!(
            c.join,
            format!(
                "rlark join --server https://cp.example:8443 --token abc.def --ca-hash {hash} \
                 --cluster-id gpu-a"
            )
        );
        assert_eq!(
            c.raw_host,
            format!(
                "./deploy/install.sh agent --server https://cp.example:8443 --cluster-id gpu-a \
                 --token abc.def --ca-hash {hash}"
            )
        );
        // What the Docker command runs in the image, parsed by this CLI.
        let words: Vec<&str> = c.docker_host.split_whitespace().collect();
        let image = words
            .iter()
            .position(|w| w.starts_with("rlark:"))
            .expect("image");
        assert_eq!(words[image], format!("rlark:{}", env!("CARGO_PKG_VERSION")));
        assert!(words.contains(&"RLARK_JOIN_TOKEN=abc.def"));
        let argv: Vec<&str> = std::iter::once("rlark")
            .chain(words[image + 1..].iter().copied())
            .collect();
        let cli = Cli::try_parse_from(argv.iter().copied().chain(["--token", "abc.def"]))
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let Command::Agent(agent) = cli.command else {
            panic!("not an agent command: {argv:?}")
        };
        assert_eq!(agent.servers, ["https://cp.example:8443"]);
        assert_eq!(agent.cluster_id, "gpu-a");
        assert_eq!(agent.data_dir, PathBuf::from("/var/lib/rlark-agent"));
        assert_eq!(agent.agent_type, super::super::agent::AgentKind::Docker);
        // The credentials-only line, parsed by this CLI.
        let argv: Vec<&str> = c.join.split_whitespace().collect();
        assert!(matches!(
            Cli::try_parse_from(argv).expect("join parses").command,
            Command::Join(_)
        ));
        // The Helm values the chart reads (deploy/helm/rlark-agent/values.yaml).
        for set in [
            "server=https://cp.example:8443",
            "clusterID=gpu-a",
            "joinToken=abc.def",
        ] {
            assert!(
                c.kubernetes.contains(&format!("--set {set}")),
                "{}",
                c.kubernetes
            );
        }
        assert!(c.kubernetes.contains(&format!("--set caHash={hash}")));
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(shell_word("sha256:ab12"), "sha256:ab12");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
