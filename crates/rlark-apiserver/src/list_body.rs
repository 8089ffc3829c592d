//! List response bodies (`kind: XList`, `PartialObjectMetadataList`, `Table`), rendered while
//! they are sent instead of encoded whole before the head.
//!
//! The body is cut into chunks of about [`CHUNK_BYTES`]: memory per list in flight is one
//! chunk plus the page's object handles (shared with the store, not copied), not the whole
//! encoded body, and the client receives the first bytes after one chunk's work rather than
//! the whole list's. Objects whose stored encoding is exactly what is sent (plain JSON lists
//! of stored, unprojected objects, i.e. almost every list) are copied from the store's
//! cached JSON without encoding them at all.
//!
//! **Nothing that can fail runs after the head.** The page (store read, `resourceVersion`
//! checks, selectors, `continue`, projections) is complete before the head is built, and
//! rendering a chunk only serializes `serde_json::Value`s into memory, which cannot fail: the
//! body stream's error type is [`Infallible`]. So a list that is answered `200` always
//! delivers a complete, valid body, unless the connection itself breaks (then the client sees
//! a truncated body, as for any response, and no status can be sent anyway). The body is
//! the page as read: writes made while it is sent are not in it, and its `resourceVersion`
//! says which state it shows.
//!
//! The first chunk is rendered before the head: a body that fits in it is sent as an ordinary
//! fixed-length response, so small lists (the common case) look exactly as before.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;
use serde_json::Value;

use crate::list::{Listed, Page};
use crate::output::{Output, has_type_meta, partial_metadata, with_type_meta};
use crate::registry::ResourceType;
use crate::table::Renderer;

/// Target size of one body chunk (a chunk ends after the item that reaches it).
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;

