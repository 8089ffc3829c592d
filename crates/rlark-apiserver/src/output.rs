//! Response bodies: objects and watch events, rendered as the client negotiated (`Accept`):
//! the object itself, a `meta.k8s.io/v1` `Table` (kubectl), or `PartialObjectMetadata`
//! (kube-rs' metadata API). List bodies are streamed by `list_body` with the same rules.

use std::borrow::Cow;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::Serialize;
use serde_json::{Value, json};

use crate::discovery::accepted_media_ranges;
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

    /// A small number naming this output, for keys of shared renderings.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Object => 0,
            Self::Table => 1,
            Self::Metadata => 2,
        }
    }

    /// One watch event line of `object` sent as `event_type`. `json`: the store's encoding of
    /// `object` (`None` if unknown), copied instead of encoding the object when the body is
    /// the object itself. `now`: the clock of a Table's ages. A function of its arguments
    /// only, so the line can be shared by watchers that pass the same ones
    /// (`event_encodings`).
    pub(crate) fn event_line(
        self,
        rt: &ResourceType,
        event_type: &str,
        object: &Arc<Value>,
        json: Option<&str>,
        columns: bool,
        now: DateTime<Utc>,
    ) -> Bytes {
        match (self, json) {
            (Self::Object, Some(json)) if has_type_meta(object) => {
                event_line_of_json(event_type, json)
            }
            (Self::Table, _) => {
                let meta = json!({"resourceVersion": object.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))});
                let table =
                    table::to_table_at(rt, std::slice::from_ref(object), meta, columns, now);
                event_line(event_type, &table)
            }
            _ => event_line(event_type, &self.object(rt, object, columns)),
        }
    }
}

/// Whether `object` carries non-empty `kind` and `apiVersion` (then it is sent as stored).
pub(crate) fn has_type_meta(object: &Value) -> bool {
    let has = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    has("kind") && has("apiVersion")
}

/// The object with `kind`/`apiVersion` set (stored objects normally have them; borrowed
/// then).
pub(crate) fn with_type_meta<'a>(rt: &ResourceType, object: &'a Value) -> Cow<'a, Value> {
    if has_type_meta(object) {
        return Cow::Borrowed(object);
    }
    let mut owned = object.clone();
    if let Some(map) = owned.as_object_mut() {
        map.insert("kind".into(), json!(rt.kind));
        map.insert("apiVersion".into(), json!(rt.api_version()));
    }
    Cow::Owned(owned)
}

pub(crate) fn partial_metadata(object: &Value) -> Value {
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

/// One watch event line from an already encoded object: the same bytes as [`event_line`]
/// of the decoded object, without encoding it.
pub(crate) fn event_line_of_json(event_type: &str, json: &str) -> Bytes {
    let mut line = Vec::with_capacity(json.len() + event_type.len() + 24);
    line.extend_from_slice(b"{\"type\":");
    // An event type is a plain ASCII word, but encode it like serde would anyway.
    line.extend_from_slice(&to_vec(&event_type));
    line.extend_from_slice(b",\"object\":");
    line.extend_from_slice(json.as_bytes());
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
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
    fn event_lines_from_json_equal_encoded_ones() {
        let object = Arc::new(
            json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                                     "metadata": {"name": "a", "resourceVersion": "3"}, "spec": {"x": "é\"\n"}}),
        );
        let json = serde_json::to_string(&*object).unwrap();
        assert_eq!(
            event_line_of_json("MODIFIED", &json),
            event_line("MODIFIED", &object)
        );
        let rt = ResourceType::lease();
        let now = chrono::Utc::now();
        assert_eq!(
            Output::Object.event_line(&rt, "ADDED", &object, Some(&json), false, now),
            event_line("ADDED", &object)
        );
        // Without type meta the stored encoding is not what is sent.
        let bare = Arc::new(json!({"metadata": {"name": "a"}}));
        let line = Output::Object.event_line(&rt, "ADDED", &bare, Some("{}"), false, now);
        let parsed: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(parsed["object"]["kind"], "Lease");
    }
}
