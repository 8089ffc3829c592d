//! Replica network namespaces (`rlark_net::netns`) on this machine's kernel: each test
//! creates namespaces named `h16netns-*` and deletes them (a Drop guard removes them even
//! when an assertion fails). Only loopback and these namespaces carry traffic.
//!
//! Needs root, `/dev/net/tun` and `nft`; elsewhere the tests say why and pass without
//! checking anything, except under `scripts/test.sh`/CI, where a missing tool fails them.

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;
#[path = "support/netns.rs"]
mod netns_support;

use netns_support::Guard;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rlark_net::netns::{
    self, DEFAULT_REDIRECT_PORT, Mode, NetnsSpec, ReplicaNetns, original_destination,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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

/// Run `f` on a fresh thread inside the namespace at `path` (for sockets a "task" uses).
fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
}

/// `ip -n NAME ARGS` output (test-side inspection only).
fn ip(name: &str, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new("ip")
        .arg("-n")
        .arg(name)
        .args(args)
        .output()
        .context("run ip")?;
    if !output.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test]
async fn create_adopt_and_delete() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "life");
    let spec = spec(&guard.0, Mode::Kernel);
    let created = ReplicaNetns::create(&spec).await?;
    assert_eq!(created.path(), Path::new("/run/netns").join(&guard.0));
    let addresses = ip(&guard.0, &["addr", "show", "dev", "rlark0"])?;
    assert!(addresses.contains("inet 10.88.0.2/16"), "{addresses}");
    assert!(addresses.contains("inet6 fd00:88::2/64"), "{addresses}");
    let lo = ip(&guard.0, &["link", "show", "lo"])?;
    assert!(lo.contains("UP"), "{lo}");
    let routes = ip(&guard.0, &["route", "show", "default"])?;
    assert!(routes.contains("default dev rlark0"), "{routes}");
    let routes6 = ip(&guard.0, &["-6", "route", "show", "default"])?;
    assert!(routes6.contains("default dev rlark0"), "{routes6}");

    // An agent restart: the old handle goes away without deleting; a new create adopts
    // the namespace (same device, still there) and applies a changed address list.
    drop(created);
    assert!(netns::existing("h16netns-life-")?.contains(&guard.0));
    let mut changed = spec.clone();
    changed.addresses = vec!["10.88.0.3/16".parse().unwrap()];
    let adopted = ReplicaNetns::create(&changed).await?;
    let addresses = ip(&guard.0, &["addr", "show", "dev", "rlark0"])?;
    assert!(addresses.contains("inet 10.88.0.3/16"), "{addresses}");
    assert!(
        !addresses.contains("10.88.0.2"),
        "stale address kept: {addresses}"
    );
    assert!(
        !addresses.contains("fd00:88::2"),
        "stale address kept: {addresses}"
    );
    let rules = ip_netns_exec(&guard.0, &["nft", "list", "table", "inet", "rlark"])?;
    assert!(rules.contains("ip daddr 10.88.0.3 return"), "{rules}");
    assert!(!rules.contains("10.88.0.2"), "{rules}");

    // A changed spec applied through the live handle: new passthrough ports.
    changed.loopback_passthrough = vec![6443, 9090];
    adopted.apply(&changed).await?;
    let rules = ip_netns_exec(&guard.0, &["nft", "list", "table", "inet", "rlark"])?;
    assert!(rules.contains("9090"), "{rules}");
    let mut other = changed.clone();
    other.name = "h16netns-not-this-one".into();
    let error = adopted.apply(&other).await.expect_err("another name");
    assert!(
        error.to_string().contains("h16netns-not-this-one"),
        "{error}"
    );

    adopted.delete().await?;
    assert!(!Path::new("/run/netns").join(&guard.0).exists());
    assert!(!netns::existing("h16netns-life-")?.contains(&guard.0));
    // Removing what is gone is not an error.
    netns::remove(&guard.0).await?;
    Ok(())
}

fn ip_netns_exec(name: &str, command: &[&str]) -> Result<String> {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", name])
        .args(command)
        .output()
        .context("run ip netns exec")?;
    if !output.status.success() {
        bail!("{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test]
async fn a_stale_namespace_file_is_replaced() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "stale");
    std::fs::create_dir_all("/run/netns")?;
    std::fs::write(Path::new("/run/netns").join(&guard.0), b"")?;
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Tun)).await?;
    let addresses = ip(&guard.0, &["addr", "show", "dev", "rlark0"])?;
    assert!(addresses.contains("inet 10.88.0.2/16"), "{addresses}");
    netns.delete().await?;
    Ok(())
}

