//! The Domain network's paths of `rlark bench net`, through the processes a user runs: the
//! real `rlark server` in namespace `s` and one real `rlark agent` per cluster in `a`, `b`
//! and `c` (each its own process of the `rlark` binary beside this one, joined with a bootstrap token, TLS and
//! tunnel as in production: `rlark_sim::topology`).
//!
//! Per termination mode, three clusters: the agents of `a` and `b` listen for the direct
//! path (`--domain-listen <address>:15443`), `c`'s does not, so a connection from `a` to a
//! member in `c` can only go through the hub. One Job in a Domain of its own places:
//!
//! - the **client** replica on `a`: its process only holds the replica (and so its network
//!   namespace); the measuring `rlark-bench net-peer --connect` runs inside that namespace
//!   (`nsenter --net=/proc/<agent pid>/root/run/netns/<name>`: the agent bind-mounts it in
//!   its own mount namespace), so its connections take exactly a task's path — the nft
//!   redirect (kernel mode) or the TUN device (tun mode), then the agent's router;
//! - a **target** replica (`rlark-bench net-peer --listen`) on `a` (local path), on `b`
//!   (direct path) and on `c` (relayed path); the client dials each by its virtual IP.
//!
//! Each path's connections are checked against the client agent's
//! `rlark_agent_domain_connections_total{path=...}`: a path whose connections went another
//! way (a direct path that fell back to relay) is reported with an error, not passed off.
//! Forwarding CPU: the client's agent (local); both agents (direct); both agents and the
//! server, which holds the hub (relay).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rlark_sim::topology::{AgentInNs, ServerInNs, log_tail};

use super::{Bench, Client, Ends, Group, NetPath};

/// Port of every agent's direct listener (on its member's address; `a` and `b` only).
const DIRECT_PORT: u16 = 15443;
/// Port of every agent's Prometheus endpoint (on its member's loopback).
const METRICS_PORT: u16 = 9464;
/// Longest wait for a replica to run.
const POD_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an agent has to stop its replicas when the bench stops it.
const AGENT_STOP_GRACE: Duration = Duration::from_secs(15);
/// The member each cluster's agent runs in; `a` and `b` announce a direct listener.
const MEMBERS: [(&str, bool); 3] = [("a", true), ("b", true), ("c", false)];

/// How the agents terminate a replica's TCP (`rlark agent --net-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// nft `REDIRECT` to the agent's listener: kernel TCP on both sides.
    Kernel,
    /// A TUN device and a userspace TCP/IP stack in the agent.
    Tun,
}

impl Mode {
    pub(super) const ALL: [Mode; 2] = [Mode::Kernel, Mode::Tun];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Tun => "tun",
        }
    }

    /// First hop inside the client replica, for the routes.
    fn entry(self) -> &'static str {
        match self {
            Mode::Kernel => "replica -> nft REDIRECT",
            Mode::Tun => "replica -> TUN + userspace TCP",
        }
    }

    /// Ports of the targets (local, direct, relay) and of the client's holder: distinct
    /// per mode, so a process of the other mode's run can never be mistaken for these.
    fn ports(self) -> [u16; 4] {
        match self {
            Mode::Kernel => [5211, 5212, 5213, 5219],
            Mode::Tun => [5221, 5222, 5223, 5229],
        }
    }

    /// The Domain's CIDR (Domains may not overlap: one per mode).
    fn cidr(self) -> &'static str {
        match self {
            Mode::Kernel => "10.77.0.0/24",
            Mode::Tun => "10.78.0.0/24",
        }
    }

    /// Cluster ID of the agent in `member` (distinct per mode: each mode's agents are new
    /// processes with fresh data).
    fn cluster(self, member: &str) -> String {
        format!("{}{member}", &self.as_str()[..1])
    }
}

/// The three Domain paths, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Local,
    Direct,
    Relay,
}

impl Kind {
    pub(super) const ALL: [Kind; 3] = [Kind::Local, Kind::Direct, Kind::Relay];

