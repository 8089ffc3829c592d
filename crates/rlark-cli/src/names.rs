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

/// The kinds `rlark get` lists and the names of each (none: all), in command-line order:
/// `KIND[,KIND...] [NAME...]` (every kind with the same names, as kubectl's
/// `get jobs,tasks x`) or `KIND/NAME...` (kinds may differ; names of one kind grouped).
pub(crate) fn kind_groups(first: &str, rest: &[String]) -> anyhow::Result<Vec<KindNames>> {
    if !first.contains('/') {
        if let Some(slashed) = rest.iter().find(|n| n.contains('/')) {
            bail!(
                "there is no need to specify a resource type as a separate argument when \
                 passing arguments in resource/name form (e.g. 'rlark get resource/<name>' \
                 instead of 'rlark get resource resource/<name>'): {slashed:?}"
            );
        }
        return Ok(kind_list(first)?
            .into_iter()
            .map(|kind| KindNames {
                kind,
                names: rest.to_vec(),
            })
            .collect());
    }
    let mut groups: Vec<KindNames> = Vec::new();
    for arg in std::iter::once(first).chain(rest.iter().map(String::as_str)) {
        let Some((kind, name)) = arg.split_once('/') else {
            bail!("{arg:?} must be KIND/NAME like {first:?}");
        };
        if kind.is_empty() || kind.contains(',') {
            bail!(
                "invalid argument {arg:?}: arguments in resource/name form must have a \
                 single resource and name"
            );
        }
        let name = checked_name(arg, name)?;
        let kind = kind.to_lowercase();
        match groups.iter_mut().find(|g| g.kind == kind) {
            Some(group) => group.names.push(name),
            None => groups.push(KindNames {
                kind,
                names: vec![name],
            }),
        }
    }
    Ok(groups)
}

/// One kind of a `get` command line and the names asked for (empty: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KindNames {
    pub kind: String,
    pub names: Vec<String>,
}

/// `jobs,tasks`: the kinds, each once, none empty.
fn kind_list(text: &str) -> anyhow::Result<Vec<String>> {
    let mut kinds: Vec<String> = Vec::new();
    for kind in text.split(',') {
        let kind = kind.trim();
        if kind.is_empty() {
            bail!("{text:?} has an empty resource type: list kinds as KIND,KIND (e.g. jobs,tasks)");
        }
        if !kinds.iter().any(|k| k.eq_ignore_ascii_case(kind)) {
            kinds.push(kind.to_string());
        }
    }
    Ok(kinds)
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

    fn group(kind: &str, names: &[&str]) -> KindNames {
        KindNames {
            kind: kind.to_string(),
            names: strings(names),
        }
    }

    #[test]
    fn both_forms_name_the_same_objects() {
        assert_eq!(
            kind_groups("task", &strings(&["a", "b"])).unwrap(),
            [group("task", &["a", "b"])]
        );
        assert_eq!(
            kind_groups("task/a", &strings(&["task/b", "TASK/c"])).unwrap(),
            [group("task", &["a", "b", "c"])]
        );
        assert_eq!(kind_groups("jobs", &[]).unwrap(), [group("jobs", &[])]);
        let err = kind_groups("task/a", &strings(&["b"])).unwrap_err();
        assert!(err.to_string().contains("must be KIND/NAME"), "{err}");
        let err = kind_groups("task", &strings(&["task/b"])).unwrap_err();
        assert!(err.to_string().contains("no need to specify"), "{err}");
        assert!(kind_groups("task/", &[]).is_err());
        assert!(kind_groups("task/a/b", &[]).is_err());
    }

    #[test]
    fn several_kinds_are_listed_in_turn() {
        assert_eq!(
            kind_groups("jobs,tasks", &[]).unwrap(),
            [group("jobs", &[]), group("tasks", &[])]
        );
        assert_eq!(
            kind_groups("jobs,tasks,jobs", &strings(&["x"])).unwrap(),
            [group("jobs", &["x"]), group("tasks", &["x"])]
        );
        assert_eq!(
            kind_groups("job/a", &strings(&["task/b", "job/c"])).unwrap(),
            [group("job", &["a", "c"]), group("task", &["b"])]
        );
        let err = kind_groups("jobs,", &[]).unwrap_err().to_string();
        assert_eq!(
            err,
            "\"jobs,\" has an empty resource type: list kinds as KIND,KIND (e.g. jobs,tasks)"
        );
        let err = kind_groups("job,task/a", &[]).unwrap_err().to_string();
        assert!(err.contains("single resource and name"), "{err}");
    }

    #[test]
    fn single_targets_join_kind_and_name() {
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
