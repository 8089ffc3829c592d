//! `rlark get -w`: the listing, then every change to the listed objects (added, modified,
//! deleted) until interrupted, as `kubectl get -w`: table rows (the header once), or with
//! `-o` one object per change (JSON documents, YAML documents separated by `---`, names,
//! the template applied to each, custom-columns rows). A NAME follows that one object.
//! When the server ends a watch (after its timeout) the next one starts from the last
//! change seen.

use anyhow::{Context as _, bail};
use futures::TryStreamExt as _;
use kube::core::{Request, WatchEvent};
use serde_json::{Value, json};

use super::format::{ObjectPrinter, OutputFormat, write_stdout};
use super::query::Query;
use super::{GetArgs, objects, tables};
use crate::client::{Reported, Session, format_status};
use crate::table::{self, TABLE_ACCEPT, TableOptions};

/// Follow `query` (one kind; the collection or one named object) in the format of `args`.
pub(crate) async fn run(
    session: &Session,
    query: &Query<'_>,
    args: &GetArgs,
) -> anyhow::Result<()> {
    let scope = Scope::of(session, query).await?;
    match &args.output {
        None | Some(OutputFormat::Wide) => rows(session, query, &scope, args).await,
        Some(format) => changes(session, query, &scope, args, format).await,
    }
}

/// What a watch follows: the collection at `path`, or the object `name` in it.
struct Scope {
    path: String,
    name: Option<String>,
}

impl Scope {
    /// The query's collection, or its named object, which must exist (the server's
    /// NotFound otherwise, as `kubectl get NAME -w`).
    async fn of(session: &Session, query: &Query<'_>) -> anyhow::Result<Scope> {
        let Some((name, path)) = query.targets.first() else {
            return Ok(Scope {
                path: query.path.clone(),
                name: None,
            });
        };
        let request = Request::new(path).get(name, &Default::default())?;
        match session.client.request::<Value>(request).await {
            Ok(_) => Ok(Scope {
                path: path.clone(),
                name: Some(name.clone()),
            }),
            Err(kube::Error::Api(status)) => {
                eprintln!("{}", format_status(&status));
                Err(Reported { count: 1 }.into())
            }
            Err(e) => Err(e).with_context(|| format!("get {} {name}", query.info.qualified_kind())),
        }
    }

    fn fields(&self) -> Option<String> {
        self.name.as_ref().map(|n| format!("metadata.name={n}"))
    }

    /// Whether a changed object (or a Table of them) is about what is followed.
    fn admits(&self, changed: &Value) -> bool {
        let Some(name) = &self.name else {
            return true;
        };
        let named = |object: &Value| object["metadata"]["name"].as_str() == Some(name);
        match changed["kind"].as_str() {
            Some("Table") => table::rows(changed).iter().any(|r| named(&r["object"])),
            _ => named(changed),
        }
    }
}

/// The table, then a row per change with the list's columns (the header only if the list
/// printed none).
async fn rows(
    session: &Session,
    query: &Query<'_>,
    scope: &Scope,
    args: &GetArgs,
) -> anyhow::Result<()> {
    let fields = scope.fields();
    let list = tables::list_at(session, query, &scope.path, args, fields.as_deref()).await?;
    let options = tables::options(query, args);
    let mut widths = Vec::new();
    if table::rows(&list).is_empty() {
        eprintln!("{}", query.nothing_found());
    } else {
        write_stdout(&table::render_within(&list, options, &mut widths))?;
    }
    let mut printer = RowPrinter {
        list: &list,
        options,
        header_printed: !table::rows(&list).is_empty() || options.no_headers,
        widths,
    };
    let version = resource_version(&list);
    follow(session, query, scope, args, version, true, |changed| {
        printer.print(changed)
    })
    .await
}

/// The objects, then each changed object, in `format`.
async fn changes(
    session: &Session,
    query: &Query<'_>,
    scope: &Scope,
    args: &GetArgs,
    format: &OutputFormat,
) -> anyhow::Result<()> {
    let fields = scope.fields();
    let (version, items) =
        objects::list(session, query.info, &scope.path, args, fields.as_deref()).await?;
    let kind = query.info.qualified_kind();
    let mut printer = ObjectPrinter::new(format, args.no_headers);
    for item in &items {
        printer.print(&kind, item)?;
    }
    follow(session, query, scope, args, version, false, |changed| {
        printer.print(&kind, &objects::with_type(changed.clone(), query.info))
    })
    .await
}

/// Watch `scope` from `version` (as Tables when `as_table`), calling `on_change` with each
/// added, modified or deleted object, until interrupted or an error.
async fn follow(
    session: &Session,
    query: &Query<'_>,
    scope: &Scope,
    args: &GetArgs,
    mut version: String,
    as_table: bool,
    mut on_change: impl FnMut(&Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let what = || format!("watch {}", query.info.qualified_plural());
    let mut params = kube::api::WatchParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    if let Some(fields) = scope.fields() {
        params = params.fields(&fields);
    }
    loop {
        let mut request = Request::new(&scope.path).watch(&params, &version)?;
        if as_table {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(TABLE_ACCEPT),
            );
        }
        let events = session
            .client
            .request_events::<Value>(request)
            .await
            .with_context(what)?;
        futures::pin_mut!(events);
        while let Some(event) = events.try_next().await.with_context(what)? {
            let changed = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
                WatchEvent::Bookmark(mark) => {
                    version = mark.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) => bail!("{}: {}", what(), e.message),
            };
            if let Some(newest) = newest_version(&changed) {
                version = newest;
            }
            if scope.admits(&changed) {
                on_change(&changed)?;
            }
        }
    }
}

fn resource_version(list: &Value) -> String {
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The resourceVersion of a changed object, or of the last row of a Table event.
fn newest_version(changed: &Value) -> Option<String> {
    let object = match changed["kind"].as_str() {
        Some("Table") => &table::rows(changed).last()?["object"],
        _ => changed,
    };
    object["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_string)
}

/// The rows of each change, with the list's columns, lined up under the list.
struct RowPrinter<'a> {
    list: &'a Value,
    options: TableOptions,
    /// The list printed rows (or -o no-headers): no header before the next rows.
    header_printed: bool,
    /// Column widths so far.
    widths: Vec<usize>,
}

impl RowPrinter<'_> {
    fn print(&mut self, changed: &Value) -> anyhow::Result<()> {
        let rows = match changed["kind"].as_str() {
            Some("Table") => changed["rows"].clone(),
            // A server that sends objects: rows of the generic columns.
            _ => {
                table::synthesize(std::slice::from_ref(changed), chrono::Utc::now())["rows"].clone()
            }
        };
        let mut columns = self.list["columnDefinitions"].clone();
        if columns.as_array().is_none_or(Vec::is_empty) {
            columns = json!([{"name": "Name", "type": "string", "format": "name", "priority": 0}]);
        }
        let event_table = json!({"columnDefinitions": columns, "rows": rows});
        let options = TableOptions {
            no_headers: self.header_printed,
            ..self.options
        };
        self.header_printed = true;
        write_stdout(&table::render_within(
            &event_table,
            options,
            &mut self.widths,
        ))
    }
}
