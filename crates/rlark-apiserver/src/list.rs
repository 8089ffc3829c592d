//! Lists: `resourceVersion` semantics, selectors, `limit`/`continue` paging.
//!
//! The store serves the current state and, from its change log, the state at an older
//! revision the log still covers ([`Store::list_encoded_at`]), so:
//! - unset `resourceVersion` (most recent), `0` (any) and `N` with `NotOlderThan` all serve
//!   the current state; for `N` ahead of the store the request waits up to
//!   [`MAX_WAIT_FOR_REVISION`] for it to catch up, then answers 504 `Too large resource
//!   version` like kube-apiserver;
//! - `Exact` serves the state at `N` when the change log still holds it, else 410 `Expired`;
//! - every page after the first is read at the first page's revision (one consistent
//!   snapshot, as etcd serves it) while the change log holds it; after that, from the
//!   current state, still reporting the first page's revision: a client that watches from
//!   it replays every change since the first page, so nothing is missed (at worst seen
//!   twice). A `continue` token whose revision is below the change log's floor is 410, so
//!   such a client relists instead of missing events.
//!
//! Selectors are applied before `limit`, so a page holds up to `limit` matching items;
//! `remainingItemCount` is only reported without selectors (as Kubernetes does).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rlark_store::{EncodedObject, ListOptions, Revision, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Inner;
use crate::error::{ApiError, Cause};
use crate::object::parse_resource_version;
use crate::registry::ResourceType;
use crate::request::Query;
use crate::selectors::Selectors;

/// How long a request for a revision the store has not reached yet waits for it.
pub(crate) const MAX_WAIT_FOR_REVISION: Duration = Duration::from_secs(3);
/// Batch size when selectors filter a limited list (selectors apply before the limit).
const FILTERED_BATCH: usize = 500;

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RvMatch {
    NotOlderThan,
    Exact,
}

/// `resourceVersion` and `resourceVersionMatch` of a list or watch, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// No resourceVersion: the most recent state.
    MostRecent,
    /// `resourceVersion=0`: any state.
    Any,
    /// `resourceVersion=N` (legacy semantics, or `NotOlderThan`).
    NotOlderThan(Revision),
    /// `resourceVersion=N&resourceVersionMatch=Exact`.
    Exact(Revision),
}

fn invalid_options(field: &str, message: &str) -> ApiError {
    let mut error = ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {message}"),
    );
    error.group = Some("meta.k8s.io".into());
    error.kind = Some("ListOptions".into());
    error.causes.push(Cause {
        reason: "FieldValueForbidden".into(),
        message: format!("Forbidden: {message}"),
        field: field.into(),
    });
    error
}

