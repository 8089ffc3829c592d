//! `rlark bench tunnel`: the reverse tunnel on loopback, next to direct TCP measured in the
//! same run.
//!
//! Setup, all in this process on 127.0.0.1: a hub end (TLS with a required client
//! certificate, WebSocket, mux session in the server role) and an agent end (TLS client,
//! WebSocket, mux session in the client role, `agent::serve`) joined by one TCP
//! connection — exactly the layers of an agent's `wss://SERVER/api/connect`. Targets are
//! local TCP servers that the agent dials. Figures:
//!
//! - single-stream throughput: N bytes through one tunnel stream to a sink that reports the
//!   byte count at EOF, vs the same to the sink over direct TCP;
//! - 8 parallel streams (N/8 each) vs 8 direct TCP connections;
//! - stream setup: `dial::open` (OPEN, header, the agent's TCP connect, the answer) p50/p99
//!   vs a direct TCP connect;
//! - head-of-line: a stream whose target never reads is stalled at its window while a
//!   second stream transfers N bytes; its throughput vs the unstalled single stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rlark_tunnel::header::StreamRequest;
use rlark_tunnel::mux::{Control, MuxConfig, Role, Session};
use rlark_tunnel::transport;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::stats::{LatencySummary, process_cpu_time};

/// Options of `rlark bench tunnel`.
#[derive(Debug, Clone, clap::Args)]
pub struct TunnelBenchOptions {
    /// Bytes per throughput measurement (MiB).
    #[arg(long, default_value_t = 512)]
    pub mib: usize,
    /// Stream setups timed.
    #[arg(long, default_value_t = 1000)]
    pub setups: usize,
    /// Largest per-stream receive window of the mux, the bound of its auto-tuning (bytes);
    /// default: the mux default.
    #[arg(long)]
    pub window: Option<u32>,
    /// Receive window every stream starts with (bytes); default: the mux default.
    #[arg(long)]
    pub start_window: Option<u32>,
    /// Largest DATA payload per mux frame (bytes); default: the mux default.
    #[arg(long)]
    pub frame: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct TunnelBenchReport {
    pub bytes: u64,
    /// Largest per-stream window (auto-tuning bound), start window, frame payload limit.
    pub window: u32,
    pub start_window: u32,
    pub max_frame_payload: usize,
    pub direct_single_mib_s: f64,
    pub tunnel_single_mib_s: f64,
    pub direct_parallel8_mib_s: f64,
    pub tunnel_parallel8_mib_s: f64,
    pub direct_connect: LatencySummary,
    pub tunnel_setup: LatencySummary,
    pub stalled_neighbour_mib_s: f64,
    pub stalled_bytes_in_flight: u64,
    /// Smallest PING round trip each end measured (µs), the path delay its window
    /// auto-tuning works from; read after the warm-up.
    pub hub_min_rtt_us: Option<f64>,
    pub agent_min_rtt_us: Option<f64>,
    /// CPU cores busy (process CPU time / wall time) during each throughput phase:
    /// direct single, tunnel single, direct 8, tunnel 8.
    pub cpu_cores: [f64; 4],
    /// Process CPU seconds per GiB transferred in the same phases (both ends of the
    /// transfer are in this process, so this is the whole cost of moving a byte: sender,
    /// tunnel or kernel, receiver). Unlike throughput it barely moves when other work
    /// competes for the cores. 0 when `/proc` is unavailable.
    pub cpu_s_per_gib: [f64; 4],
}

impl TunnelBenchReport {
    fn single_ratio(&self) -> f64 {
        self.tunnel_single_mib_s / self.direct_single_mib_s
    }
    fn parallel_ratio(&self) -> f64 {
        self.tunnel_parallel8_mib_s / self.direct_parallel8_mib_s
    }
    fn hol_ratio(&self) -> f64 {
        self.stalled_neighbour_mib_s / self.tunnel_single_mib_s
    }
    /// Tunnel CPU per byte over direct CPU per byte, 8 streams.
    fn parallel_cpu_factor(&self) -> f64 {
        self.cpu_s_per_gib[3] / self.cpu_s_per_gib[2]
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets target" } else { "BELOW TARGET" }
}

impl std::fmt::Display for TunnelBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rlark bench tunnel: {} MiB per measurement, mux window {}..{} KiB (auto-tuned), frames <= {} KiB, TLS + WebSocket on 127.0.0.1",
            self.bytes / (1024 * 1024),
            self.start_window / 1024,
            self.window / 1024,
            self.max_frame_payload / 1024
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<34} {:>12} {:>12} {:>8}  target",
            "", "direct TCP", "tunnel", "ratio"
        )?;
        writeln!(
            f,
            "{:<34} {:>9.0} MiB/s {:>9.0} MiB/s {:>7.0}%  >= 25%: {}",
            "single stream throughput",
            self.direct_single_mib_s,
            self.tunnel_single_mib_s,
            self.single_ratio() * 100.0,
            verdict(self.single_ratio() >= 0.25)
        )?;
        writeln!(
            f,
            "{:<34} {:>9.0} MiB/s {:>9.0} MiB/s {:>7.0}%  >= 30%: {}",
            "8 parallel streams (aggregate)",
            self.direct_parallel8_mib_s,
            self.tunnel_parallel8_mib_s,
            self.parallel_ratio() * 100.0,
            verdict(self.parallel_ratio() >= 0.30)
        )?;
        writeln!(
            f,
            "{:<34} {:>9.3} ms {:>12.3} ms",
            "stream setup p50", self.direct_connect.p50_ms, self.tunnel_setup.p50_ms
        )?;
        writeln!(
            f,
            "{:<34} {:>9.3} ms {:>12.3} ms {:>8}  p99 <= 2 ms: {}",
            "stream setup p99",
            self.direct_connect.p99_ms,
            self.tunnel_setup.p99_ms,
            "",
            verdict(self.tunnel_setup.p99_ms <= 2.0)
        )?;
        writeln!(
            f,
            "{:<34} {:>12} {:>9.0} MiB/s {:>7.0}%  >= 80% of unstalled: {}",
            "neighbour of a stalled stream",
            "",
            self.stalled_neighbour_mib_s,
            self.hol_ratio() * 100.0,
            verdict(self.hol_ratio() >= 0.80)
        )?;
        writeln!(
            f,
            "{:<34} {:>12} {:>9} KiB",
            "stalled stream bytes in flight",
            "",
            self.stalled_bytes_in_flight / 1024
        )?;
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} us"));
        writeln!(
            f,
            "{:<34} {:>12} {:>12}   (hub / agent, the RTT window auto-tuning works from)",
            "tunnel PING round trip (min)",
            us(self.hub_min_rtt_us),
            us(self.agent_min_rtt_us)
        )?;
        writeln!(
            f,
            "{:<34} {:>9.2} / {:.2} {:>8.2} / {:.2}   (single / 8 streams)",
            "CPU cores busy",
            self.cpu_cores[0],
            self.cpu_cores[2],
            self.cpu_cores[1],
            self.cpu_cores[3]
        )?;
        writeln!(
            f,
            "{:<34} {:>9.2} / {:.2} {:>8.2} / {:.2}   (single / 8 streams; tunnel = {:.1}x direct at 8)",
            "CPU seconds per GiB",
            self.cpu_s_per_gib[0],
            self.cpu_s_per_gib[2],
            self.cpu_s_per_gib[1],
            self.cpu_s_per_gib[3],
            self.parallel_cpu_factor()
        )
    }
}

