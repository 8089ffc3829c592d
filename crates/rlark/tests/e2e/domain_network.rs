//! The Domain pod network across "clusters" that are network namespaces (issue 16, "Must
//! show"): the server in namespace `s`, each cluster's real `rlark agent` in its own, all
//! on one bridge (`rlark_testkit::netns`).
//!
//! Needs root, `ip` (iproute2), `nft` (nftables) and python3; without them the tests skip
//! with a message, except under `scripts/test.sh` (which installs them) or `CI=true`,
//! where they fail (`tests/support/missing_tool.rs`).
//!
//! The first tests check the topology itself; the scenarios after them exercise the data
//! path end to end (docs/network.md).

use crate::missing_tool;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rlark_testkit::netns::{DomainNet, Topology, tools_missing, unique_prefix};

const RLARK: &str = env!("CARGO_BIN_EXE_rlark");
/// Longest wait for a pod of a scenario to reach the phase asked.
const POD_WAIT: Duration = Duration::from_secs(120);

/// Whether the namespace tests can run here; `false` (after saying why) when they skip.
fn can_run() -> bool {
    match tools_missing() {
        None => true,
        Some(why) => {
            missing_tool::skip_or_fail(&why);
            false
        }
    }
}

fn python(code: &str) -> Command {
    let mut command = Command::new("python3");
    command.args(["-c", code]);
    command
}

/// A TCP server in the namespace that answers `ok` to every connection, on `port` of every
/// address (v4 and v6).
fn tcp_server(port: u16) -> Command {
    python(&format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET6)\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('::', {port}))\n\
         s.listen(16)\n\
         while True:\n    c, _ = s.accept()\n    c.sendall(b'ok')\n    c.close()\n"
    ))
}

/// Connect to `host:port` (1 s timeout) and expect `ok`.
fn tcp_client(host: &str, port: u16) -> Command {
    python(&format!(
        "import socket, sys\n\
         c = socket.create_connection(('{host}', {port}), timeout=1)\n\
         sys.exit(0 if c.recv(2) == b'ok' else 3)\n"
    ))
}

fn describe(out: &Output) -> String {
    format!(
        "{}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run `client` in `from` until it succeeds (at most 10 tries, 300 ms apart: the server
/// may still be starting).
fn eventually_ok(topology: &Topology, from: &str, client: &Command) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..10 {
        let out = topology.run(from, client)?;
        if out.status.success() {
            return Ok(());
        }
        last = Some(describe(&out));
        std::thread::sleep(Duration::from_millis(300));
    }
    bail!(
        "{client:?} in {from} kept failing: {}",
        last.unwrap_or_default()
    )
}

fn namespaces() -> anyhow::Result<String> {
    let out = Command::new("ip").args(["netns", "list"]).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn members_reach_each_other_over_the_bridge_v4_and_v6() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let mut topology = Topology::create(&unique_prefix(), &["s", "a", "b"])?;
    let b4 = topology.address("b")?.to_string();
    let b6 = topology.address_v6("b")?.to_string();
    ensure!(
        b4 != topology.address("a")?.to_string(),
        "distinct addresses"
    );
    topology.spawn_detached("b", &tcp_server(7000), |_| {})?;
    eventually_ok(&topology, "a", &tcp_client(&b4, 7000))?;
    eventually_ok(&topology, "a", &tcp_client(&b6, 7000))?;
    eventually_ok(&topology, "s", &tcp_client(&b4, 7000))?;
    // B's server is not reachable from the test's own namespace: nothing leaks out.
    let out = tcp_client(&b4, 7000).output()?;
    ensure!(
        !out.status.success(),
        "the bridge is visible outside its namespaces"
    );
    Ok(())
}

#[test]
fn a_drop_rule_cuts_one_port_only_until_removed() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let mut topology = Topology::create(&unique_prefix(), &["a", "b"])?;
    let b = topology.address("b")?;
    topology.spawn_detached("b", &tcp_server(7001), |_| {})?;
    topology.spawn_detached("b", &tcp_server(7002), |_| {})?;
    eventually_ok(&topology, "a", &tcp_client(&b.to_string(), 7001))?;
    eventually_ok(&topology, "a", &tcp_client(&b.to_string(), 7002))?;

    let rule = topology.drop_tcp("a", b, 7001)?;
    let cut = topology.run("a", &tcp_client(&b.to_string(), 7001))?;
    ensure!(
        !cut.status.success(),
        "7001 still reachable: {}",
        describe(&cut)
    );
    let other = topology.run("a", &tcp_client(&b.to_string(), 7002))?;
    ensure!(other.status.success(), "7002 cut too: {}", describe(&other));
    rule.remove()?;
    eventually_ok(&topology, "a", &tcp_client(&b.to_string(), 7001))?;
    Ok(())
}

