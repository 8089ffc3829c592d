//! `rlark get KIND [NAME...] [-n NS | -A] [-o yaml|json|wide|name] [-l SELECTOR]`.

use anyhow::{Context as _, bail};
use clap::Args;
use kube::api::ListParams;
use kube::core::Request;
use serde_json::{Value, json};

use super::ClientArgs;
use super::client::{Reported, Session, format_status};
use super::discovery::{Catalog, ResourceInfo};
use super::names;
use super::output::{CustomColumns, Template};
use super::table::{self, TABLE_ACCEPT, TableOptions};

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    /// Resource type: plural, singular, kind or short name (jobs, job, rljob, tasks, ns,
    /// leases), or KIND/NAME.
    pub kind: String,
    /// Names of the objects (default: all), or more KIND/NAME. Without -n, namespaced
    /// objects are found in whichever namespace holds them (an error lists the namespaces
    /// when several do) and listed across all namespaces.
    pub names: Vec<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format (default: a table): yaml, json, wide, name, jsonpath=TEMPLATE (e.g.
    /// `jsonpath='{.items[*].metadata.name}'`, with `{range PATH}...{end}` and `{"\n"}`),
    /// or custom-columns=HEADER:PATH,... (e.g. `custom-columns=NAME:.metadata.name`).
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = parse_output)]
    pub output: Option<OutputFormat>,
    /// Label selector, e.g. `app=ppo,tier!=gpu`.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Omit the table header.
    #[arg(long)]
    pub no_headers: bool,
    /// After the table, print a row for every change to the listed objects (added,
    /// modified, deleted) until interrupted, as `kubectl get -w`. Lists only (no NAME), as
    /// a table (default or `-o wide`).
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Clone, Debug)]
pub(crate) enum OutputFormat {
    Yaml,
    Json,
    Wide,
    Name,
    JsonPath(Template),
    CustomColumns(CustomColumns),
}

/// `-o FORMAT`: a name, or `jsonpath=` / `custom-columns=` with their argument.
fn parse_output(value: &str) -> Result<OutputFormat, String> {
    match value {
        "yaml" => return Ok(OutputFormat::Yaml),
        "json" => return Ok(OutputFormat::Json),
        "wide" => return Ok(OutputFormat::Wide),
        "name" => return Ok(OutputFormat::Name),
        _ => {}
    }
    if let Some(template) = value.strip_prefix("jsonpath=") {
        return Template::parse(template)
            .map(OutputFormat::JsonPath)
            .map_err(|e| e.to_string());
    }
    if let Some(spec) = value.strip_prefix("custom-columns=") {
        return CustomColumns::parse(spec)
            .map(OutputFormat::CustomColumns)
            .map_err(|e| e.to_string());
    }
    Err("one of yaml, json, wide, name, jsonpath=TEMPLATE, custom-columns=SPEC".to_string())
}

