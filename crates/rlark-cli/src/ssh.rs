//! SSH from the command line (docs/ssh.md):
//!
//! - `rlark ssh task/NAME [--replica N] [-L SPEC]... [-N] [-t] [-- CMD...]`: OpenSSH's `ssh`
//!   into a replica with the kubeconfig's identity and no key setup: a fresh Ed25519 key is
//!   made in a temporary directory, registered for the caller (`POST /rlark/v1/sshkeys`),
//!   used once, and removed again when `ssh` ends (a killed `rlark ssh` leaves it
//!   registered: `rlark ssh-key list` shows it with comment `rlark-ssh`). The server's host
//!   key comes from `GET /rlark/v1/sshinfo` over the kubeconfig's verified TLS connection
//!   and is pinned (`StrictHostKeyChecking yes`). The exit code is `ssh`'s.
//! - `rlark ssh-config [--alias A] [--known-hosts FILE] [-i KEY]`: prints an `ssh_config`
//!   stanza for the endpoint and writes its pinned host key to FILE (default
//!   `~/.ssh/rlark_known_hosts`), so plain `ssh TASK@A` works.
//! - `rlark ssh-key add FILE.pub | list | remove ID`: the caller's registered keys.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use kube::ResourceExt as _;
use serde_json::{Value, json};

use super::ClientArgs;
use super::client::Session;
use super::security::SecurityClient;
use super::table::align;

