//! The `rlark-agent` crate's integration tests as one test binary (each module was its own
//! binary, and each linked the crate's whole dependency tree: one binary keeps CI's disk
//! and link time down). Run one module with `cargo test -p rlark-agent --test integration MODULE::`.

#[path = "../../../../tests/support/missing_tool.rs"]
#[allow(dead_code)] // each module uses the part it needs
mod missing_tool;
#[path = "../../../rlark-net/tests/support/netns.rs"]
#[allow(dead_code)] // each module uses the part it needs
mod netns_support;

mod artifacts_env;
mod docker_runtime;
mod exec;
mod isolation;
mod logs;
mod net_membership;
mod netns;
mod node;
mod reports;
mod runtime;
mod tasks;
