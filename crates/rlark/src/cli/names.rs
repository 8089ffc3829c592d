//! Naming objects on the command line, the same way in every command: `KIND/NAME` or
//! `KIND NAME`, and (without `-n`) a namespaced object found in whichever namespace holds
//! it, as long as only one does.
//!
//! rlark keeps the objects of a cluster in its agent namespace (`rlark-<clusterID>`), so
//! without `-n` namespaced kinds are looked up (and listed) across all namespaces rather
//! than in `default`, where they never live.

use anyhow::bail;
use kube::api::{Api, DynamicObject, ListParams};

use super::discovery::ResourceInfo;

/// `rlark get KIND NAME...` or `rlark get KIND/NAME...` (all of one kind): the kind and the
/// names.
pub(crate) fn kind_and_names(
    first: &str,
    rest: &[String],
) -> anyhow::Result<(String, Vec<String>)> {
    let Some((kind, name)) = first.split_once('/') else {
        if let Some(slashed) = rest.iter().find(|n| n.contains('/')) {
            bail!(
                "there is no need to specify a resource type as a separate argument when \
                 passing arguments in resource/name form (e.g. 'rlark get resource/<name>' \
                 instead of 'rlark get resource resource/<name>'): {slashed:?}"
            );
        }
        return Ok((first.to_string(), rest.to_vec()));
    };
    let mut names = vec![checked_name(first, name)?];
    for arg in rest {
        match arg.split_once('/') {
            Some((k, n)) if k.eq_ignore_ascii_case(kind) => names.push(checked_name(arg, n)?),
            Some((k, _)) => {
                bail!("{arg:?} names another kind ({k:?}) than {first:?}: run one command per kind")
            }
            None => bail!("{arg:?} must be {kind}/NAME like {first:?}"),
        }
    }
    Ok((kind.to_string(), names))
}

fn checked_name(arg: &str, name: &str) -> anyhow::Result<String> {
    if name.is_empty() || name.contains('/') {
        bail!("invalid argument {arg:?}: use KIND/NAME or KIND NAME");
    }
    Ok(name.to_string())
}

/// A single-object target given as `KIND/NAME`, `KIND NAME` or `NAME`: the `KIND/NAME` (or
/// `NAME`) form the command parses.
pub(crate) fn join_target(first: &str, second: Option<&str>) -> anyhow::Result<String> {
    match second {
        None => Ok(first.to_string()),
        Some(_) if first.contains('/') => {
            bail!("{first:?} already names the kind: give KIND/NAME or KIND NAME, not both")
        }
        Some(name) if name.is_empty() || name.contains('/') => {
            bail!("invalid name {name:?}: use KIND/NAME or KIND NAME")
        }
        Some(name) => Ok(format!("{first}/{name}")),
    }
}

/// The namespace holding `name` among `namespaces` (those where an object of that name was
/// found): the only one, else an error naming the candidates.
pub(crate) fn pick_namespace(
    kind: &str,
    name: &str,
    mut namespaces: Vec<String>,
) -> anyhow::Result<String> {
    namespaces.sort();
    namespaces.dedup();
    match namespaces.as_slice() {
        [] => bail!("{kind} {name:?} not found in any namespace"),
        [one] => Ok(one.clone()),
        several => bail!(
            "{kind} {name:?} exists in several namespaces ({}): pick one with -n",
            several.join(", ")
        ),
    }
}

/// Where a namespaced object named `name` lives: `namespace` when given (`-n`), else the only
/// namespace holding one (see [`pick_namespace`]).
pub(crate) async fn locate(
    client: &kube::Client,
    info: &ResourceInfo,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<String> {
    if let Some(ns) = namespace {
        return Ok(ns.to_string());
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &info.ar);
    let found = api
        .list_metadata(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map_err(|e| {
            anyhow::Error::new(e).context(format!("look up {} {name}", info.qualified_kind()))
        })?;
    let namespaces = found
        .items
        .iter()
        .filter(|o| o.metadata.name.as_deref() == Some(name))
        .filter_map(|o| o.metadata.namespace.clone())
        .collect();
    pick_namespace(&info.qualified_kind(), name, namespaces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn both_forms_name_the_same_objects() {
        assert_eq!(
            kind_and_names("task", &strings(&["a", "b"])).unwrap(),
            ("task".to_string(), strings(&["a", "b"]))
        );
        assert_eq!(
            kind_and_names("task/a", &strings(&["task/b", "TASK/c"])).unwrap(),
            ("task".to_string(), strings(&["a", "b", "c"]))
        );
        assert_eq!(
            kind_and_names("jobs", &[]).unwrap(),
            ("jobs".to_string(), vec![])
        );
        let err = kind_and_names("task/a", &strings(&["job/b"])).unwrap_err();
        assert!(err.to_string().contains("one command per kind"), "{err}");
        let err = kind_and_names("task/a", &strings(&["b"])).unwrap_err();
        assert!(err.to_string().contains("must be task/NAME"), "{err}");
        let err = kind_and_names("task", &strings(&["task/b"])).unwrap_err();
        assert!(err.to_string().contains("no need to specify"), "{err}");
        assert!(kind_and_names("task/", &[]).is_err());
        assert!(kind_and_names("task/a/b", &[]).is_err());

        assert_eq!(join_target("task", Some("a")).unwrap(), "task/a");
        assert_eq!(join_target("task/a", None).unwrap(), "task/a");
        assert_eq!(join_target("a", None).unwrap(), "a");
        assert!(join_target("task/a", Some("b")).is_err());
        assert!(join_target("task", Some("")).is_err());
    }

    #[test]
    fn a_name_in_one_namespace_is_found_several_are_listed() {
        assert_eq!(
            pick_namespace("task.rlinf.io", "t", strings(&["rlark-a", "rlark-a"])).unwrap(),
            "rlark-a"
        );
        let err = pick_namespace("task.rlinf.io", "t", strings(&["rlark-b", "rlark-a"]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "task.rlinf.io \"t\" exists in several namespaces (rlark-a, rlark-b): pick one with -n"
        );
        let err = pick_namespace("task.rlinf.io", "t", vec![])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "task.rlinf.io \"t\" not found in any namespace");
    }
}
