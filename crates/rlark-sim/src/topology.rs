//! Simulated hosts as Linux network namespaces, for `rlark bench net` and the Domain network
//! tests: a "wan" namespace holding a bridge, and one namespace per member (a server `s`,
//! clusters `a`, `b`, ...) joined to that bridge by a veth pair.
//!
//! Each member's `eth0` gets `198.18.0.<i+1>/15` (RFC 2544's benchmark range) and
//! `fd1b::<i+1>/64` (DAD off, usable at once), `lo` is up. Nothing is added to the caller's
//! own namespace: every interface lives in a namespace this module created, so topologies
//! of parallel tests never collide as long as their name prefixes differ
//! ([`unique_prefix`]). The addresses repeat between topologies; that is fine because each
//! bridge is alone in its own wan namespace.
//!
//! [`Topology`]'s `Drop` stops what it spawned (SIGTERM, then SIGKILL after
//! [`STOP_GRACE`]), kills whatever else still runs in its namespaces, and deletes them.
//!
//! Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN), `ip` (iproute2) and, for
//! [`Topology::drop_tcp`], `nft` (nftables). Every command is bounded by
//! [`COMMAND_TIMEOUT`].

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for one `ip`/`nft` command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a spawned process has between SIGTERM and SIGKILL when the topology is dropped.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Longest wait for `rlark server` to listen or `rlark agent` to connect its tunnel.
pub const START_TIMEOUT: Duration = Duration::from_secs(90);
/// The port `rlark server` listens on in its namespace ([`Topology::start_server`]).
pub const SERVER_PORT: u16 = 6443;
/// Prefix length of the IPv4 addresses (198.18.0.0/15).
pub const IPV4_PREFIX_LEN: u8 = 15;
/// Prefix length of the IPv6 addresses (fd1b::/64).
pub const IPV6_PREFIX_LEN: u8 = 64;
/// Environment variable overriding the first part of [`unique_prefix`] (default `rlk`).
pub const PREFIX_ENV: &str = "RLARK_NETNS_PREFIX";
/// Longest accepted namespace prefix: names must stay short enough to read in `ip netns`.
pub const MAX_PREFIX_LEN: usize = 40;

/// Failures building or using a [`Topology`], naming the command or member involved.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("invalid member name {0:?}: use 1-8 lowercase letters or digits, unique")]
    BadMember(String),
    #[error("invalid namespace prefix {0:?}: use at most {MAX_PREFIX_LEN} of [a-z0-9-]")]
    BadPrefix(String),
    #[error("at most 200 members in one topology, got {0}")]
    TooManyMembers(usize),
    #[error("no member {0:?} in this topology")]
    UnknownMember(String),
    #[error("start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` did not finish within {timeout:?}")]
    Timeout { command: String, timeout: Duration },
    #[error("{what} exited ({status})\n{log_tail}")]
    Exited {
        what: String,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("{what} not ready within {within:?}\n{log_tail}")]
    NotReady {
        what: String,
        within: Duration,
        log_tail: String,
    },
    #[error("`{command}` printed no {field}: {output}")]
    BadOutput {
        command: String,
        field: &'static str,
        output: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// A namespace prefix no other live topology uses: `<base><pid>-<n>-` where base is
/// `$RLARK_NETNS_PREFIX` or `rlk`, and n counts the calls in this process.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::env::var(PREFIX_ENV).unwrap_or_else(|_| "rlk".to_string());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{base}{}-{n}-", std::process::id())
}

/// One member namespace.
#[derive(Debug, Clone)]
pub struct Member {
    /// The name given to [`Topology::create`] (`s`, `a`, ...).
    pub name: String,
    /// The network namespace (`<prefix><name>`).
    pub netns: String,
    /// Its IPv4 address on the bridge.
    pub ipv4: Ipv4Addr,
    /// Its IPv6 address on the bridge.
    pub ipv6: Ipv6Addr,
}

/// The namespaces, bridge and veths of one test or bench run; deleted on drop.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
    wan: Option<String>,
    members: Vec<Member>,
    /// Processes started with [`Topology::spawn_detached`], stopped on drop.
    children: Vec<Child>,
}