    /// The `path` label of the agent's metrics.
    fn label(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::Direct => "direct",
            Kind::Relay => "relay",
        }
    }

    /// The member of the target's agent.
    fn target_member(self) -> &'static str {
        match self {
            Kind::Local => "a",
            Kind::Direct => "b",
            Kind::Relay => "c",
        }
    }

    /// The row's name in the report.
    pub(super) fn row(self, mode: Mode) -> String {
        format!("rlark {} ({})", self.label(), mode.as_str())
    }

    /// The row's route.
    pub(super) fn route(self, mode: Mode) -> String {
        let entry = mode.entry();
        match self {
            Kind::Local => format!("{entry} -> agent a -> replica (same agent)"),
            Kind::Direct => format!("{entry} -> agent a -> mTLS -> agent b -> replica"),
            Kind::Relay => format!(
                "{entry} -> agent a -> tunnel -> hub (server in s) -> tunnel -> agent c -> replica"
            ),
        }
    }
}

/// Empty rows (name and route) of one mode, in report order.
pub(super) fn rows(mode: Mode) -> Vec<NetPath> {
    Kind::ALL
        .iter()
        .map(|kind| NetPath {
            name: kind.row(mode),
            route: kind.route(mode),
            ..NetPath::default()
        })
        .collect()
}

/// Why `exe`'s agent cannot run `mode`, if it cannot: the `--net-mode` flag is looked up in
/// `rlark agent --help` (without the flag the agent runs kernel mode only).
pub(super) fn unsupported(exe: &Path, mode: Mode) -> Option<String> {
    let help = match Command::new(exe).args(["agent", "--help"]).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => return Some(format!("`{} agent --help`: {e}", exe.display())),
    };
    match mode {
        _ if help.contains("--net-mode") => None,
        Mode::Kernel => None,
        Mode::Tun => {
            Some("this rlark agent has no --net-mode flag: tun mode is not in this build".into())
        }
    }
}

/// Whether the agent takes `--net-mode` (then the bench passes the mode explicitly).
fn has_mode_flag(exe: &Path) -> bool {
    Command::new(exe)
        .args(["agent", "--help"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("--net-mode"))
}

/// Start the server in `s`, with its data under `dir`.
pub(super) fn start_server(bench: &mut Bench, dir: &Path) -> anyhow::Result<ServerInNs> {
    let exe = bench.rlark.clone();
    tokio::task::block_in_place(|| {
        bench
            .topology
            .start_server("s", &exe, &dir.join("server"), &[])
            .context("start rlark server in s")
    })
}

/// One mode's run: agents, the Job's replicas, their pids and addresses.
struct ModeRun<'a> {
    mode: Mode,
    server: &'a ServerInNs,
    agents: Vec<AgentInNs>,
    /// Replica processes the bench made the agents start (targets and the client's
    /// holder), by pid: killed after the agents stopped if one outlived them.
    replicas: Vec<(u32, String)>,
}

/// Measure `mode`'s three paths into `rows` (from [`rows`]); a failure to set the mode up
/// marks every row not measured with the reason.
pub(super) async fn measure_mode(
    bench: &mut Bench,
    server: &ServerInNs,
    mode: Mode,
    rows: &mut [NetPath],
) {
    let mut run = ModeRun {
        mode,
        server,
        agents: Vec::new(),
        replicas: Vec::new(),
    };
    let outcome = run.measure(bench, rows).await;
    run.stop(bench);
    if let Err(e) = outcome {
        for row in rows.iter_mut().filter(|r| r.not_measured.is_none()) {
            if row.single_mb_s.is_none() && row.setup.is_none() {
                row.not_measured = Some(format!("{e:#}"));
            } else {
                row.errors.push(format!("{e:#}"));
            }
        }
    }
}