#[tokio::test]
async fn listen_and_connect_inside() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "tcp");
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Kernel)).await?;
    let result = async {
        // The replica's own address: not redirected, reachable only inside.
        let own: SocketAddr = "10.88.0.2:7000".parse()?;
        let listener = netns.listen(own).await?;
        let redirect = netns
            .listen((Ipv4Addr::LOCALHOST, DEFAULT_REDIRECT_PORT).into())
            .await?;
        let (client, accepted) = tokio::join!(netns.connect(own, LIMIT), listener.accept());
        let mut client = client?;
        let (mut server, peer) = accepted?;
        assert_eq!(
            peer.ip(),
            own.ip(),
            "the connection came from inside the namespace"
        );
        // Not NATed: conntrack's original destination is where it was accepted.
        if let Ok(original) = original_destination(&server) {
            assert_eq!(original, own, "own-address traffic must not be redirected");
        }
        client.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        // Nothing reached the redirect listener.
        let idle = tokio::time::timeout(Duration::from_millis(200), redirect.accept()).await;
        assert!(idle.is_err(), "the redirect listener saw a connection");
        anyhow::Ok(())
    }
    .await;
    netns.delete().await?;
    result
}

/// Connect from inside to `target`; the redirect listener must accept it with `target` as
/// the original destination.
async fn assert_redirected(
    netns: &ReplicaNetns,
    listener: &tokio::net::TcpListener,
    target: SocketAddr,
) -> Result<()> {
    let (client, accepted) = tokio::join!(
        netns.connect(target, LIMIT),
        tokio::time::timeout(LIMIT, listener.accept())
    );
    let mut client = client.with_context(|| format!("connect to {target}"))?;
    let (mut server, _) = accepted.context("accept timed out")??;
    assert_eq!(original_destination(&server)?, target);
    server.write_all(b"ok").await?;
    let mut buf = [0u8; 2];
    client.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"ok");
    Ok(())
}

#[tokio::test]
async fn tcp_is_redirected_with_its_original_destination() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "redir");
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Kernel)).await?;
    let result = async {
        let v4 = netns
            .listen((Ipv4Addr::LOCALHOST, DEFAULT_REDIRECT_PORT).into())
            .await?;
        let v6 = netns
            .listen((Ipv6Addr::LOCALHOST, DEFAULT_REDIRECT_PORT).into())
            .await?;
        // A domain peer, any other address, IPv6, and a loopback passthrough port.
        assert_redirected(&netns, &v4, "10.88.0.9:8080".parse()?).await?;
        assert_redirected(&netns, &v4, "192.0.2.1:443".parse()?).await?;
        assert_redirected(&netns, &v6, "[fd00:88::9]:80".parse()?).await?;
        assert_redirected(&netns, &v4, "127.0.0.1:6443".parse()?).await?;
        // Other loopback ports stay the namespace's own: nothing listens there.
        let refused = netns.connect("127.0.0.1:6444".parse()?, LIMIT).await;
        assert_eq!(
            refused.expect_err("nothing listens on 6444").kind(),
            std::io::ErrorKind::ConnectionRefused
        );
        anyhow::Ok(())
    }
    .await;
    netns.delete().await?;
    result
}

#[tokio::test]
async fn tun_mode_has_no_redirect() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "tunmode");
    // Adopting a kernel-mode namespace in tun mode removes its table.
    drop(ReplicaNetns::create(&spec(&guard.0, Mode::Kernel)).await?);
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Tun)).await?;
    let result = async {
        let tables = ip_netns_exec(&guard.0, &["nft", "list", "tables"])?;
        assert!(!tables.contains("rlark"), "{tables}");
        // TCP is not redirected: its SYN reaches the TUN device (for a userspace stack).
        let target: SocketAddr = "10.88.0.9:8080".parse()?;
        let connecting = netns.connect(target, Duration::from_secs(2));
        let syn = recv_matching(&netns, |p| {
            p.len() >= 40 && p[0] >> 4 == 4 && p[9] == 6 && p[16..20] == [10, 88, 0, 9]
        });
        let (connected, syn) = tokio::join!(connecting, syn);
        assert!(connected.is_err(), "nothing answered the SYN");
        let syn = syn?;
        assert_eq!(u16::from_be_bytes([syn[22], syn[23]]), 8080);
        assert_eq!(syn[33] & 0x12, 0x02, "a SYN without ACK");
        anyhow::Ok(())
    }
    .await;
    netns.delete().await?;
    result
}

/// Read packets from the TUN until one satisfies `wanted` (the kernel sends IPv6 router
/// solicitations and MLD reports into a fresh device too).
async fn recv_matching(netns: &ReplicaNetns, wanted: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
    let deadline = Instant::now() + LIMIT;
    let mut buf = vec![0u8; usize::from(netns.tun().mtu())];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, netns.tun().recv(&mut buf))
            .await
            .context("no matching packet on the TUN device")??;
        if wanted(&buf[..n]) {
            return Ok(buf[..n].to_vec());
        }
    }
}

