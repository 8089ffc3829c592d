//! `tracing` for a binary: one subscriber writing to stderr, filtered by `RUST_LOG`.

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal unless `NO_COLOR` is set.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Send `tracing` events to stderr in `format`, filtered by `RUST_LOG`, or by
/// `default_filter` (`EnvFilter` directives such as `info` or `warn,kube_client=off`) when
/// `RUST_LOG` is unset or invalid. Does nothing when a subscriber is already set.
pub fn init_tracing(default_filter: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // Err only if a subscriber is already set.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
