//! The `rlark` crate's end-to-end tests as one test binary: each module was its own
//! binary, and each linked the whole workspace (about 200 MB apiece, 9 GB for all of them,
//! and a link of several seconds each). One binary keeps CI's disk and build time down;
//! the tests of every module run in one process, two at a time (`--test-threads=2`).
//! `memory_bound` and `hostile_memory` stay their own binaries: they read this process's
//! resident memory, which tests running beside them would change.

#[allow(dead_code)] // shared by the embodied suites, which together use all of it
mod embodied_common;
#[path = "../../../../tests/support/missing_tool.rs"]
mod missing_tool;
#[path = "../support/raw_api.rs"]
mod raw_api;

mod agent_crash;
mod camera_cli;
mod cli;
mod cli_controllers;
mod cli_docs;
mod cli_flags;
mod cli_output;
mod cli_quickstart;
mod cli_security;
mod client;
mod connection_limits;
mod deploy_helm;
mod docker_runtime;
mod domain_network;
mod durability;
mod e2e_kubectl;
mod embodied_cli;
mod embodied_devices;
mod embodied_output;
mod exec_cli;
mod hostile_identity;
mod hostile_proxy;
mod hostile_ssh;
mod kube_watcher;
mod kubectl_portforward;
mod kubectl_replicas;
mod kubernetes_nodes;
mod kubernetes_runtime;
mod limits;
mod logs_cli;
mod relay;
mod replicas;
mod reports_cli;
mod rlark_samples;
mod security;
mod ssh_certs;
mod ssh_server;
mod store_backup;
mod supervise_bin;
mod task_proxy;
mod tensorboard;
mod tunnel;
mod up;
mod up_demo;
mod up_session;
