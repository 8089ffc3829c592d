//! Multi-cluster tests in network namespaces: the server in one namespace, each cluster's
//! agent in its own, all on one bridge (`rlark_sim::topology`, shared with `rlark
//! bench net`, re-exported here).
//!
//! [`DomainNet::start`] builds the topology (`s` for the server, one member per cluster),
//! starts the real `rlark server` in `s` and one real `rlark agent` per cluster, each joined
//! with a bootstrap token. The test drives the server with the real CLI run inside `s`
//! ([`DomainNet::cli`]): the test process stays in its own namespace, where the bridge's
//! addresses do not exist. Dropping it stops every process and deletes every namespace.
//!
//! Needs root, `ip` and (for drop rules) `nft`: [`tools_missing`] says what is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, bail};
pub use rlark_sim::topology::{
    AgentInNs, DropRule, Member, ServerInNs, Topology, TopologyError, log_tail, unique_prefix,
};
use tempfile::TempDir;

/// What stops namespace tests on this machine (not root, `ip` or `nft` missing), if
/// anything.
pub fn tools_missing() -> Option<String> {
    let root =
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    if !root {
        return Some("network namespace tests need root".to_string());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "{tool} is not installed (apt-get install {package})"
            ));
        }
    }
    None
}

/// A server in namespace `s` and one real agent per cluster, each in its own namespace.
pub struct DomainNet {
    /// The namespaces (declared first: dropped before the data directory it logs into).
    pub topology: Topology,
    /// The server.
    pub server: ServerInNs,
    /// The agents, in the order of the clusters given to [`DomainNet::start`].
    pub agents: Vec<AgentInNs>,
    exe: PathBuf,
    dir: TempDir,
}

impl DomainNet {
    /// Build the topology (`s` plus one member per cluster, named as the cluster), start
    /// `exe server` in `s` (controllers on) and `exe agent` for each cluster in its member,
    /// with `agent_args` added to every agent (`{address}` in an argument becomes the
    /// agent's own IPv4 address on the bridge). `exe` is the `rlark` binary
    /// (`env!("CARGO_BIN_EXE_rlark")`).
    pub fn start(exe: &str, clusters: &[&str], agent_args: &[&str]) -> anyhow::Result<DomainNet> {
        DomainNet::start_with(exe, clusters, agent_args, &[])
    }

    /// [`DomainNet::start`] with `server_args` added to the server's (`{address}` in an
    /// argument becomes the server's IPv4 address on the bridge).
    pub fn start_with(
        exe: &str,
        clusters: &[&str],
        agent_args: &[&str],
        server_args: &[&str],
    ) -> anyhow::Result<DomainNet> {
        let dir = tempfile::Builder::new()
            .prefix("rlark-domain-net-")
            .tempdir()?;
        let mut members = vec!["s"];
        members.extend_from_slice(clusters);
        let mut topology = Topology::create(&unique_prefix(), &members)?;
        let exe = PathBuf::from(exe);
        let server_address = topology.address("s")?.to_string();
        let server_args: Vec<String> = server_args
            .iter()
            .map(|a| a.replace("{address}", &server_address))
            .collect();
        let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
        let server = topology
            .start_server("s", &exe, &dir.path().join("server"), &server_args)
            .context("start the server")?;
        let mut agents = Vec::new();
        for cluster in clusters {
            let data = dir.path().join(format!("agent-{cluster}"));
            let address = topology.address(cluster)?.to_string();
            let args: Vec<String> = agent_args
                .iter()
                .map(|a| a.replace("{address}", &address))
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let agent = topology
                .start_agent(cluster, &exe, &server, cluster, &data, &args)
                .with_context(|| format!("start the agent of cluster {cluster}"))?;
            agents.push(agent);
        }
        Ok(DomainNet {
            topology,
            server,
            agents,
            exe,
            dir,
        })
    }

    /// The temporary directory holding data directories and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin's kubeconfig (for clients run in `s` with [`DomainNet::run_in_server`]).
    pub fn kubeconfig(&self) -> &Path {
        &self.server.kubeconfig
    }

    /// `command` run inside `s` (e.g. kubectl with [`DomainNet::kubeconfig`]); its output
    /// whatever the exit.
    pub fn run_in_server(&self, command: &Command) -> anyhow::Result<Output> {
        Ok(self.topology.run("s", command)?)
    }

    /// `rlark ARGS --kubeconfig <admin>` run inside `s`; its output whatever the exit.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut command = Command::new(&self.exe);
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.server.kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG");
        Ok(self.topology.run("s", &command)?)
    }

    /// [`DomainNet::cli`], failing with its stderr unless it exits 0; its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.cli(args)?;
        if !out.status.success() {
            bail!(
                "rlark {args:?} exited with {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `rlark apply -f FILE` with `yaml` written to a file of the temporary directory.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        let file = tempfile::Builder::new()
            .suffix(".yaml")
            .tempfile_in(self.dir.path())?;
        std::fs::write(file.path(), yaml)?;
        let path = file.path().to_string_lossy().into_owned();
        self.cli_ok(&["apply", "-f", &path])
    }

    /// `rlark get KIND NAME -o json` (namespace `namespace` if given), parsed; `None` when
    /// it does not exist (the CLI exits non-zero naming NotFound).
    pub fn get_json(
        &self,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
    ) -> anyhow::Result<Option<serde_json::Value>> {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if let Some(namespace) = namespace {
            args.extend(["-n", namespace]);
        }
        let out = self.cli(&args)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("NotFound") || stderr.contains("not found") {
                return Ok(None);
            }
            bail!("rlark {args:?} exited with {}: {stderr}", out.status);
        }
        Ok(Some(serde_json::from_slice(&out.stdout)?))
    }

    /// Poll (every 500 ms, at most `within`) until pod `namespace/name` has
    /// `status.phase` in `phases`; its JSON. A pod that reaches another final phase
    /// (`Succeeded`/`Failed` not asked for) fails at once, with the logs.
    pub fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        phases: &[&str],
        within: std::time::Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let until = std::time::Instant::now() + within;
        let mut last = None;
        loop {
            if let Some(pod) = self.get_json("pod", name, Some(namespace))? {
                let phase = pod["status"]["phase"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if phases.contains(&phase.as_str()) {
                    return Ok(pod);
                }
                if matches!(phase.as_str(), "Succeeded" | "Failed") {
                    bail!(
                        "pod {namespace}/{name} ended {phase}, wanted {phases:?}: {pod}\n{}",
                        self.logs()
                    );
                }
                last = Some(pod);
            }
            if std::time::Instant::now() >= until {
                bail!(
                    "pod {namespace}/{name} not {phases:?} within {within:?} (last: {})\n{}",
                    last.map(|p| p.to_string())
                        .unwrap_or_else(|| "absent".into()),
                    self.logs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    /// Every process's log tail, for a failure message.
    pub fn logs(&self) -> String {
        std::iter::once(&self.server.log)
            .chain(self.agents.iter().map(|a| &a.log))
            .map(|log| log_tail(log))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
