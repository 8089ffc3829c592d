//! Connecting to a server and reporting its errors the way kubectl does.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;

use super::ClientArgs;

/// Kubeconfig used when neither `--kubeconfig` nor `$KUBECONFIG` is given.
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
}

impl Session {
    /// Connect using `--kubeconfig`, else `$KUBECONFIG` (a `:`-separated list is merged),
    /// else `./.rlark/admin.kubeconfig`.
    pub async fn connect(args: &ClientArgs, namespace: Option<&str>) -> anyhow::Result<Session> {
        let kubeconfig = load_kubeconfig(args.kubeconfig.as_deref())?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("load kubeconfig")?;
        let client = kube::Client::try_from(config).context("create client")?;
        let (namespace, namespace_explicit) = match namespace {
            Some(ns) => (ns.to_string(), true),
            None => (client.default_namespace().to_string(), false),
        };
        Ok(Session {
            client,
            namespace,
            namespace_explicit,
        })
    }
}

fn load_kubeconfig(flag: Option<&Path>) -> anyhow::Result<Kubeconfig> {
    if let Some(path) = flag {
        return Kubeconfig::read_from(path)
            .with_context(|| format!("read kubeconfig {}", path.display()));
    }
    if let Some(merged) = Kubeconfig::from_env().context("read kubeconfig from $KUBECONFIG")? {
        return Ok(merged);
    }
    let default = PathBuf::from(DEFAULT_KUBECONFIG);
    if !default.exists() {
        bail!(
            "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or start a local server with \
             `rlark up` (looked for ./{DEFAULT_KUBECONFIG})"
        );
    }
    Kubeconfig::read_from(&default).with_context(|| format!("read kubeconfig {DEFAULT_KUBECONFIG}"))
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
pub(crate) fn report(error: &anyhow::Error) -> Option<String> {
    if error.downcast_ref::<Reported>().is_some() {
        return None;
    }
    if let Some(status) = status_of(error) {
        return Some(format_status(status));
    }
    Some(format!("error: {error:#}"))
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
        assert_eq!(
            format_status(&status("", "", 500)),
            "Error from server: the server answered 500"
        );
    }
}
