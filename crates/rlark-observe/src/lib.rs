//! What every rlark process shares to be observed and configured alike: the one `/metrics`
//! responder and its listener ([`metrics_endpoint`]), the `process_*` and
//! `rlark_build_info` metrics in every answer ([`process_metrics`]), the `tracing` set-up of
//! the binary ([`init_tracing`]) and the duration syntax of flags and configuration files
//! ([`parse_duration`]).
//!
//! A leaf below the product crates: it must not depend on any other rlark crate (the
//! tunnel, the agent, the server and the embodied runtime all depend on it).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// Every public item says what it is: every rlark process builds on this API.
#![deny(missing_docs)]

mod duration;
pub mod metrics_endpoint;
pub mod process_metrics;
mod tracing_setup;

pub use duration::parse_duration;
pub use tracing_setup::{LogFormat, init_tracing};
