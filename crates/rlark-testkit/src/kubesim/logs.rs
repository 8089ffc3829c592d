//! Container logs the test writes and the member server serves (`pods/log`): the
//! simulator's [`PodLogSource`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use rlark_apiserver::pod_sources::{LogStream, PodLogError, PodLogRequest, PodLogSource};

/// `(namespace, pod, container)`.
type LogKey = (String, String, String);

#[derive(Default)]
struct Instance {
    /// Chunks as written, each with its time.
    chunks: Vec<(DateTime<Utc>, String)>,
    /// The container instance has ended: a follow stream ends after the last chunk.
    closed: bool,
}

#[derive(Default)]
struct Log {
    current: Instance,
    /// The last terminated instance (`previous=true`).
    previous: Option<Instance>,
    /// Bumped when the current instance is replaced (a restart).
    generation: u64,
}

/// Every container log of the simulated cluster. Clones share the logs.
#[derive(Clone, Default)]
pub struct SimLogs {
    shared: Arc<Shared>,
}

struct Shared {
    logs: Mutex<HashMap<LogKey, Log>>,
    /// Bumped on every change; follow streams wait on it.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            logs: Mutex::new(HashMap::new()),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

fn key(namespace: &str, pod: &str, container: &str) -> LogKey {
    (
        namespace.to_string(),
        pod.to_string(),
        container.to_string(),
    )
}

/// The kubelet's line prefix with `timestamps=true` (RFC 3339 with nanoseconds).
fn render(chunk: &(DateTime<Utc>, String), timestamps: bool) -> String {
    if !timestamps {
        return chunk.1.clone();
    }
    let stamp = chunk.0.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    chunk
        .1
        .split_inclusive('\n')
        .map(|line| format!("{stamp} {line}"))
        .collect()
}

impl SimLogs {
    fn bump(&self) {
        self.shared.changed.send_modify(|n| *n += 1);
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<LogKey, Log>) -> R) -> R {
        // A panic while holding this lock is a bug in a test; the data stays usable.
        let mut logs = self.shared.logs.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut logs)
    }

    /// Append `text` to the current instance of a container's log.
    pub fn write(&self, namespace: &str, pod: &str, container: &str, text: &str) {
        self.with(|logs| {
            let log = logs.entry(key(namespace, pod, container)).or_default();
            log.current.chunks.push((Utc::now(), text.to_string()));
        });
        self.bump();
    }

    /// The container ended: follow streams end once they sent everything.
    pub(crate) fn close(&self, namespace: &str, pod: &str, container: &str) {
        self.with(|logs| {
            logs.entry(key(namespace, pod, container))
                .or_default()
                .current
                .closed = true;
        });
        self.bump();
    }

    /// The container restarted: its log becomes the previous one, a new one starts.
    pub(crate) fn restart(&self, namespace: &str, pod: &str, container: &str) {
        self.with(|logs| {
            let log = logs.entry(key(namespace, pod, container)).or_default();
            let mut old = std::mem::take(&mut log.current);
            old.closed = true;
            log.previous = Some(old);
            log.generation += 1;
        });
        self.bump();
    }

    /// Forget a Pod's logs (it was deleted; a Pod of the same name starts afresh).
    pub(crate) fn forget_pod(&self, namespace: &str, pod: &str) {
        self.with(|logs| logs.retain(|(ns, p, _), _| !(ns == namespace && p == pod)));
        self.bump();
    }

    /// The text of a container's current log, as written.
    pub fn text(&self, namespace: &str, pod: &str, container: &str) -> String {
        self.with(|logs| {
            logs.get(&key(namespace, pod, container))
                .map(|log| log.current.chunks.iter().map(|c| c.1.as_str()).collect())
                .unwrap_or_default()
        })
    }
}

/// What a request reads of one instance: the chunks since `since_seconds`, then the last
/// `tail_lines` lines.
fn initial(instance: &Instance, request: &PodLogRequest) -> String {
    let cutoff = request
        .since_seconds
        .and_then(|s| i64::try_from(s).ok())
        .map(|s| Utc::now() - chrono::Duration::seconds(s));
    let text: String = instance
        .chunks
        .iter()
        .filter(|c| cutoff.is_none_or(|cutoff| c.0 >= cutoff))
        .map(|c| render(c, request.timestamps))
        .collect();
    match request.tail_lines.and_then(|n| usize::try_from(n).ok()) {
        Some(n) => {
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            lines[lines.len().saturating_sub(n)..].concat()
        }
        None => text,
    }
}

/// State of one follow stream.
struct Follow {
    logs: SimLogs,
    key: LogKey,
    generation: u64,
    /// Chunks of the instance already sent.
    sent: usize,
    timestamps: bool,
    changes: tokio::sync::watch::Receiver<u64>,
}