/// A TCP server that reads everything and answers the byte count (8 bytes, big-endian) at
/// EOF.
async fn sink_server() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) => break,
                        Ok(n) => total += n as u64,
                        Err(_) => return,
                    }
                }
                let _ = socket.write_all(&total.to_be_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(addr)
}

/// A TCP server that accepts and holds connections without reading them.
async fn stall_server() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok(addr)
}

/// Write `bytes` then half-close, and read the sink's count.
async fn push<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, bytes: u64) -> anyhow::Result<()> {
    let chunk = vec![0x5au8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await?;
    let mut count = [0u8; 8];
    stream
        .read_exact(&mut count)
        .await
        .context("read the sink's count")?;
    let got = u64::from_be_bytes(count);
    if got != bytes {
        bail!("the sink received {got} bytes, {bytes} were sent");
    }
    Ok(())
}

/// Process CPU time over wall time since `start`.
struct CpuClock {
    wall: Instant,
    cpu: Option<Duration>,
}

impl CpuClock {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: process_cpu_time(),
        }
    }

    /// (average cores this process kept busy, CPU seconds per GiB of `bytes`) since the
    /// start; (0, 0) when /proc is unavailable. `/proc` counts CPU time in 10 ms ticks, so
    /// a phase should last well over a second of CPU for a precise figure.
    fn stop(&self, bytes: u64) -> (f64, f64) {
        match (self.cpu, process_cpu_time()) {
            (Some(before), Some(after)) => {
                let cpu = after.saturating_sub(before).as_secs_f64();
                let gib = bytes as f64 / (1024.0 * 1024.0 * 1024.0);
                (
                    cpu / self.wall.elapsed().as_secs_f64().max(1e-9),
                    cpu / gib.max(1e-12),
                )
            }
            _ => (0.0, 0.0),
        }
    }
}

