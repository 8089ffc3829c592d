//! DeviceService.Setup (devinit) in network namespaces this test creates; the machine's own
//! interfaces are never touched.
//!
//! Namespace `H` plays the host: it gets veth pairs (`rlkpar0`, `rlkpar1`) as macvlan
//! parents, and the runtime runs there (`ip netns exec H` on this test binary, in the
//! helper role). Callers are processes in other namespaces (`B`, `C`, ...) that call Setup
//! over the unix socket, as `rlark devinit setup` in a pod's init container would. Results
//! are checked with `ip -j -d` in the caller's namespace. `ip` sets the test up and reads
//! results only; the runtime itself speaks netlink.
//!
//! Where network namespaces cannot be created (not root, no CAP_NET_ADMIN, no `ip`), or
//! `setpriv` is missing for the permission case, a test fails under `CI=true` /
//! `RLARK_REQUIRE_TOOLS=1` (what `scripts/test.sh` sets), naming what is missing; elsewhere
//! (a developer's `cargo test`) it prints `SKIPPED:` and why, and returns without checking
//! the rest (`tests/support/missing_tool.rs`).

use crate::missing_tool;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

/// Environment variable selecting the helper role (`runtime` or `client`).
const ROLE: &str = "RLARK_DEVINIT_TEST_ROLE";
const CONFIG: &str = "RLARK_DEVINIT_TEST_CONFIG";
const SOCKET_DIR: &str = "RLARK_DEVINIT_TEST_SOCKET_DIR";
/// Marks the helper's output lines among the test harness's.
const READY: &str = "RLARK-DEVINIT-READY";
const RESULT: &str = "RLARK-DEVINIT-RESULT ";
/// Longest any process of this test may take.
const LIMIT: Duration = Duration::from_secs(60);

// ---- helper processes ----

/// Not a test: the body of the helper processes the tests start (`ip netns exec NS
/// <this binary> --ignored --exact devinit::helper_process`).
#[test]
#[ignore = "helper process of the devinit tests, started with RLARK_DEVINIT_TEST_ROLE set"]
fn helper_process() {
    let role = std::env::var(ROLE)
        .expect("RLARK_DEVINIT_TEST_ROLE must be set: this is a helper process, not a test");
    let socket_dir = PathBuf::from(std::env::var(SOCKET_DIR).expect("socket dir"));
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match role.as_str() {
        "runtime" => runtime.block_on(helper_runtime(&socket_dir)),
        "client" => runtime.block_on(helper_client(&socket_dir)),
        other => panic!("unknown helper role {other:?}"),
    }
}

/// Serve the configuration until stdin closes.
async fn helper_runtime(socket_dir: &Path) {
    let config = std::env::var(CONFIG).expect("config path");
    let config = rlark_embodied::EmbodiedConfig::from_file(Path::new(&config)).expect("config");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = rlark_embodied::serve(config, socket_dir, shutdown.clone())
        .await
        .expect("serve");
    println!("{READY}");
    // The test closes our stdin to stop us.
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    })
    .await
    .expect("stdin reader");
    shutdown.cancel();
    running.wait().await.expect("clean shutdown");
}

/// Call Setup once and print the outcome as JSON.
async fn helper_client(socket_dir: &Path) {
    use rlark_proto::device::v1::SetupRequest;
    use rlark_proto::device::v1::device_service_client::DeviceServiceClient;
    let channel = match rlark_embodied::client::connect(
        socket_dir.join(rlark_embodied::DEVINIT_SOCKET),
    )
    .await
    {
        Ok(channel) => channel,
        Err(e) => {
            let outcome = json!({"error": {"code": "Unavailable", "message": e.to_string()}});
            println!("{RESULT}{outcome}");
            return;
        }
    };
    let outcome = match DeviceServiceClient::new(channel)
        .setup(SetupRequest {})
        .await
    {
        Ok(response) => {
            let r = response.into_inner();
            json!({"ok": {
                "created": r.created,
                "skipped": r.skipped,
                "host_network": r.host_network,
                "interfaces": r.interfaces.iter().map(|i| json!({
                    "name": i.name, "parent": i.parent, "address": i.address,
                    "mac": i.mac, "mtu": i.mtu, "created": i.created,
                })).collect::<Vec<_>>(),
            }})
        }
        Err(status) => json!({"error": {
            "code": format!("{:?}", status.code()),
            "message": status.message(),
        }}),
    };
    println!("{RESULT}{outcome}");
}