impl Follow {
    /// New chunks, or `None` when the instance is over and everything was sent.
    fn poll_once(&mut self) -> Option<Option<Bytes>> {
        self.logs.with(|logs| {
            let Some(log) = logs.get(&self.key) else {
                // Forgotten: the Pod is gone.
                return Some(None);
            };
            // After a restart the followed instance is the previous one: what it got before
            // it ended is still sent, then the stream ends.
            let instance = if log.generation == self.generation {
                &log.current
            } else if let Some(previous) = log
                .previous
                .as_ref()
                .filter(|_| log.generation == self.generation + 1)
            {
                previous
            } else {
                return Some(None);
            };
            let new = &instance.chunks[self.sent.min(instance.chunks.len())..];
            if !new.is_empty() {
                self.sent += new.len();
                let text: String = new.iter().map(|c| render(c, self.timestamps)).collect();
                return Some(Some(Bytes::from(text)));
            }
            instance.closed.then_some(None)
        })
    }
}

impl PodLogSource for SimLogs {
    fn open(&self, request: &PodLogRequest) -> Result<LogStream, PodLogError> {
        let key = key(&request.namespace, &request.pod, &request.container);
        if request.previous {
            let text = self.with(|logs| {
                logs.get(&key)
                    .and_then(|log| log.previous.as_ref())
                    .map(|previous| initial(previous, request))
            });
            return match text {
                Some(text) => Ok(futures::stream::iter([Bytes::from(text)]).boxed()),
                None => Err(PodLogError::BadRequest(format!(
                    "previous terminated container {:?} in pod {:?} not found",
                    request.container, request.pod
                ))),
            };
        }
        // Subscribe before reading, so no write between the two is missed.
        let changes = self.shared.changed.subscribe();
        let (text, generation, sent) = self.with(|logs| {
            let log = logs.entry(key.clone()).or_default();
            (
                initial(&log.current, request),
                log.generation,
                log.current.chunks.len(),
            )
        });
        let first = futures::stream::iter([Bytes::from(text)]);
        if !request.follow {
            return Ok(first.boxed());
        }
        let follow = Follow {
            logs: self.clone(),
            key,
            generation,
            sent,
            timestamps: request.timestamps,
            changes,
        };
        let rest = futures::stream::unfold(follow, |mut follow| async move {
            loop {
                match follow.poll_once() {
                    Some(Some(bytes)) => return Some((bytes, follow)),
                    Some(None) => return None,
                    None => {
                        // The sender lives as long as `follow.logs`, which this holds.
                        if follow.changes.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            }
        });
        Ok(first.chain(rest).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(follow: bool) -> PodLogRequest {
        PodLogRequest {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
            follow,
            previous: false,
            tail_lines: None,
            since_seconds: None,
            timestamps: false,
        }
    }

    async fn read_all(stream: LogStream) -> String {
        let chunks: Vec<Bytes> = stream.collect().await;
        String::from_utf8(chunks.concat()).unwrap()
    }

    #[tokio::test]
    async fn tail_previous_and_follow() {
        let logs = SimLogs::default();
        logs.write("ns", "p", "c", "one\ntwo\n");
        logs.write("ns", "p", "c", "three\n");
        let tail = PodLogRequest {
            tail_lines: Some(2),
            ..request(false)
        };
        assert_eq!(read_all(logs.open(&tail).unwrap()).await, "two\nthree\n");
        let stamped = PodLogRequest {
            timestamps: true,
            ..request(false)
        };
        let text = read_all(logs.open(&stamped).unwrap()).await;
        assert!(
            text.lines().all(|l| l.ends_with('Z') || l.contains("Z ")),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3);
        assert_eq!(
            logs.open(&PodLogRequest {
                previous: true,
                ..request(false)
            })
            .err(),
            Some(PodLogError::BadRequest(
                "previous terminated container \"c\" in pod \"p\" not found".into()
            ))
        );

        let follow = logs.open(&request(true)).unwrap();
        let reader = tokio::spawn(read_all(follow));
        logs.write("ns", "p", "c", "four\n");
        logs.restart("ns", "p", "c");
        let followed = tokio::time::timeout(std::time::Duration::from_secs(10), reader)
            .await
            .expect("follow ends when the container restarts")
            .unwrap();
        assert_eq!(followed, "one\ntwo\nthree\nfour\n");
        let previous = PodLogRequest {
            previous: true,
            ..request(false)
        };
        assert_eq!(
            read_all(logs.open(&previous).unwrap()).await,
            "one\ntwo\nthree\nfour\n"
        );
        assert_eq!(read_all(logs.open(&request(false)).unwrap()).await, "");
    }
}
