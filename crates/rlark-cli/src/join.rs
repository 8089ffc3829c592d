//! `rlark join`: the agent side of the bootstrap-token join (see `rlark_agent::join`).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

/// Default directory of an agent's credentials.
pub(crate) const DEFAULT_AGENT_DIR: &str = ".rlark/agent";

#[derive(Debug, Args)]
pub(crate) struct JoinArgs {
    /// URL of the server, https://HOST:PORT (printed by `rlark token create`).
    #[arg(long, value_name = "URL", env = "RLARK_SERVER")]
    server: String,
    /// Bootstrap token from `rlark token create`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RLARK_JOIN_TOKEN",
        hide_env_values = true
    )]
    token: String,
    /// sha256:<hex> of the CA's public key, from `rlark token create`. The join refuses a
    /// server whose CA does not match.
    #[arg(long, value_name = "sha256:HEX")]
    ca_hash: String,
    /// Cluster ID to join as: the one the token was made for (`rlark token create
    /// --cluster-id`); when omitted, the token's.
    #[arg(long, value_name = "ID")]
    cluster_id: Option<String>,
    /// Directory for the key, certificate, CA bundle and kubeconfig (mode 0700).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_AGENT_DIR)]
    dir: PathBuf,
    /// Replace credentials already in --dir.
    #[arg(long)]
    force: bool,
}

pub(crate) async fn join(args: JoinArgs) -> anyhow::Result<()> {
    let existing = args.dir.join(rlark_agent::join::AGENT_PEM);
    if existing.exists() && !args.force {
        anyhow::bail!(
            "{} already holds agent credentials; pass --force to replace them",
            args.dir.display()
        );
    }
    let options = rlark_agent::join::JoinOptions {
        server: args.server,
        token: args.token,
        ca_hash: args.ca_hash,
        cluster_id: args.cluster_id,
        dir: args.dir.clone(),
    };
    let credentials = rlark_agent::join::join(&options)
        .await
        .context("join failed")?;
    println!(
        "joined as cluster {:?} (user {}, certificate {} valid until {})",
        credentials.state.cluster_id,
        credentials.info.common_name,
        credentials.info.serial,
        chrono::DateTime::<chrono::Utc>::from(credentials.info.not_after)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    println!(
        "credentials: {}",
        std::path::absolute(&args.dir).unwrap_or(args.dir).display()
    );
    Ok(())
}
