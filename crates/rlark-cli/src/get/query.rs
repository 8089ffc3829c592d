//! What one kind of a `rlark get` command line reads: the collection, or the named objects
//! found in their namespaces.

use crate::client::Session;
use crate::discovery::ResourceInfo;
use crate::names;

/// One kind to read: its collection (`namespace` `None` = all namespaces), or the named
/// objects, each with the collection path of its namespace.
pub(crate) struct Query<'a> {
    pub info: &'a ResourceInfo,
    pub namespace: Option<String>,
    /// The collection's URL path.
    pub path: String,
    /// Names were given: only `targets` are read (those found).
    pub named: bool,
    /// `(name, collection path of its namespace)`.
    pub targets: Vec<(String, String)>,
}

impl<'a> Query<'a> {
    /// The query for `names` of `info` (none: the collection). Without -n, namespaced
    /// objects are listed (and found by name) across namespaces: rlark keeps them in agent
    /// namespaces, never in `default` (see [`names`]). A name that cannot be found is
    /// reported on stderr and counted in `errors`.
    pub(crate) async fn new(
        session: &Session,
        info: &'a ResourceInfo,
        names: &[String],
        all_namespaces: bool,
        errors: &mut usize,
    ) -> Query<'a> {
        let namespace = match (info.namespaced, all_namespaces) {
            (true, false) if session.namespace_explicit => Some(session.namespace.clone()),
            _ => None,
        };
        let path = info.collection_path(namespace.as_deref());
        let mut targets = Vec::new();
        for name in names {
            if !info.namespaced || namespace.is_some() {
                targets.push((name.clone(), path.clone()));
                continue;
            }
            match names::locate(&session.client, info, name, None).await {
                Ok(ns) => targets.push((name.clone(), info.collection_path(Some(&ns)))),
                Err(error) => {
                    if let Some(message) = crate::client::report(&error) {
                        eprintln!("{message}");
                    }
                    *errors += 1;
                }
            }
        }
        Query {
            info,
            namespace,
            path,
            named: !names.is_empty(),
            targets,
        }
    }

    /// `kubectl`'s message for an empty listing of this query.
    pub(crate) fn nothing_found(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("No resources found in {ns} namespace."),
            None => "No resources found".to_string(),
        }
    }
}
