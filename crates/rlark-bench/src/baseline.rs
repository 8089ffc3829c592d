//! Reference figures measured in the same run as the API benchmark, so its numbers can be
//! read against what this machine can do at all: raw loopback TCP round trips and store-only
//! creates (no HTTP, no TLS, no JSON parsing).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use rlark_store::{
    Backend, CachedStore, ObjectKey, PostgresStore, PostgresStoreConfig, SqliteStore,
    SqliteStoreConfig, Store as _,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant as TokioInstant;

use super::stats::{PhaseClock, Throughput, WorkerOutcome};

/// Size of one echo message.
const ECHO_MESSAGE_BYTES: usize = 64;

/// Raw TCP request/response ceiling: `connections` clients each send a small message to an
/// echo server on 127.0.0.1 and wait for it to come back, `round_trips` times in total.
pub async fn tcp_echo(
    connections: usize,
    round_trips: usize,
    deadline: TokioInstant,
) -> anyhow::Result<Throughput> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind echo server")?;
    let addr = listener.local_addr().context("echo server address")?;
    let server = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            conns.spawn(async move {
                let mut buf = [0u8; ECHO_MESSAGE_BYTES * 4];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });

    let mut streams = Vec::with_capacity(connections);
    for _ in 0..connections {
        let stream = TcpStream::connect(addr)
            .await
            .context("connect to echo server")?;
        stream.set_nodelay(true).context("set TCP_NODELAY")?;
        streams.push(stream);
    }

    let next = Arc::new(AtomicUsize::new(0));
    let clock = PhaseClock::start();
    let mut workers = JoinSet::new();
    for mut stream in streams {
        let next = Arc::clone(&next);
        workers.spawn(async move {
            let mut outcome = WorkerOutcome {
                connections: 1,
                ..WorkerOutcome::default()
            };
            let message = [0x5au8; ECHO_MESSAGE_BYTES];
            let mut reply = [0u8; ECHO_MESSAGE_BYTES];
            while next.fetch_add(1, Ordering::Relaxed) < round_trips {
                let start = Instant::now();
                let round_trip = async {
                    stream.write_all(&message).await?;
                    stream.read_exact(&mut reply).await?;
                    Ok::<_, std::io::Error>(())
                };
                match tokio::time::timeout_at(deadline, round_trip).await {
                    Ok(Ok(())) => outcome.latencies.push(start.elapsed()),
                    Ok(Err(e)) => {
                        outcome.fail(format!("echo: {e}"));
                        break;
                    }
                    Err(_) => {
                        outcome.fail("overall deadline reached");
                        break;
                    }
                }
            }
            outcome
        });
    }
    let outcome = join_outcomes(workers).await;
    let times = clock.stop();
    server.abort();
    Ok(Throughput::from_parts(
        format!("TCP echo round trips ({ECHO_MESSAGE_BYTES} B)"),
        connections,
        outcome,
        times,
    ))
}

/// Store-only creates: `concurrency` tasks call `create` directly on a fresh SQLite database
/// in `dir`, or on the PostgreSQL database at `store_url` (whose objects of this run are
/// deleted again afterwards, untimed), `count` objects in total, each built by `object(name)`.
pub async fn store_creates(
    dir: &Path,
    store_url: Option<&str>,
    concurrency: usize,
    count: usize,
    resource: &str,
    object: impl Fn(&str) -> serde_json::Value + Send + Sync + 'static,
    deadline: TokioInstant,
) -> anyhow::Result<Throughput> {
    match store_url {
        None => {
            let path = dir.join("rlark.db");
            let store = SqliteStore::open(SqliteStoreConfig::new(&path))
                .await
                .with_context(|| format!("open store {}", path.display()))?;
            let label = "store-only creates (SqliteStore)";
            creates_on(
                store,
                label,
                false,
                concurrency,
                count,
                resource,
                object,
                deadline,
            )
            .await
        }
        Some(url) => {
            let store = PostgresStore::open(PostgresStoreConfig::from_url(url)?)
                .await
                .context("open the PostgreSQL store")?;
            let label = "store-only creates (PostgresStore)";
            creates_on(
                store,
                label,
                true,
                concurrency,
                count,
                resource,
                object,
                deadline,
            )
            .await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn creates_on<B: Backend>(
    store: CachedStore<B>,
    label: &str,
    clean_up: bool,
    concurrency: usize,
    count: usize,
    resource: &str,
    object: impl Fn(&str) -> serde_json::Value + Send + Sync + 'static,
    deadline: TokioInstant,
) -> anyhow::Result<Throughput> {
    let object = Arc::new(object);
    // Build the objects before the clock starts, as the API clients do with their bodies.
    let objects: Arc<Vec<(ObjectKey, serde_json::Value)>> = Arc::new(
        (0..count)
            .map(|i| {
                let name = format!("bench-store-{i:06}");
                (ObjectKey::new(resource, "", name.as_str()), object(&name))
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let before = store.stats();
    let clock = PhaseClock::start();
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let store = store.clone();
        let next = Arc::clone(&next);
        let objects = Arc::clone(&objects);
        workers.spawn(async move {
            let mut outcome = WorkerOutcome::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((key, value)) = objects.get(i) else {
                    break;
                };
                let start = Instant::now();
                // The clone is part of the cost a server pays too (it owns the parsed body).
                match tokio::time::timeout_at(deadline, store.create(key, value.clone())).await {
                    Ok(Ok(_)) => outcome.latencies.push(start.elapsed()),
                    Ok(Err(e)) => outcome.fail(format!("store create: {e}")),
                    Err(_) => {
                        outcome.fail("overall deadline reached");
                        break;
                    }
                }
            }
            outcome
        });
    }
    let outcome = join_outcomes(workers).await;
    let times = clock.stop();
    let after = store.stats();
    if clean_up {
        for (key, _) in objects.iter() {
            match store.delete(key, None).await {
                Ok(_) | Err(rlark_store::StoreError::NotFound(_)) => {}
                Err(e) => return Err(anyhow::anyhow!("delete the baseline's {}: {e}", key.name)),
            }
        }
    }
    store.close().await;
    let commits = after.commits.saturating_sub(before.commits);
    let writes = after.writes.saturating_sub(before.writes);
    tracing::info!(commits, writes, "store-only creates done");
    let mut result = Throughput::from_parts(label, concurrency, outcome, times);
    result.writes_per_commit = (commits > 0).then(|| writes as f64 / commits as f64);
    Ok(result)
}

/// Wait for every worker; a panicked worker counts as one failure.
pub async fn join_outcomes(mut workers: JoinSet<WorkerOutcome>) -> WorkerOutcome {
    let mut total = WorkerOutcome::default();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(outcome) => total.merge(outcome),
            Err(e) => total.fail(format!("worker task failed: {e}")),
        }
    }
    total
}