fn mib_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-9)
}

/// A connected hub/agent pair over TLS + WebSocket on loopback.
struct Pair {
    hub: Control,
    agent: Control,
}

async fn tunnel_pair(mux: MuxConfig) -> anyhow::Result<Pair> {
    let dir = tempfile::tempdir()?;
    let ca = rlark_pki::Ca::load_or_create(dir.path())?;
    let serving = ca.issue_serving(&["127.0.0.1".to_string()], Duration::from_secs(3600))?;
    let agent = ca.issue_client(
        "system:rlark:agent:bench",
        &["rlark:agents".to_string()],
        Duration::from_secs(3600),
    )?;
    let provider = Arc::new(rlark_pki::tls_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca.cert_der().to_vec()))?;
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()?;
    let server_tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?,
        )?;
    let client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(agent.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(agent.key_pem.as_bytes())?,
        )?;

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_tls));
    let hub_mux = mux.clone();
    let hub = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let mut tls = acceptor.accept(transport::ReadAhead::new(tcp)).await?;
        tls.get_mut()
            .1
            .set_buffer_limit(Some(transport::TLS_BUFFER_LIMIT));
        let ws = transport::accept(tls).await?;
        let (control, _incoming) = Session::new(ws, Role::Server, hub_mux);
        anyhow::Ok(control)
    });
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls))
        .connect(
            ServerName::try_from("127.0.0.1")?,
            transport::ReadAhead::new(tcp),
        )
        .await?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(transport::TLS_BUFFER_LIMIT));
    let (ws, _) = transport::connect(format!("wss://{addr}/api/connect"), tls).await?;
    let (agent, incoming) = Session::new(ws, Role::Client, mux);
    tokio::spawn(rlark_tunnel::agent::serve(
        incoming,
        rlark_tunnel::agent::AgentConfig::default(),
    ));
    let hub = hub.await??;
    drop(dir);
    Ok(Pair { hub, agent })
}

async fn dial(hub: &Control, addr: SocketAddr) -> anyhow::Result<rlark_tunnel::mux::MuxStream> {
    let request = StreamRequest::DialTcp {
        host: addr.ip().to_string(),
        port: addr.port(),
        timeout: Duration::from_secs(10),
    };
    rlark_tunnel::dial::open(hub, &request, Duration::from_secs(11))
        .await
        .map_err(|e| anyhow::anyhow!("dial {addr}: {e}"))
}

