//! `meta.k8s.io/v1` `Table` responses (what `kubectl get` asks for).
//!
//! Cells follow kube-apiserver's CRD table convertor (`apiextensions-apiserver`
//! `tableconvertor.go`), which is what users of CRDs see from a real cluster:
//!
//! - the first column is always `Name` (`format: name`, so `kubectl get -o name`-style
//!   decorations work);
//! - each printer column's JSONPath is evaluated with missing keys allowed; no match gives a
//!   `null` cell, which kubectl prints as an empty cell;
//! - `string` columns print the first match (objects and arrays as compact JSON),
//!   `integer`/`number`/`boolean` columns keep the JSON value when it has that type (else
//!   `null`), and `date` columns become a human-readable age such as `5m10s`, computed by
//!   the server: kubectl prints cells verbatim and does no date arithmetic of its own.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::{Map, Value, json};

use crate::discovery::accepted_media_ranges;
use crate::jsonpath::JsonPath;
use crate::registry::ResourceType;

/// Description of the `Name` column, as kube-apiserver sends it (ObjectMeta's field doc).
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// Whether the request's `Accept` header prefers a `Table` rendering.
///
/// True when the first media range this server can satisfy (in `q` order, ties in header
/// order) is `application/json;as=Table;g=meta.k8s.io;v=v1` (or `v=v1beta1`). kubectl sends
/// `application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json`.
/// A client that lists plain JSON first gets plain JSON, as with kube-apiserver's
/// negotiation. Ranges we never produce (protobuf, other `as=` kinds) are skipped.
/// The response is always a `meta.k8s.io/v1` Table, which kubectl accepts for v1beta1 too.
pub fn wants_table(headers: &HeaderMap) -> bool {
    for range in accepted_media_ranges(headers) {
        let json_like = range.matches_type("application", "json")
            || range.essence == "*/*"
            || range.essence == "application/*";
        if !json_like {
            continue;
        }
        match range.param("as") {
            None => return false,
            Some("Table") => {
                let group_ok = range.param("g") == Some("meta.k8s.io");
                let version_ok = matches!(range.param("v"), Some("v1" | "v1beta1"));
                if group_ok && version_ok {
                    return true;
                }
            }
            Some(_) => {}
        }
    }
    false
}

/// Render `objects` of type `rt` as a `meta.k8s.io/v1` `Table`.
///
/// `list_meta` becomes the table's `metadata` (pass the list's `resourceVersion` /
/// `continue` / `remainingItemCount`, or `{}`). With `include_column_definitions = false`
/// `columnDefinitions` is empty (`[]`), as kube-apiserver sends for watch events after the
/// first. Each row carries the object's metadata as a `PartialObjectMetadata` (kube's default
/// `includeObject=Metadata`).
pub fn to_table(
    rt: &ResourceType,
    objects: &[Arc<Value>],
    list_meta: Value,
    include_column_definitions: bool,
) -> Value {
    to_table_at(
        rt,
        objects,
        list_meta,
        include_column_definitions,
        Utc::now(),
    )
}

/// [`to_table`] with an explicit clock, so ages are testable.
pub(crate) fn to_table_at(
    rt: &ResourceType,
    objects: &[Arc<Value>],
    list_meta: Value,
    include_column_definitions: bool,
    now: DateTime<Utc>,
) -> Value {
    let renderer = Renderer::new(rt, now);
    let column_definitions = if include_column_definitions {
        renderer.column_definitions(rt)
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| renderer.row(rt, object))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": column_definitions,
        "rows": rows,
    })
}

/// The parts of a `Table` of one kind, rendered one at a time, so that a list body can be
/// streamed row by row (`list_body`) and still equal [`to_table`]'s. Every method takes the
/// `ResourceType` the renderer was made for.
pub(crate) struct Renderer {
    /// Parsed once per table, not per row.
    paths: Vec<Option<JsonPath>>,
    /// Ages are relative to this instant, the same for every row.
    now: DateTime<Utc>,
}

impl Renderer {
    pub(crate) fn new(rt: &ResourceType, now: DateTime<Utc>) -> Self {
        // A column whose path does not parse shows `null` everywhere rather than failing the
        // request: kube-apiserver likewise keeps serving when a CRD column is unusable.
        let paths = rt
            .printer_columns
            .iter()
            .map(|c| JsonPath::parse(&c.json_path).ok())
            .collect();
        Self { paths, now }
    }