#[derive(Debug, Args)]
pub(crate) struct SshArgs {
    /// The task: `task/NAME` or `NAME`.
    pub target: String,
    /// The replica [default: 0].
    #[arg(long, value_name = "N")]
    pub replica: Option<u32>,
    /// Forward a local port into the replica, as `ssh -L` (`6006:localhost:6006`).
    #[arg(short = 'L', value_name = "SPEC")]
    pub forwards: Vec<String>,
    /// Run no command (with -L: only forward), as `ssh -N`.
    #[arg(short = 'N')]
    pub no_command: bool,
    /// Force a terminal, as `ssh -t`.
    #[arg(short = 't')]
    pub tty: bool,
    /// The command to run instead of a shell (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub(crate) struct SshConfigArgs {
    /// The `Host` alias of the stanza.
    #[arg(long, default_value = "rlark")]
    pub alias: String,
    /// Where the pinned host key is written [default: ~/.ssh/rlark_known_hosts].
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// An `IdentityFile` for the stanza (a key registered with `rlark ssh-key add`, or one
    /// with an ssh-guest certificate beside it).
    #[arg(short = 'i', long, value_name = "KEY")]
    pub identity: Option<PathBuf>,
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SshKeyCommand {
    /// Register a public key (an `id_*.pub` file, `-` for stdin) for SSH logins as you.
    Add(SshKeyAddArgs),
    /// List your registered keys (an admin: everyone's, or --user's).
    List(SshKeyListArgs),
    /// Remove a registered key by id or `SHA256:` fingerprint; its open SSH connections close.
    Remove(SshKeyRemoveArgs),
}

#[derive(Debug, Args)]
pub(crate) struct SshKeyAddArgs {
    /// The public key file (`-`: stdin).
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct SshKeyListArgs {
    /// (Admins) the keys of this user.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SshKeyRemoveArgs {
    /// The key's id or `SHA256:` fingerprint.
    pub id: String,
}

pub(crate) async fn ssh_key(command: SshKeyCommand, client: ClientArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&client).await?;
    match command {
        SshKeyCommand::Add(args) => {
            let text = if args.file == Path::new("-") {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("read the key from stdin")?;
                text
            } else {
                std::fs::read_to_string(&args.file)
                    .with_context(|| format!("read {}", args.file.display()))?
            };
            let record = api
                .post("/rlark/v1/sshkeys", &json!({"publicKey": text.trim()}))
                .await?;
            println!(
                "registered SSH key {} ({}) for user {}",
                record["fingerprint"].as_str().unwrap_or("?"),
                record["id"].as_str().unwrap_or("?"),
                record["user"].as_str().unwrap_or("?")
            );
            Ok(())
        }
        SshKeyCommand::List(args) => {
            let path = match &args.user {
                Some(user) => format!(
                    "/rlark/v1/sshkeys?user={}",
                    rlark_api::agent::local::percent_encode(user)
                ),
                None => "/rlark/v1/sshkeys".to_string(),
            };
            let response = api.get(&path).await?;
            let mut lines = vec![
                ["ID", "USER", "FINGERPRINT", "COMMENT", "CREATED"]
                    .map(String::from)
                    .to_vec(),
            ];
            for item in response["items"].as_array().into_iter().flatten() {
                let text = |name: &str| item[name].as_str().unwrap_or_default().to_string();
                lines.push(vec![
                    text("id").chars().take(16).collect(),
                    text("user"),
                    text("fingerprint"),
                    text("comment"),
                    text("createdAt"),
                ]);
            }
            print!("{}", align(&lines));
            Ok(())
        }
        SshKeyCommand::Remove(args) => {
            let record = api
                .delete(&format!(
                    "/rlark/v1/sshkeys/{}",
                    rlark_api::agent::local::percent_encode(&args.id)
                ))
                .await?;
            println!(
                "removed SSH key {} of user {}",
                record["fingerprint"].as_str().unwrap_or("?"),
                record["user"].as_str().unwrap_or("?")
            );
            Ok(())
        }
    }
}

/// The SSH endpoint as the server describes it, and the host to reach it at.
struct Endpoint {
    host: String,
    port: u16,
    host_key: String,
    fingerprint: String,
}

async fn endpoint(api: &SecurityClient) -> anyhow::Result<Endpoint> {
    let info = api.get("/rlark/v1/sshinfo").await?;
    if info["enabled"] != Value::Bool(true) {
        bail!(
            "the server has no SSH endpoint: start it with `rlark server --ssh-listen ADDR` \
             (rlark up has one)"
        );
    }
    let uri: http::Uri = api
        .server_url
        .parse()
        .with_context(|| format!("the kubeconfig's server {:?}", api.server_url))?;
    let host = uri
        .host()
        .context("the kubeconfig's server has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok(Endpoint {
        host,
        port: info["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .context("sshinfo has no port")?,
        host_key: info["hostKey"]
            .as_str()
            .context("sshinfo has no hostKey")?
            .to_string(),
        fingerprint: info["hostKeyFingerprint"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// `[host]:port` as known_hosts spells a host on a non-default port.
fn known_host(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

pub(crate) async fn ssh_config(args: SshConfigArgs) -> anyhow::Result<()> {
    let api = SecurityClient::from_args(&args.client).await?;
    let endpoint = endpoint(&api).await?;
    let known_hosts = match args.known_hosts {
        Some(path) => path,
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set: pass --known-hosts")?;
            PathBuf::from(home).join(".ssh").join("rlark_known_hosts")
        }
    };
    if let Some(dir) = known_hosts.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(
        &known_hosts,
        format!("{} {}\n", args.alias, endpoint.host_key),
    )
    .with_context(|| format!("write {}", known_hosts.display()))?;
    let identity = args
        .identity
        .map(|key| {
            format!(
                "    IdentityFile {}\n    IdentitiesOnly yes\n",
                key.display()
            )
        })
        .unwrap_or_default();
    print!(
        "# rlark SSH endpoint of {server} (host key {fingerprint}).\n\
         # ssh TASK@{alias} (replica 0), TASK.N@{alias}, menu@{alias}; docs/ssh.md\n\
         Host {alias}\n\
         \x20   HostName {host}\n\
         \x20   Port {port}\n\
         \x20   HostKeyAlias {alias}\n\
         \x20   UserKnownHostsFile {known_hosts}\n\
         \x20   StrictHostKeyChecking yes\n\
         {identity}",
        server = api.server_url,
        fingerprint = endpoint.fingerprint,
        alias = args.alias,
        host = endpoint.host,
        port = endpoint.port,
        known_hosts = known_hosts.display(),
    );
    Ok(())
}

/// Lifetime of `rlark ssh`'s one-time key: long enough for `ssh` to log in.
const ONE_TIME_KEY_TTL_SECONDS: u64 = 600;

/// The one-time key `rlark ssh` registered, removed when `ssh` ends.
struct Registered<'a> {
    api: &'a SecurityClient,
    id: String,
}

impl Registered<'_> {
    async fn remove(self) -> anyhow::Result<()> {
        self.api
            .delete(&format!("/rlark/v1/sshkeys/{}", self.id))
            .await
            .map(|_| ())
    }
}

pub(crate) async fn ssh(args: SshArgs) -> anyhow::Result<()> {
    let name = match args.target.split_once('/') {
        None => args.target.clone(),
        Some(("task" | "tasks", name)) => name.to_string(),
        Some((kind, _)) => bail!("rlark ssh goes into a task: use task/NAME, not {kind}/..."),
    };
    let session = Session::connect(&args.client).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let task = super::logs::find_task(&session.client, &name, namespace.as_deref()).await?;
    let namespace = task.namespace().unwrap_or_default();
    let index = args.replica.unwrap_or(0);
    let api = SecurityClient::from_args(&args.client).await?;
    let endpoint = endpoint(&api).await?;

    let dir = tempfile::Builder::new()
        .prefix("rlark-ssh-")
        .tempdir()
        .context("make a temporary directory")?;
    let key = dir.path().join("id_ed25519");
    let made = tokio::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "rlark-ssh", "-f"])
        .arg(&key)
        .stdin(Stdio::null())
        .output()
        .await
        .context("run ssh-keygen (install OpenSSH's client: Debian openssh-client)")?;
    if !made.status.success() {
        bail!(
            "ssh-keygen: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        );
    }
    let public = std::fs::read_to_string(dir.path().join("id_ed25519.pub"))?;
    let record = api
        // Needed only to log in: expiring, so a killed `rlark ssh` leaves nothing usable.
        .post(
            "/rlark/v1/sshkeys",
            &json!({"publicKey": public.trim(), "ttlSeconds": ONE_TIME_KEY_TTL_SECONDS}),
        )
        .await
        .context("register a one-time SSH key")?;
    let registered = Registered {
        api: &api,
        id: record["id"].as_str().unwrap_or_default().to_string(),
    };
    let known_hosts = dir.path().join("known_hosts");
    std::fs::write(
        &known_hosts,
        format!(
            "{} {}\n",
            known_host(&endpoint.host, endpoint.port),
            endpoint.host_key
        ),
    )?;
    let mut command = tokio::process::Command::new("ssh");
    command
        .arg("-i")
        .arg(&key)
        .args([
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=yes",
        ])
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args(["-p", &endpoint.port.to_string()]);
    for forward in &args.forwards {
        command.args(["-L", forward]);
    }
    if args.no_command {
        command.arg("-N");
    }
    if args.tty {
        command.arg("-t");
    }
    command.arg(format!("{name}.{index}.{namespace}@{}", endpoint.host));
    command.args(&args.command);
    // ^C belongs to ssh (and the replica): this process stays to remove the key.
    let ignore_interrupts = tokio::spawn(async { while tokio::signal::ctrl_c().await.is_ok() {} });
    let status = command
        .status()
        .await
        .context("run ssh (Debian openssh-client)");
    ignore_interrupts.abort();
    let removed = registered.remove().await;
    let status = status?;
    removed.context("remove the one-time SSH key")?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => std::process::exit(255),
    }
}
