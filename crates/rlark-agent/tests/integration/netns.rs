//! The agent's supervisor starting a replica inside its network namespace (`--netns` and
//! `--hosts`, namespaces from `rlark_net::netns`) on this machine's kernel: each test
//! creates namespaces named `h16netns-*` and deletes them (a Drop guard removes them even
//! when an assertion fails). The pod network's own namespace tests are in
//! crates/rlark-net/tests/netns.rs.
//!
//! Needs root, `/dev/net/tun` and `nft`; elsewhere the tests say why and pass without
//! checking anything, except under `scripts/test.sh`/CI, where a missing tool fails them.

use crate::netns_support;
use netns_support::Guard;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rlark_net::netns::{self, DEFAULT_REDIRECT_PORT, Mode, NetnsSpec, ReplicaNetns};

const LIMIT: Duration = Duration::from_secs(10);

fn supported() -> bool {
    netns_support::supported(true)
}

/// Namespaces of this file: `h16netns-<suffix>-<pid>`.
const PREFIX: &str = "h16netns";

fn spec(name: &str, mode: Mode) -> NetnsSpec {
    NetnsSpec {
        name: name.to_string(),
        addresses: vec![
            "10.88.0.2/16".parse().unwrap(),
            "fd00:88::2/64".parse().unwrap(),
        ],
        mode,
        redirect_port: DEFAULT_REDIRECT_PORT,
        loopback_passthrough: vec![6443],
    }
}

// ---- starting a replica inside its namespace (the supervisor's --netns and --hosts) ----

fn supervised(script: &str, dir: &Path) -> rlark_agent::runtime::ReplicaSpec {
    let mut spec = rlark_agent::runtime::ReplicaSpec::new(
        vec!["sh".into(), "-c".into(), script.into()],
        dir.join("replica"),
    );
    spec.supervisor = vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()];
    spec
}

#[tokio::test]
async fn a_replica_starts_inside_with_its_address_and_hosts_file() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "super");
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Kernel)).await?;
    let dir = tempfile::tempdir()?;
    let result = async {
        let hosts = dir.path().join("hosts");
        netns::rewrite_in_place(&hosts, b"127.0.0.1 localhost\n10.88.0.2 me-0.dom\n")?;
        let script = "ip -o addr show dev rlark0; ls /sys/class/net; \
                      echo HOSTS-BEGIN; cat /etc/hosts; echo HOSTS-END; \
                      i=0; while ! grep -q peer-0.dom /etc/hosts; do \
                        i=$((i+1)); [ $i -gt 400 ] && exit 7; sleep 0.025; done; \
                      echo SAW-UPDATE; cat /etc/hosts";
        let mut spec = supervised(script, dir.path());
        spec.network = Some(rlark_agent::runtime::ReplicaNetwork {
            netns_path: netns.path().to_path_buf(),
            hosts_file: hosts.clone(),
        });
        let mut handle = rlark_agent::runtime::spawn_replica(spec).await?;
        let log_path = handle.log_path().to_path_buf();
        let deadline = Instant::now() + LIMIT;
        while !std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("HOSTS-END")
        {
            if Instant::now() > deadline {
                bail!(
                    "the task never printed its hosts file: {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The agent's update, written in place, reaches the task's /etc/hosts.
        netns::rewrite_in_place(
            &hosts,
            b"127.0.0.1 localhost\n10.88.0.2 me-0.dom\n10.88.0.9 peer-0.dom\n",
        )?;
        let exit = tokio::time::timeout(LIMIT, handle.wait())
            .await
            .context("the task did not end")?;
        let log = std::fs::read_to_string(&log_path)?;
        assert_eq!(exit.status.code(), Some(0), "{log}");
        assert!(log.contains("inet 10.88.0.2/16"), "{log}");
        assert!(log.contains("inet6 fd00:88::2/64"), "{log}");
        assert!(
            log.contains("rlark0"),
            "/sys/class/net of the namespace: {log}"
        );
        let first = &log[log.find("HOSTS-BEGIN").unwrap()..log.find("HOSTS-END").unwrap()];
        assert!(first.contains("10.88.0.2 me-0.dom"), "{log}");
        assert!(!first.contains("peer-0.dom"), "{log}");
        assert!(log.contains("SAW-UPDATE"), "{log}");
        assert!(log.contains("10.88.0.9 peer-0.dom"), "{log}");
        // The host's own /etc/hosts is untouched.
        let host_hosts = std::fs::read_to_string("/etc/hosts")?;
        assert!(!host_hosts.contains("me-0.dom"), "{host_hosts}");
        anyhow::Ok(())
    }
    .await;
    netns.delete().await?;
    result
}

#[tokio::test]
async fn a_missing_namespace_is_a_start_error_naming_it() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let hosts = dir.path().join("hosts");
    netns::rewrite_in_place(&hosts, b"127.0.0.1 localhost\n")?;
    let mut spec = supervised("true", dir.path());
    spec.network = Some(rlark_agent::runtime::ReplicaNetwork {
        netns_path: "/run/netns/h16netns-never-made".into(),
        hosts_file: hosts,
    });
    let error = rlark_agent::runtime::spawn_replica(spec)
        .await
        .expect_err("no such namespace");
    assert!(
        error.to_string().contains("/run/netns/h16netns-never-made"),
        "{error}"
    );
    assert_eq!(error.reason(), rlark_agent::runtime::REASON_START_ERROR);
    Ok(())
}
