//! `rlark apply -f FILE|DIR|- [-n NS]`: create each object, or update it when it exists.
//!
//! An update is a JSON merge patch of the whole manifest (fields absent from the manifest
//! are left alone). The outcome is read from `resourceVersion`: unchanged when the server
//! did not write.

use anyhow::{Context as _, bail};
use clap::Args;
use kube::api::{Api, DynamicObject, Patch, PatchParams, ValidationDirective};
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
    /// What the server does with fields the schema does not know (or given twice), as
    /// kubectl's `--validate`: `strict` refuses the object, `warn` drops them with a
    /// warning, `ignore` drops them silently. `true` means strict, `false` ignore.
    #[arg(
        long,
        value_name = "MODE",
        default_value = "strict",
        num_args = 0..=1,
        default_missing_value = "strict",
        value_parser = parse_validate
    )]
    pub validate: Validate,
    #[arg(skip)]
    pub client: ClientArgs,
}

/// `--validate`: the `fieldValidation` directive of apply's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Validate {
    Strict,
    Warn,
    Ignore,
}

impl Validate {
    /// The `fieldValidation` query value.
    pub(crate) fn directive(self) -> &'static str {
        match self {
            Validate::Strict => "Strict",
            Validate::Warn => "Warn",
            Validate::Ignore => "Ignore",
        }
    }
}

/// kubectl's `--validate` values.
fn parse_validate(text: &str) -> Result<Validate, String> {
    match text.to_ascii_lowercase().as_str() {
        "strict" | "true" => Ok(Validate::Strict),
        "warn" => Ok(Validate::Warn),
        "ignore" | "false" => Ok(Validate::Ignore),
        _ => Err(format!(
            "invalid value {text:?}: use strict, warn or ignore (true = strict, false = ignore)"
        )),
    }
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
    let session = Session::connect(&args.client).await?;
    let catalog = Catalog::discover(&session.client).await?;
    let mut errors = 0;
    for manifest in &manifests {
        match apply_one(&session, &catalog, manifest, args.validate).await {
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
                eprintln!("error: {}", super::client::error_chain(&e));
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
    validate: Validate,
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
        match create(session, info, namespace.as_deref(), &object, validate).await {
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
    let params = PatchParams {
        field_validation: Some(match validate {
            Validate::Strict => ValidationDirective::Strict,
            Validate::Warn => ValidationDirective::Warn,
            Validate::Ignore => ValidationDirective::Ignore,
        }),
        ..PatchParams::default()
    };
    match api.patch(name, &params, &Patch::Merge(&object)).await {
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

/// POST `object` to its collection with the `fieldValidation` directive (kube's
/// `PostParams` has no field for it).
async fn create(
    session: &Session,
    info: &ResourceInfo,
    namespace: Option<&str>,
    object: &Value,
    validate: Validate,
) -> Result<Value, kube::Error> {
    let path = format!(
        "{}?fieldValidation={}",
        info.collection_path(namespace),
        validate.directive()
    );
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(body)
        .map_err(|e| kube::Error::BuildRequest(kube::core::request::Error::BuildRequest(e)))?;
    session.client.request::<Value>(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::catalog;

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
    fn validate_takes_kubectls_values() {
        for (text, mode) in [
            ("strict", Validate::Strict),
            ("true", Validate::Strict),
            ("Warn", Validate::Warn),
            ("ignore", Validate::Ignore),
            ("false", Validate::Ignore),
        ] {
            assert_eq!(parse_validate(text), Ok(mode), "{text}");
        }
        let err = parse_validate("lax").expect_err("unknown mode");
        assert!(err.contains("strict, warn or ignore"), "{err}");
        assert_eq!(Validate::Warn.directive(), "Warn");
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
