//! Watch delivery latency: many watchers, one paced writer, latency = event received −
//! create sent (the clock starts when the write request is sent, as etcd's benchmark
//! starts it at the put, so the write's own commit time is part of the figure).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Instant as TokioInstant;
use tokio_util::sync::CancellationToken;

use super::client::{Reconnecting, Target, expect_status};
use super::object::{self, JOBS_PATH};
use super::report::WatchFigures;
use super::stats::{LatencySummary, PhaseClock, Throughput, WorkerOutcome};

/// Name prefix of the objects the watch writer creates.
const NAME_PREFIX: &str = "bench-w-";
/// Concurrent writer connections sharing the paced schedule, so that one slow create does
/// not hold back the pace.
const WRITERS: usize = 8;
/// How long watchers may take to get their watch accepted.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// After the last create, how long to wait for the remaining events.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of one watch run.
#[derive(Clone, Debug)]
pub struct WatchPlan {
    /// Concurrent watchers, one connection each.
    pub watchers: usize,
    /// Objects the writer creates.
    pub events: usize,
    /// Writer pace, creates per second.
    pub rate: f64,
}

/// One line of a watch stream (only the fields the benchmark needs).
#[derive(Deserialize)]
struct WatchLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    object: WatchObject<'a>,
}

#[derive(Deserialize, Default)]
struct WatchObject<'a> {
    #[serde(default, borrow)]
    metadata: Option<WatchMeta<'a>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct WatchMeta<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
}

/// What one watcher saw.
#[derive(Debug, Default)]
struct WatcherOutcome {
    /// `(object index, receive instant)` of each first ADDED event of a writer object.
    received: Vec<(usize, Instant)>,
    duplicates: usize,
    error: Option<String>,
}

/// Index of a writer object from its name.
fn object_index(name: &str) -> Option<usize> {
    name.strip_prefix(NAME_PREFIX)?.parse().ok()
}