#[test]
fn dropping_the_topology_kills_its_processes_and_deletes_its_namespaces() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let prefix = unique_prefix();
    let mut topology = Topology::create(&prefix, &["a", "b"])?;
    let listed = namespaces()?;
    for name in ["wan", "a", "b"] {
        ensure!(
            listed.contains(&format!("{prefix}{name}")),
            "{prefix}{name} missing from {listed}"
        );
    }
    // A process that ignores SIGTERM: the drop must still get rid of it.
    let stubborn = topology.spawn_detached(
        "a",
        &python(
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n",
        ),
        |_| {},
    )?;
    // Started outside `spawn_detached` (a grandchild): killed by the namespace sweep.
    let mut sweep = Command::new("sh");
    // Its output elsewhere: `run` reads the pipes to their end.
    sweep.args(["-c", "sleep 600 >/dev/null 2>&1 & echo $!"]);
    let out = topology.run("b", &sweep)?;
    let orphan: i32 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    let started = std::time::Instant::now();
    drop(topology);
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "cleanup took {:?}",
        started.elapsed()
    );
    let listed = namespaces()?;
    ensure!(!listed.contains(&prefix), "left behind: {listed}");
    for pid in [stubborn as i32, orphan] {
        // Reaped (a zombie of ours would still show in /proc with state Z).
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        ensure!(
            state.is_empty() || state.contains(") Z"),
            "process {pid} survived: {state}"
        );
    }
    Ok(())
}

#[test]
fn server_and_agents_run_in_their_own_namespaces() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    let nodes = net.cli_ok(&["get", "nodes", "-A", "-o", "name"])?;
    for node in ["a-0", "b-0"] {
        ensure!(
            nodes.contains(node),
            "node {node} missing: {nodes}\n{}",
            net.logs()
        );
    }
    // A Job pinned to cluster b runs there: the agent in b's namespace reaches the server.
    net.apply(&job_yaml("hello", None, &[("main", "b-0", "echo hello")]))?;
    net.wait_pod("rlark-b", "hello-main-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

/// A Job of raw tasks, each `(template, node, shell script)`, in `domain` if given.
fn job_yaml(name: &str, domain: Option<&str>, tasks: &[(&str, &str, &str)]) -> String {
    let tasks: Vec<serde_json::Value> = tasks
        .iter()
        .map(|(task, node, script)| {
            serde_json::json!({
                "name": task,
                "agentType": "Raw",
                "role": "Actor",
                "nodeName": node,
                "raw": {"entrypoint": ["sh", "-c", script]},
            })
        })
        .collect();
    let mut spec = serde_json::json!({"tasks": tasks});
    if let Some(domain) = domain {
        spec["domain"] = domain.into();
    }
    serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": spec,
    })
    .to_string()
}

/// `yaml` (a Job of [`job_yaml`]) with every task's `raw.runAsUser: 0` (root; the agent
/// must list the Job with `--replica-root-job`).
fn as_root(yaml: &str) -> String {
    let mut job: serde_json::Value = serde_json::from_str(yaml).unwrap_or_default();
    if let Some(tasks) = job["spec"]["tasks"].as_array_mut() {
        for task in tasks {
            task["raw"]["runAsUser"] = 0.into();
        }
    }
    job.to_string()
}

fn domain_yaml(name: &str, cidr: &str) -> String {
    serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Domain",
        "metadata": {"name": name},
        "spec": {"cidr": cidr},
    })
    .to_string()
}

/// Fetch `url` (python, 2 s timeout), retried for up to 60 s; exit 0 on a 200.
fn fetch_script(url: &str) -> String {
    format!(
        "for i in $(seq 60); do python3 -c \"import urllib.request as u; \
         u.urlopen('{url}', timeout=2).read()\" && exit 0; sleep 1; done; exit 1"
    )
}