impl Topology {
    /// Build the wan namespace and one namespace per `members` entry. A failure half way
    /// deletes what was already created.
    pub fn create(prefix: &str, members: &[&str]) -> Result<Topology, TopologyError> {
        let prefix_ok = prefix.len() <= MAX_PREFIX_LEN
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !prefix_ok {
            return Err(TopologyError::BadPrefix(prefix.to_string()));
        }
        if members.len() > 200 {
            return Err(TopologyError::TooManyMembers(members.len()));
        }
        for (i, name) in members.iter().enumerate() {
            let ok = (1..=8).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && name != &"wan"
                && !members[..i].contains(name);
            if !ok {
                return Err(TopologyError::BadMember(name.to_string()));
            }
        }
        // Built step by step: on error, `Drop` deletes the part already made.
        let mut topology = Topology {
            prefix: prefix.to_string(),
            wan: None,
            members: Vec::new(),
            children: Vec::new(),
        };
        let wan = format!("{prefix}wan");
        ip(&["netns", "add", &wan])?;
        topology.wan = Some(wan.clone());
        ip(&["-n", &wan, "link", "set", "lo", "up"])?;
        ip(&["-n", &wan, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &wan, "link", "set", "br0", "up"])?;
        for (i, name) in members.iter().enumerate() {
            let netns = format!("{prefix}{name}");
            ip(&["netns", "add", &netns])?;
            // The index is < 200 (checked above), so the host part fits one octet.
            let host = (i + 1) as u8;
            let member = Member {
                name: name.to_string(),
                netns: netns.clone(),
                ipv4: Ipv4Addr::new(198, 18, 0, host),
                ipv6: Ipv6Addr::new(0xfd1b, 0, 0, 0, 0, 0, 0, u16::from(host)),
            };
            topology.members.push(member.clone());
            let veth = format!("v{i}");
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &wan, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                &netns,
            ])?;
            ip(&["-n", &wan, "link", "set", &veth, "master", "br0", "up"])?;
            let v4 = format!("{}/{IPV4_PREFIX_LEN}", member.ipv4);
            let v6 = format!("{}/{IPV6_PREFIX_LEN}", member.ipv6);
            ip(&["-n", &netns, "addr", "add", &v4, "dev", "eth0"])?;
            ip(&["-n", &netns, "addr", "add", &v6, "dev", "eth0", "nodad"])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
        }
        Ok(topology)
    }

    /// The namespace prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The members, in the order given to [`Topology::create`].
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Member `name`.
    pub fn member(&self, name: &str) -> Result<&Member, TopologyError> {
        self.members
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| TopologyError::UnknownMember(name.to_string()))
    }

    /// The network namespace of member `name`.
    pub fn netns(&self, name: &str) -> Result<&str, TopologyError> {
        Ok(&self.member(name)?.netns)
    }

    /// The IPv4 address of member `name` on the bridge.
    pub fn address(&self, name: &str) -> Result<IpAddr, TopologyError> {
        Ok(IpAddr::V4(self.member(name)?.ipv4))
    }

    /// The IPv6 address of member `name` on the bridge.
    pub fn address_v6(&self, name: &str) -> Result<IpAddr, TopologyError> {
        Ok(IpAddr::V6(self.member(name)?.ipv6))
    }

    /// `command` to be run inside member `name`'s namespace: `ip netns exec NS PROGRAM
    /// ARGS` with `command`'s environment changes and working directory (not its stdio:
    /// set that on the result). `ip netns exec` execs the program, so the child's pid is
    /// the program's.
    pub fn wrap(&self, name: &str, command: &Command) -> Result<Command, TopologyError> {
        let netns = self.netns(name)?;
        let mut wrapped = Command::new("ip");
        wrapped
            .args(["netns", "exec", netns])
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        Ok(wrapped)
    }

    /// Run `command` inside member `name`'s namespace to completion (bounded by
    /// [`COMMAND_TIMEOUT`]) and return its output, whatever its exit status. Its stdout and
    /// stderr are read to their end: a process it leaves running must not keep them open
    /// (redirect a background job's output).
    pub fn run(&self, name: &str, command: &Command) -> Result<Output, TopologyError> {
        let mut wrapped = self.wrap(name, command)?;
        output_within(&mut wrapped, COMMAND_TIMEOUT)
    }

    /// Start `command` inside member `name`'s namespace (stdin null; stdout and stderr as
    /// `command` would get them by default, i.e. inherited, unless `stdio` sets them). The
    /// topology stops it when dropped; the returned pid is the program's.
    pub fn spawn_detached(
        &mut self,
        name: &str,
        command: &Command,
        stdio: impl FnOnce(&mut Command),
    ) -> Result<u32, TopologyError> {
        let mut wrapped = self.wrap(name, command)?;
        wrapped.stdin(Stdio::null());
        stdio(&mut wrapped);
        let child = wrapped.spawn().map_err(|source| TopologyError::Spawn {
            command: describe(&wrapped),
            source,
        })?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Whether the process `pid` started by [`Topology::spawn_detached`] has exited (and
    /// its status if so).
    pub fn try_wait(&mut self, pid: u32) -> Option<std::process::ExitStatus> {
        let child = self.children.iter_mut().find(|c| c.id() == pid)?;
        child.try_wait().ok().flatten()
    }

    /// Stop process `pid` started by [`Topology::spawn_detached`]: SIGTERM, then SIGKILL
    /// after `grace`. Unknown pids are ignored.
    pub fn stop(&mut self, pid: u32, grace: Duration) {
        if let Some(i) = self.children.iter().position(|c| c.id() == pid) {
            let child = self.children.remove(i);
            stop_all(vec![child], grace);
        }
    }

    /// Drop TCP packets leaving member `from` for `to:port` (an nftables table of its own
    /// in `from`'s namespace, output hook): new connections there hang as on a cut link,
    /// other ports are untouched. Undone by [`DropRule::remove`] or when the rule is
    /// dropped.
    pub fn drop_tcp(&self, from: &str, to: IpAddr, port: u16) -> Result<DropRule, TopologyError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let netns = self.netns(from)?.to_string();
        let table = format!("rlark_drop_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let family = match to {
            IpAddr::V4(_) => "ip",
            IpAddr::V6(_) => "ip6",
        };
        let script = format!(
            "table inet {table} {{\n chain out {{\n  type filter hook output priority 0; \
             policy accept;\n  {family} daddr {to} tcp dport {port} drop\n }}\n}}\n"
        );
        let path = std::env::temp_dir().join(format!("{}{table}.nft", self.prefix));
        std::fs::write(&path, script).map_err(|source| TopologyError::Spawn {
            command: format!("write {}", path.display()),
            source,
        })?;
        let result = ip_netns_exec(
            &netns,
            &[OsString::from("nft"), "-f".into(), path.clone().into()],
        );
        let _ = std::fs::remove_file(&path);
        result?;
        Ok(DropRule {
            netns,
            table,
            removed: false,
        })
    }
}

