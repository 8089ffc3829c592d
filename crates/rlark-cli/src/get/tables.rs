//! `rlark get` as tables (the default and `-o wide`): the server's columns for each kind
//! in turn, a blank line between kinds, and names prefixed with their kind
//! (`job.rlinf.io/ppo`) when several kinds are shown, as kubectl prints them.

use anyhow::Context as _;
use kube::core::Request;
use serde_json::Value;

use super::query::Query;
use super::{GetArgs, OutputFormat};
use crate::client::{Reported, Session, format_status};
use crate::table::{self, TABLE_ACCEPT, TableOptions};

/// Print the table of every query; `Reported` when some named object was missing.
pub(crate) async fn print(
    session: &Session,
    queries: &[Query<'_>],
    args: &GetArgs,
) -> anyhow::Result<()> {
    let several = queries.len() > 1;
    let mut errors = 0;
    let mut printed = false;
    for query in queries {
        let mut table = match query.named {
            false => list(session, query, args).await?,
            true => match named(session, query, &mut errors).await? {
                Some(table) => table,
                None => continue,
            },
        };
        if table::rows(&table).is_empty() {
            continue;
        }
        if several {
            table::prefix_names(&mut table, &format!("{}/", query.info.qualified_kind()));
        }
        if printed {
            println!();
        }
        print!("{}", table::render(&table, options(query, args)));
        printed = true;
    }
    if !printed && queries.iter().all(|q| !q.named) {
        eprintln!("{}", nothing_found(queries));
    }
    match errors {
        0 => Ok(()),
        count => Err(Reported { count }.into()),
    }
}

/// How a query's table prints: `-o wide`, a NAMESPACE column across namespaces.
pub(crate) fn options(query: &Query<'_>, args: &GetArgs) -> TableOptions {
    TableOptions {
        wide: matches!(args.output, Some(OutputFormat::Wide)),
        with_namespace: query.info.namespaced && query.namespace.is_none(),
        no_headers: args.no_headers,
    }
}

/// kubectl's message when nothing was listed: the namespace named when all queries read
/// the same one.
pub(crate) fn nothing_found(queries: &[Query<'_>]) -> String {
    let first = queries
        .first()
        .map(Query::nothing_found)
        .unwrap_or_default();
    match queries.iter().all(|q| q.namespace == queries[0].namespace) {
        true => first,
        false => "No resources found".to_string(),
    }
}

/// The collection as a Table, with the label (and `fields`) selector.
pub(crate) async fn list(
    session: &Session,
    query: &Query<'_>,
    args: &GetArgs,
) -> anyhow::Result<Value> {
    list_at(session, query, &query.path, args, None).await
}

/// [`list`] of the collection at `path`, narrowed by a field selector.
pub(crate) async fn list_at(
    session: &Session,
    query: &Query<'_>,
    path: &str,
    args: &GetArgs,
    fields: Option<&str>,
) -> anyhow::Result<Value> {
    let request = Request::new(path).list(&super::list_params(args, fields))?;
    let response = request_table(session, request)
        .await
        .with_context(|| format!("list {}", query.info.qualified_plural()))?;
    Ok(into_table(response))
}

/// The named objects' rows in one Table (`None` when none was found); a missing one is
/// reported on stderr and counted in `errors`.
async fn named(
    session: &Session,
    query: &Query<'_>,
    errors: &mut usize,
) -> anyhow::Result<Option<Value>> {
    let mut merged: Option<Value> = None;
    for (name, path) in &query.targets {
        let request = Request::new(path).get(name, &Default::default())?;
        match request_table(session, request).await {
            Ok(response) => {
                let t = into_table(response);
                match merged.as_mut() {
                    Some(m) => table::merge(m, t),
                    None => merged = Some(t),
                }
            }
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
    Ok(merged)
}

/// GET asking for a Table.
pub(crate) async fn request_table(
    session: &Session,
    mut request: http::Request<Vec<u8>>,
) -> Result<Value, kube::Error> {
    request.headers_mut().insert(
        http::header::ACCEPT,
        http::HeaderValue::from_static(TABLE_ACCEPT),
    );
    session.client.request::<Value>(request).await
}

/// A Table response as is; a list or an object (server without Table support) converted.
fn into_table(response: Value) -> Value {
    if response["kind"] == "Table" {
        return response;
    }
    let objects: Vec<Value> = match response.get("items").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => vec![response],
    };
    table::synthesize(&objects, chrono::Utc::now())
}
