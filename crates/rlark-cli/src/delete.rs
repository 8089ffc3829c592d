//! `rlark delete KIND NAME... | KIND/NAME... [-n NS]` and `rlark delete -f FILE|DIR|-`.

use anyhow::bail;
use clap::Args;
use kube::api::{Api, DeleteParams, DynamicObject};

use super::ClientArgs;
use super::apply::place;
use super::client::{Reported, Session, format_status, is_not_found};
use super::discovery::{Catalog, ResourceInfo};
use super::manifest;
use super::names;

#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    /// Resource type (jobs, job, rljob, tasks, ns, ...), or KIND/NAME.
    #[arg(required_unless_present = "filenames", conflicts_with = "filenames")]
    pub kind: Option<String>,
    /// Names of the objects to delete (or more KIND/NAME). Without -n, a namespaced object
    /// is found in whichever namespace holds it.
    pub names: Vec<String>,
    /// Delete the objects of these manifests (file, directory or `-`). Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub filenames: Vec<String>,
    /// Treat "not found" as success.
    #[arg(long)]
    pub ignore_not_found: bool,
    #[arg(skip)]
    pub client: ClientArgs,
}

/// The kind and names of `delete KIND NAME...` or `delete KIND/NAME...`; at least one name.
pub(crate) fn named(kind: &str, names: &[String]) -> anyhow::Result<(String, Vec<String>)> {
    let mut groups = names::kind_groups(kind, names)?;
    if groups.len() > 1 {
        let kinds: Vec<&str> = groups.iter().map(|g| g.kind.as_str()).collect();
        bail!(
            "delete names one kind, not {}: run one command per kind",
            kinds.join(", ")
        );
    }
    let names::KindNames { kind, names } = groups.remove(0);
    if names.is_empty() {
        bail!(
            "resource(s) were provided, but no name was specified: `rlark delete {kind} NAME` \
             or `rlark delete {kind}/NAME`"
        );
    }
    Ok((kind, names))
}

pub(crate) async fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    // Read the manifests before connecting, so a bad file fails fast.
    let manifests = manifest::read_sources(&args.filenames)?;
    let session = Session::connect(&args.client).await?;
    let catalog = Catalog::discover(&session.client).await?;
    let mut targets: Vec<(&ResourceInfo, Option<String>, String)> = Vec::new();
    if let Some(kind) = &args.kind {
        let (kind, names) = named(kind, &args.names)?;
        let info = catalog.resolve(&kind)?;
        let explicit = session
            .namespace_explicit
            .then_some(session.namespace.as_str());
        for name in names {
            let namespace = match info.namespaced {
                true => Some(names::locate(&session.client, info, &name, explicit).await?),
                false => None,
            };
            targets.push((info, namespace, name));
        }
    }
    for manifest in &manifests {
        let (info, namespace, _) = place(
            &catalog,
            manifest,
            &session.namespace,
            session.namespace_explicit,
        )?;
        targets.push((info, namespace, manifest.name().to_string()));
    }

    let mut errors = 0;
    for (info, namespace, name) in targets {
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(session.client.clone(), ns, &info.ar),
            None => Api::all_with(session.client.clone(), &info.ar),
        };
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => println!("{} {name:?} deleted", info.qualified_kind()),
            Err(e) if args.ignore_not_found && is_not_found(&e) => {}
            Err(kube::Error::Api(status)) => {
                errors += 1;
                eprintln!("{}", format_status(&status));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("delete {} {name}", info.qualified_kind())));
            }
        }
    }
    if errors > 0 {
        return Err(Reported { count: errors }.into());
    }
    Ok(())
}
