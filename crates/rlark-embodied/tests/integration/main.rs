//! The `rlark-embodied` crate's integration tests as one test binary (each module was its own
//! binary, and each linked the crate's whole dependency tree: one binary keeps CI's disk
//! and link time down). Run one module with `cargo test -p rlark-embodied --test integration MODULE::`.

#[path = "../../../../tests/support/missing_tool.rs"]
#[allow(dead_code)] // each module uses the part it needs
mod missing_tool;
#[path = "../support/rtsp.rs"]
#[allow(dead_code)] // each module uses the part it needs
mod rtsp;

mod access;
mod camera;
mod clean_children;
mod deviceplugin;
mod devinit;
mod metrics;
mod robot;
