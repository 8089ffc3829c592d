//! Response bodies: objects, lists and watch events, rendered as the client negotiated
//! (`Accept`): the object itself, a `meta.k8s.io/v1` `Table` (kubectl), or
//! `PartialObjectMetadata` (kube-rs' metadata API).

use std::borrow::Cow;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};

use crate::discovery::accepted_media_ranges;
use crate::list::Page;
use crate::registry::ResourceType;
use crate::table;

/// How objects are rendered for this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Object,
    Table,
    Metadata,
}

impl Output {
    /// Negotiate from the `Accept` header.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        if table::wants_table(headers) {
            return Self::Table;
        }
        let metadata = accepted_media_ranges(headers).first().is_some_and(|range| {
            range.accepts_json()
                && range.param("g") == Some("meta.k8s.io")
                && range
                    .param("as")
                    .is_some_and(|a| a.starts_with("PartialObjectMetadata"))
        });
        if metadata {
            Self::Metadata
        } else {
            Self::Object
        }
    }

    /// One object. `columns`: whether a Table carries its column definitions (always for a
    /// GET; only on the first event of a watch, as kube-apiserver does).
    pub(crate) fn object<'a>(
        self,
        rt: &ResourceType,
        object: &'a Arc<Value>,
        columns: bool,
    ) -> Cow<'a, Value> {
        match self {
            Self::Object => with_type_meta(rt, object),
            Self::Table => {
                let meta = json!({"resourceVersion": object.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))});
                Cow::Owned(table::to_table(
                    rt,
                    std::slice::from_ref(object),
                    meta,
                    columns,
                ))
            }
            Self::Metadata => Cow::Owned(partial_metadata(object)),
        }
    }

    /// A list page as the response body.
    pub(crate) fn list(self, rt: &ResourceType, page: &Page) -> Vec<u8> {
        #[derive(Serialize)]
        struct List<'a> {
            kind: &'a str,
            #[serde(rename = "apiVersion")]
            api_version: &'a str,
            metadata: Value,
            items: Vec<Cow<'a, Value>>,
        }
        let api_version = rt.api_version();
        let body = match self {
            Self::Table => {
                return to_vec(&table::to_table(rt, &page.items, page.list_meta(), true));
            }
            Self::Object => List {
                kind: &rt.list_kind,
                api_version: &api_version,
                metadata: page.list_meta(),
                items: page.items.iter().map(|o| with_type_meta(rt, o)).collect(),
            },
            Self::Metadata => List {
                kind: "PartialObjectMetadataList",
                api_version: "meta.k8s.io/v1",
                metadata: page.list_meta(),
                items: page
                    .items
                    .iter()
                    .map(|o| Cow::Owned(partial_metadata(o)))
                    .collect(),
            },
        };
        to_vec(&body)
    }
}

/// The object with `kind`/`apiVersion` set (stored objects normally have them; borrowed
/// then).
fn with_type_meta<'a>(rt: &ResourceType, object: &'a Value) -> Cow<'a, Value> {
    let has = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    if has("kind") && has("apiVersion") {
        return Cow::Borrowed(object);
    }
    let mut owned = object.clone();
    if let Some(map) = owned.as_object_mut() {
        map.insert("kind".into(), json!(rt.kind));
        map.insert("apiVersion".into(), json!(rt.api_version()));
    }
    Cow::Owned(owned)
}

fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn to_vec(value: &impl Serialize) -> Vec<u8> {
    // JSON values and plain structs of them always serialize.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Most `Warning` headers one response carries; the rest are counted in one last warning.
pub(crate) const MAX_WARNINGS: usize = 100;
/// Most bytes of warning text one response carries (kube-apiserver: 4 Ki runes).
pub(crate) const MAX_WARNING_BYTES: usize = 16 * 1024;
/// Longest single warning text; longer ones are cut (kube-apiserver cuts at 256 runes
/// once the total is over its limit).
pub(crate) const MAX_WARNING_LEN: usize = 512;

/// The `Warning` texts a response carries for `warnings`: duplicates dropped (a body with
/// the same key 100,000 times gets one warning), each cut to [`MAX_WARNING_LEN`] bytes, at
/// most [`MAX_WARNINGS`] of them and [`MAX_WARNING_BYTES`] in total, then one
/// `N more warnings omitted`. Headers that large break HTTP/2 clients (a header list over
/// their limit fails the whole response, although the write succeeded).
pub(crate) fn capped_warnings(warnings: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::new();
    let mut bytes = 0;
    let mut omitted = 0usize;
    for warning in warnings {
        if !seen.insert(warning.as_str()) {
            continue;
        }
        let text = if warning.len() > MAX_WARNING_LEN {
            let mut cut = MAX_WARNING_LEN;
            while !warning.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}...", &warning[..cut])
        } else {
            warning.clone()
        };
        if kept.len() < MAX_WARNINGS && bytes + text.len() <= MAX_WARNING_BYTES {
            bytes += text.len();
            kept.push(text);
        } else {
            omitted += 1;
        }
    }
    if omitted > 0 {
        kept.push(format!("{omitted} more warnings omitted"));
    }
    kept
}

