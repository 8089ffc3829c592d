//! Watch streams: the change-log backlog first, then live events from the fan-out channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use crate::{ObjectKey, Revision, StoreError, WatchEvent, WatchStream};

/// Which events a watch delivers.
pub(crate) struct Filter {
    pub(crate) resource: String,
    pub(crate) namespace: Option<String>,
    /// Only events with a revision strictly greater than this.
    pub(crate) after: Revision,
}

impl Filter {
    pub(crate) fn matches(&self, event: &WatchEvent) -> bool {
        event.revision > self.after && self.selects(&event.key)
    }

    fn selects(&self, key: &ObjectKey) -> bool {
        key.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }
}

/// A stream that yields `backlog`, then the live events of `receiver` that `filter` selects.
/// `receiver` must have been subscribed under the same lock the backlog was read under, so
/// every event is in exactly one of them. When the receiver lags, the stream yields
/// `Expired` (with `compacted` as the oldest revision) and ends.
pub(crate) fn stream(
    backlog: Vec<WatchEvent>,
    receiver: broadcast::Receiver<Arc<WatchEvent>>,
    filter: Filter,
    compacted: Arc<AtomicU64>,
) -> WatchStream {
    let last = filter.after;
    let watch = Watch {
        backlog: backlog.into_iter(),
        receiver: Some(receiver),
        filter,
        last,
        compacted,
    };
    Box::pin(futures::stream::unfold(watch, Watch::next))
}

struct Watch {
    backlog: std::vec::IntoIter<WatchEvent>,
    /// `None` once the stream has ended.
    receiver: Option<broadcast::Receiver<Arc<WatchEvent>>>,
    filter: Filter,
    /// Revision of the last event delivered (or the start revision).
    last: Revision,
    compacted: Arc<AtomicU64>,
}

impl Watch {
    async fn next(mut self) -> Option<(Result<WatchEvent, StoreError>, Self)> {
        if let Some(event) = self.backlog.next() {
            self.last = event.revision;
            return Some((Ok(event), self));
        }
        loop {
            let received = self.receiver.as_mut()?.recv().await;
            match received {
                Ok(event) if self.filter.matches(&event) => {
                    self.last = event.revision;
                    let event = Arc::unwrap_or_clone(event);
                    return Some((Ok(event), self));
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The watcher fell `watch_buffer` events behind. Rather than buffer without
                    // bound, end the stream: the client relists and watches again.
                    self.receiver = None;
                    let error = StoreError::Expired {
                        requested: self.last,
                        oldest: self.compacted.load(Ordering::Acquire),
                    };
                    return Some((Err(error), self));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
