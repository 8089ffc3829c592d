//! `rlark devinit setup`: ask the embodied runtime's DeviceService (`devinit.sock`) to
//! create the configured macvlan interfaces in **this process's** network namespace (the
//! runtime finds the caller by its peer credentials). Run in a pod, e.g. as an init
//! container, it connects the pod to the robots' network; in a hostNetwork pod it changes
//! nothing and exits 0.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use rlark_proto::device::v1::SetupRequest;
use rlark_proto::device::v1::device_service_client::DeviceServiceClient;
use rlark_proto::sockets::{DEFAULT_SOCKET_DIR, DEVINIT_SOCKET};

use super::table::align;
use rlark_observe::parse_duration;

/// The variable `rlark embodied`'s device plugin sets in allocated containers.
const SOCKET_ENV: &str = "RLINF_EMBODIED_DEVINIT_SOCKET_PATH";

#[derive(Debug, Args)]
pub(crate) struct DevinitArgs {
    /// Directory of the embodied runtime's sockets (devinit.sock is there). Default: the
    /// directory of $RLINF_EMBODIED_DEVINIT_SOCKET_PATH if set, else /var/run/rlark.
    #[arg(long, value_name = "DIR", global = true)]
    pub socket_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: DevinitCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DevinitCommand {
    /// Create the configured macvlan interfaces in this process's network namespace and
    /// print them (idempotent: existing ones are reported, not made again).
    Setup {
        /// How long to wait for the runtime (connecting and the setup itself).
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
}

pub(crate) async fn devinit(args: DevinitArgs) -> anyhow::Result<()> {
    let socket = match (&args.socket_dir, std::env::var_os(SOCKET_ENV)) {
        (Some(dir), _) => dir.join(DEVINIT_SOCKET),
        (None, Some(path)) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from(DEFAULT_SOCKET_DIR).join(DEVINIT_SOCKET),
    };
    match args.command {
        DevinitCommand::Setup { timeout } => {
            let call = async {
                let channel = rlark_proto::client::connect(&socket).await?;
                DeviceServiceClient::new(channel)
                    .setup(SetupRequest {})
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))
            };
            let response = tokio::time::timeout(timeout, call)
                .await
                .map_err(|_| {
                    anyhow::anyhow!("no answer from {} within {timeout:?}", socket.display())
                })?
                .with_context(|| format!("devinit setup via {}", socket.display()))?;
            if response.host_network {
                println!(
                    "this process shares the host's network namespace (hostNetwork): nothing to set up"
                );
                return Ok(());
            }
            let mut lines = vec![
                ["INTERFACE", "PARENT", "ADDRESS", "MAC", "MTU", "STATUS"]
                    .map(String::from)
                    .to_vec(),
            ];
            for interface in &response.interfaces {
                lines.push(vec![
                    interface.name.clone(),
                    interface.parent.clone(),
                    interface.address.clone(),
                    interface.mac.clone(),
                    interface.mtu.to_string(),
                    if interface.created {
                        "created"
                    } else {
                        "existing"
                    }
                    .into(),
                ]);
            }
            // A runtime that predates the `interfaces` field still reports the names.
            if response.interfaces.is_empty() {
                for (names, status) in [
                    (&response.created, "created"),
                    (&response.skipped, "existing"),
                ] {
                    for name in names {
                        lines.push(vec![
                            name.clone(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                            status.into(),
                        ]);
                    }
                }
            }
            if lines.len() == 1 {
                println!("no macvlan interfaces are configured");
            } else {
                print!("{}", align(&lines));
            }
            Ok(())
        }
    }
}