pub(crate) async fn get(mut args: GetArgs) -> anyhow::Result<()> {
    (args.kind, args.names) = names::kind_and_names(&args.kind, &args.names)?;
    if !args.names.is_empty() && args.all_namespaces {
        bail!("a resource cannot be retrieved by name across all namespaces");
    }
    if !args.names.is_empty() && args.selector.is_some() {
        bail!("name cannot be provided when a selector is specified");
    }
    if args.watch && !args.names.is_empty() {
        bail!("--watch follows a whole list: name no object (narrow it with -l or -n)");
    }
    if args.watch && !matches!(args.output, None | Some(OutputFormat::Wide)) {
        bail!("--watch prints table rows: use it without -o or with -o wide");
    }
    let session = Session::connect(&args.client).await?;
    // Tunnels are live state of the server's hub, not stored objects (`/api/v1/tunnels`).
    if matches!(args.kind.as_str(), "tunnels" | "tunnel") {
        return print_tunnels(&session, &args).await;
    }
    let catalog = Catalog::discover(&session.client).await?;
    let info = catalog.resolve(&args.kind)?;
    // Without -n, namespaced objects are listed (and found by name) across namespaces:
    // rlark keeps them in agent namespaces, never in `default` (see `names`).
    let namespace = match (info.namespaced, args.all_namespaces) {
        (true, false) if session.namespace_explicit => Some(session.namespace.as_str()),
        _ => None,
    };
    let path = info.collection_path(namespace);
    let mut errors = 0;
    let mut targets = Vec::new();
    for name in &args.names {
        if !info.namespaced || namespace.is_some() {
            targets.push((name.clone(), path.clone()));
            continue;
        }
        match names::locate(&session.client, info, name, None).await {
            Ok(ns) => targets.push((name.clone(), info.collection_path(Some(&ns)))),
            Err(error) => {
                if let Some(message) = super::client::report(&error) {
                    eprintln!("{message}");
                }
                errors += 1;
            }
        }
    }
    if !args.names.is_empty() && targets.is_empty() {
        return Err(Reported { count: errors }.into());
    }
    let listed = Listing {
        path: &path,
        namespace,
        targets: &targets,
    };
    let result = match &args.output {
        None | Some(OutputFormat::Wide) => {
            let options = TableOptions {
                wide: matches!(args.output, Some(OutputFormat::Wide)),
                with_namespace: info.namespaced && namespace.is_none(),
                no_headers: args.no_headers,
            };
            print_table(&session, info, &listed, &args, options).await
        }
        Some(format) => print_objects(&session, info, &listed, &args, format).await,
    };
    match result {
        Err(e) if errors > 0 => match e.downcast::<Reported>() {
            Ok(r) => Err(Reported {
                count: r.count + errors,
            }
            .into()),
            Err(e) => Err(e),
        },
        Ok(()) if errors > 0 => Err(Reported { count: errors }.into()),
        other => other,
    }
}

/// What `get` reads: the collection (`namespace` `None` = all namespaces), or the named
/// objects, each with the collection path of its namespace.
struct Listing<'a> {
    path: &'a str,
    namespace: Option<&'a str>,
    targets: &'a [(String, String)],
}

async fn print_table(
    session: &Session,
    info: &ResourceInfo,
    listing: &Listing<'_>,
    args: &GetArgs,
    options: TableOptions,
) -> anyhow::Result<()> {
    let mut errors = 0;
    let namespace = listing.namespace;
    if args.names.is_empty() {
        let list_params = list_params(args);
        let request = Request::new(listing.path).list(&list_params)?;
        let response = table_request(session, request)
            .await
            .with_context(|| format!("list {}", info.qualified_plural()))?;
        let table = into_table(response);
        if table::rows(&table).is_empty() {
            match namespace {
                Some(ns) => eprintln!("No resources found in {ns} namespace."),
                None => eprintln!("No resources found"),
            }
            if !args.watch {
                return Ok(());
            }
        } else {
            print!("{}", table::render(&table, options));
            flush_stdout()?;
        }
        if args.watch {
            return watch_rows(session, info, listing, args, &table, options).await;
        }
        return Ok(());
    }
    let table = {
        let mut merged: Option<Value> = None;
        for (name, path) in listing.targets {
            let request = Request::new(path).get(name, &Default::default())?;
            match table_request(session, request).await {
                Ok(response) => {
                    let t = into_table(response);
                    match merged.as_mut() {
                        Some(m) => table::merge(m, t),
                        None => merged = Some(t),
                    }
                }
                Err(kube::Error::Api(status)) => {
                    eprintln!("{}", format_status(&status));
                    errors += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("get {} {name}", info.qualified_kind()));
                }
            }
        }
        match merged {
            Some(t) => t,
            None => return Err(Reported { count: errors }.into()),
        }
    };
    print!("{}", table::render(&table, options));
    if errors > 0 {
        return Err(Reported { count: errors }.into());
    }
    Ok(())
}

fn flush_stdout() -> anyhow::Result<()> {
    use std::io::Write as _;
    std::io::stdout().flush().context("write to stdout")
}