/// The `200` response for `page`, rendered as `output` asks, streamed in chunks.
pub(crate) fn response(output: Output, rt: Arc<ResourceType>, page: Page) -> Response {
    let mut body = ListBody::new(output, rt, page);
    let first = body.next_chunk().unwrap_or_default();
    let body = if body.is_done() {
        Body::from(first)
    } else {
        let rest = futures::stream::iter(std::iter::from_fn(move || {
            body.next_chunk().map(Ok::<_, Infallible>)
        }));
        Body::from_stream(futures::StreamExt::chain(
            futures::stream::once(async move { Ok::<_, Infallible>(first) }),
            rest,
        ))
    };
    (
        StatusCode::OK,
        [(http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Where the rendering of a list body stands.
enum Part {
    Head,
    Items,
    Done,
}

/// A list body being rendered, one chunk at a time.
pub(crate) struct ListBody {
    output: Output,
    rt: Arc<ResourceType>,
    /// The list's `metadata` (taken when the head of the body is written).
    meta: Option<Value>,
    items: std::vec::IntoIter<Listed>,
    /// Set for Table output: printer columns parsed once, one clock for every row.
    table: Option<Renderer>,
    part: Part,
    /// Whether an item was written (the next one needs a comma).
    wrote_item: bool,
}

impl ListBody {
    pub(crate) fn new(output: Output, rt: Arc<ResourceType>, page: Page) -> Self {
        let table = (output == Output::Table).then(|| Renderer::new(&rt, chrono::Utc::now()));
        Self {
            output,
            meta: Some(page.list_meta()),
            rt,
            items: page.items.into_iter(),
            table,
            part: Part::Head,
            wrote_item: false,
        }
    }

    /// Whether every byte of the body was returned.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.part, Part::Done)
    }

    /// The next chunk (about [`CHUNK_BYTES`]), `None` after the last.
    pub(crate) fn next_chunk(&mut self) -> Option<Bytes> {
        if self.is_done() {
            return None;
        }
        let mut buf = Vec::with_capacity(CHUNK_BYTES + CHUNK_BYTES / 4);
        if matches!(self.part, Part::Head) {
            self.write_head(&mut buf);
            self.part = Part::Items;
        }
        while buf.len() < CHUNK_BYTES {
            let Some(item) = self.items.next() else {
                buf.extend_from_slice(b"]}");
                self.part = Part::Done;
                break;
            };
            if self.wrote_item {
                buf.push(b',');
            }
            self.wrote_item = true;
            self.write_item(&mut buf, &item);
        }
        Some(Bytes::from(buf))
    }

    /// Everything before the first item: `{"kind":...,"metadata":...,"items":[`.
    fn write_head(&mut self, buf: &mut Vec<u8>) {
        let meta = self.meta.take().unwrap_or_default();
        let api_version = self.rt.api_version();
        let (kind, api_version, items_field) = match self.output {
            Output::Object => (self.rt.list_kind.as_str(), api_version.as_str(), "items"),
            Output::Metadata => ("PartialObjectMetadataList", "meta.k8s.io/v1", "items"),
            Output::Table => ("Table", "meta.k8s.io/v1", "rows"),
        };
        buf.extend_from_slice(b"{\"kind\":");
        write_json(buf, kind);
        buf.extend_from_slice(b",\"apiVersion\":");
        write_json(buf, api_version);
        buf.extend_from_slice(b",\"metadata\":");
        write_json(buf, &meta);
        if let Some(table) = &self.table {
            buf.extend_from_slice(b",\"columnDefinitions\":");
            write_json(buf, &table.column_definitions(&self.rt));
        }
        buf.push(b',');
        write_json(buf, items_field);
        buf.extend_from_slice(b":[");
    }

    fn write_item(&self, buf: &mut Vec<u8>, item: &Listed) {
        match (self.output, &self.table) {
            (Output::Table, Some(table)) => write_json(buf, &table.row(&self.rt, &item.object)),
            (Output::Metadata, _) => write_json(buf, &partial_metadata(&item.object)),
            // The stored encoding is the object as sent when it carries its type meta.
            _ => match &item.json {
                Some(json) if has_type_meta(&item.object) => buf.extend_from_slice(json.as_bytes()),
                _ => write_json(buf, &with_type_meta(&self.rt, &item.object)),
            },
        }
    }
}

/// Append `value` as JSON. Serializing strings and `serde_json::Value`s into memory cannot
/// fail (map keys are strings, a `Vec` writer has no IO errors); should it ever, the error is
/// logged and the body is the part written so far.
fn write_json(buf: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    if let Err(error) = serde_json::to_writer(&mut *buf, value) {
        tracing::error!(%error, "encoding a list item failed");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn page(items: Vec<Listed>) -> Page {
        Page {
            items,
            revision: 7,
            continue_token: Some("c".into()),
            remaining: Some(3),
        }
    }

    /// The whole body, chunk by chunk, and the number of chunks.
    fn render(output: Output, rt: &Arc<ResourceType>, page: Page) -> (Value, usize) {
        let mut body = ListBody::new(output, Arc::clone(rt), page);
        let mut bytes = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = body.next_chunk() {
            bytes.extend_from_slice(&chunk);
            chunks += 1;
        }
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
        (value, chunks)
    }

    #[test]
    fn lists_fill_type_meta() {
        let rt = Arc::new(ResourceType::lease());
        let items = vec![Listed::new(Arc::new(json!({"metadata": {"name": "a"}})))];
        let (body, chunks) = render(Output::Object, &rt, page(items.clone()));
        assert_eq!(chunks, 1);
        assert_eq!(body["kind"], "LeaseList");
        assert_eq!(body["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(
            body["metadata"],
            json!({"resourceVersion": "7", "continue": "c", "remainingItemCount": 3})
        );
        assert_eq!(body["items"][0]["kind"], "Lease");
        assert_eq!(body["items"][0]["apiVersion"], "coordination.k8s.io/v1");
        let (body, _) = render(Output::Metadata, &rt, page(items));
        assert_eq!(body["kind"], "PartialObjectMetadataList");
        assert_eq!(
            body["items"][0],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}})
        );
        let (body, _) = render(Output::Object, &rt, page(Vec::new()));
        assert_eq!(body["items"], json!([]));
    }

    #[test]
    fn stored_encodings_are_sent_verbatim() {
        let rt = Arc::new(ResourceType::lease());
        let object = Arc::new(
            json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                                     "metadata": {"name": "a"}}),
        );
        // A marker the object does not have: proves the bytes came from the cache.
        let cached = Listed {
            object: Arc::clone(&object),
            json: Some(Arc::from(
                r#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"cached"}}"#,
            )),
        };
        let (body, _) = render(Output::Object, &rt, page(vec![cached.clone()]));
        assert_eq!(body["items"][0]["metadata"]["name"], "cached");
        // Other outputs render from the object.
        let (body, _) = render(Output::Metadata, &rt, page(vec![cached]));
        assert_eq!(body["items"][0]["metadata"]["name"], "a");
    }

    #[test]
    fn large_lists_stream_in_chunks_and_equal_the_whole_rendering() {
        let rt = Arc::new(ResourceType::lease());
        let items: Vec<Listed> = (0..2000)
            .map(|i| {
                let object = Arc::new(
                    json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                    "metadata": {"name": format!("lease-{i:04}"), "namespace": "default"},
                    "spec": {"holderIdentity": "x".repeat(100)}}),
                );
                // Half with stored encodings, half rendered: both paths in one body.
                let json = (i % 2 == 0).then(|| Arc::from(object.to_string()));
                Listed { object, json }
            })
            .collect();
        let objects: Vec<Arc<Value>> = items.iter().map(|i| Arc::clone(&i.object)).collect();
        let (body, chunks) = render(Output::Object, &rt, page(items.clone()));
        assert!(chunks > 2, "{chunks} chunks");
        assert_eq!(
            body["items"],
            Value::Array(objects.iter().map(|o| (**o).clone()).collect())
        );
        let (table, chunks) = render(Output::Table, &rt, page(items));
        assert!(chunks > 2, "{chunks} chunks");
        let meta = json!({"resourceVersion": "7", "continue": "c", "remainingItemCount": 3});
        let mut whole = crate::table::to_table(&rt, &objects, meta, true);
        // Ages are computed at render time; Leases have no date column, so all cells match.
        assert_eq!(table["rows"].as_array().unwrap().len(), 2000);
        assert_eq!(table, std::mem::take(&mut whole));
    }
}
