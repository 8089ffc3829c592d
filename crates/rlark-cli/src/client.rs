//! Connecting to a server and reporting its errors the way kubectl does.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;

use super::ClientArgs;

/// Kubeconfig used when neither `--kubeconfig` nor `$KUBECONFIG` is given (before
/// `~/.kube/config`).
pub(crate) const DEFAULT_KUBECONFIG: &str = ".rlark/admin.kubeconfig";

/// A failure whose message was already printed (e.g. per-object errors of `apply`); `main`
/// only sets the exit code.
#[derive(Debug, thiserror::Error)]
#[error("{count} error(s) reported above")]
pub(crate) struct Reported {
    pub count: usize,
}

/// A connected client plus the namespace of its kubeconfig context.
pub(crate) struct Session {
    pub client: kube::Client,
    /// `-n` when given, else the context's namespace (`default` when unset).
    pub namespace: String,
    /// Whether `-n` was given.
    pub namespace_explicit: bool,
    /// The server's URL (`https://host:port`, no trailing slash).
    pub server: String,
}

impl Session {
    /// Connect with the kubeconfig [`load_kubeconfig`] finds and the context `--context`
    /// names (else the current one); the namespace is `-n`, else the context's.
    pub async fn connect(args: &ClientArgs) -> anyhow::Result<Session> {
        let kubeconfig = load_kubeconfig(args, Path::new(DEFAULT_KUBECONFIG))?;
        let config = kube_config(kubeconfig, args).await?;
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        let client = build_client(config)?;
        let (namespace, namespace_explicit) = match &args.namespace {
            Some(ns) => (ns.clone(), true),
            None => (client.default_namespace().to_string(), false),
        };
        Ok(Session {
            client,
            namespace,
            namespace_explicit,
            server,
        })
    }
}

/// The client configuration of `kubeconfig`'s `--context` (else its current context).
pub(crate) async fn kube_config(
    kubeconfig: Kubeconfig,
    args: &ClientArgs,
) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .context("load kubeconfig")
}

/// A client for `config` that prints every `Warning` header of the server's answers on
/// stderr (`Warning: TEXT`, as kubectl does).
pub(crate) fn build_client(config: kube::Config) -> anyhow::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config).context("create client")?;
    Ok(builder
        .with_layer(&tower::util::MapResponseLayer::new(print_warnings))
        .build())
}

fn print_warnings<B>(response: http::Response<B>) -> http::Response<B> {
    for value in response.headers().get_all(http::header::WARNING) {
        if let Some(text) = warning_text(value.as_bytes()) {
            eprintln!("Warning: {text}");
        }
    }
    response
}

/// The text of a `Warning` header value (`299 - "text"`, RFC 7234 §5.5), as kubectl shows
/// it; `None` when the value is not of that form.
pub(crate) fn warning_text(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (code, rest) = value.split_once(' ')?;
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (_agent, rest) = rest.trim_start().split_once(' ')?;
    let quoted = rest.trim_start().strip_prefix('"')?;
    // The text ends at the first unescaped quote (a date may follow).
    let mut text = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => text.push(chars.next()?),
            '"' => return Some(text),
            c => text.push(c),
        }
    }
    None
}