/// `get -w`: watch the collection from the list's resourceVersion, asking for Table
/// events, and print each event's rows with the list's columns (the header only if the
/// list printed none) until interrupted: when the server ends a watch (after its timeout)
/// the next one starts from the last change seen.
async fn watch_rows(
    session: &Session,
    info: &ResourceInfo,
    listing: &Listing<'_>,
    args: &GetArgs,
    list: &Value,
    options: TableOptions,
) -> anyhow::Result<()> {
    use futures::TryStreamExt as _;
    use kube::core::WatchEvent;

    let mut version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut params = kube::api::WatchParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    let mut header_printed = !table::rows(list).is_empty() || options.no_headers;
    loop {
        let mut request = Request::new(listing.path).watch(&params, &version)?;
        request.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(TABLE_ACCEPT),
        );
        let events = session
            .client
            .request_events::<Value>(request)
            .await
            .with_context(|| format!("watch {}", info.qualified_plural()))?;
        futures::pin_mut!(events);
        while let Some(event) = events
            .try_next()
            .await
            .with_context(|| format!("watch {}", info.qualified_plural()))?
        {
            let changed = match event {
                WatchEvent::Added(t) | WatchEvent::Modified(t) | WatchEvent::Deleted(t) => t,
                WatchEvent::Bookmark(mark) => {
                    version = mark.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) => {
                    bail!("watch {}: {}", info.qualified_plural(), e.message)
                }
            };
            print_event(&changed, list, options, &mut header_printed, &mut version)?;
        }
    }
}

/// One watch event's rows; `version` becomes the newest resourceVersion in them.
fn print_event(
    changed: &Value,
    list: &Value,
    options: TableOptions,
    header_printed: &mut bool,
    version: &mut String,
) -> anyhow::Result<()> {
    let rows = match changed["kind"].as_str() {
        Some("Table") => changed["rows"].clone(),
        // A server that sends objects: rows of the generic columns.
        _ => table::synthesize(std::slice::from_ref(changed), chrono::Utc::now())["rows"].clone(),
    };
    for row in rows.as_array().into_iter().flatten() {
        if let Some(v) = row["object"]["metadata"]["resourceVersion"].as_str() {
            *version = v.to_string();
        }
    }
    let mut columns = list["columnDefinitions"].clone();
    if columns.as_array().is_none_or(Vec::is_empty) {
        columns = json!([{"name": "Name", "type": "string", "format": "name", "priority": 0}]);
    }
    let event_table = json!({"columnDefinitions": columns, "rows": rows});
    let event_options = TableOptions {
        no_headers: *header_printed,
        ..options
    };
    *header_printed = true;
    print!("{}", table::render(&event_table, event_options));
    flush_stdout()?;
    Ok(())
}