// ---- test machinery ----

/// Run `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("run ip {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A network namespace, deleted on drop (with everything in it).
struct Netns {
    name: String,
}

impl Netns {
    fn new(suffix: &str) -> Result<Self> {
        // Unique per process and per namespace (the tests run in parallel).
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rlkdi{}-{}{suffix}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// `ip -j -d addr show` in this namespace, by interface name.
    fn interfaces(&self) -> Result<Vec<Value>> {
        let text = self.ip(&["-j", "-d", "addr", "show"])?;
        Ok(serde_json::from_str::<Vec<Value>>(&text)?)
    }

    fn interface(&self, name: &str) -> Result<Value> {
        self.interfaces()?
            .into_iter()
            .find(|i| i["ifname"] == name)
            .with_context(|| format!("no interface {name} in namespace {}", self.name))
    }

    fn link_names(&self) -> Result<Vec<String>> {
        Ok(self
            .interfaces()?
            .iter()
            .filter_map(|i| i["ifname"].as_str().map(String::from))
            .collect())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Why network namespaces cannot be used here, if they cannot.
fn netns_unavailable() -> Option<String> {
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the ip command (iproute2) is not installed".into());
    }
    match Netns::new("probe") {
        Ok(_) => None,
        Err(e) => Some(format!(
            "cannot create a network namespace (needs root / CAP_NET_ADMIN): {e:#}"
        )),
    }
}

/// Wait for `child` at most `limit`; kill it past that.
fn wait_bounded(child: &mut Child, limit: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("process did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This test binary, as a helper in namespace `ns` (optionally under `wrapper`, e.g.
/// setpriv).
fn helper(
    ns: &Netns,
    role: &str,
    socket_dir: &Path,
    config: Option<&Path>,
    wrapper: &[&str],
) -> Command {
    let exe = std::env::current_exe().expect("test binary");
    let mut command = Command::new("ip");
    command.args(["netns", "exec", &ns.name]);
    command.args(wrapper);
    command
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "devinit::helper_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(SOCKET_DIR, socket_dir);
    if let Some(config) = config {
        command.env(CONFIG, config);
    }
    command
}

/// A runtime serving in namespace `ns`; stopped (stdin closed) on drop.
struct Runtime {
    child: Child,
    stdin: Option<ChildStdin>,
    socket_dir: PathBuf,
}

impl Runtime {
    fn start(ns: &Netns, dir: &Path, name: &str, yaml: &str, wrapper: &[&str]) -> Result<Self> {
        let socket_dir = dir.join(name);
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, yaml)?;
        let mut child = helper(ns, "runtime", &socket_dir, Some(&config), wrapper)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the runtime helper")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(READY) {
                    let _ = tx.send(());
                }
            }
        });
        let mut runtime = Runtime {
            child,
            stdin,
            socket_dir,
        };
        if rx.recv_timeout(LIMIT).is_err() {
            let status = runtime.child.try_wait()?;
            bail!(
                "the runtime in {} did not get ready (exit status: {status:?})",
                ns.name
            );
        }
        Ok(runtime)
    }

    /// Setup called by a process in namespace `ns`: `Ok(response)` or `Err((code, message))`.
    fn setup_from(&self, ns: &Netns) -> Result<std::result::Result<Value, (String, String)>> {
        let mut child = helper(ns, "client", &self.socket_dir, None, &[])
            .stdout(Stdio::piped())
            .spawn()
            .context("start the client helper")?;
        let stdout = child.stdout.take().context("stdout")?;
        let reader = std::thread::spawn(move || {
            // Read everything (the helper must not hit a closed pipe), keep the result.
            // libtest may print "test helper_process ... " on the same line first.
            let lines: Vec<String> = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect();
            lines.iter().find_map(|line| {
                line.find(RESULT)
                    .map(|at| line[at + RESULT.len()..].to_string())
            })
        });
        let status = wait_bounded(&mut child, LIMIT)?;
        let line = reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader thread panicked"))?
            .with_context(|| format!("the client in {} printed no result ({status})", ns.name))?;
        let value: Value = serde_json::from_str(&line)?;
        if let Some(ok) = value.get("ok") {
            return Ok(Ok(ok.clone()));
        }
        let error = &value["error"];
        Ok(Err((
            error["code"].as_str().unwrap_or_default().to_string(),
            error["message"].as_str().unwrap_or_default().to_string(),
        )))
    }

    fn stop(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = wait_bounded(&mut self.child, LIMIT)?;
        if !status.success() {
            bail!("the runtime exited with {status}");
        }
        Ok(())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if wait_bounded(&mut self.child, Duration::from_secs(10)).is_err() {
            let _ = self.child.kill();
        }
    }
}

