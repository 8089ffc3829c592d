//! `rlark get -o json|yaml|name|jsonpath=|custom-columns=`: the objects of every query,
//! as one object (a single name) or one `List`, as kubectl prints them.

use anyhow::Context as _;
use kube::core::Request;
use serde_json::{Value, json};

use super::format::{ObjectPrinter, OutputFormat, print_document, write_stdout};
use super::query::Query;
use super::{GetArgs, list_params};
use crate::client::{Reported, Session, format_status};
use crate::discovery::ResourceInfo;

/// Print the objects of `queries` in `format`; `Reported` when a named one was missing.
pub(crate) async fn print(
    session: &Session,
    queries: &[Query<'_>],
    args: &GetArgs,
    format: &OutputFormat,
) -> anyhow::Result<()> {
    let mut errors = 0;
    let mut objects = Vec::new();
    for query in queries {
        let found = match query.named {
            false => list(session, query.info, &query.path, args, None).await?.1,
            true => named(session, query, &mut errors).await?,
        };
        objects.extend(found.into_iter().map(|o| (query.info, o)));
    }
    let single = queries.len() == 1 && queries[0].targets.len() == 1 && queries[0].named;
    match format {
        OutputFormat::Name => {
            let mut printer = ObjectPrinter::new(format, args.no_headers);
            for (info, object) in &objects {
                printer.print(&info.qualified_kind(), object)?;
            }
        }
        // One table, aligned over all rows.
        OutputFormat::CustomColumns(columns) if !objects.is_empty() => {
            let objects: Vec<Value> = objects.into_iter().map(|(_, o)| o).collect();
            write_stdout(&columns.render(&objects, args.no_headers))?;
        }
        OutputFormat::CustomColumns(_) => {}
        _ if objects.is_empty() && errors > 0 => {}
        _ => {
            let mut items: Vec<Value> = objects.into_iter().map(|(_, o)| o).collect();
            let document = match single && items.len() == 1 {
                true => items.remove(0),
                false => json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": items,
                    "metadata": {"resourceVersion": ""},
                }),
            };
            print_document(&document, format)?;
        }
    }
    match errors {
        0 => Ok(()),
        count => Err(Reported { count }.into()),
    }
}

/// The collection at `path` (label selector of `args`, `fields` if given): the list's
/// resourceVersion and its items with apiVersion and kind.
pub(crate) async fn list(
    session: &Session,
    info: &ResourceInfo,
    path: &str,
    args: &GetArgs,
    fields: Option<&str>,
) -> anyhow::Result<(String, Vec<Value>)> {
    let request = Request::new(path).list(&list_params(args, fields))?;
    let list: Value = session
        .client
        .request(request)
        .await
        .with_context(|| format!("list {}", info.qualified_plural()))?;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let items = list["items"].as_array().cloned().unwrap_or_default();
    Ok((
        version,
        items.into_iter().map(|o| with_type(o, info)).collect(),
    ))
}

/// The named objects found; a missing one is reported on stderr and counted in `errors`.
async fn named(
    session: &Session,
    query: &Query<'_>,
    errors: &mut usize,
) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (name, path) in &query.targets {
        let request = Request::new(path).get(name, &Default::default())?;
        match session.client.request::<Value>(request).await {
            Ok(object) => objects.push(with_type(object, query.info)),
            Err(kube::Error::Api(status)) => {
                eprintln!("{}", format_status(&status));
                *errors += 1;
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("get {} {name}", query.info.qualified_kind()));
            }
        }
    }
    Ok(objects)
}

/// List items come without apiVersion and kind; kubectl fills them in.
pub(crate) fn with_type(mut object: Value, info: &ResourceInfo) -> Value {
    if let Value::Object(map) = &mut object {
        map.entry("apiVersion")
            .or_insert_with(|| Value::String(info.ar.api_version.clone()));
        map.entry("kind")
            .or_insert_with(|| Value::String(info.ar.kind.clone()));
    }
    object
}