#[tokio::test]
async fn udp_leaves_through_the_tun_and_packets_written_to_it_arrive() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let guard = Guard::new(PREFIX, "udp");
    let netns = ReplicaNetns::create(&spec(&guard.0, Mode::Kernel)).await?;
    let result = async {
        // Outbound: a task's datagram to a domain address is read from the TUN.
        let path = netns.path().to_path_buf();
        in_netns(&path, || {
            let socket = UdpSocket::bind("0.0.0.0:4000")?;
            socket.send_to(b"hello", "10.88.0.9:5353")?;
            Ok(())
        })?;
        let packet = recv_matching(&netns, |p| {
            p.len() >= 28 && p[0] >> 4 == 4 && p[9] == 17 && p[16..20] == [10, 88, 0, 9]
        })
        .await?;
        assert_eq!(
            &packet[12..16],
            &[10, 88, 0, 2],
            "source is the replica's IP"
        );
        assert_eq!(u16::from_be_bytes([packet[20], packet[21]]), 4000);
        assert_eq!(u16::from_be_bytes([packet[22], packet[23]]), 5353);
        assert_eq!(&packet[28..], b"hello");

        // IPv6 too.
        in_netns(&path, || {
            let socket = UdpSocket::bind("[::]:4001")?;
            socket.send_to(b"hello6", "[fd00:88::9]:5353")?;
            Ok(())
        })?;
        let packet = recv_matching(&netns, |p| {
            p.len() >= 48 && p[0] >> 4 == 6 && p[6] == 17 && p[24..40] == fd00_88(9)
        })
        .await?;
        assert_eq!(&packet[8..24], &fd00_88(2));
        assert_eq!(&packet[48..], b"hello6");

        // Inbound: packets written to the TUN reach a task's UDP sockets.
        let receiver = in_netns(&path, || {
            let v4 = UdpSocket::bind("10.88.0.2:5000")?;
            let v6 = UdpSocket::bind("[fd00:88::2]:5000")?;
            v4.set_read_timeout(Some(LIMIT))?;
            v6.set_read_timeout(Some(LIMIT))?;
            Ok((v4, v6))
        })?;
        let from4 = SocketAddr::from(([10, 88, 0, 9], 4100));
        let to4 = SocketAddr::from(([10, 88, 0, 2], 5000));
        netns.tun().send(&udp_packet(from4, to4, b"to you")).await?;
        let from6 = SocketAddr::from((Ipv6Addr::from(fd00_88(9)), 4100));
        let to6 = SocketAddr::from((Ipv6Addr::from(fd00_88(2)), 5000));
        netns
            .tun()
            .send(&udp_packet(from6, to6, b"to you 6"))
            .await?;
        let (v4, v6) = receiver;
        let got4 = tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 64];
            let (n, from) = v4.recv_from(&mut buf)?;
            anyhow::Ok((buf[..n].to_vec(), from))
        })
        .await??;
        assert_eq!(got4, (b"to you".to_vec(), from4));
        let got6 = tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 64];
            let (n, from) = v6.recv_from(&mut buf)?;
            anyhow::Ok((buf[..n].to_vec(), from))
        })
        .await??;
        assert_eq!(got6, (b"to you 6".to_vec(), from6));
        // Bytes that are not an IP packet are refused, not silently dropped.
        assert!(netns.tun().send(b"\x00garbage").await.is_err());
        anyhow::Ok(())
    }
    .await;
    netns.delete().await?;
    result
}

fn fd00_88(host: u8) -> [u8; 16] {
    let mut ip = [0u8; 16];
    ip[0] = 0xfd;
    ip[3] = 0x88;
    ip[15] = host;
    ip
}

fn checksum(data: &[u8], mut sum: u32) -> u16 {
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 or IPv6 UDP packet from `from` to `to` with valid checksums.
fn udp_packet(from: SocketAddr, to: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let mut udp = Vec::with_capacity(udp_len);
    udp.extend_from_slice(&from.port().to_be_bytes());
    udp.extend_from_slice(&to.port().to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = Vec::new();
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, 17]);
            pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
        }
        _ => panic!("mixed families"),
    }
    let mut sum_input = pseudo.clone();
    sum_input.extend_from_slice(&udp);
    let sum = checksum(&sum_input, 0);
    udp[6..8].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = 20 + udp_len;
            let mut ip = vec![0x45, 0];
            ip.extend_from_slice(&(total as u16).to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let sum = checksum(&ip, 0);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            ip.extend_from_slice(&udp);
            ip
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut ip = vec![0x60, 0, 0, 0];
            ip.extend_from_slice(&(udp_len as u16).to_be_bytes());
            ip.extend_from_slice(&[17, 64]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            ip.extend_from_slice(&udp);
            ip
        }
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn probe_netfilter_passes_here() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let started = Instant::now();
    netns::probe_netfilter()
        .await
        .map_err(|e| anyhow::anyhow!("probe_netfilter: {e}"))?;
    assert!(
        netns::existing("rlarkprobe-")?
            .iter()
            .all(|n| !n.starts_with(&format!("rlarkprobe-{}-", std::process::id()))),
        "the probe left its namespace behind"
    );
    eprintln!("probe_netfilter took {:?}", started.elapsed());
    Ok(())
}