/// An `rlark server` started by [`Topology::start_server`].
#[derive(Debug, Clone)]
pub struct ServerInNs {
    /// The member it runs in.
    pub member: String,
    /// Its pid (stopped when the topology is dropped).
    pub pid: u32,
    /// `https://<member address>:SERVER_PORT`.
    pub url: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// The admin kubeconfig it wrote (usable inside any member's namespace).
    pub kubeconfig: PathBuf,
    /// Its log (JSON lines).
    pub log: PathBuf,
}

/// An `rlark agent` started by [`Topology::start_agent`].
#[derive(Debug, Clone)]
pub struct AgentInNs {
    /// The member it runs in.
    pub member: String,
    /// Its cluster ID (namespace `rlark-<cluster>`).
    pub cluster: String,
    /// Its pid (stopped when the topology is dropped).
    pub pid: u32,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its log (JSON lines).
    pub log: PathBuf,
}

impl Topology {
    /// Start `rlark server` (the executable `exe`) in member `name`, listening on the
    /// member's IPv4 address port [`SERVER_PORT`] with that address in its certificate,
    /// data in `data_dir`, log in `data_dir/../<name>-server.log`, plus `extra` arguments;
    /// wait (at most [`START_TIMEOUT`]) until it logs `listening`.
    pub fn start_server(
        &mut self,
        name: &str,
        exe: &Path,
        data_dir: &Path,
        extra: &[&str],
    ) -> Result<ServerInNs, TopologyError> {
        let address = self.address(name)?;
        let listen = SocketAddr::new(address, SERVER_PORT);
        let log = sibling(data_dir, &format!("{name}-server.log"));
        let mut command = Command::new(exe);
        command
            .args(["--log-format", "json", "server", "--listen"])
            .arg(listen.to_string())
            .args(["--tls-san", &address.to_string(), "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG");
        let what = format!("rlark server in {name}");
        let pid = self.spawn_logged(name, &command, &log, &what)?;
        self.wait_log(pid, &what, &log, |line| line.contains("\"listening\""))?;
        Ok(ServerInNs {
            member: name.to_string(),
            pid,
            url: format!("https://{listen}"),
            data_dir: data_dir.to_path_buf(),
            kubeconfig: data_dir.join("admin.kubeconfig"),
            log,
        })
    }

    /// Start `rlark agent` of `cluster` in member `name` (node name `<cluster>-0`, data in
    /// `data_dir`, `--stop-tasks-on-exit`, 1 s heartbeats, plus `extra` arguments), joined
    /// with a bootstrap token that `rlark token create` makes inside the server's member;
    /// wait (at most [`START_TIMEOUT`]) until it logs `tunnel connected`.
    pub fn start_agent(
        &mut self,
        name: &str,
        exe: &Path,
        server: &ServerInNs,
        cluster: &str,
        data_dir: &Path,
        extra: &[&str],
    ) -> Result<AgentInNs, TopologyError> {
        let mut token = Command::new(exe);
        token
            .args(["token", "create", "--cluster-id", cluster, "--ttl", "10m"])
            .args(["-o", "json", "--kubeconfig"])
            .arg(&server.kubeconfig)
            .env_remove("KUBECONFIG");
        let described = describe(&token);
        let output = self.run(&server.member, &token)?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(TopologyError::Failed {
                command: described,
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|_| TopologyError::BadOutput {
                command: described.clone(),
                field: "JSON",
                output: text.clone(),
            })?;
        let field = |field: &'static str| {
            json[field]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| TopologyError::BadOutput {
                    command: described.clone(),
                    field,
                    output: text.clone(),
                })
        };
        let (token, ca_hash) = (field("token")?, field("caHash")?);
        let log = sibling(data_dir, &format!("{name}-agent.log"));
        let mut command = Command::new(exe);
        command
            .args(["--log-format", "json", "agent", "--server", &server.url])
            .args(["--cluster-id", cluster, "--data-dir"])
            .arg(data_dir)
            .args([
                "--node-name",
                &format!("{cluster}-0"),
                "--stop-tasks-on-exit",
            ])
            .args(["--heartbeat-interval", "1s", "--token", &token])
            .args(["--ca-hash", &ca_hash])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG");
        let what = format!("rlark agent of cluster {cluster} in {name}");
        let pid = self.spawn_logged(name, &command, &log, &what)?;
        self.wait_log(pid, &what, &log, |line| line.contains("tunnel connected"))?;
        Ok(AgentInNs {
            member: name.to_string(),
            cluster: cluster.to_string(),
            pid,
            data_dir: data_dir.to_path_buf(),
            log,
        })
    }