/// Run the benchmark.
pub async fn run_tunnel(options: TunnelBenchOptions) -> anyhow::Result<TunnelBenchReport> {
    let bytes = (options.mib as u64).max(1) * 1024 * 1024;
    let mut mux = MuxConfig::default();
    if let Some(window) = options.window {
        mux.window = window;
    }
    if let Some(start) = options.start_window {
        mux.start_window = start;
    }
    if let Some(frame) = options.frame {
        mux.max_frame_payload = frame;
    }
    let (window, start_window, max_frame_payload) =
        (mux.window, mux.start_window, mux.max_frame_payload);
    let sink = sink_server().await?;
    let stall = stall_server().await?;
    let pair = tunnel_pair(mux).await.context("set up the tunnel")?;

    // Warm-up: one small transfer each way.
    push(&mut TcpStream::connect(sink).await?, 1 << 20).await?;
    push(&mut dial(&pair.hub, sink).await?, 1 << 20).await?;
    let rtt_us = |c: &Control| c.stats().min_rtt.map(|d| d.as_secs_f64() * 1e6);
    let (hub_min_rtt_us, agent_min_rtt_us) = (rtt_us(&pair.hub), rtt_us(&pair.agent));

    let mut cpu_cores = [0.0; 4];
    let mut cpu_s_per_gib = [0.0; 4];
    let cpu = CpuClock::start();
    let started = Instant::now();
    let mut direct = TcpStream::connect(sink).await?;
    direct.set_nodelay(true)?;
    push(&mut direct, bytes).await?;
    let direct_single = mib_s(bytes, started.elapsed());
    (cpu_cores[0], cpu_s_per_gib[0]) = cpu.stop(bytes);

    let cpu = CpuClock::start();
    let started = Instant::now();
    push(&mut dial(&pair.hub, sink).await?, bytes).await?;
    let tunnel_single = mib_s(bytes, started.elapsed());
    (cpu_cores[1], cpu_s_per_gib[1]) = cpu.stop(bytes);

    let per = bytes / 8;
    let cpu = CpuClock::start();
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        set.spawn(async move {
            let mut s = TcpStream::connect(sink).await?;
            s.set_nodelay(true)?;
            push(&mut s, per).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let direct_parallel = mib_s(per * 8, started.elapsed());
    (cpu_cores[2], cpu_s_per_gib[2]) = cpu.stop(per * 8);

    let cpu = CpuClock::start();
    let started = Instant::now();
    for _ in 0..8 {
        let hub = pair.hub.clone();
        set.spawn(async move { push(&mut dial(&hub, sink).await?, per).await });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let tunnel_parallel = mib_s(per * 8, started.elapsed());
    (cpu_cores[3], cpu_s_per_gib[3]) = cpu.stop(per * 8);

    let mut direct_samples = Vec::with_capacity(options.setups);
    let mut tunnel_samples = Vec::with_capacity(options.setups);
    let mut held = Vec::new();
    for _ in 0..options.setups {
        let t = Instant::now();
        let s = TcpStream::connect(stall).await?;
        direct_samples.push(t.elapsed());
        held.push(s);
        let t = Instant::now();
        let s = dial(&pair.hub, stall).await?;
        tunnel_samples.push(t.elapsed());
        drop(s);
        if held.len() >= 100 {
            held.clear();
        }
    }
    drop(held);

    // Head-of-line: stall one stream at its window, then measure a neighbour.
    let mut stalled = dial(&pair.hub, stall).await?;
    let chunk = vec![0u8; 64 * 1024];
    let mut in_flight = 0u64;
    loop {
        match tokio::time::timeout(Duration::from_millis(500), stalled.write(&chunk)).await {
            Ok(Ok(n)) => in_flight += n as u64,
            Ok(Err(e)) => bail!("stalled stream failed: {e}"),
            Err(_) => break,
        }
        if in_flight > 4 * u64::from(window) + (64 << 20) {
            bail!("the stalled stream accepted {in_flight} bytes: no flow control");
        }
    }
    let started = Instant::now();
    push(&mut dial(&pair.hub, sink).await?, bytes).await?;
    let neighbour = mib_s(bytes, started.elapsed());
    drop(stalled);

    Ok(TunnelBenchReport {
        bytes,
        window,
        start_window,
        max_frame_payload,
        direct_single_mib_s: direct_single,
        tunnel_single_mib_s: tunnel_single,
        direct_parallel8_mib_s: direct_parallel,
        tunnel_parallel8_mib_s: tunnel_parallel,
        direct_connect: LatencySummary::from_samples(&mut direct_samples),
        tunnel_setup: LatencySummary::from_samples(&mut tunnel_samples),
        stalled_neighbour_mib_s: neighbour,
        stalled_bytes_in_flight: in_flight,
        hub_min_rtt_us,
        agent_min_rtt_us,
        cpu_cores,
        cpu_s_per_gib,
    })
}