/// A JSON response with `Warning` headers (`299 - "text"`, as kube-apiserver sends them),
/// bounded by [`capped_warnings`].
pub(crate) fn json_response(status: StatusCode, body: Vec<u8>, warnings: &[String]) -> Response {
    let mut response = (
        status,
        [(http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    for warning in capped_warnings(warnings) {
        let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(http::header::WARNING, value);
        }
    }
    response
}

/// One watch event line: `{"type":...,"object":...}\n`.
pub(crate) fn event_line(event_type: &str, object: &Value) -> Bytes {
    #[derive(Serialize)]
    struct Event<'a> {
        #[serde(rename = "type")]
        event_type: &'a str,
        object: &'a Value,
    }
    let mut line = to_vec(&Event { event_type, object });
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, accept.parse().unwrap());
        headers
    }

    #[test]
    fn negotiation() {
        assert_eq!(Output::of(&HeaderMap::new()), Output::Object);
        assert_eq!(Output::of(&headers("application/json")), Output::Object);
        assert_eq!(
            Output::of(&headers(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            )),
            Output::Table
        );
        assert_eq!(
            Output::of(&headers(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Output::Metadata
        );
    }

    #[test]
    fn warnings_are_quoted() {
        let response = json_response(
            StatusCode::OK,
            b"{}".to_vec(),
            &["unknown field \"spec.foo\"".to_string()],
        );
        let values: Vec<_> = response
            .headers()
            .get_all(http::header::WARNING)
            .iter()
            .collect();
        assert_eq!(values, vec![r#"299 - "unknown field \"spec.foo\"""#]);
    }

    #[test]
    fn warnings_are_deduplicated_and_capped() {
        // 100,000 warnings for the same field: one header.
        let same = vec!["duplicate field \"a\"".to_string(); 100_000];
        assert_eq!(capped_warnings(&same), vec![same[0].clone()]);

        // 100,000 distinct ones: MAX_WARNINGS, then the count of the rest.
        let distinct: Vec<String> = (0..100_000)
            .map(|i| format!("duplicate field \"k{i}\""))
            .collect();
        let capped = capped_warnings(&distinct);
        assert_eq!(capped.len(), MAX_WARNINGS + 1);
        assert_eq!(capped[..MAX_WARNINGS], distinct[..MAX_WARNINGS]);
        assert_eq!(
            capped[MAX_WARNINGS],
            format!("{} more warnings omitted", 100_000 - MAX_WARNINGS)
        );
        let response = json_response(StatusCode::CREATED, b"{}".to_vec(), &distinct);
        assert_eq!(
            response
                .headers()
                .get_all(http::header::WARNING)
                .iter()
                .count(),
            MAX_WARNINGS + 1
        );

        // Long ones are cut (on a character boundary) and the byte total is bounded.
        let long: Vec<String> = (0..100)
            .map(|i| format!("{i}{}", "é".repeat(2 * MAX_WARNING_LEN)))
            .collect();
        let capped = capped_warnings(&long);
        let total: usize = capped.iter().map(String::len).sum();
        assert!(total <= MAX_WARNING_BYTES + 64, "{total}");
        assert!(capped[0].len() <= MAX_WARNING_LEN + 3);
        assert!(capped.last().unwrap().ends_with("more warnings omitted"));
    }

    #[test]
    fn lists_fill_type_meta() {
        let rt = ResourceType::lease();
        let page = Page {
            items: vec![Arc::new(json!({"metadata": {"name": "a"}}))],
            revision: 7,
            continue_token: None,
            remaining: None,
        };
        let body: Value = serde_json::from_slice(&Output::Object.list(&rt, &page)).unwrap();
        assert_eq!(body["kind"], "LeaseList");
        assert_eq!(body["metadata"], json!({"resourceVersion": "7"}));
        assert_eq!(body["items"][0]["kind"], "Lease");
        assert_eq!(body["items"][0]["apiVersion"], "coordination.k8s.io/v1");
        let body: Value = serde_json::from_slice(&Output::Metadata.list(&rt, &page)).unwrap();
        assert_eq!(body["kind"], "PartialObjectMetadataList");
        assert_eq!(
            body["items"][0],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}})
        );
    }
}
