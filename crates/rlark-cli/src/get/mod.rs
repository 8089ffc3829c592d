//! `rlark get KIND[,KIND...] [NAME...] [-n NS | -A] [-o FORMAT] [-l SELECTOR] [-w]`, as
//! `kubectl get`: one kind or several in turn (`jobs,tasks`, `job/a task/b`), as tables or
//! in an output format, once or following changes (`-w`).

mod format;
mod objects;
mod query;
mod tables;
mod tunnels;
mod watch;

use anyhow::bail;
use clap::Args;
use kube::api::ListParams;

use super::ClientArgs;
use super::client::{Reported, Session};
use super::discovery::Catalog;
use super::names::{self, KindNames};
use format::{OutputFormat, parse_output};
use query::Query;

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    /// Resource type: plural, singular, kind or short name (jobs, job, rljob, tasks, ns,
    /// leases); several separated by commas (jobs,tasks: a table each, names prefixed with
    /// their kind); or KIND/NAME.
    pub kind: String,
    /// Names of the objects (default: all), or more KIND/NAME (of any kind). Without -n,
    /// namespaced objects are found in whichever namespace holds them (an error lists the
    /// namespaces when several do) and listed across all namespaces.
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
    /// After the listing, print every change to the listed objects (added, modified,
    /// deleted) until interrupted, as `kubectl get -w`: a table row each, or with -o an
    /// object each (JSON documents; YAML documents separated by `---`; names; the
    /// template's output). One kind; with a NAME, that object only.
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[arg(skip)]
    pub client: ClientArgs,
}

pub(crate) async fn get(args: GetArgs) -> anyhow::Result<()> {
    let groups = names::kind_groups(&args.kind, &args.names)?;
    check(&args, &groups)?;
    let session = Session::connect(&args.client).await?;
    if is_tunnels(&groups[0].kind) {
        return tunnels::print(&session, &args, &groups[0].names).await;
    }
    let catalog = Catalog::discover(&session.client).await?;
    // Every kind is known before anything prints.
    let infos = groups
        .iter()
        .map(|g| catalog.resolve(&g.kind))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut errors = 0;
    let mut queries = Vec::new();
    for (info, group) in infos.into_iter().zip(&groups) {
        let query = Query::new(
            &session,
            info,
            &group.names,
            args.all_namespaces,
            &mut errors,
        );
        queries.push(query.await);
    }
    if queries.iter().all(|q| q.named && q.targets.is_empty()) {
        return Err(Reported { count: errors }.into());
    }
    let result = match &args.output {
        _ if args.watch => watch::run(&session, &queries[0], &args).await,
        None | Some(OutputFormat::Wide) => tables::print(&session, &queries, &args).await,
        Some(format) => objects::print(&session, &queries, &args, format).await,
    };
    with_lookup_errors(result, errors)
}

/// The flag combinations `get` refuses, before connecting.
fn check(args: &GetArgs, groups: &[KindNames]) -> anyhow::Result<()> {
    let named = groups.iter().any(|g| !g.names.is_empty());
    if named && args.all_namespaces {
        bail!("a resource cannot be retrieved by name across all namespaces");
    }
    if named && args.selector.is_some() {
        bail!("name cannot be provided when a selector is specified");
    }
    if groups.len() > 1 && groups.iter().any(|g| is_tunnels(&g.kind)) {
        bail!("tunnels are listed alone: `rlark get tunnels`, then the other kinds");
    }
    if !args.watch {
        return Ok(());
    }
    if groups.len() > 1 {
        let kinds: Vec<&str> = groups.iter().map(|g| g.kind.as_str()).collect();
        bail!(
            "--watch follows one kind, not {}: run one `rlark get -w` per kind",
            kinds.join(", ")
        );
    }
    if groups[0].names.len() > 1 {
        bail!(
            "--watch follows one object or a whole list, not {} objects: name one (or narrow \
             the list with -l or -n)",
            groups[0].names.len()
        );
    }
    if is_tunnels(&groups[0].kind) {
        bail!("--watch does not follow tunnels (they are not stored objects)");
    }
    Ok(())
}

/// Tunnels are live state of the server's hub, not stored objects (`/api/v1/tunnels`).
fn is_tunnels(kind: &str) -> bool {
    matches!(kind, "tunnels" | "tunnel")
}

/// `result`, with `errors` (names not found before reading) added to its count.
fn with_lookup_errors(result: anyhow::Result<()>, errors: usize) -> anyhow::Result<()> {
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

/// List parameters: the label selector of `args`, and `fields` if given.
fn list_params(args: &GetArgs, fields: Option<&str>) -> ListParams {
    let mut params = ListParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    if let Some(fields) = fields {
        params = params.fields(fields);
    }
    params
}
