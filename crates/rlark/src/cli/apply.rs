//! `rlark apply -f FILE|DIR|- [-n NS]`: create each object, or update it when it exists.
//!
//! An update is a JSON merge patch of the whole manifest (fields absent from the manifest
//! are left alone). The outcome is read from `resourceVersion`: unchanged when the server
//! did not write.

use anyhow::{Context as _, bail};
use clap::Args;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;

use super::ClientArgs;
use super::client::{Reported, Session, format_status};
use super::discovery::{Catalog, ResourceInfo};
use super::manifest::{self, Manifest};

#[derive(Debug, Args)]
pub(crate) struct ApplyArgs {
    /// Manifest file, directory (its .yaml/.yml/.json files) or `-` for stdin. Repeatable.
    #[arg(
        short = 'f',
        long = "filename",
        required = true,
        value_name = "FILE|DIR|-"
    )]
    pub filenames: Vec<String>,
    /// Namespace for namespaced objects that name none.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What apply did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

pub(crate) async fn apply(args: ApplyArgs) -> anyhow::Result<()> {
    let manifests = manifest::read_sources(&args.filenames)?;
    if manifests.is_empty() {
        bail!("no objects passed to apply");
    }
    let session = Session::connect(&args.client, args.namespace.as_deref()).await?;
    let catalog = Catalog::discover(&session.client).await?;
    let mut errors = 0;
    for manifest in &manifests {
        match apply_one(&session, &catalog, manifest).await {
            Ok((info, outcome)) => {
                println!(
                    "{}/{} {}",
                    info.qualified_kind(),
                    manifest.name(),
                    outcome.as_str()
                );
            }
            Err(ApplyError::Server { verb, status }) => {
                errors += 1;
                eprintln!(
                    "{}",
                    format_status(&status).replacen(
                        "): ",
                        &format!("): error when {verb} {:?}: ", manifest.source),
                        1
                    )
                );
            }
            Err(ApplyError::Other(e)) => {
                errors += 1;
                eprintln!("error: {e:#}");
            }
        }
    }
    if errors > 0 {
        return Err(Reported { count: errors }.into());
    }
    Ok(())
}

enum ApplyError {
    /// The server refused; `verb` says what apply was doing ("creating", "patching", ...).
    Server {
        verb: &'static str,
        status: Box<kube::core::Status>,
    },
    Other(anyhow::Error),
}

impl From<anyhow::Error> for ApplyError {
    fn from(e: anyhow::Error) -> Self {
        ApplyError::Other(e)
    }
}

/// Where a manifest goes: its resource and namespace (`None` for cluster-scoped kinds), with
/// the object adjusted to match (namespace filled in or removed).
pub(crate) fn place<'c>(
    catalog: &'c Catalog,
    manifest: &Manifest,
    session_namespace: &str,
    namespace_explicit: bool,
) -> anyhow::Result<(&'c ResourceInfo, Option<String>, Value)> {
    let info = catalog
        .resolve_kind(manifest.api_version(), manifest.kind())
        .with_context(|| {
            format!(
                "resource mapping not found for name {:?} from {:?}",
                manifest.name(),
                manifest.source
            )
        })?;
    let mut object = manifest.object.clone();
    if !info.namespaced {
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        return Ok((info, None, object));
    }
    let namespace = match manifest.namespace() {
        Some(ns) if namespace_explicit && ns != session_namespace => bail!(
            "the namespace from the provided object {ns:?} does not match the namespace \
             {session_namespace:?}. You must pass '--namespace={ns}' to perform this operation."
        ),
        Some(ns) => ns.to_string(),
        None => session_namespace.to_string(),
    };
    object["metadata"]["namespace"] = Value::String(namespace.clone());
    Ok((info, Some(namespace), object))
}

async fn apply_one<'c>(
    session: &Session,
    catalog: &'c Catalog,
    manifest: &Manifest,
) -> Result<(&'c ResourceInfo, Outcome), ApplyError> {
    let (info, namespace, object) = place(
        catalog,
        manifest,
        &session.namespace,
        session.namespace_explicit,
    )?;
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(session.client.clone(), ns, &info.ar),
        None => Api::all_with(session.client.clone(), &info.ar),
    };
    let name = manifest.name();
    let existing = match api.get_opt(name).await {
        Ok(existing) => existing,
        Err(kube::Error::Api(status)) => {
            return Err(ApplyError::Server {
                verb: "retrieving the current state of",
                status,
            });
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("get {} {name}", info.qualified_kind()))
                .into());
        }
    };
    if existing.is_none() {
        let body: DynamicObject = serde_json::from_value(object.clone())
            .with_context(|| format!("{}: object {name:?} is malformed", manifest.source))?;
        match api.create(&PostParams::default(), &body).await {
            Ok(_) => return Ok((info, Outcome::Created)),
            // Created by someone else in between: fall through to the update.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(kube::Error::Api(status)) => {
                return Err(ApplyError::Server {
                    verb: "creating",
                    status,
                });
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("create {} {name}", info.qualified_kind()))
                    .into());
            }
        }
    }
    let before = existing.and_then(|o| o.metadata.resource_version);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&object))
        .await
    {
        Ok(patched) => {
            let unchanged = before.is_some() && patched.metadata.resource_version == before;
            Ok((
                info,
                if unchanged {
                    Outcome::Unchanged
                } else {
                    Outcome::Configured
                },
            ))
        }
        Err(kube::Error::Api(status)) => Err(ApplyError::Server {
            verb: "patching",
            status,
        }),
        Err(e) => Err(anyhow::Error::new(e)
            .context(format!("patch {} {name}", info.qualified_kind()))
            .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::discovery::tests::catalog;

    fn manifest(yaml: &str) -> Manifest {
        manifest::parse_documents(yaml, "m.yaml")
            .expect("parse")
            .remove(0)
    }

    #[test]
    fn namespaced_objects_get_the_session_namespace_unless_they_name_one() {
        let catalog = catalog();
        let task = manifest("apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata: {name: t}\n");
        let (info, ns, object) = place(&catalog, &task, "default", false).expect("place");
        assert_eq!(info.ar.plural, "tasks");
        assert_eq!(ns.as_deref(), Some("default"));
        assert_eq!(object["metadata"]["namespace"], "default");

        let task = manifest(
            "apiVersion: rlinf.io/v1alpha1\nkind: Task\nmetadata: {name: t, namespace: a}\n",
        );
        let (_, ns, _) = place(&catalog, &task, "default", false).expect("place");
        assert_eq!(ns.as_deref(), Some("a"));
        let (_, ns, _) = place(&catalog, &task, "a", true).expect("same namespace");
        assert_eq!(ns.as_deref(), Some("a"));
        let err = place(&catalog, &task, "b", true).expect_err("conflicting namespace");
        assert!(err.to_string().contains("--namespace=a"), "{err}");
    }

    #[test]
    fn cluster_scoped_objects_lose_any_namespace_and_unknown_kinds_fail() {
        let catalog = catalog();
        let job = manifest(
            "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata: {name: ppo-train, namespace: x}\n",
        );
        let (info, ns, object) = place(&catalog, &job, "default", true).expect("place");
        assert_eq!(info.qualified_kind(), "job.rlinf.io");
        assert_eq!(ns, None);
        assert!(object["metadata"].get("namespace").is_none());

        let pod = manifest("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
        let err = place(&catalog, &pod, "default", false).expect_err("pods unknown");
        let text = format!("{err:#}");
        assert!(text.contains("no matches for kind \"Pod\""), "{text}");
        assert!(text.contains("m.yaml"), "{text}");
    }
}
