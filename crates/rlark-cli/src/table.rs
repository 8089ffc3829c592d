//! Rendering `meta.k8s.io/v1` `Table` responses the way kubectl prints them.

use serde_json::{Value, json};

/// The `Accept` header that asks for a Table and falls back to plain JSON.
pub(crate) const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// What to print besides the server's default columns.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TableOptions {
    /// Also the columns with priority > 0 (`-o wide`).
    pub wide: bool,
    /// A leading NAMESPACE column (`-A`).
    pub with_namespace: bool,
    /// No header line.
    pub no_headers: bool,
}

/// The rows of a Table response (empty when it has none).
pub(crate) fn rows(table: &Value) -> &[Value] {
    table["rows"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A table as kubectl prints it: upper-case headers, columns separated by at least three
/// spaces (each at least 10 wide, like kubectl's tabwriter), empty cells for nulls.
/// `table` is a `Table` object (`columnDefinitions` + `rows`); the rows may come from
/// several responses (see [`merge`]).
pub(crate) fn render(table: &Value, options: TableOptions) -> String {
    render_within(table, options, &mut Vec::new())
}

/// [`render`] with every column at least `widths` wide, widened (and `widths` updated) to
/// fit: tables printed one after the other (the rows of a watch) line up.
pub(crate) fn render_within(
    table: &Value,
    options: TableOptions,
    widths: &mut Vec<usize>,
) -> String {
    let empty = Vec::new();
    let columns = table["columnDefinitions"].as_array().unwrap_or(&empty);
    let shown: Vec<usize> = columns
        .iter()
        .enumerate()
        .filter(|(_, c)| options.wide || c["priority"].as_i64().unwrap_or(0) == 0)
        .map(|(i, _)| i)
        .collect();
    let mut lines: Vec<Vec<String>> = Vec::new();
    if !options.no_headers {
        let mut header = Vec::new();
        if options.with_namespace {
            header.push("NAMESPACE".to_string());
        }
        header.extend(shown.iter().map(|&i| {
            columns[i]["name"]
                .as_str()
                .unwrap_or_default()
                .to_uppercase()
        }));
        lines.push(header);
    }
    for row in rows(table) {
        let mut line = Vec::new();
        if options.with_namespace {
            line.push(
                row["object"]["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
        line.extend(shown.iter().map(|&i| format_cell(&row["cells"][i])));
        lines.push(line);
    }
    align_within(&lines, widths)
}

/// Append the rows of `other` to `table` (same resource, so the same columns).
pub(crate) fn merge(table: &mut Value, other: Value) {
    let Value::Object(mut other) = other else {
        return;
    };
    let Some(Value::Array(more)) = other.remove("rows") else {
        return;
    };
    match table.get_mut("rows") {
        Some(Value::Array(rows)) => rows.extend(more),
        _ => table["rows"] = Value::Array(more),
    }
}

/// Put `prefix` (`job.rlinf.io/`) before every row's name, as kubectl does when one
/// command shows several kinds. The name column is the one with format `name`, else the
/// one called Name.
pub(crate) fn prefix_names(table: &mut Value, prefix: &str) {
    let Some(columns) = table["columnDefinitions"].as_array() else {
        return;
    };
    let by_format = columns.iter().position(|c| c["format"] == "name");
    let Some(index) = by_format.or_else(|| columns.iter().position(|c| c["name"] == "Name")) else {
        return;
    };
    let Some(rows) = table.get_mut("rows").and_then(Value::as_array_mut) else {
        return;
    };
    for row in rows {
        if let Some(Value::String(name)) = row["cells"].get_mut(index) {
            name.insert_str(0, prefix);
        }
    }
}

/// A Table with NAME and AGE columns built from plain objects, for servers that answer a
/// Table request with a list or an object.
pub(crate) fn synthesize(objects: &[Value], now: chrono::DateTime<chrono::Utc>) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let age = o["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| human_duration((now - t.with_timezone(&chrono::Utc)).num_seconds()))
                .map_or(Value::Null, Value::String);
            json!({
                "cells": [o["metadata"]["name"].clone(), age],
                "object": {"metadata": o["metadata"].clone()},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Age", "type": "string", "priority": 0},
        ],
        "rows": rows,
    })
}

/// kubectl's (apimachinery `HumanDuration`) rendering of an age in seconds.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = seconds / 3600;
    let days = hours / 24;
    let years = days / 365;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else if days < 365 * 8 {
        match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        }
    } else {
        format!("{years}y")
    }
}

fn format_cell(cell: &Value) -> String {
    match cell {
        // kubectl's table printer leaves cells the server sent as null empty.
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// Left-aligned columns (3 spaces apart, at least 10 wide), as kubectl prints tables.
pub(crate) fn align(lines: &[Vec<String>]) -> String {
    align_within(lines, &mut Vec::new())
}

/// [`align`] with columns at least `widths` wide; `widths` becomes the widths used.
fn align_within(lines: &[Vec<String>], widths: &mut Vec<usize>) -> String {
    const PADDING: usize = 3;
    const MIN_WIDTH: usize = 10;
    let columns = lines.iter().map(Vec::len).max().unwrap_or(0);
    if widths.len() < columns {
        widths.resize(columns, 0);
    }
    for (c, width) in widths.iter_mut().enumerate().take(columns) {
        let longest = lines
            .iter()
            .filter_map(|l| l.get(c))
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0);
        *width = (*width).max((longest + PADDING).max(MIN_WIDTH));
    }
    let mut out = String::new();
    for line in lines {
        let mut text = String::new();
        for (c, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if c + 1 < line.len() {
                let pad = widths[c].saturating_sub(cell.chars().count());
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_table() -> Value {
        json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "priority": 0},
                {"name": "Phase", "type": "string", "priority": 0},
                {"name": "Tasks", "type": "integer", "priority": 1},
                {"name": "Age", "type": "date", "priority": 0},
            ],
            "rows": [
                {"cells": ["ppo-train", "Running", 4, "5m"],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "ppo-train", "namespace": "team-a"}}},
                {"cells": ["eval", null, 1, "20h"],
                 "object": {"kind": "PartialObjectMetadata", "metadata": {"name": "eval", "namespace": "b"}}},
            ],
        })
    }

    #[test]
    fn prints_default_columns_like_kubectl() {
        let out = render(&job_table(), TableOptions::default());
        assert_eq!(
            out,
            "NAME        PHASE     AGE\n\
             ppo-train   Running   5m\n\
             eval                  20h\n"
        );
    }

    #[test]
    fn wide_adds_priority_columns_and_all_namespaces_adds_namespace_first() {
        let out = render(
            &job_table(),
            TableOptions {
                wide: true,
                with_namespace: true,
                no_headers: false,
            },
        );
        assert_eq!(
            out,
            "NAMESPACE   NAME        PHASE     TASKS     AGE\n\
             team-a      ppo-train   Running   4         5m\n\
             b           eval                  1         20h\n"
        );
    }

    #[test]
    fn merge_and_synthesize_produce_renderable_tables() {
        let mut table = job_table();
        let mut other = job_table();
        other["rows"] = json!([{"cells": ["third", "Done", 0, "1d"]}]);
        merge(&mut table, other);
        assert_eq!(rows(&table).len(), 3);

        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let objects =
            [json!({"metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"}})];
        let out = render(&synthesize(&objects, now), TableOptions::default());
        assert_eq!(out, "NAME      AGE\nx         60m\n");
        let empty = render(
            &synthesize(&[], now),
            TableOptions {
                no_headers: true,
                ..Default::default()
            },
        );
        assert_eq!(empty, "");
    }

    #[test]
    fn tables_printed_in_turn_line_up() {
        let mut widths = Vec::new();
        let first = render_within(&job_table(), TableOptions::default(), &mut widths);
        let mut short = job_table();
        short["rows"] = json!([{"cells": ["x", "Done", 0, "1s"]}]);
        let next = render_within(
            &short,
            TableOptions {
                no_headers: true,
                ..Default::default()
            },
            &mut widths,
        );
        assert_eq!(first.lines().next(), Some("NAME        PHASE     AGE"));
        assert_eq!(next, "x           Done      1s\n");
    }

    #[test]
    fn names_take_the_kind_prefix() {
        let mut table = job_table();
        prefix_names(&mut table, "job.rlinf.io/");
        let out = render(&table, TableOptions::default());
        assert_eq!(
            out,
            "NAME                     PHASE     AGE\n\
             job.rlinf.io/ppo-train   Running   5m\n\
             job.rlinf.io/eval                  20h\n"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (secs, text) in [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (10 * 365 * 86400, "10y"),
        ] {
            assert_eq!(human_duration(secs), text, "{secs}");
        }
    }
}