fn names(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The interface's IPv4 addresses as `a.b.c.d/len`.
fn ipv4_addresses(interface: &Value) -> Vec<String> {
    interface["addr_info"]
        .as_array()
        .map(|addrs| {
            addrs
                .iter()
                .filter(|a| a["family"] == "inet")
                .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
                .collect()
        })
        .unwrap_or_default()
}

/// Check the interface `name` in `ns` is an up bridge-mode macvlan with `address`.
fn assert_macvlan(ns: &Netns, name: &str, address: &str) -> Result<Value> {
    let interface = ns.interface(name)?;
    assert_eq!(
        interface["linkinfo"]["info_kind"], "macvlan",
        "{interface:#}"
    );
    assert_eq!(
        interface["linkinfo"]["info_data"]["mode"], "bridge",
        "{interface:#}"
    );
    let flags = names(&interface["flags"]);
    assert!(flags.contains(&"UP"), "{name} is not up: {flags:?}");
    assert_eq!(ipv4_addresses(&interface), [address], "{interface:#}");
    Ok(interface)
}

/// The host namespace of a test: two veth pairs as parents, with host addresses.
fn host_namespace() -> Result<Netns> {
    let host = Netns::new("h")?;
    for (parent, peer, address) in [
        ("rlkpar0", "rlkpeer0", "192.0.2.1/24"),
        ("rlkpar1", "rlkpeer1", "198.51.100.1/24"),
    ] {
        host.ip(&["link", "add", parent, "type", "veth", "peer", "name", peer])?;
        host.ip(&["addr", "add", address, "dev", parent])?;
        host.ip(&["link", "set", parent, "up"])?;
        host.ip(&["link", "set", peer, "up"])?;
    }
    Ok(host)
}

const CONFIG_YAML: &str = r#"
macvlans:
  - {parent: rlkpar0, name: robot0, network: 192.0.2.0/24}
  - {parent: rlkpar0, name: robot1, address: 192.0.2.2/24, mtu: 1400}
  # No parent: the host interface with an address in the network (rlkpar1).
  - {name: robot2, network: 198.51.100.0/24}
"#;

// ---- tests ----

#[test]
fn setup_creates_macvlans_in_the_callers_namespace_idempotently() -> Result<()> {
    if let Some(reason) = netns_unavailable() {
        missing_tool::skip_or_fail(&reason);
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let host = host_namespace()?;
    let pod_b = Netns::new("b")?;
    let pod_c = Netns::new("c")?;
    let runtime = Runtime::start(&host, dir.path(), "run", CONFIG_YAML, &[])?;
    let host_links_before = host.link_names()?;

    // First Setup from B: every interface created, the first free addresses picked (.1 is
    // the host's, .2 robot1's static address).
    let first = runtime
        .setup_from(&pod_b)?
        .map_err(|e| anyhow::anyhow!("setup from B failed: {e:?}"))?;
    assert_eq!(
        names(&first["created"]),
        ["robot0", "robot1", "robot2"],
        "{first:#}"
    );
    assert!(names(&first["skipped"]).is_empty());
    assert_eq!(first["host_network"], false);
    let robot0 = assert_macvlan(&pod_b, "robot0", "192.0.2.3/24")?;
    let robot1 = assert_macvlan(&pod_b, "robot1", "192.0.2.2/24")?;
    assert_eq!(robot1["mtu"], 1400);
    assert_macvlan(&pod_b, "robot2", "198.51.100.2/24")?;
    let reported: Vec<(&str, &str, &str)> = first["interfaces"]
        .as_array()
        .context("interfaces")?
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap_or_default(),
                i["parent"].as_str().unwrap_or_default(),
                i["address"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        reported,
        [
            ("robot0", "rlkpar0", "192.0.2.3/24"),
            ("robot1", "rlkpar0", "192.0.2.2/24"),
            ("robot2", "rlkpar1", "198.51.100.2/24"),
        ]
    );
    assert_eq!(first["interfaces"][0]["mac"], robot0["address"]);
    // Nothing is left behind in the host namespace (no temporary links).
    assert_eq!(host.link_names()?, host_links_before);

    // Again from B: nothing new, same interfaces and addresses.
    let second = runtime
        .setup_from(&pod_b)?
        .map_err(|e| anyhow::anyhow!("second setup from B failed: {e:?}"))?;
    assert!(names(&second["created"]).is_empty(), "{second:#}");
    assert_eq!(names(&second["skipped"]), ["robot0", "robot1", "robot2"]);
    assert_eq!(second["interfaces"][0]["address"], "192.0.2.3/24");
    assert_macvlan(&pod_b, "robot0", "192.0.2.3/24")?;
    assert_eq!(
        pod_b.link_names()?,
        ["lo", "robot0", "robot1", "robot2"],
        "no duplicate interfaces"
    );

    // A second pod gets the next free addresses (B's are leased).
    let from_c = runtime
        .setup_from(&pod_c)?
        .map_err(|e| anyhow::anyhow!("setup from C failed: {e:?}"))?;
    assert_eq!(names(&from_c["created"]), ["robot0", "robot1", "robot2"]);
    assert_macvlan(&pod_c, "robot0", "192.0.2.4/24")?;
    assert_macvlan(&pod_c, "robot2", "198.51.100.3/24")?;
    let leases = std::fs::read_to_string(dir.path().join("run/devinit-leases.json"))?;
    assert!(leases.contains("192.0.2.4"), "{leases}");

    // C goes away: its leases are released and a new pod gets its addresses.
    drop(pod_c);
    let pod_d = Netns::new("d")?;
    let from_d = runtime
        .setup_from(&pod_d)?
        .map_err(|e| anyhow::anyhow!("setup from D failed: {e:?}"))?;
    assert_eq!(names(&from_d["created"]), ["robot0", "robot1", "robot2"]);
    assert_macvlan(&pod_d, "robot0", "192.0.2.4/24")?;

    // A caller in the host's own namespace (a hostNetwork pod) changes nothing.
    let from_host = runtime
        .setup_from(&host)?
        .map_err(|e| anyhow::anyhow!("setup from the host failed: {e:?}"))?;
    assert_eq!(from_host["host_network"], true);
    assert!(names(&from_host["created"]).is_empty());
    assert_eq!(host.link_names()?, host_links_before);

    runtime.stop()?;
    Ok(())
}

#[test]
fn setup_errors_name_the_interface_and_the_cause() -> Result<()> {
    if let Some(reason) = netns_unavailable() {
        missing_tool::skip_or_fail(&reason);
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let host = host_namespace()?;
    let yaml = r#"
macvlans:
  - {parent: rlkpar0, name: clash0, address: 192.0.2.50/24}
  - {parent: rlkmissing, name: robot5, address: 192.0.2.51/24}
"#;
    let runtime = Runtime::start(&host, dir.path(), "run", yaml, &[])?;

    // The caller already has a clash0 that is not a macvlan.
    let pod_e = Netns::new("e")?;
    pod_e.ip(&[
        "link", "add", "clash0", "type", "veth", "peer", "name", "clash1",
    ])?;
    let (code, message) = runtime
        .setup_from(&pod_e)?
        .err()
        .context("setup over a veth named clash0 must fail")?;
    assert_eq!(code, "FailedPrecondition", "{message}");
    assert!(
        message.contains("clash0") && message.contains("not a macvlan") && message.contains("veth"),
        "{message}"
    );

    // A parent that does not exist: NotFound naming the parent and the interface.
    let pod_b = Netns::new("b")?;
    let (code, message) = runtime
        .setup_from(&pod_b)?
        .err()
        .context("setup with a missing parent must fail")?;
    assert_eq!(code, "NotFound", "{message}");
    assert!(
        message.contains("rlkmissing") && message.contains("robot5"),
        "{message}"
    );
    // The interface before the failing one was made; the failing one was not.
    let links = pod_b.link_names()?;
    assert!(
        links.contains(&"clash0".to_string()) && !links.contains(&"robot5".to_string()),
        "{links:?}"
    );
    runtime.stop()?;

    // Without CAP_NET_ADMIN the runtime cannot create links: PermissionDenied.
    if Command::new("setpriv").arg("--version").output().is_err() {
        missing_tool::skip_or_fail("setpriv (util-linux) is not installed: the permission case");
        return Ok(());
    }
    let unprivileged = Runtime::start(
        &host,
        dir.path(),
        "run-unprivileged",
        "macvlans:\n  - {parent: rlkpar0, name: robot0, address: 192.0.2.60/24}\n",
        &[
            "setpriv",
            "--bounding-set=-net_admin",
            "--inh-caps=-net_admin",
            "--",
        ],
    )?;
    let pod_f = Netns::new("f")?;
    let (code, message) = unprivileged
        .setup_from(&pod_f)?
        .err()
        .context("setup without CAP_NET_ADMIN must fail")?;
    assert_eq!(code, "PermissionDenied", "{message}");
    assert!(
        message.contains("robot0") && message.contains("CAP_NET_ADMIN"),
        "{message}"
    );
    assert_eq!(pod_f.link_names()?, ["lo"]);
    unprivileged.stop()?;
    Ok(())
}

#[test]
fn macvlan_configuration_is_validated_with_field_paths() {
    let yaml = r#"
host_macvlans:
  - {host_nic: eth1, name: robot0, address: 172.16.0.10/24}
  - {parent: eth1, name: robot0, network: 172.16.0.5/24}
  - {parent: "eth1 with space", name: an-interface-name-too-long, mtu: 9}
"#;
    let error = rlark_embodied::EmbodiedConfig::from_yaml(yaml)
        .unwrap_err()
        .to_string();
    for needle in [
        "macvlans[1].name: interface \"robot0\" is also the name of macvlans[0]",
        "macvlans[1].network: 172.16.0.5/24 has host bits set",
        "macvlans[2].name: \"an-interface-name-too-long\" is not an interface name",
        "macvlans[2].parent: \"eth1 with space\" is not an interface name",
        "macvlans[2].address: needs an address",
        "macvlans[2].mtu: 9 is not an IPv4 MTU",
    ] {
        assert!(error.contains(needle), "{error}\n lacks {needle:?}");
    }
    // RLark's spellings are accepted, and a valid section parses.
    let config = rlark_embodied::EmbodiedConfig::from_yaml(
        "host_macvlans:\n  - {host_nic: eth1, name: robot0, address: 172.16.0.10}\n",
    )
    .expect("valid");
    assert_eq!(config.macvlans[0].parent, "eth1");
    assert_eq!(
        config.macvlans[0].addressing(),
        Ok(rlark_embodied::config::macvlan::Addressing::Static(
            "172.16.0.10/24".parse().unwrap()
        ))
    );
}