    /// Spawn `command` in `name` with stdout and stderr appended to `log`.
    fn spawn_logged(
        &mut self,
        name: &str,
        command: &Command,
        log: &Path,
        what: &str,
    ) -> Result<u32, TopologyError> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|source| TopologyError::Io {
                    what: format!("open {} (log of {what})", log.display()),
                    source,
                })
        };
        let (out, err) = (open()?, open()?);
        self.spawn_detached(name, command, |c| {
            c.stdout(out).stderr(err);
        })
    }

    /// Poll `log` until a line satisfies `ready`; fail early when `pid` exits.
    fn wait_log(
        &mut self,
        pid: u32,
        what: &str,
        log: &Path,
        ready: impl Fn(&str) -> bool,
    ) -> Result<(), TopologyError> {
        let until = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.lines().any(&ready) {
                return Ok(());
            }
            if let Some(status) = self.try_wait(pid) {
                return Err(TopologyError::Exited {
                    what: what.to_string(),
                    status,
                    log_tail: log_tail(log),
                });
            }
            if Instant::now() >= until {
                return Err(TopologyError::NotReady {
                    what: what.to_string(),
                    within: START_TIMEOUT,
                    log_tail: log_tail(log),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `path`'s sibling named `file` (or `file` in the current directory).
fn sibling(path: &Path, file: &str) -> PathBuf {
    path.parent()
        .map_or_else(|| PathBuf::from(file), |p| p.join(file))
}

/// The last 30 lines of `log`, for an error message.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(30);
    format!(
        "{} (last lines):\n{}",
        log.display(),
        lines[start..].join("\n")
    )
}

impl Drop for Topology {
    fn drop(&mut self) {
        stop_all(std::mem::take(&mut self.children), STOP_GRACE);
        let namespaces: Vec<String> = self
            .members
            .iter()
            .map(|m| m.netns.clone())
            .chain(self.wan.clone())
            .collect();
        for netns in &namespaces {
            // Whatever else runs there (a child's own children) would keep the namespace.
            if let Ok(out) = output_within(
                Command::new("ip").args(["netns", "pids", netns]),
                COMMAND_TIMEOUT,
            ) {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
            if let Err(error) = ip(&["netns", "del", netns]) {
                tracing::warn!(netns = %netns, %error, "could not delete a network namespace");
            }
        }
    }
}

/// An nftables drop rule made by [`Topology::drop_tcp`]; removed on drop.
#[derive(Debug)]
pub struct DropRule {
    netns: String,
    table: String,
    removed: bool,
}

impl DropRule {
    /// Remove the rule: connections to the port work again.
    pub fn remove(mut self) -> Result<(), TopologyError> {
        self.removed = true;
        self.delete()
    }

    fn delete(&self) -> Result<(), TopologyError> {
        ip_netns_exec(
            &self.netns,
            &["nft", "delete", "table", "inet", self.table.as_str()].map(OsString::from),
        )
    }
}

impl Drop for DropRule {
    fn drop(&mut self) {
        // The namespace may already be gone (the topology dropped first): nothing to undo.
        if !self.removed {
            let _ = self.delete();
        }
    }
}

/// SIGTERM every child, wait up to `grace` for all, SIGKILL the rest and reap them.
fn stop_all(mut children: Vec<Child>, grace: Duration) {
    for child in &children {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let until = Instant::now() + grace;
    while Instant::now() < until {
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
        if children.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn ip(args: &[&str]) -> Result<(), TopologyError> {
    checked(Command::new("ip").args(args))
}

fn ip_netns_exec(netns: &str, argv: &[OsString]) -> Result<(), TopologyError> {
    checked(Command::new("ip").args(["netns", "exec", netns]).args(argv))
}

/// Run to completion within [`COMMAND_TIMEOUT`]; a non-zero exit is an error with stderr.
fn checked(command: &mut Command) -> Result<(), TopologyError> {
    let output = output_within(command, COMMAND_TIMEOUT)?;
    if output.status.success() {
        return Ok(());
    }
    Err(TopologyError::Failed {
        command: describe(command),
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

/// `command`'s output (stdout and stderr captured), killing it after `timeout`.
fn output_within(command: &mut Command, timeout: Duration) -> Result<Output, TopologyError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| TopologyError::Spawn {
            command: describe(command),
            source,
        })?;
    // Read both pipes on threads so a chatty command cannot block on a full pipe.
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let until = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TopologyError::Timeout {
                    command: describe(command),
                    timeout,
                });
            }
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_anything_is_created() {
        for (prefix, members) in [
            ("Bad", &["a"][..]),
            ("x y", &["a"][..]),
            ("ok-", &["A"][..]),
            ("ok-", &["wan"][..]),
            ("ok-", &["a", "a"][..]),
            ("ok-", &[""][..]),
            ("ok-", &["toolongname"][..]),
        ] {
            let error = Topology::create(prefix, members).unwrap_err();
            assert!(
                matches!(
                    error,
                    TopologyError::BadPrefix(_) | TopologyError::BadMember(_)
                ),
                "{prefix:?} {members:?}: {error}"
            );
        }
    }

    #[test]
    fn prefixes_differ_per_call() {
        let a = unique_prefix();
        let b = unique_prefix();
        assert_ne!(a, b);
        assert!(a.ends_with('-'), "{a}");
    }
}