/// Where a client's kubeconfig comes from, first match wins:
/// 1. `--kubeconfig FILE`;
/// 2. `$KUBECONFIG`, a `:`-separated list: the files that exist, merged as kubectl merges
///    them (the first file to set a value wins); an error when none exists;
/// 3. `default` (`./.rlark/admin.kubeconfig`, or the data directory's) when it exists;
/// 4. `~/.kube/config` when it exists.
pub(crate) fn kubeconfig_sources(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    default: &Path,
    home: Option<&Path>,
) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(path) = flag {
        return Ok(vec![path.to_path_buf()]);
    }
    if let Some(list) = env.filter(|v| !v.is_empty()) {
        let listed: Vec<PathBuf> = std::env::split_paths(list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        let existing: Vec<PathBuf> = listed.iter().filter(|p| p.exists()).cloned().collect();
        if existing.is_empty() {
            bail!(
                "none of the kubeconfig files in $KUBECONFIG exists ({})",
                listed
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return Ok(existing);
    }
    if default.exists() {
        return Ok(vec![default.to_path_buf()]);
    }
    if let Some(home_config) = home.map(|h| h.join(".kube").join("config"))
        && home_config.exists()
    {
        return Ok(vec![home_config]);
    }
    bail!(
        "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or start a local server with \
         `rlark up` (looked for {} and ~/.kube/config)",
        default.display()
    );
}

/// Read and merge the kubeconfig files of [`kubeconfig_sources`] for this process.
pub(crate) fn load_kubeconfig(args: &ClientArgs, default: &Path) -> anyhow::Result<Kubeconfig> {
    let env = std::env::var_os("KUBECONFIG");
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let sources = kubeconfig_sources(
        args.kubeconfig.as_deref(),
        env.as_deref(),
        default,
        home.as_deref(),
    )?;
    merge_files(&sources)
}

fn merge_files(paths: &[PathBuf]) -> anyhow::Result<Kubeconfig> {
    let mut merged: Option<Kubeconfig> = None;
    for path in paths {
        // kube's error already names the file and the cause.
        let next = Kubeconfig::read_from(path)?;
        merged = Some(match merged {
            None => next,
            Some(m) => m
                .merge(next)
                .with_context(|| format!("merge kubeconfig {}", path.display()))?,
        });
    }
    merged.context("no kubeconfig file")
}

/// kubectl's rendering of a server `Status`: `Error from server (Reason): message`.
pub(crate) fn format_status(status: &Status) -> String {
    let message = if status.message.is_empty() {
        format!("the server answered {}", status.code)
    } else {
        status.message.clone()
    };
    if status.reason.is_empty() {
        format!("Error from server: {message}")
    } else {
        format!("Error from server ({}): {message}", status.reason)
    }
}

/// The server `Status` inside an error chain, if any.
pub(crate) fn status_of(error: &anyhow::Error) -> Option<&Status> {
    error
        .chain()
        .find_map(|e| match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => Some(status.as_ref()),
            _ => None,
        })
}

/// Whether the error is a server `NotFound`.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// What `main` prints for a failed command; `None` when it was printed already.
pub fn report(error: &anyhow::Error) -> Option<String> {
    if error.downcast_ref::<Reported>().is_some() {
        return None;
    }
    if let Some(status) = status_of(error) {
        return Some(format_status(status));
    }
    Some(format!("error: {}", error_chain(error)))
}

/// `error` and its causes as `a: b: c`, each cause once: a cause whose text its parent
/// already shows (as `kube` and `std::io` wrappers do, `... (os error 2)`) is left out.
pub(crate) fn error_chain(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || parts.iter().any(|shown| shown.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(reason: &str, message: &str, code: u16) -> Status {
        let mut s = Status::failure(message, reason);
        s.code = code;
        s
    }

    #[test]
    fn warning_headers_read_as_kubectl_shows_them() {
        assert_eq!(
            warning_text(br#"299 - "unknown field \"spec.x\"""#).as_deref(),
            Some(r#"unknown field "spec.x""#)
        );
        assert_eq!(
            warning_text(br#"299 rlark "text" "Wed, 02 Dec 2026 00:00:00 GMT""#).as_deref(),
            Some("text")
        );
        for bad in [
            &b"text"[..],
            b"299 - text",
            b"29 - \"x\"",
            b"299 - \"open",
            b"\xff",
        ] {
            assert_eq!(
                warning_text(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn kubeconfig_sources_follow_kubectl() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "").expect("write");
            path
        };
        let (a, b) = (file("a"), file("b"));
        let missing = dir.path().join("missing");
        let default = dir.path().join("default");
        let home = dir.path().join("home");
        let flag = Some(missing.as_path());
        assert_eq!(
            kubeconfig_sources(flag, None, &default, None).unwrap(),
            vec![missing.clone()]
        );
        let list = std::env::join_paths([&missing, &b, &a]).unwrap();
        assert_eq!(
            kubeconfig_sources(None, Some(&list), &default, None).unwrap(),
            [b.clone(), a.clone()]
        );
        let only_missing = missing.clone().into_os_string();
        let err = kubeconfig_sources(None, Some(&only_missing), &default, None).unwrap_err();
        assert!(
            err.to_string().contains("none of the kubeconfig files"),
            "{err}"
        );
        // An empty KUBECONFIG counts as unset.
        let err = kubeconfig_sources(None, Some(std::ffi::OsStr::new("")), &default, Some(&home))
            .unwrap_err();
        assert!(err.to_string().contains("no kubeconfig"), "{err}");
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(home.join(".kube/config"), "").unwrap();
        assert_eq!(
            kubeconfig_sources(None, None, &default, Some(&home)).unwrap(),
            [home.join(".kube/config")]
        );
        std::fs::write(&default, "").unwrap();
        assert_eq!(
            kubeconfig_sources(None, None, &default, Some(&home)).unwrap(),
            vec![default.clone()]
        );
    }

    #[test]
    fn server_errors_print_like_kubectl() {
        let err = anyhow::Error::new(kube::Error::Api(
            status("NotFound", "jobs.rlinf.io \"x\" not found", 404).boxed(),
        ))
        .context("get job x");
        assert_eq!(
            report(&err).as_deref(),
            Some("Error from server (NotFound): jobs.rlinf.io \"x\" not found")
        );
        let err = anyhow::anyhow!("disk on fire").context("read manifests");
        assert_eq!(
            report(&err).as_deref(),
            Some("error: read manifests: disk on fire")
        );
        assert_eq!(report(&anyhow::Error::new(Reported { count: 2 })), None);
        // A cause its parent already quotes is printed once.
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let wrapped = kube::config::KubeconfigError::ReadConfig(io, PathBuf::from("/x/k"));
        let err = anyhow::Error::new(wrapped).context("load kubeconfig");
        let shown = report(&err).expect("printed");
        assert_eq!(shown.matches(&text).count(), 1, "{shown}");
        assert!(
            shown.starts_with("error: load kubeconfig: failed to read kubeconfig from"),
            "{shown}"
        );
        assert_eq!(
            format_status(&status("", "", 500)),
            "Error from server: the server answered 500"
        );
    }
}