impl ModeRun<'_> {
    fn job(&self) -> String {
        format!("bench-{}", self.mode.as_str())
    }

    fn agent(&self, member: &str) -> anyhow::Result<&AgentInNs> {
        self.agents
            .iter()
            .find(|a| a.member == member)
            .with_context(|| format!("no agent in {member}"))
    }

    async fn measure(&mut self, bench: &mut Bench, rows: &mut [NetPath]) -> anyhow::Result<()> {
        let mode = self.mode;
        let data = bench.dir.path().join(mode.as_str());
        std::fs::create_dir_all(&data)?;
        let mode_flag = has_mode_flag(&bench.rlark);
        for (member, direct) in MEMBERS {
            let mut args = vec![
                "--metrics-listen".to_string(),
                format!("127.0.0.1:{METRICS_PORT}"),
            ];
            if direct {
                let address = bench.topology.address(member)?;
                args.push("--domain-listen".into());
                args.push(SocketAddr::new(address, DIRECT_PORT).to_string());
            }
            if mode_flag {
                args.push("--net-mode".into());
                args.push(mode.as_str().into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let cluster = mode.cluster(member);
            let exe = bench.rlark.clone();
            let agent = tokio::task::block_in_place(|| {
                bench.topology.start_agent(
                    member,
                    &exe,
                    self.server,
                    &cluster,
                    &data.join(format!("agent-{member}")),
                    &args,
                )
            })
            .with_context(|| format!("start the {} agent of {member}", mode.as_str()))?;
            self.agents.push(agent);
        }

        let domain = self.job();
        let [local, direct, relay, holder] = mode.ports();
        let exe = bench.exe.to_string_lossy().into_owned();
        let listen = |port: u16| -> serde_json::Value {
            serde_json::json!([exe, "net-peer", "--listen", format!("0.0.0.0:{port}")])
        };
        let task = |name: &str, member: &str, entrypoint: serde_json::Value| {
            serde_json::json!({
                "name": name,
                "agentType": "Raw",
                "role": "Actor",
                "nodeName": format!("{}-0", mode.cluster(member)),
                "raw": {"entrypoint": entrypoint},
            })
        };
        let holder_entry =
            serde_json::json!([exe, "net-peer", "--listen", format!("127.0.0.1:{holder}")]);
        let job = serde_json::json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": self.job()},
            "spec": {"domain": domain, "tasks": [
                task("client", "a", holder_entry),
                task("local", Kind::Local.target_member(), listen(local)),
                task("direct", Kind::Direct.target_member(), listen(direct)),
                task("relay", Kind::Relay.target_member(), listen(relay)),
            ]},
        });
        let domain_doc = serde_json::json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Domain",
            "metadata": {"name": domain},
            "spec": {"cidr": mode.cidr()},
        });
        self.apply(bench, &domain_doc)?;
        self.apply(bench, &job)?;

        // Every replica running: the client's holder and the targets, with their pids.
        let mut targets = Vec::new();
        let mut client_pid = None;
        for (task, member, port) in [
            ("client", "a", holder),
            ("local", Kind::Local.target_member(), local),
            ("direct", Kind::Direct.target_member(), direct),
            ("relay", Kind::Relay.target_member(), relay),
        ] {
            let namespace = format!("rlark-{}", mode.cluster(member));
            let pod = format!("{}-{task}-0", self.job());
            self.wait_running(bench, &namespace, &pod)?;
            let pid = find_listener(port).await.with_context(|| {
                format!("no process of replica {namespace}/{pod} listens on port {port}")
            })?;
            self.replicas.push((pid, listener_arg(port)));
            if task == "client" {
                client_pid = Some(pid);
            } else {
                let ip = self.allocated_ip(bench, &format!("{}-{task}", self.job()))?;
                targets.push((pid, SocketAddr::new(ip, port)));
            }
        }
        // The client replica's own network namespace, through its holder process.
        let client_pid = client_pid.context("no client replica")?;
        let client_netns = PathBuf::from(format!("/proc/{client_pid}/ns/net"));
        if !client_netns.exists() {
            bail!(
                "the client replica's network namespace {} does not exist",
                client_netns.display()
            );
        }

        let server_pid = self.server.pid;
        for ((kind, row), (target_pid, addr)) in Kind::ALL.iter().zip(rows.iter_mut()).zip(targets)
        {
            let mut forwarders: Group = vec![("agent a".into(), self.agent("a")?.pid)];
            match kind {
                Kind::Local => {}
                Kind::Direct => forwarders.push(("agent b".into(), self.agent("b")?.pid)),
                Kind::Relay => {
                    forwarders.push(("agent c".into(), self.agent("c")?.pid));
                    forwarders.push(("server".into(), server_pid));
                }
            }
            let ends = Ends {
                client: Client::Netns(client_netns.clone()),
                target_pid,
            };
            let before = self.connections(bench, &domain);
            let opened = bench.measure(row, &ends, addr, &forwarders).await;
            if row.not_measured.is_some() {
                continue;
            }
            match (before, self.connections(bench, &domain)) {
                (Ok(before), Ok(after)) => {
                    let delta = |path: &str| {
                        after.get(path).copied().unwrap_or(0.0)
                            - before.get(path).copied().unwrap_or(0.0)
                    };
                    let counted = delta(kind.label());
                    row.counted_connections = Some(counted as u64);
                    let elsewhere: Vec<String> = Kind::ALL
                        .iter()
                        .filter(|k| *k != kind && delta(k.label()) > 0.0)
                        .map(|k| format!("{} over {}", delta(k.label()), k.label()))
                        .collect();
                    if !elsewhere.is_empty() || counted < opened as f64 {
                        row.errors.push(format!(
                            "agent a counted {counted} {} connection(s) of the {opened} opened \
                             and {}: the figures are not all of this path",
                            kind.label(),
                            if elsewhere.is_empty() {
                                "none elsewhere".to_string()
                            } else {
                                elsewhere.join(", ")
                            }
                        ));
                    }
                }
                (Err(e), _) | (_, Err(e)) => row
                    .errors
                    .push(format!("path not verified in agent a's metrics: {e:#}")),
            }
        }
        Ok(())
    }

    /// `rlark apply -f` of `doc` inside `s`.
    fn apply(&self, bench: &Bench, doc: &serde_json::Value) -> anyhow::Result<()> {
        let file = bench.dir.path().join(format!(
            "{}-{}.json",
            self.job(),
            doc["kind"].as_str().unwrap_or("doc")
        ));
        std::fs::write(&file, doc.to_string())?;
        let path = file.to_string_lossy().into_owned();
        self.cli_ok(bench, &["apply", "-f", &path])?;
        Ok(())
    }

    /// `rlark ARGS --kubeconfig <admin>` inside `s`; its stdout, or an error with its
    /// stderr unless it exits 0.
    fn cli_ok(&self, bench: &Bench, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new(&bench.rlark);
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.server.kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG");
        let out = tokio::task::block_in_place(|| bench.topology.run("s", &command))?;
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

    /// Poll pod `namespace/pod` until it is `Running` (bounded by [`POD_TIMEOUT`]).
    fn wait_running(&self, bench: &Bench, namespace: &str, pod: &str) -> anyhow::Result<()> {
        let until = Instant::now() + POD_TIMEOUT;
        let mut last = String::new();
        loop {
            if let Ok(text) =
                self.cli_ok(bench, &["get", "pod", pod, "-n", namespace, "-o", "json"])
            {
                let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                match json["status"]["phase"].as_str() {
                    Some("Running") => return Ok(()),
                    Some(phase @ ("Succeeded" | "Failed")) => {
                        bail!(
                            "replica {namespace}/{pod} ended {phase}: {text}\n{}",
                            self.logs()
                        )
                    }
                    _ => last = text,
                }
            }
            if Instant::now() >= until {
                bail!(
                    "replica {namespace}/{pod} not Running within {POD_TIMEOUT:?} (last: {last})\n{}",
                    self.logs()
                );
            }
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(300)));
        }
    }

    /// The virtual IP allocated to replica 0 of Task `task` in the mode's Domain.
    fn allocated_ip(&self, bench: &Bench, task: &str) -> anyhow::Result<IpAddr> {
        let text = self.cli_ok(bench, &["get", "domain", &self.job(), "-o", "json"])?;
        let domain: serde_json::Value = serde_json::from_str(&text)?;
        domain["status"]["ipAllocations"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["task"] == task && a["index"] == 0 && a["releasedAt"].is_null())
            .and_then(|a| a["ip"].as_str()?.parse().ok())
            .with_context(|| format!("no IP allocated to {task}-0: {text}"))
    }

    /// Agent a's `rlark_agent_domain_connections_total{outcome="ok"}` of `domain`, by path.
    fn connections(&self, bench: &Bench, domain: &str) -> anyhow::Result<BTreeMap<String, f64>> {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{METRICS_PORT}/metrics"));
        let out = tokio::task::block_in_place(|| bench.topology.run("a", &curl))
            .context("curl (apt-get install curl) in a")?;
        if !out.status.success() {
            bail!(
                "curl of agent a's metrics: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(connections_by_path(
            &String::from_utf8_lossy(&out.stdout),
            domain,
        ))
    }

    /// The agents' log tails, for an error.
    fn logs(&self) -> String {
        std::iter::once(&self.server.log)
            .chain(self.agents.iter().map(|a| &a.log))
            .map(|log| log_tail(log))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Delete the Job, stop the agents (they stop their replicas: `--stop-tasks-on-exit`),
    /// then kill any replica process that outlived its agent.
    fn stop(&mut self, bench: &mut Bench) {
        if !self.agents.is_empty() {
            let _ = self.cli_ok(bench, &["delete", "job", &self.job()]);
        }
        tokio::task::block_in_place(|| {
            for agent in self.agents.drain(..) {
                bench.topology.stop(agent.pid, AGENT_STOP_GRACE);
            }
        });
        for (pid, arg) in self.replicas.drain(..) {
            // Only if that pid is still the replica's process (not a reused pid).
            if listener_pid_matches(pid, &arg)
                && let Some(pid) = rustix::process::Pid::from_raw(pid as i32)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// `--listen`'s value a replica of this bench was given for `port` (`0.0.0.0:PORT` for a
/// target, `127.0.0.1:PORT` for the client's holder), as it appears in its command line.
fn listener_arg(port: u16) -> String {
    format!(":{port}")
}

/// Whether `pid` runs `... net-peer --listen ADDR` with ADDR ending in `suffix`.
fn listener_pid_matches(pid: u32, suffix: &str) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
    args.iter().any(|a| *a == b"net-peer")
        && args
            .windows(2)
            .any(|w| w[0] == b"--listen" && w[1].ends_with(suffix.as_bytes()))
}

/// The pid of the process running `net-peer --listen *:port`, polled for up to 10 s (a
/// replica's Pod may say Running a moment before its process is exec'd).
async fn find_listener(port: u16) -> Option<u32> {
    let suffix = listener_arg(port);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let found = std::fs::read_dir("/proc").ok().and_then(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .find(|&pid| listener_pid_matches(pid, &suffix))
        });
        if found.is_some() || Instant::now() >= until {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `rlark_agent_domain_connections_total` samples of `domain` with `outcome="ok"` in a
/// Prometheus text exposition, summed by `path`. Lines it cannot read are skipped.
pub(super) fn connections_by_path(text: &str, domain: &str) -> BTreeMap<String, f64> {
    let mut by_path = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("rlark_agent_domain_connections_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                (key.trim() == name).then(|| value.trim().trim_matches('"').to_string())
            })
        };
        if label("domain").as_deref() == Some(domain)
            && label("outcome").as_deref() == Some("ok")
            && let Some(path) = label("path")
        {
            *by_path.entry(path).or_insert(0.0) += value;
        }
    }
    by_path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_summed_by_path_for_one_domain_and_outcome_ok() {
        let text = "\
# HELP rlark_agent_domain_connections Pod-network connections
# TYPE rlark_agent_domain_connections counter
rlark_agent_domain_connections_total{domain=\"bench-kernel\",path=\"direct\",outcome=\"ok\"} 12
rlark_agent_domain_connections_total{domain=\"bench-kernel\",path=\"direct\",outcome=\"refused\"} 3
rlark_agent_domain_connections_total{domain=\"bench-kernel\",path=\"relay\",outcome=\"ok\"} 2
rlark_agent_domain_connections_total{domain=\"other\",path=\"local\",outcome=\"ok\"} 7
rlark_agent_domain_connections_total{domain=\"bench-kernel\",path=\"local\",outcome=\"ok\"} not-a-number
rlark_agent_domain_bytes_total{domain=\"bench-kernel\",path=\"direct\",direction=\"out\"} 99
";
        let by_path = connections_by_path(text, "bench-kernel");
        assert_eq!(by_path.get("direct"), Some(&12.0));
        assert_eq!(by_path.get("relay"), Some(&2.0));
        assert_eq!(by_path.get("local"), None);
        assert_eq!(by_path.len(), 2);
    }

    #[test]
    fn rows_name_each_path_and_mode_once() {
        let names: Vec<String> = Mode::ALL
            .iter()
            .flat_map(|m| rows(*m))
            .map(|r| r.name)
            .collect();
        assert_eq!(names.len(), 6);
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), 6);
        assert!(names.contains(&"rlark relay (tun)".to_string()));
        assert_ne!(Mode::Kernel.cluster("a"), Mode::Tun.cluster("a"));
    }
}