/// Parse as many complete JSON values from `buf` as it holds and hand each to `on_line`;
/// return how many bytes were consumed (a trailing partial value stays in the buffer).
fn parse_lines(
    buf: &[u8],
    mut on_line: impl FnMut(WatchLine<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<usize> {
    let mut stream = serde_json::Deserializer::from_slice(buf).into_iter::<WatchLine<'_>>();
    let mut consumed = 0;
    loop {
        match stream.next() {
            Some(Ok(line)) => {
                consumed = stream.byte_offset();
                on_line(line)?;
            }
            Some(Err(e)) if e.is_eof() => return Ok(consumed),
            Some(Err(e)) => return Err(anyhow!("malformed watch stream: {e}")),
            None => return Ok(stream.byte_offset()),
        }
    }
}

/// Open a watch, report readiness, then record every ADDED event of a writer object until
/// all `events` arrived, the stream ends or `stop` fires.
async fn watcher(
    target: Target,
    path: String,
    events: usize,
    ready: oneshot::Sender<()>,
    delivered: Arc<AtomicUsize>,
    stop: CancellationToken,
) -> WatcherOutcome {
    let mut outcome = WatcherOutcome::default();
    let result = async {
        let mut conn = target.connect().await?;
        let response = conn.send(Method::GET, &path, None).await?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            bail!(
                "watch answered HTTP {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(300)
                    .collect::<String>()
            );
        }
        // The receiver may have given up waiting; the watch still runs.
        let _ = ready.send(());
        let mut body = response.into_body();
        let mut seen = vec![false; events];
        let mut count = 0;
        let mut buf: Vec<u8> = Vec::new();
        while count < events {
            let frame = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                frame = body.frame() => frame,
            };
            let now = Instant::now();
            let Some(frame) = frame else {
                bail!("watch stream ended after {count} of {events} events");
            };
            let Ok(data) = frame.context("read watch stream")?.into_data() else {
                continue; // trailers
            };
            buf.extend_from_slice(&data);
            let consumed = parse_lines(&buf, |line| {
                match line.kind.as_ref() {
                    "ADDED" => {
                        let name = line.object.metadata.and_then(|m| m.name);
                        if let Some(i) = name.as_deref().and_then(object_index)
                            && let Some(slot) = seen.get_mut(i)
                        {
                            if *slot {
                                outcome.duplicates += 1;
                            } else {
                                *slot = true;
                                count += 1;
                                outcome.received.push((i, now));
                                delivered.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    "ERROR" => bail!(
                        "watch ERROR event: {}",
                        line.object.message.as_deref().unwrap_or("(no message)")
                    ),
                    // BOOKMARK, and events of objects from earlier phases.
                    _ => {}
                }
                Ok(())
            })?;
            buf.drain(..consumed);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        outcome.error = Some(format!("{e:#}"));
    }
    outcome
}

/// Run the watch phase against the server behind `target`.
pub async fn run(
    target: &Target,
    plan: &WatchPlan,
    deadline: TokioInstant,
    errors: &mut Vec<String>,
) -> anyhow::Result<WatchFigures> {
    // Start from the current revision, as a client does after its initial list.
    let mut probe = Reconnecting::new(target.clone());
    let reply = tokio::time::timeout_at(
        deadline,
        probe.request(Method::GET, &format!("{JOBS_PATH}?limit=1"), None),
    )
    .await
    .context("overall deadline reached")??;
    expect_status(&reply, StatusCode::OK).context("list for the watch revision")?;
    let revision = list_revision(&reply.body)?;
    let timeout_secs = deadline
        .saturating_duration_since(TokioInstant::now())
        .as_secs()
        .max(60);
    let path =
        format!("{JOBS_PATH}?watch=true&resourceVersion={revision}&timeoutSeconds={timeout_secs}");

    // Watchers.
    let delivered = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut watchers = JoinSet::new();
    let mut ready = Vec::with_capacity(plan.watchers);
    for _ in 0..plan.watchers {
        let (tx, rx) = oneshot::channel();
        ready.push(rx);
        watchers.spawn(watcher(
            target.clone(),
            path.clone(),
            plan.events,
            tx,
            Arc::clone(&delivered),
            stop.clone(),
        ));
    }
    let ready_by = TokioInstant::now() + READY_TIMEOUT;
    let mut watchers_ready = 0;
    for rx in ready {
        if let Ok(Ok(())) = tokio::time::timeout_at(ready_by.min(deadline), rx).await {
            watchers_ready += 1;
        }
    }
    tracing::info!(watchers_ready, revision, "watchers started");

    // Writers: object i is due at start + i / rate, handled by writer i % WRITERS.
    let bodies: Arc<Vec<Bytes>> = Arc::new(
        (0..plan.events)
            .map(|i| Bytes::from(object::job_bytes(&format!("{NAME_PREFIX}{i:06}"), "watch")))
            .collect(),
    );
    let period = Duration::from_secs_f64(1.0 / plan.rate);
    let mut writers = JoinSet::new();
    let mut conns = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS.min(plan.events.max(1)) {
        let mut conn = Reconnecting::new(target.clone());
        tokio::time::timeout_at(deadline, conn.warm())
            .await
            .context("overall deadline reached")??;
        conns.push(conn);
    }
    let writer_count = conns.len();
    let clock = PhaseClock::start();
    let start = TokioInstant::now();
    for (w, mut conn) in conns.into_iter().enumerate() {
        let bodies = Arc::clone(&bodies);
        writers.spawn(async move {
            let mut outcome = WorkerOutcome::default();
            let mut acks = Vec::new();
            for i in (w..bodies.len()).step_by(writer_count) {
                let due = start + period.mul_f64(i as f64);
                if due >= deadline {
                    outcome.fail("overall deadline reached");
                    break;
                }
                tokio::time::sleep_until(due).await;
                let sent = Instant::now();
                let request = conn.request(Method::POST, JOBS_PATH, Some(bodies[i].clone()));
                match tokio::time::timeout_at(deadline, request).await {
                    Ok(Ok(reply)) => match expect_status(&reply, StatusCode::CREATED) {
                        Ok(()) => {
                            let acked = Instant::now();
                            outcome.latencies.push(acked - sent);
                            acks.push((i, sent, acked));
                        }
                        Err(e) => outcome.fail(e),
                    },
                    Ok(Err(e)) => outcome.fail(format!("{e:#}")),
                    Err(_) => {
                        outcome.fail("overall deadline reached");
                        break;
                    }
                }
            }
            outcome.connections = conn.opened;
            (outcome, acks)
        });
    }
    let mut writer_outcome = WorkerOutcome::default();
    // (sent, acknowledged) of each create that succeeded.
    let mut acked: Vec<Option<(Instant, Instant)>> = vec![None; plan.events];
    while let Some(joined) = writers.join_next().await {
        match joined {
            Ok((outcome, acks)) => {
                writer_outcome.merge(outcome);
                for (i, sent, at) in acks {
                    acked[i] = Some((sent, at));
                }
            }
            Err(e) => writer_outcome.fail(format!("writer task failed: {e}")),
        }
    }
    let times = clock.stop();
    let writer = Throughput::from_parts("POST jobs (paced)", writer_count, writer_outcome, times);
    let acked_count = acked.iter().filter(|a| a.is_some()).count();

    // Wait for the stragglers, then stop every watcher.
    let expected = acked_count * watchers_ready;
    let drain_by = (TokioInstant::now() + DRAIN_TIMEOUT).min(deadline);
    while delivered.load(Ordering::Relaxed) < expected && TokioInstant::now() < drain_by {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();

    let mut latencies = Vec::with_capacity(expected);
    let mut figures = WatchFigures {
        watchers: plan.watchers,
        watchers_ready,
        target_rate: plan.rate,
        expected,
        ..WatchFigures::default()
    };
    let mut watcher_errors = Vec::new();
    while let Some(joined) = watchers.join_next().await {
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(e) => {
                watcher_errors.push(format!("watcher task failed: {e}"));
                continue;
            }
        };
        figures.duplicates += outcome.duplicates;
        if let Some(e) = outcome.error {
            watcher_errors.push(e);
        }
        let mut got = 0;
        for (i, received) in outcome.received {
            if let Some((sent, ack)) = acked[i] {
                got += 1;
                if received < ack {
                    figures.before_ack += 1;
                }
                latencies.push(received.saturating_duration_since(sent));
            }
        }
        figures.delivered += got;
        if got < acked_count {
            figures.incomplete_watchers += 1;
        }
    }
    figures.missing = expected.saturating_sub(figures.delivered);
    figures.latency = LatencySummary::from_samples(&mut latencies);
    figures.writer = writer;
    if figures.missing > 0 {
        errors.push(format!(
            "watch: {} of {} events never arrived ({} watchers incomplete)",
            figures.missing, figures.expected, figures.incomplete_watchers
        ));
    }
    if watchers_ready < plan.watchers {
        errors.push(format!(
            "watch: only {watchers_ready} of {} watches were accepted within {} s",
            plan.watchers,
            READY_TIMEOUT.as_secs()
        ));
    }
    if let Some(first) = watcher_errors.first() {
        errors.push(format!(
            "watch: {} watcher(s) failed; first: {first}",
            watcher_errors.len()
        ));
    }
    if figures.writer.failed > 0 {
        errors.push(format!(
            "watch: {} paced creates failed; first: {}",
            figures.writer.failed,
            figures.writer.first_error.as_deref().unwrap_or("-")
        ));
    }
    Ok(figures)
}

/// `metadata.resourceVersion` of a list response.
pub fn list_revision(body: &[u8]) -> anyhow::Result<String> {
    #[derive(Deserialize)]
    struct List {
        metadata: ListMeta,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ListMeta {
        resource_version: String,
    }
    let list: List = serde_json::from_slice(body).context("parse list response")?;
    Ok(list.metadata.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_split_watch_stream() {
        let stream = concat!(
            r#"{"type":"ADDED","object":{"metadata":{"name":"bench-w-000003"}}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"metadata":{"name":"bench-w-000004"}}}"#,
            "\n"
        )
        .as_bytes();
        // Feed it in chunks that cut values in the middle.
        let mut names = Vec::new();
        let mut buf = Vec::new();
        for chunk in stream.chunks(17) {
            buf.extend_from_slice(chunk);
            let consumed = parse_lines(&buf, |line| {
                let name = line.object.metadata.and_then(|m| m.name);
                names.push((line.kind.into_owned(), name.map(Cow::into_owned)));
                Ok(())
            })
            .expect("parse");
            buf.drain(..consumed);
        }
        assert!(buf.iter().all(u8::is_ascii_whitespace));
        let adds: Vec<_> = names
            .iter()
            .filter(|(kind, _)| kind == "ADDED")
            .filter_map(|(_, name)| name.as_deref().and_then(object_index))
            .collect();
        assert_eq!(adds, [3, 4]);
        assert_eq!(names.len(), 3);
        assert!(parse_lines(b"{\"type\":]", |_| Ok(())).is_err());
    }

    #[test]
    fn list_revision_from_body() {
        let body = br#"{"kind":"JobList","metadata":{"resourceVersion":"42"},"items":[]}"#;
        assert_eq!(list_revision(body).expect("rv"), "42");
    }
}