/// Validate the list/watch options as kube-apiserver's `ValidateListOptions` does (422) and
/// resolve what state is asked for.
pub(crate) fn freshness(query: &Query) -> Result<Freshness, ApiError> {
    let rv_match = match query.resource_version_match.as_deref() {
        None => None,
        Some("NotOlderThan") => Some(RvMatch::NotOlderThan),
        Some("Exact") => Some(RvMatch::Exact),
        Some(other) => {
            let mut error = invalid_options("resourceVersionMatch", "");
            error.message = format!(
                "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
            );
            return Err(error);
        }
    };
    if query.send_initial_events.is_some() {
        if !query.watch {
            return Err(invalid_options(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
        if rv_match != Some(RvMatch::NotOlderThan) {
            return Err(invalid_options(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !query.allow_watch_bookmarks {
            return Err(invalid_options(
                "allowWatchBookmarks",
                "allowWatchBookmarks must be set to true when sendInitialEvents is provided",
            ));
        }
    } else if rv_match.is_some() {
        if query.watch {
            return Err(invalid_options(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if query.resource_version.is_none() {
            return Err(invalid_options(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if query.continue_token.is_some() {
            return Err(invalid_options(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    let freshness = match (query.resource_version.as_deref(), rv_match) {
        (None, _) => Freshness::MostRecent,
        (Some("0"), Some(RvMatch::Exact)) => {
            return Err(invalid_options(
                "resourceVersionMatch",
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
        (Some("0"), _) => Freshness::Any,
        (Some(rv), Some(RvMatch::Exact)) => Freshness::Exact(parse_resource_version(rv)?),
        (Some(rv), _) => Freshness::NotOlderThan(parse_resource_version(rv)?),
    };
    Ok(freshness)
}

/// Wait (polling, up to [`MAX_WAIT_FOR_REVISION`]) until the store has reached `revision`;
/// 504 `Too large resource version` otherwise, with the cause client-go looks for.
pub(crate) async fn wait_for_revision(
    store: &dyn Store,
    revision: Revision,
) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + MAX_WAIT_FOR_REVISION;
    while store.revision() < revision {
        if tokio::time::Instant::now() >= deadline {
            let mut error = ApiError::new(
                504,
                "Timeout",
                format!(
                    "Too large resource version: {revision}, current: {}",
                    store.revision()
                ),
            );
            error.causes.push(Cause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            });
            error.retry_after_seconds = Some(1);
            return Err(error);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// What a `continue` token carries: the revision of the list's first page and the key of
/// the last item returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ContinueToken {
    rv: Revision,
    ns: String,
    name: String,
}

impl ContinueToken {
    fn encode(&self) -> String {
        // Serializing a struct of strings and an integer cannot fail.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(token: &str) -> Result<Self, ApiError> {
        URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| ApiError::bad_request(format!("continue key is not valid: {token:?}")))
    }
}

/// One listed object as this kind shows it.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    pub object: Arc<Value>,
    /// The store's encoding of `object` (`serde_json::to_string`, byte for byte), when
    /// `object` is what the store holds; `None` when the kind shows it projected.
    pub json: Option<Arc<str>>,
}

impl Listed {
    /// An object without an encoding at hand (rendered when sent).
    pub(crate) fn new(object: Arc<Value>) -> Self {
        Self { object, json: None }
    }

    /// A stored object (with its stored encoding) as `rt` shows it.
    pub(crate) fn presented(rt: &ResourceType, stored: EncodedObject) -> Self {
        if rt.projection.is_some() {
            Self::new(rt.present(stored.object))
        } else {
            Self {
                object: stored.object,
                json: Some(stored.json),
            }
        }
    }
}

/// One page of a list. Holds the objects (shared, not copied) so that the body can be
/// rendered while it is sent: everything that can fail happened when the page was read.
#[derive(Debug)]
pub(crate) struct Page {
    pub items: Vec<Listed>,
    /// The list's `metadata.resourceVersion`.
    pub revision: Revision,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

impl Page {
    /// The list's `metadata`.
    pub(crate) fn list_meta(&self) -> Value {
        let mut meta = serde_json::json!({"resourceVersion": self.revision.to_string()});
        if let Some(token) = &self.continue_token {
            meta["continue"] = Value::String(token.clone());
        }
        if let Some(remaining) = self.remaining {
            meta["remainingItemCount"] = Value::from(remaining);
        }
        meta
    }
}

impl Inner {
    /// Read one page of `rt` (in `namespace`, or all namespaces) as `query` asks.
    pub(crate) async fn list_page(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        selectors: &Selectors,
        query: &Query,
    ) -> Result<Page, ApiError> {
        let freshness = freshness(query)?;
        let token = query
            .continue_token
            .as_deref()
            .map(ContinueToken::decode)
            .transpose()?;
        if let Some(token) = &token {
            if !matches!(freshness, Freshness::MostRecent | Freshness::Any) {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            if token.rv < self.store.compacted_revision() {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
        }
        match freshness {
            Freshness::NotOlderThan(rv) | Freshness::Exact(rv) => {
                wait_for_revision(self.store.as_ref(), rv).await?
            }
            Freshness::MostRecent | Freshness::Any => {}
        }

        let resource = rt.store_resource();
        let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
        let mut cursor = token.as_ref().map(|t| (t.ns.clone(), t.name.clone()));
        let mut items = Vec::new();
        let mut first_revision = None;
        // `Exact` and continued lists read the snapshot at their revision from the store's
        // change log; a continued list whose snapshot the log no longer holds falls back to
        // the live state (each page then at its own revision, as before snapshots).
        let exact = matches!(freshness, Freshness::Exact(_));
        let mut at = match freshness {
            Freshness::Exact(rv) => Some(rv),
            _ => token.as_ref().map(|t| t.rv),
        };
        let mut more = false;
        let mut remaining = None;
        loop {
            let batch = match (limit, selectors.is_empty()) {
                (0, _) => None,
                (_, true) => Some(limit),
                (_, false) => Some(limit.max(FILTERED_BATCH)),
            };
            let options = ListOptions {
                namespace: namespace.map(str::to_string),
                start_after: cursor.clone(),
                limit: batch,
            };
            let read = match at {
                Some(rv) => match self.store.list_encoded_at(&resource, &options, rv).await {
                    Err(StoreError::Expired { .. }) if exact => {
                        return Err(ApiError::gone(
                            "The resourceVersion for the provided list is too old.",
                        ));
                    }
                    Err(StoreError::Expired { .. }) => {
                        at = None;
                        self.store.list_encoded(&resource, &options).await
                    }
                    read => read,
                },
                None => self.store.list_encoded(&resource, &options).await,
            };
            let result = read.map_err(|e| ApiError::from_store(e, rt, ""))?;
            first_revision.get_or_insert(result.revision);
            let listed: Vec<Listed> = result
                .items
                .into_iter()
                .map(|stored| Listed::presented(rt, stored))
                .collect();
            if selectors.is_empty() {
                more = result.continue_after.is_some();
                remaining = more.then_some(result.remaining);
                items = listed;
                break;
            }
            for item in listed {
                if limit > 0 && items.len() == limit {
                    // Something follows; it may not match, then the next page is empty (as in
                    // Kubernetes, whose continue only promises "maybe more").
                    more = true;
                    break;
                }
                if selectors.matches(&item.object) {
                    items.push(item);
                }
            }
            match result.continue_after {
                Some(after) if !more => cursor = Some((after.namespace, after.name)),
                _ => break,
            }
        }
        // The loop lists at least once, so this is always set.
        let listed_at = first_revision.unwrap_or_else(|| self.store.revision());
        if let Freshness::Exact(rv) = freshness
            && listed_at != rv
        {
            return Err(ApiError::gone(
                "The resourceVersion for the provided list is too old.",
            ));
        }
        let revision = token.as_ref().map_or(listed_at, |t| t.rv);
        let continue_token = match (more, items.last()) {
            (true, Some(last)) => Some(
                ContinueToken {
                    rv: revision,
                    ns: crate::object::meta_str(&last.object, "namespace")
                        .unwrap_or("")
                        .to_string(),
                    name: crate::object::meta_str(&last.object, "name")
                        .unwrap_or("")
                        .to_string(),
                }
                .encode(),
            ),
            _ => None,
        };
        let remaining = if continue_token.is_some() {
            remaining
        } else {
            None
        };
        Ok(Page {
            items,
            revision,
            continue_token,
            remaining,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &str) -> Query {
        crate::request::parse_query(&format!("/x?{pairs}").parse().unwrap()).unwrap()
    }

    #[test]
    fn freshness_follows_kubernetes() {
        assert_eq!(freshness(&query("")).unwrap(), Freshness::MostRecent);
        assert_eq!(
            freshness(&query("resourceVersion=0")).unwrap(),
            Freshness::Any
        );
        assert_eq!(
            freshness(&query("resourceVersion=7")).unwrap(),
            Freshness::NotOlderThan(7)
        );
        assert_eq!(
            freshness(&query(
                "resourceVersion=7&resourceVersionMatch=NotOlderThan"
            ))
            .unwrap(),
            Freshness::NotOlderThan(7)
        );
        assert_eq!(
            freshness(&query("resourceVersion=7&resourceVersionMatch=Exact")).unwrap(),
            Freshness::Exact(7)
        );
        assert_eq!(
            freshness(&query("watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"))
                .unwrap(),
            Freshness::MostRecent
        );
        for bad in [
            "resourceVersionMatch=NotOlderThan",
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersion=1&resourceVersionMatch=Newest",
            "watch=true&resourceVersion=1&resourceVersionMatch=NotOlderThan",
            "watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
            "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            "resourceVersion=1&resourceVersionMatch=NotOlderThan&continue=abc",
        ] {
            let error = freshness(&query(bad)).unwrap_err();
            assert_eq!((error.code, error.reason), (422, "Invalid"), "{bad}");
        }
        assert_eq!(
            freshness(&query("resourceVersion=abc")).unwrap_err().code,
            400
        );
    }

    #[test]
    fn continue_tokens_round_trip() {
        let token = ContinueToken {
            rv: 42,
            ns: "a".into(),
            name: "b".into(),
        };
        assert_eq!(ContinueToken::decode(&token.encode()).unwrap(), token);
        assert_eq!(ContinueToken::decode("not-a-token!").unwrap_err().code, 400);
        assert_eq!(
            ContinueToken::decode(&URL_SAFE_NO_PAD.encode(b"{}"))
                .unwrap_err()
                .code,
            400
        );
    }
}