    /// `columnDefinitions`: `Name`, then the kind's printer columns.
    pub(crate) fn column_definitions(&self, rt: &ResourceType) -> Vec<Value> {
        let mut columns = vec![json!({
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": NAME_DESCRIPTION,
            "priority": 0,
        })];
        columns.extend(rt.printer_columns.iter().map(|c| {
            let description = if c.description.is_empty() {
                format!(
                    "Custom resource definition column (in JSONPath format): {}",
                    c.json_path
                )
            } else {
                c.description.clone()
            };
            json!({
                "name": c.name,
                "type": c.type_,
                "format": c.format,
                "description": description,
                "priority": c.priority,
            })
        }));
        columns
    }

    /// The row of `object`: its cells and its metadata as a `PartialObjectMetadata`.
    /// Infallible: a cell that cannot be computed is `null`.
    pub(crate) fn row(&self, rt: &ResourceType, object: &Value) -> Value {
        let metadata = object
            .get("metadata")
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        let name = metadata.get("name").cloned().unwrap_or_else(|| json!(""));
        let mut cells = Vec::with_capacity(1 + self.paths.len());
        cells.push(name);
        for (column, path) in rt.printer_columns.iter().zip(&self.paths) {
            let value = path.as_ref().and_then(|p| p.first(object));
            cells.push(value.map_or(Value::Null, |v| cell(&column.type_, v, self.now)));
        }
        json!({
            "cells": cells,
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
            },
        })
    }
}

/// One cell of a printer column of type `type_` (kube's `cellForJSONValue`).
fn cell(type_: &str, value: &Value, now: DateTime<Utc>) -> Value {
    match (type_, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(_)) => value.clone(),
        // jsonpath's PrintResults: composites as compact JSON, scalars as text.
        ("string", Value::Object(_) | Value::Array(_)) => Value::String(value.to_string()),
        ("string", Value::Number(n)) => Value::String(n.to_string()),
        ("string", Value::Bool(b)) => Value::String(b.to_string()),
        ("integer", Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => json!(i),
            // Go converts float64 to int64 by truncation.
            (None, Some(f)) => json!(f.trunc() as i64),
            _ => Value::Null,
        },
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        ("boolean", Value::Bool(_)) => value.clone(),
        ("date", Value::String(s)) => Value::String(age(s, now)),
        _ => Value::Null,
    }
}