/// GET asking for a Table.
async fn table_request(
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

fn list_params(args: &GetArgs) -> ListParams {
    let mut params = ListParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    params
}

async fn print_objects(
    session: &Session,
    info: &ResourceInfo,
    listing: &Listing<'_>,
    args: &GetArgs,
    format: &OutputFormat,
) -> anyhow::Result<()> {
    let mut errors = 0;
    let mut objects = Vec::new();
    let single = args.names.len() == 1;
    if args.names.is_empty() {
        let request = Request::new(listing.path).list(&list_params(args))?;
        let list: Value = session
            .client
            .request(request)
            .await
            .with_context(|| format!("list {}", info.qualified_plural()))?;
        objects.extend(list["items"].as_array().cloned().unwrap_or_default());
    } else {
        for (name, path) in listing.targets {
            let request = Request::new(path).get(name, &Default::default())?;
            match session.client.request::<Value>(request).await {
                Ok(object) => objects.push(object),
                Err(kube::Error::Api(status)) => {
                    eprintln!("{}", format_status(&status));
                    errors += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("get {} {name}", info.qualified_kind()));
                }
            }
        }
    }
    // List items come without apiVersion/kind; kubectl fills them in.
    for object in &mut objects {
        if let Value::Object(map) = object {
            map.entry("apiVersion")
                .or_insert_with(|| Value::String(info.ar.api_version.clone()));
            map.entry("kind")
                .or_insert_with(|| Value::String(info.ar.kind.clone()));
        }
    }
    if let OutputFormat::CustomColumns(columns) = format {
        if !objects.is_empty() {
            print!("{}", columns.render(&objects, args.no_headers));
        }
    } else if matches!(format, OutputFormat::Name) {
        for object in &objects {
            println!(
                "{}/{}",
                info.qualified_kind(),
                object["metadata"]["name"].as_str().unwrap_or_default()
            );
        }
    } else if !(objects.is_empty() && errors > 0) {
        let document = if single && objects.len() == 1 {
            objects.remove(0)
        } else {
            json!({"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {"resourceVersion": ""}})
        };
        print_document(&document, format)?;
    }
    if errors > 0 {
        return Err(Reported { count: errors }.into());
    }
    Ok(())
}

fn print_document(document: &Value, format: &OutputFormat) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(document)?),
        // As kubectl: no newline of its own (templates end with `{"\n"}`).
        OutputFormat::JsonPath(template) => {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(template.render(document).as_bytes())
                .and_then(|()| stdout.flush())
                .context("write to stdout")?;
        }
        _ => print!(
            "{}",
            serde_saphyr::to_string(document).context("render YAML")?
        ),
    }
    Ok(())
}

/// `rlark get tunnels`: the agent sessions of the server the kubeconfig points at.
async fn print_tunnels(session: &Session, args: &GetArgs) -> anyhow::Result<()> {
    let request = http::Request::get("/api/v1/tunnels")
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .context("build request")?;
    let list: Value = match session.client.request(request).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) => bail!("{}", format_status(&status)),
        Err(e) => return Err(e).context("GET /api/v1/tunnels"),
    };
    let mut items: Vec<&Value> = list["items"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if !args.names.is_empty() {
        items.retain(|t| {
            args.names
                .iter()
                .any(|n| t["clusterID"].as_str() == Some(n))
        });
    }
    match &args.output {
        Some(format @ (OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_))) => {
            print_document(&list, format)?;
        }
        Some(OutputFormat::CustomColumns(columns)) => {
            let items: Vec<Value> = items.into_iter().cloned().collect();
            print!("{}", columns.render(&items, args.no_headers));
        }
        Some(OutputFormat::Name) => {
            for t in items {
                println!("tunnel/{}", t["clusterID"].as_str().unwrap_or_default());
            }
        }
        None | Some(OutputFormat::Wide) => {
            let mut rows = Vec::new();
            if !args.no_headers {
                rows.push(
                    [
                        "AGENT",
                        "NODE",
                        "REPLICA",
                        "REMOTE",
                        "SINCE",
                        "STREAMS",
                        "BYTES-IN",
                        "BYTES-OUT",
                        "RTT",
                    ]
                    .map(String::from)
                    .to_vec(),
                );
            }
            for t in &items {
                let text = |f: &str| t[f].as_str().unwrap_or("<none>").to_string();
                let num = |f: &str| t[f].as_u64().unwrap_or(0).to_string();
                rows.push(vec![
                    text("clusterID"),
                    text("node"),
                    text("replica"),
                    text("remote"),
                    text("connectedSince"),
                    num("streamsOpen"),
                    num("bytesIn"),
                    num("bytesOut"),
                    t["minRttMicros"]
                        .as_u64()
                        .map_or("<none>".to_string(), |us| {
                            format!("{:.2}ms", us as f64 / 1000.0)
                        }),
                ]);
            }
            if items.is_empty() {
                eprintln!("No tunnels connected to this server.");
            }
            let widths: Vec<usize> = (0..9)
                .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
                .collect();
            for row in rows {
                let line: Vec<String> = row
                    .iter()
                    .zip(&widths)
                    .map(|(cell, w)| format!("{cell:<w$}"))
                    .collect();
                println!("{}", line.join("   ").trim_end());
            }
        }
    }
    Ok(())
}
