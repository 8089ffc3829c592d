//! The `rlark-controllers` crate's integration tests as one test binary (each module was its own
//! binary, and each linked the crate's whole dependency tree: one binary keeps CI's disk
//! and link time down). Run one module with `cargo test -p rlark-controllers --test integration MODULE::`.

mod agent_capture;
mod domain_controller;
mod job_controller;
mod scenarios;
mod task_node_leader;