/// kube's `ConvertToHumanReadableDateType` for an RFC 3339 timestamp.
fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    if timestamp.is_empty() {
        return "<unknown>".into();
    }
    match DateTime::parse_from_rfc3339(timestamp) {
        Ok(time) => human_duration(now.signed_duration_since(time.with_timezone(&Utc))),
        Err(_) => "<invalid>".into(),
    }
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`: two or three significant figures.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let seconds = d.num_seconds();
    // Up to two seconds in the future counts as "now" (clock skew between machines).
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{}h", hours / 24, h)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{}d", hours / 24 / 365, days)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use http::HeaderValue;

    use super::*;
    use crate::registry::{PrinterColumn, Registry};

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn wants_table_for_kubectl_accept() {
        assert!(wants_table(&accept(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        )));
        assert!(wants_table(&accept(
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
        )));
        assert!(wants_table(&accept(
            "application/json; as=Table; g=meta.k8s.io; v=v1"
        )));
    }

    #[test]
    fn no_table_for_plain_or_other_requests() {
        assert!(!wants_table(&HeaderMap::new()));
        assert!(!wants_table(&accept("application/json")));
        assert!(!wants_table(&accept("*/*")));
        assert!(!wants_table(&accept(
            "application/json,application/json;as=Table;v=v1;g=meta.k8s.io"
        )));
        assert!(!wants_table(&accept(
            "application/json;as=Table;v=v2;g=meta.k8s.io"
        )));
        assert!(!wants_table(&accept(
            "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
        )));
        // Protobuf is skipped (we never produce it), so the table request behind it wins.
        assert!(wants_table(&accept(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io"
        )));
        // q-values order preferences.
        assert!(wants_table(&accept(
            "application/json;q=0.5,application/json;as=Table;v=v1;g=meta.k8s.io"
        )));
    }

    #[test]
    fn namespace_table() {
        let rt = ResourceType::namespace();
        let objects = vec![
            Arc::new(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "default", "creationTimestamp": "2026-11-30T11:54:50Z", "resourceVersion": "7"},
                "status": {"phase": "Active"}
            })),
            Arc::new(
                json!({"metadata": {"name": "fresh", "creationTimestamp": "2026-11-28T12:00:00Z"}}),
            ),
        ];
        let table = to_table_at(&rt, &objects, json!({"resourceVersion": "9"}), true, now());
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(table["metadata"], json!({"resourceVersion": "9"}));
        let columns = table["columnDefinitions"].as_array().unwrap();
        assert_eq!(columns.len(), 3);
        assert_eq!(columns[0]["name"], "Name");
        assert_eq!(columns[0]["format"], "name");
        assert_eq!(columns[0]["description"], NAME_DESCRIPTION);
        assert_eq!(columns[1]["name"], "Status");
        assert_eq!(
            columns[1]["description"],
            "Custom resource definition column (in JSONPath format): .status.phase"
        );
        assert_eq!(columns[2]["type"], "date");
        assert_eq!(
            table["rows"][0]["cells"],
            json!(["default", "Active", "5m10s"])
        );
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(
            table["rows"][0]["object"]["metadata"]["resourceVersion"],
            "7"
        );
        assert_eq!(table["rows"][1]["cells"], json!(["fresh", null, "2d"]));
    }

    #[test]
    fn without_column_definitions() {
        let rt = ResourceType::lease();
        let objects = vec![Arc::new(
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}),
        )];
        let table = to_table_at(&rt, &objects, json!({}), false, now());
        assert_eq!(table["columnDefinitions"], json!([]));
        assert_eq!(table["rows"][0]["cells"], json!(["l", "me", null]));
    }

    #[test]
    fn cells_by_type() {
        let column = |name: &str, type_: &str, path: &str| PrinterColumn {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: format!("the {name}"),
            priority: 1,
            json_path: path.into(),
        };
        let mut rt = ResourceType::lease();
        rt.printer_columns = vec![
            column("Int", "integer", ".spec.n"),
            column("IntFromFloat", "integer", ".spec.f"),
            column("IntFromString", "integer", ".spec.s"),
            column("Num", "number", ".spec.n"),
            column("Bool", "boolean", ".spec.b"),
            column("Str", "string", ".spec.n"),
            column("Obj", "string", ".spec.o"),
            column("First", "string", ".spec.list[*].x"),
            column("BadDate", "date", ".spec.s"),
            column("EmptyDate", "date", ".spec.e"),
            column("Broken", "string", ".spec[0"),
        ];
        let object = json!({"metadata": {"name": "x"}, "spec": {
            "n": 3, "f": 2.7, "s": "abc", "b": true, "o": {"k": [1, 2]}, "e": "",
            "list": [{"x": "one"}, {"x": "two"}]
        }});
        let table = to_table_at(&rt, &[Arc::new(object)], json!({}), true, now());
        assert_eq!(
            table["rows"][0]["cells"],
            json!([
                "x",
                3,
                2,
                null,
                3.0,
                true,
                "3",
                "{\"k\":[1,2]}",
                "one",
                "<invalid>",
                "<unknown>",
                null
            ])
        );
        assert_eq!(table["columnDefinitions"][1]["description"], "the Int");
        assert_eq!(table["columnDefinitions"][1]["priority"], 1);
    }

    #[test]
    fn crd_tables_from_the_builtin_registry() {
        let registry = Registry::builtin();
        for rt in registry.all() {
            let object = Arc::new(
                // `lastTimestamp`: the date column of core Events.
                json!({"metadata": {"name": "o", "creationTimestamp": "2026-11-30T11:00:00Z"},
                       "lastTimestamp": "2026-11-30T11:00:00Z"}),
            );
            let table = to_table_at(rt, &[object], json!({}), true, now());
            let columns = table["columnDefinitions"].as_array().unwrap();
            assert_eq!(columns.len(), 1 + rt.printer_columns.len(), "{rt:?}");
            let cells = table["rows"][0]["cells"].as_array().unwrap();
            assert_eq!(cells.len(), columns.len(), "{rt:?}");
            for (column, cell) in columns.iter().zip(cells) {
                if column["type"] == "date" {
                    assert_eq!(cell, "60m", "{rt:?}");
                }
            }
        }
    }

    #[test]
    fn human_durations_match_kubernetes() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (310, "5m10s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 24 * 3600, "8d"),
            (2 * 365 * 24 * 3600, "2y"),
            ((2 * 365 + 3) * 24 * 3600, "2y3d"),
            (9 * 365 * 24 * 3600, "9y"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(
                human_duration(TimeDelta::seconds(seconds)),
                expected,
                "{seconds}s"
            );
        }
    }
}
