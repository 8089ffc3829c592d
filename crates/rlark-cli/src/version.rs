//! `rlark version`: this binary's version, git commit and build date, and the server's
//! (`GET /version`), as `kubectl version` prints them; `-o json|yaml` gives both as
//! `version.Info` objects under `clientVersion` / `serverVersion`.

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use super::ClientArgs;
use super::client::Session;

#[derive(Debug, Args)]
pub(crate) struct VersionArgs {
    /// Only this binary's version; do not ask the server.
    #[arg(long)]
    client: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Format>,
    #[arg(skip)]
    pub client_args: ClientArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Json,
    Yaml,
}

/// What this build knows of itself (from `build.rs`).
pub fn build_info() -> rlark_server::BuildInfo {
    rlark_server::BuildInfo {
        git_commit: env!("RLARK_BUILD_GIT_COMMIT").to_string(),
        build_date: build_date(env!("RLARK_BUILD_EPOCH")),
    }
}

/// RFC 3339 of a Unix time in seconds (the epoch when it is not one).
fn build_date(epoch: &str) -> String {
    epoch
        .parse::<i64>()
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// This binary as a `version.Info`.
fn client_info() -> Value {
    let build = build_info();
    json!({
        "gitVersion": format!("v{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": build.git_commit,
        "buildDate": build.build_date,
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// `VERSION (commit C, built D)` of a `version.Info`.
fn line(info: &Value) -> String {
    let text = |k: &str| info[k].as_str().unwrap_or_default().to_string();
    let commit = text("gitCommit");
    let commit = if commit.is_empty() {
        "unknown".to_string()
    } else {
        commit.chars().take(12).collect()
    };
    format!(
        "{} (commit {commit}, built {})",
        text("gitVersion"),
        text("buildDate")
    )
}

pub(crate) async fn version(args: VersionArgs) -> anyhow::Result<()> {
    let client = client_info();
    let server = if args.client {
        None
    } else {
        Some(server_info(&args.client_args).await)
    };
    match args.output {
        Some(format) => {
            let mut doc = json!({ "clientVersion": client });
            if let Some(Ok(server)) = &server {
                doc["serverVersion"] = server.clone();
            }
            match format {
                Format::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
                Format::Yaml => print!("{}", serde_saphyr::to_string(&doc)?),
            }
        }
        None => {
            println!("Client Version: {}", line(&client));
            if let Some(Ok(server)) = &server {
                println!("Server Version: {}", line(server));
            }
        }
    }
    match server {
        Some(Err(error)) => Err(error),
        _ => Ok(()),
    }
}

async fn server_info(args: &ClientArgs) -> anyhow::Result<Value> {
    let session = Session::connect(args).await?;
    let info = session
        .client
        .apiserver_version()
        .await
        .context("get the server's version")?;
    serde_json::to_value(info).context("encode the server's version")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_dates_are_rfc3339_utc() {
        assert_eq!(build_date("0"), "1970-01-01T00:00:00Z");
        assert_eq!(build_date("1764646136"), "2025-12-02T03:28:56Z");
        assert_eq!(build_date("not a number"), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn lines_shorten_the_commit_and_say_when_it_is_unknown() {
        let info = json!({"gitVersion": "v0.1.0", "gitCommit": "0123456789abcdef0123",
                          "buildDate": "2026-12-02T00:00:00Z"});
        assert_eq!(
            line(&info),
            "v0.1.0 (commit 0123456789ab, built 2026-12-02T00:00:00Z)"
        );
        let info = json!({"gitVersion": "v0.1.0", "gitCommit": "", "buildDate": "x"});
        assert_eq!(line(&info), "v0.1.0 (commit unknown, built x)");
    }
}
