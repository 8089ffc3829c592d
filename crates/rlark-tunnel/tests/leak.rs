//! Abandoned dials leave nothing behind: 10,000 dials towards a target that never answers,
//! each given up by the hub after 1 ms, must leave no stream open on either side of the
//! session, no file descriptor and no significant memory.
//!
//! Library level (a session pair over a real loopback TCP connection carrying a WebSocket,
//! no TLS): much faster than 10,000 TLS handshakes, and the same mux, header and agent code.

#[path = "../src/test_wait.rs"]
mod test_wait;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use rlark_tunnel::agent::{self, AgentConfig};
use rlark_tunnel::dial;
use rlark_tunnel::header::StreamRequest;
use rlark_tunnel::mux::{Control, Incoming, MuxConfig, Role, Session};
use rlark_tunnel::transport::WsTransport;
use rlark_tunnel::ws::Role as WsRole;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const DIALS: usize = 10_000;
const BATCH: usize = 500;
/// Allowed difference of the fd count from the baseline once everything has settled.
const FD_SLACK: usize = 8;
/// Allowed RSS growth.
const RSS_LIMIT_KIB: u64 = 64 * 1024;

fn fd_count() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")
        .context("read /proc/self/fd")?
        .count())
}

fn rss_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .context("no VmRSS in /proc/self/status")
}

/// A hub session and an agent session (served by `agent::serve`) over loopback TCP and a
/// WebSocket without TLS. Returns the hub's control and incoming streams, and the agent's
/// control.
async fn session_pair() -> Result<(Control, Incoming, Control)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (agent_tcp, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let agent_tcp = agent_tcp?;
    let (hub_tcp, _) = accepted?;
    agent_tcp.set_nodelay(true)?;
    hub_tcp.set_nodelay(true)?;
    let hub_ws = WsTransport::from_raw_socket(hub_tcp, WsRole::Server);
    let agent_ws = WsTransport::from_raw_socket(agent_tcp, WsRole::Client);
    let (hub, hub_in) = Session::new(hub_ws, Role::Server, MuxConfig::default());
    let (agent, agent_in) = Session::new(agent_ws, Role::Client, MuxConfig::default());
    tokio::spawn(agent::serve(agent_in, AgentConfig::default()));
    Ok((hub, hub_in, agent))
}

/// A loopback address that accepts no connection: a listener with backlog 0 whose accept
/// queue is full, so Linux drops further SYNs and a connect hangs until its timeout. Keep
/// the listener and the fillers alive while using it.
async fn black_hole() -> Result<(TcpListener, Vec<TcpStream>, std::net::SocketAddr)> {
    let socket = TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(0)?;
    let addr = listener.local_addr()?;
    let mut fillers = Vec::new();
    for _ in 0..2 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
        {
            fillers.push(s);
        }
    }
    ensure!(!fillers.is_empty(), "could not fill the accept queue");
    Ok((listener, fillers, addr))
}

/// One dial through the session to an echo server must work.
async fn echo_through(hub: &Control) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(async move {
        if let Ok((mut s, _)) = listener.accept().await {
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        }
    });
    let request = StreamRequest::DialTcp {
        host: "127.0.0.1".into(),
        port,
        timeout: Duration::from_secs(5),
    };
    let mut stream = dial::open(hub, &request, Duration::from_secs(10))
        .await
        .context("dial the echo server")?;
    stream.write_all(b"still works").await?;
    stream.shutdown().await?;
    let mut back = Vec::new();
    stream.read_to_end(&mut back).await?;
    ensure!(back == b"still works", "echo: {back:?}");
    drop(stream);
    server.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_dials_do_not_leak() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(120), async {
        let (hub, _hub_in, agent) = session_pair().await?;
        let (_listener, _fillers, hole) = black_hole().await?;
        echo_through(&hub).await?;

        let fds_before = fd_count()?;
        let rss_before = rss_kib()?;
        let request = StreamRequest::DialTcp {
            host: "127.0.0.1".into(),
            port: hole.port(),
            timeout: Duration::from_millis(200),
        };
        let started = Instant::now();
        let (mut abandoned, mut answered) = (0usize, 0usize);
        let (mut peak_agent_streams, mut peak_fds) = (0usize, 0usize);
        for _ in 0..DIALS / BATCH {
            let dials = (0..BATCH).map(|_| {
                tokio::time::timeout(
                    Duration::from_millis(1),
                    dial::open(&hub, &request, Duration::from_millis(300)),
                )
            });
            for result in futures::future::join_all(dials).await {
                match result {
                    Err(_) => abandoned += 1,
                    Ok(_) => answered += 1,
                }
            }
            peak_agent_streams = peak_agent_streams.max(agent.stats().streams_open);
            peak_fds = peak_fds.max(fd_count()?);
        }
        let dialing = started.elapsed();

        let settled = test_wait::eventually(Duration::from_secs(30), || {
            hub.stats().streams_open == 0 && agent.stats().streams_open == 0
        })
        .await;
        ensure!(
            settled,
            "streams still open 30 s after the dials: hub {:?}, agent {:?}",
            hub.stats(),
            agent.stats()
        );
        let fds_back = test_wait::eventually(Duration::from_secs(30), || {
            fd_count().is_ok_and(|n| n.abs_diff(fds_before) <= FD_SLACK)
        })
        .await;
        let fds_after = fd_count()?;
        let rss_after = rss_kib()?;
        eprintln!(
            "{DIALS} dials in {dialing:?}: {abandoned} abandoned after 1 ms, {answered} answered \
             in time; peak agent streams {peak_agent_streams}; hub {:?}; agent {:?}",
            hub.stats(),
            agent.stats()
        );
        eprintln!(
            "fds {fds_before} -> {fds_after} (peak {peak_fds} while dialing); VmRSS {rss_before} KiB -> {rss_after} KiB \
             ({:+} KiB)",
            rss_after as i64 - rss_before as i64
        );
        ensure!(
            fds_back,
            "fd count {fds_after} did not return to {fds_before} (± {FD_SLACK})"
        );
        ensure!(
            rss_after.saturating_sub(rss_before) < RSS_LIMIT_KIB,
            "RSS grew by {} KiB",
            rss_after - rss_before
        );
        ensure!(!hub.is_closed() && !agent.is_closed(), "the session died");
        echo_through(&hub).await?;
        Ok(())
    })
    .await
    .context("test did not finish within 120 s")?
}