/// The allocated virtual IP of replica 0 of `task` in Domain `domain`.
fn allocated_ip(net: &DomainNet, domain: &str, task: &str) -> anyhow::Result<String> {
    let domain = net
        .get_json("domain", domain, None)?
        .context("the Domain is gone")?;
    domain["status"]["ipAllocations"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["task"] == task && a["index"] == 0 && a["releasedAt"].is_null())
        .and_then(|a| a["ip"].as_str().map(str::to_string))
        .with_context(|| format!("no IP allocated to {task}-0: {domain}"))
}

#[test]
fn a_task_in_a_reaches_an_http_server_in_b_by_ip_and_by_name() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let ip = allocated_ip(&net, "net1", "web-server")?;
    net.apply(&job_yaml(
        "probe",
        Some("net1"),
        &[
            ("by-ip", "a-0", &fetch_script(&format!("http://{ip}:8080/"))),
            (
                "by-name",
                "a-0",
                &fetch_script("http://web-server-0.net1:8080/"),
            ),
        ],
    ))?;
    net.wait_pod("rlark-a", "probe-by-ip-0", &["Succeeded"], POD_WAIT)?;
    net.wait_pod("rlark-a", "probe-by-name-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

/// Tun mode end to end: agents started with `--net-mode tun` (no nftables in the replicas'
/// namespaces; a userspace TCP stack per replica) report it on their Nodes, and a task in
/// cluster a fetches from an HTTP server in cluster b by IP and by name over the relay.
#[test]
fn tun_mode_agents_carry_http_by_ip_and_by_name_over_the_relay() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &["--net-mode", "tun"])?;
    for (cluster, name) in [("a", "a-0"), ("b", "b-0")] {
        // The Node is written by the agent's reporter: poll briefly (bounded).
        let mut network = serde_json::Value::Null;
        for _ in 0..60 {
            let node = net.get_json("node", name, Some(&format!("rlark-{cluster}")))?;
            network = node.map_or(serde_json::Value::Null, |n| n["status"]["network"].clone());
            if !network.is_null() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        ensure!(network["mode"] == "tun", "Node of {cluster}: {network}");
        ensure!(
            network["message"]
                .as_str()
                .is_some_and(|m| m.contains("--net-mode tun")),
            "Node of {cluster}: {network}"
        );
    }
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let ip = allocated_ip(&net, "net1", "web-server")?;
    net.apply(&job_yaml(
        "probe",
        Some("net1"),
        &[
            ("by-ip", "a-0", &fetch_script(&format!("http://{ip}:8080/"))),
            (
                "by-name",
                "a-0",
                &fetch_script("http://web-server-0.net1:8080/"),
            ),
        ],
    ))?;
    net.wait_pod("rlark-a", "probe-by-ip-0", &["Succeeded"], POD_WAIT)?;
    net.wait_pod("rlark-a", "probe-by-name-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

#[test]
fn a_ray_style_worker_finds_its_head_through_rlark_head_address() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    net.apply(&domain_yaml("ray", "10.89.0.0/24"))?;
    let head = serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "rl"},
        "spec": {"domain": "ray", "tasks": [
            {"name": "head", "head": true, "agentType": "Raw", "role": "Actor",
             "nodeName": "b-0",
             "raw": {"entrypoint": ["python3", "-m", "http.server", "6379", "--bind", "0.0.0.0"]}},
            {"name": "worker", "agentType": "Raw", "role": "Rollout", "nodeName": "a-0",
             "raw": {"entrypoint": ["sh", "-c",
                 "test -n \"$RLARK_HEAD_ADDRESS\" || exit 9; host=${RLARK_HEAD_ADDRESS%%:*}; \
                  for i in $(seq 60); do python3 -c \"import socket,sys; \
                  socket.create_connection(('$host', 6379), timeout=2)\" && exit 0; sleep 1; done; exit 1"]}},
        ]},
    });
    net.apply(&head.to_string())?;
    net.wait_pod("rlark-a", "rl-worker-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

#[test]
fn a_task_outside_the_domain_is_refused() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&domain_yaml("net2", "10.90.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let ip = allocated_ip(&net, "net1", "web-server")?;
    // A member of another domain, and a task in no domain: neither gets an answer. (In
    // a domain every TCP connect completes at the agent's redirect listener, which then
    // closes what it may not route: the refusal shows as a connection that ends unanswered.)
    let probe = format!(
        "python3 -c \"import urllib.request as u; u.urlopen('http://{ip}:8080/', timeout=5)\" \
         && exit 1; exit 0"
    );
    net.apply(&job_yaml(
        "other",
        Some("net2"),
        &[("probe", "a-0", &probe)],
    ))?;
    net.apply(&job_yaml("plain", None, &[("probe", "a-0", &probe)]))?;
    net.wait_pod("rlark-a", "other-probe-0", &["Succeeded"], POD_WAIT)?;
    net.wait_pod("rlark-a", "plain-probe-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

#[test]
fn a_restarted_replica_keeps_its_ip() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a"], &[])?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[("server", "a-0", "exec sleep 600")],
    ))?;
    net.wait_pod("rlark-a", "web-server-0", &["Running"], POD_WAIT)?;
    let before = allocated_ip(&net, "net1", "web-server")?;
    let first = net
        .get_json("pod", "web-server-0", Some("rlark-a"))?
        .context("pod")?;
    net.cli_ok(&["delete", "pod", "web-server-0", "-n", "rlark-a"])?;
    // The agent runs the replica again (a new Pod UID) with the same address.
    let until = std::time::Instant::now() + POD_WAIT;
    loop {
        let pod = net.get_json("pod", "web-server-0", Some("rlark-a"))?;
        if let Some(pod) = pod
            && pod["metadata"]["uid"] != first["metadata"]["uid"]
            && pod["status"]["phase"] == "Running"
        {
            break;
        }
        ensure!(
            std::time::Instant::now() < until,
            "no new replica\n{}",
            net.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        allocated_ip(&net, "net1", "web-server")? == before,
        "the IP changed"
    );
    Ok(())
}

#[test]
fn a_cut_direct_path_falls_back_to_relay_and_shows_in_metrics() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    const DIRECT_PORT: u16 = 15443;
    let listen = format!("{{address}}:{DIRECT_PORT}");
    let net = DomainNet::start(
        RLARK,
        &["a", "b"],
        &[
            "--domain-listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:9464",
        ],
    )?;
    let b = net.topology.address("b")?;
    let _cut = net.topology.drop_tcp("a", b, DIRECT_PORT)?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    net.apply(&job_yaml(
        "probe",
        Some("net1"),
        &[(
            "get",
            "a-0",
            &fetch_script("http://web-server-0.net1:8080/"),
        )],
    ))?;
    net.wait_pod("rlark-a", "probe-get-0", &["Succeeded"], POD_WAIT)?;
    let metrics = net.topology.run(
        "a",
        &python(
            "import urllib.request as u\n\
             print(u.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())",
        ),
    )?;
    let text = String::from_utf8_lossy(&metrics.stdout);
    let fallbacks: f64 = text
        .lines()
        .filter(|l| l.starts_with("rlark_agent_domain_direct_fallbacks_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    ensure!(fallbacks >= 1.0, "no fallback counted: {text}");
    Ok(())
}

#[test]
fn an_ipv6_domain_works() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    net.apply(&domain_yaml("net6", "fd00:88::/120"))?;
    net.apply(&job_yaml(
        "web",
        Some("net6"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind ::",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let ip = allocated_ip(&net, "net6", "web-server")?;
    net.apply(&job_yaml(
        "probe",
        Some("net6"),
        &[("get", "a-0", &fetch_script(&format!("http://[{ip}]:8080/")))],
    ))?;
    net.wait_pod("rlark-a", "probe-get-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

#[test]
fn udp_and_ping_work_between_members() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let net = DomainNet::start(RLARK, &["a", "b"], &[])?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    let echo = "exec python3 -c \"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                s.bind(('0.0.0.0', 9999))\nwhile True:\n    d, a = s.recvfrom(2048)\n    s.sendto(d, a)\n\"";
    net.apply(&job_yaml("udp", Some("net1"), &[("echo", "b-0", echo)]))?;
    net.wait_pod("rlark-b", "udp-echo-0", &["Running"], POD_WAIT)?;
    let client = "for i in $(seq 30); do python3 -c \"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                  s.settimeout(1)\ns.sendto(b'hi', ('udp-echo-0.net1', 9999))\n\
                  assert s.recvfrom(2048)[0] == b'hi'\n\" && ping -c 1 -W 2 udp-echo-0.net1 && exit 0; sleep 1; done; exit 1";
    net.apply(&job_yaml("probe", Some("net1"), &[("udp", "a-0", client)]))?;
    net.wait_pod("rlark-a", "probe-udp-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

/// `rlark bench net --quick` runs end to end in its own namespaces: direct TCP and the
/// OpenSSH relay are measured (the relay needs sshd: scripts/test.sh installs it), and so
/// are the Domain paths through a real server and real agents — local, direct and relayed,
/// each verified in the client agent's metrics to have taken that path — in kernel mode, and
/// in tun mode when this binary's agent has `--net-mode`. Structure, not times. `rlark bench`
/// runs the `rlark-bench` binary beside `rlark` (`cargo test --workspace` builds both), so
/// this also runs that forwarder.
#[test]
fn bench_net_quick_measures_its_baselines_and_the_domain_paths() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let out = Command::new(RLARK)
        .args(["bench", "net", "--quick", "--json", "--timeout", "600"])
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .output()?;
    ensure!(out.status.success(), "rlark bench net: {}", describe(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("no JSON report: {}", describe(&out)))?;
    println!("{report:#}");
    let path = |name: &str| {
        report["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    let direct = path("direct TCP");
    ensure!(
        direct["single_mb_s"].as_f64().is_some_and(|v| v > 0.0)
            && direct["multi_mb_s"].as_f64().is_some_and(|v| v > 0.0)
            && direct["setup"]["count"].as_u64().is_some_and(|n| n > 0),
        "direct TCP not measured: {direct}"
    );
    ensure!(
        report["targets"].as_array().is_some_and(|t| t.len() == 4),
        "targets missing: {report}"
    );
    let help = Command::new(RLARK).args(["agent", "--help"]).output()?;
    let tun_flag = String::from_utf8_lossy(&help.stdout).contains("--net-mode");
    for mode in ["kernel", "tun"] {
        for kind in ["local", "direct", "relay"] {
            let row = path(&format!("rlark {kind} ({mode})"));
            let why = row["not_measured"].as_str().unwrap_or_default();
            if mode == "tun" && !tun_flag {
                ensure!(
                    why.contains("--net-mode"),
                    "the tun row does not say why it is absent: {row}"
                );
                continue;
            }
            if mode == "tun" && !why.is_empty() {
                // The tun mode's own tests (issue 17) judge whether its data path works;
                // this one asks that the row says why it has no figures.
                println!("rlark {kind} (tun) not measured: {why}");
                continue;
            }
            ensure!(
                row["single_mb_s"].as_f64().is_some_and(|v| v > 0.0)
                    && row["multi_mb_s"].as_f64().is_some_and(|v| v > 0.0)
                    && row["setup"]["count"].as_u64().is_some_and(|n| n > 0)
                    && row["forwarding_cpu_s_per_gib"]
                        .as_f64()
                        .is_some_and(|v| v > 0.0)
                    && row["counted_connections"].as_u64().is_some_and(|n| n > 0)
                    && row["errors"].as_array().is_some_and(Vec::is_empty),
                "{kind} ({mode}) not measured along its path: {row}"
            );
        }
    }
    let ssh = path("OpenSSH relay");
    if let Some(why) = ssh["not_measured"].as_str() {
        missing_tool::skip_or_fail(&format!("the OpenSSH relay was not measured: {why}"));
        return Ok(());
    }
    ensure!(
        ssh["single_mb_s"].as_f64().is_some_and(|v| v > 0.0)
            && ssh["forwarding_cpu_s_per_gib"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
        "OpenSSH relay not measured: {ssh}"
    );
    Ok(())
}

/// Agent a's metrics, read inside its namespace (`--metrics-listen 127.0.0.1:9464`).
fn agent_metrics(net: &DomainNet, cluster: &str) -> anyhow::Result<String> {
    let out = net.topology.run(
        cluster,
        &python(
            "import urllib.request as u\n\
             print(u.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())",
        ),
    )?;
    ensure!(
        out.status.success(),
        "metrics of {cluster}: {}",
        describe(&out)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sum of the samples of `family` whose line contains every one of `labels`.
fn metric_sum(text: &str, family: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(family) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_revoked_agent_is_refused_on_the_direct_path() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    const DIRECT_PORT: u16 = 15443;
    let listen = format!("{{address}}:{DIRECT_PORT}");
    let net = DomainNet::start(
        RLARK,
        &["a", "b"],
        &[
            "--domain-listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:9464",
        ],
    )?;
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let url = "http://web-server-0.net1:8080/";
    net.apply(&job_yaml(
        "before",
        Some("net1"),
        &[("get", "a-0", &fetch_script(url))],
    ))?;
    net.wait_pod("rlark-a", "before-get-0", &["Succeeded"], POD_WAIT)?;
    let text = agent_metrics(&net, "a")?;
    ensure!(
        metric_sum(
            &text,
            "rlark_agent_domain_connections_total",
            &["path=\"direct\"", "outcome=\"ok\""]
        ) >= 1.0,
        "the first fetch did not take the direct path: {text}"
    );

    net.cli_ok(&["cert", "revoke", "--cluster-id", "b"])?;
    // a's agent learns of it (its long poll answers at once); bounded.
    let mut learned = false;
    for _ in 0..60 {
        let text = agent_metrics(&net, "a")?;
        if metric_sum(&text, "rlark_agent_domain_revoked_agent_serials", &[]) >= 1.0 {
            learned = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        learned,
        "agent a did not learn of the revocation\n{}",
        net.logs()
    );

    // b's server still runs, but a refuses b's certificate on the direct path, and b's
    // tunnel is closed, so the relay has no way to b either: every fetch fails.
    net.apply(&job_yaml(
        "after",
        Some("net1"),
        &[(
            "get",
            "a-0",
            &format!(
                "for i in $(seq 5); do python3 -c \"import urllib.request as u; \
                 u.urlopen('{url}', timeout=2).read()\" && exit 1; sleep 1; done; exit 0"
            ),
        )],
    ))?;
    net.wait_pod("rlark-a", "after-get-0", &["Succeeded"], POD_WAIT)?;
    let text = agent_metrics(&net, "a")?;
    ensure!(
        metric_sum(
            &text,
            "rlark_agent_domain_direct_refused_total",
            &["direction=\"outbound\"", "reason=\"revoked\""]
        ) >= 1.0,
        "no direct connection refused for revocation: {text}"
    );
    Ok(())
}

/// `ssh -F /dev/null` options for a key with its certificate beside it, through the
/// server's SSH endpoint at `server:2222`.
fn domain_ssh(key: &str, server: &str) -> String {
    format!(
        "ssh -F /dev/null -i {key} -o CertificateFile={key}-cert.pub -o IdentitiesOnly=yes \
         -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes \
         -o ConnectTimeout=10 -p {SSH_PORT} domain@{server}"
    )
}

/// The SSH endpoint's port in [`a_domain_certificate_carries_a_members_flows_over_ssh`].
const SSH_PORT: u16 = 2222;

/// RLark's pod-network transport, served: a `domain` SSH certificate for cluster a carries
/// a's member's TCP flows to a member in cluster b through the server's SSH endpoint and the
/// hub's relay, with the real OpenSSH client run inside a's member (so the channels'
/// originator is the member's own address). By address, by RLark's `.agent` spelling and by
/// name; a flow whose originator is not a's member, and a session, are refused; each
/// forward is audited; a revoked certificate is refused at the next connection.
#[test]
fn a_domain_certificate_carries_a_members_flows_over_ssh() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    let listen = format!("{{address}}:{SSH_PORT}");
    // The OpenSSH client in a's member uses a key the test made (root's, 0600): the gateway
    // tasks run as root, which the agents allow for these two Jobs only.
    let net = DomainNet::start_with(
        RLARK,
        &["a", "b"],
        &["--replica-root-job", "gw", "--replica-root-job", "gw2"],
        &["--ssh-listen", &listen],
    )?;
    let server = net.topology.address("s")?.to_string();
    net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
    net.apply(&job_yaml(
        "web",
        Some("net1"),
        &[(
            "server",
            "b-0",
            "exec python3 -m http.server 8080 --bind 0.0.0.0",
        )],
    ))?;
    net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
    let ip = allocated_ip(&net, "net1", "web-server")?;

    let key = net.dir().join("gw");
    let key = key.to_str().context("utf-8 path")?.to_string();
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", &key])
        .output()
        .context("run ssh-keygen (openssh-client; scripts/test.sh installs it)")?;
    ensure!(keygen.status.success(), "ssh-keygen: {}", describe(&keygen));
    let signed = net.cli(&[
        "cert",
        "sign-ssh",
        "--role",
        "domain",
        "--domain",
        "net1",
        "--cluster-id",
        "a",
        "--public-key",
        &format!("{key}.pub"),
        "-o",
        &format!("{key}-cert.pub"),
    ])?;
    ensure!(signed.status.success(), "sign-ssh: {}", describe(&signed));
    let serial = String::from_utf8_lossy(&signed.stderr)
        .split_whitespace()
        .nth(3)
        .context("sign-ssh printed no serial")?
        .to_string();

    let ssh = domain_ssh(&key, &server);
    let session_err = net.dir().join("session.err");
    let get = |url: &str| {
        format!("python3 -c \"import urllib.request as u; u.urlopen('{url}', timeout=5).read()\"")
    };
    // Inside a's member: three forwards, two from the member's own address (allowed) and
    // one from loopback (its originator is no member: refused), then a session (refused).
    let script = format!(
        "{ssh} -N -o ExitOnForwardFailure=yes \
           -L $RLARK_POD_IP:9000:{ip}:8080 \
           -L $RLARK_POD_IP:9001:{ip}.b.agent:8080 \
           -L $RLARK_POD_IP:9002:web-server-0.net1:8080 \
           -L 127.0.0.1:9003:{ip}:8080 & \
         ok=0; for i in $(seq 60); do {by_ip} && ok=1 && break; sleep 1; done; \
         test $ok = 1 || {{ echo 'no answer by address'; exit 1; }}; \
         {by_agent} || {{ echo 'no answer by .agent'; exit 1; }}; \
         {by_name} || {{ echo 'no answer by name'; exit 1; }}; \
         {from_loopback} && {{ echo 'a loopback originator was carried'; exit 1; }}; \
         {ssh} true 2>{session_err} && {{ echo 'a session opened'; exit 1; }}; \
         grep -q 'carries forwards into domain net1 only' {session_err} || exit 1; \
         exit 0",
        session_err = session_err.display(),
        by_ip = get("http://$RLARK_POD_IP:9000/"),
        by_agent = get("http://$RLARK_POD_IP:9001/"),
        by_name = get("http://$RLARK_POD_IP:9002/"),
        from_loopback = get("http://127.0.0.1:9003/"),
    );
    net.apply(&as_root(&job_yaml(
        "gw",
        Some("net1"),
        &[("ssh", "a-0", &script)],
    )))?;
    if let Err(error) = net.wait_pod("rlark-a", "gw-ssh-0", &["Succeeded"], POD_WAIT) {
        let logs = net.cli(&["logs", "task/gw-ssh"])?;
        let session = std::fs::read_to_string(&session_err).unwrap_or_default();
        bail!(
            "{error}\ntask log: {}\nthe session's stderr: {session}\n{}",
            describe(&logs),
            net.logs()
        );
    }

    // Audited: the carried flows (with bytes) and the refused one (naming why). A flow's
    // record is written when it ends: bounded wait.
    let carried = |e: &serde_json::Value| {
        e["decision"] == "allowed"
            && e["user"] == "domain:net1@a"
            && e["reason"].as_str().is_some_and(|r| r.contains("bytes in"))
    };
    let refused = |e: &serde_json::Value| {
        e["decision"] == "denied"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("from 127.0.0.1:"))
    };
    let mut forwards = Vec::new();
    for _ in 0..40 {
        let audit = std::fs::read_to_string(net.server.data_dir.join("audit.log"))?;
        forwards = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["verb"] == "ssh-forward" && e["resource"] == "domains.rlinf.io/ssh")
            .collect();
        if forwards.iter().any(carried) && forwards.iter().any(refused) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    ensure!(
        forwards.iter().any(carried),
        "no carried flow audited: {forwards:?}"
    );
    ensure!(
        forwards.iter().any(refused),
        "the loopback originator's refusal is not audited: {forwards:?}"
    );

    // Revoked: the next connection is refused (ssh exits 255 at authentication).
    net.cli_ok(&["cert", "revoke", &serial])?;
    let script = format!("timeout 30 {ssh} -N -L $RLARK_POD_IP:9000:{ip}:8080; test $? = 255");
    net.apply(&as_root(&job_yaml(
        "gw2",
        Some("net1"),
        &[("ssh", "a-0", &script)],
    )))?;
    net.wait_pod("rlark-a", "gw2-ssh-0", &["Succeeded"], POD_WAIT)?;
    Ok(())
}

/// A shell into a Domain replica is where the task is (issue 40): `rlark exec`, `rlark ssh`
/// and `kubectl exec` into a replica of cluster a resolve another cluster's member by name
/// and fetch from it, as the task itself would; with replica isolation on (the default)
/// and off.
#[test]
fn exec_ssh_and_kubectl_exec_into_a_domain_replica_see_its_network() -> anyhow::Result<()> {
    if !can_run() {
        return Ok(());
    }
    if which("kubectl").is_none() || which("ssh").is_none() {
        missing_tool::skip_or_fail(
            "kubectl or ssh is not installed (scripts/test.sh installs them)",
        );
        return Ok(());
    }
    for isolation in ["true", "false"] {
        let flag = format!("--replica-isolation={isolation}");
        let listen = format!("{{address}}:{SSH_PORT}");
        let net = DomainNet::start_with(RLARK, &["a", "b"], &[&flag], &["--ssh-listen", &listen])?;
        net.apply(&domain_yaml("net1", "10.88.0.0/24"))?;
        net.apply(&job_yaml(
            "web",
            Some("net1"),
            &[
                (
                    "server",
                    "b-0",
                    "exec python3 -m http.server 8080 --bind 0.0.0.0",
                ),
                ("shell", "a-0", "exec sleep 600"),
            ],
        ))?;
        net.wait_pod("rlark-b", "web-server-0", &["Running"], POD_WAIT)?;
        net.wait_pod("rlark-a", "web-shell-0", &["Running"], POD_WAIT)?;
        // `rlark SUBCOMMAND --kubeconfig K ARGS... -- CMD` in `s`: the flag before `--`.
        let rlark = |args: &[&str]| -> anyhow::Result<Output> {
            let mut command = Command::new(RLARK);
            command
                .arg(args[0])
                .arg("--kubeconfig")
                .arg(net.kubeconfig())
                .args(&args[1..])
                .env_remove("KUBECONFIG")
                .env_remove("RUST_LOG");
            net.run_in_server(&command)
        };
        let fetch = "python3 -c \"import urllib.request as u; \
                     print(u.urlopen('http://web-server-0.net1:8080/', timeout=5).status)\"";
        // The first fetch retries while the server starts; then one try per client.
        let first = rlark(&[
            "exec",
            "-n",
            "rlark-a",
            "web-shell-0",
            "--",
            "sh",
            "-c",
            &fetch_script("http://web-server-0.net1:8080/"),
        ])?;
        ensure!(
            first.status.success(),
            "isolation {isolation}: rlark exec could not fetch by name: {}",
            describe(&first)
        );
        let printed = |out: Output, client: &str| -> anyhow::Result<()> {
            ensure!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "200",
                "isolation {isolation}: {client}: {}",
                describe(&out)
            );
            Ok(())
        };
        // `rlark exec` and `kubectl exec` into web-shell-0, then `rlark ssh` to its task.
        let into_shell = ["exec", "-n", "rlark-a", "web-shell-0", "--"];
        printed(
            rlark(&[&into_shell[..], &["sh", "-c", fetch]].concat())?,
            "rlark exec",
        )?;
        let mut kubectl = Command::new("kubectl");
        kubectl
            .arg("--kubeconfig")
            .arg(net.kubeconfig())
            .args(into_shell)
            .args(["sh", "-c", fetch]);
        printed(net.run_in_server(&kubectl)?, "kubectl exec")?;
        printed(
            // As with OpenSSH, the command is one line for the remote shell.
            rlark(&["ssh", "-n", "rlark-a", "task/web-shell", "--", fetch])?,
            "rlark ssh",
        )?;
        // The names the replica sees: its /etc/hosts holds the Domain's block.
        let hosts = rlark(&[&into_shell[..], &["cat", "/etc/hosts"]].concat())?;
        let hosts = String::from_utf8_lossy(&hosts.stdout);
        ensure!(
            hosts.contains("web-server-0.net1") && hosts.contains("web-shell-0.net1"),
            "isolation {isolation}: /etc/hosts in the replica: {hosts}"
        );
    }
    Ok(())
}

/// `name` on `PATH`.
fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}
