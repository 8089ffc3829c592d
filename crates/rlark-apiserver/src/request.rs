//! Request coordinates: the URL path names a resource (and maybe a namespace, an object
//! and a subresource), the query string carries Kubernetes' list/watch/write options, and
//! the two together with the method give the verb.

use std::sync::Arc;

use http::{Method, Uri};

use crate::error::ApiError;
use crate::registry::{Registry, ResourceType};

/// What a resource URL addresses.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub rt: Arc<ResourceType>,
    /// Namespace from the URL (`/namespaces/{ns}/...`); `None` for cluster-scoped kinds and
    /// for cluster-wide lists of namespaced kinds.
    pub namespace: Option<String>,
    /// Object name; `None` addresses the collection.
    pub name: Option<String>,
    /// The `/status` subresource.
    pub status: bool,
    /// Any other subresource (`log` and `exec` of stored core Pods, `scale` of kinds that
    /// have it).
    pub subresource: Option<Subresource>,
}

/// A subresource other than `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subresource {
    /// `pods/{name}/log`: read only.
    Log,
    /// `{workload}/{name}/scale`: get, update, patch.
    Scale,
    /// `pods/{name}/exec`: a WebSocket upgrade (stored core Pods only).
    Exec,
}

impl Subresource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Subresource::Log => "log",
            Subresource::Scale => "scale",
            Subresource::Exec => "exec",
        }
    }
}

/// The Kubernetes verb of a request (the `verb` label of metrics and audit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// The verb for `method` on `target`, or 405 when the URL does not support the method
    /// (writes on the cluster-wide collection of a namespaced kind, POST to an object, ...).
    pub(crate) fn of(method: &Method, target: &Target, query: &Query) -> Result<Self, ApiError> {
        let collection = target.name.is_none();
        // Only list/watch are served on the all-namespaces URL of a namespaced kind.
        let all_namespaces = target.rt.namespaced && target.namespace.is_none();
        let verb = match target.subresource {
            Some(sub) => match *method {
                Method::GET if !query.watch => Some(Verb::Get),
                Method::PUT if sub == Subresource::Scale => Some(Verb::Update),
                Method::PATCH if sub == Subresource::Scale => Some(Verb::Patch),
                _ => None,
            },
            None => match *method {
                Method::GET if query.watch => Some(Verb::Watch),
                Method::GET if collection => Some(Verb::List),
                Method::GET => Some(Verb::Get),
                Method::POST if collection && !all_namespaces && !target.status => {
                    Some(Verb::Create)
                }
                Method::PUT if !collection => Some(Verb::Update),
                Method::PATCH if !collection => Some(Verb::Patch),
                Method::DELETE if !collection && !target.status => Some(Verb::Delete),
                Method::DELETE if collection && !all_namespaces => Some(Verb::DeleteCollection),
                _ => None,
            },
        };
        verb.ok_or_else(|| {
            ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({} {})",
                method,
                target.rt.qualified_name()
            ))
        })
    }
}

/// The 404 of a URL that names no served resource, worded as kube-apiserver words it.
fn no_such_resource(group: &str, resource: &str) -> ApiError {
    let mut error = ApiError::path_not_found("the server could not find the requested resource");
    error.group = Some(group.to_string());
    error.kind = Some(resource.to_string());
    error
}

/// Parse a resource path:
/// - `/api/v1/{plural}[/{name}[/{sub}]]`, `/api/v1/namespaces/{ns}/{plural}[/{name}[/{sub}]]`
///   (and the Namespace object itself at `/api/v1/namespaces/{name}[/status]`);
/// - `/apis/{group}/{version}/...` with the same shapes.
///
/// Unknown group/version/resource, a namespaced URL for a cluster-scoped kind, an object URL
/// without namespace for a namespaced kind, and unknown subresources are all 404.
pub(crate) fn parse_path(registry: &Registry, path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(no_such_resource("", "")),
    };
    if rest.iter().any(|s| s.is_empty()) {
        return Err(no_such_resource(group, ""));
    }
    // `/namespaces/{x}` followed by nothing or a subresource of Namespace addresses the
    // Namespace object; followed by a resource name it is a namespace prefix.
    let namespace_object = group.is_empty()
        && matches!(
            rest,
            ["namespaces", _] | ["namespaces", _, "status" | "finalize"]
        );
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() && !namespace_object => (Some(*ns), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(no_such_resource(group, rest.first().copied().unwrap_or(""))),
    };
    let rt = registry
        .get(group, version, plural)
        .ok_or_else(|| no_such_resource(group, plural))?;
    if namespace.is_some() && !rt.namespaced {
        return Err(no_such_resource(group, plural));
    }
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(no_such_resource(group, plural));
    }
    let (status, subresource) = match sub {
        None => (false, None),
        Some("status") if rt.status_subresource => (true, None),
        Some("log") if rt.log_subresource => (false, Some(Subresource::Log)),
        Some("exec") if rt.log_subresource => (false, Some(Subresource::Exec)),
        Some("scale") if rt.scale_subresource => (false, Some(Subresource::Scale)),
        Some(sub) => return Err(no_such_resource(group, &format!("{plural}/{sub}"))),
    };
    Ok(Target {
        rt,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        status,
        subresource,
    })
}

/// `metav1.ListOptions`, `CreateOptions`, `UpdateOptions`, `PatchOptions` and the query form of
/// `DeleteOptions`, as far as this server honours them. Unknown parameters are ignored, as
/// kube-apiserver ignores them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Query {
    pub watch: bool,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// 0 = no limit.
    pub limit: u64,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    /// `dryRun=All`.
    pub dry_run: bool,
    pub field_validation: Option<String>,
    pub propagation_policy: Option<String>,
}

fn bad_param(name: &str, value: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("{name}: Invalid value: {value:?}: {why}"))
}

/// Go's `strconv.ParseBool`, which kube-apiserver uses for boolean parameters.
fn parse_bool(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(bad_param(name, value, "must be a boolean")),
    }
}

fn parse_u64(name: &str, value: &str) -> Result<u64, ApiError> {
    value
        .parse()
        .map_err(|_| bad_param(name, value, "must be a non-negative integer"))
}

/// Parse the query string. Empty pairs are skipped (kube-rs sends `?&limit=500`), empty
/// values count as absent, and repeated parameters keep the last value (except `dryRun`,
/// where every value must be `All`).
pub(crate) fn parse_query(uri: &Uri) -> Result<Query, ApiError> {
    let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?
        .0;
    let mut query = Query::default();
    for (key, value) in pairs {
        if value.is_empty() {
            continue;
        }
        match key.as_str() {
            "watch" => query.watch = parse_bool(&key, &value)?,
            "labelSelector" => query.label_selector = Some(value),
            "fieldSelector" => query.field_selector = Some(value),
            "limit" => query.limit = parse_u64(&key, &value)?,
            "continue" => query.continue_token = Some(value),
            "resourceVersion" => query.resource_version = Some(value),
            "resourceVersionMatch" => query.resource_version_match = Some(value),
            "timeoutSeconds" => query.timeout_seconds = Some(parse_u64(&key, &value)?),
            "allowWatchBookmarks" => query.allow_watch_bookmarks = parse_bool(&key, &value)?,
            "sendInitialEvents" => query.send_initial_events = Some(parse_bool(&key, &value)?),
            "dryRun" if value == "All" => query.dry_run = true,
            "dryRun" => {
                return Err(ApiError::bad_request(format!(
                    "dryRun: Unsupported value: {value:?}: supported values: \"All\""
                )));
            }
            "fieldValidation" => query.field_validation = Some(value),
            "propagationPolicy" => query.propagation_policy = Some(value),
            _ => {}
        }
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry::builtin()
    }

    fn target(path: &str) -> Result<Target, ApiError> {
        parse_path(&registry(), path)
    }

    #[test]
    fn core_namespace_paths() {
        let t = target("/api/v1/namespaces").unwrap();
        assert_eq!(
            (t.rt.plural.as_str(), t.namespace, t.name, t.status),
            ("namespaces", None, None, false)
        );
        let t = target("/api/v1/namespaces/dev").unwrap();
        assert_eq!((t.namespace, t.name.as_deref()), (None, Some("dev")));
        let t = target("/api/v1/namespaces/dev/status").unwrap();
        assert_eq!((t.name.as_deref(), t.status), (Some("dev"), true));
        // Namespaces are cluster-scoped: no namespace prefix for them.
        assert_eq!(
            target("/api/v1/namespaces/dev/namespaces")
                .unwrap_err()
                .code,
            404
        );
        assert_eq!(
            target("/api/v1/namespaces/dev/finalize").unwrap_err().code,
            404
        );
        assert_eq!(target("/api/v1/widgets").unwrap_err().code, 404);
        assert_eq!(target("/api/v2/namespaces").unwrap_err().code, 404);
    }

    #[test]
    fn group_paths_and_scope() {
        let t = target("/apis/coordination.k8s.io/v1/namespaces/kube/leases/l1").unwrap();
        assert_eq!(
            (
                t.rt.kind.as_str(),
                t.namespace.as_deref(),
                t.name.as_deref()
            ),
            ("Lease", Some("kube"), Some("l1"))
        );
        let t = target("/apis/coordination.k8s.io/v1/leases").unwrap();
        assert_eq!((t.namespace, t.name), (None, None));
        // An object of a namespaced kind needs its namespace.
        assert_eq!(
            target("/apis/coordination.k8s.io/v1/leases/l1")
                .unwrap_err()
                .code,
            404
        );
        let t = target("/apis/rlinf.io/v1alpha1/jobs/j1/status").unwrap();
        assert_eq!((t.rt.kind.as_str(), t.status), ("Job", true));
        // Jobs are cluster-scoped: a namespaced URL is 404.
        let error = target("/apis/rlinf.io/v1alpha1/namespaces/default/jobs").unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            (404, "the server could not find the requested resource")
        );
        // Leases have no status subresource.
        assert_eq!(
            target("/apis/coordination.k8s.io/v1/namespaces/a/leases/l/status")
                .unwrap_err()
                .code,
            404
        );
        let error = target("/apis/rlinf.io/v1alpha1/gadgets").unwrap_err();
        assert_eq!(error.status()["details"]["kind"], "gadgets");
        assert_eq!(target("/apis/rlinf.io/v9/jobs").unwrap_err().code, 404);
        assert_eq!(
            target("/apis/rlinf.io/v1alpha1/jobs/a/b/c")
                .unwrap_err()
                .code,
            404
        );
        assert_eq!(
            target("/apis/rlinf.io/v1alpha1/jobs//status")
                .unwrap_err()
                .code,
            404
        );
    }

    #[test]
    fn verbs_follow_method_and_url() {
        let q = Query::default();
        let watch = Query {
            watch: true,
            ..Query::default()
        };
        let jobs = target("/apis/rlinf.io/v1alpha1/jobs").unwrap();
        let job = target("/apis/rlinf.io/v1alpha1/jobs/j").unwrap();
        let all_leases = target("/apis/coordination.k8s.io/v1/leases").unwrap();
        assert_eq!(Verb::of(&Method::GET, &jobs, &q).unwrap(), Verb::List);
        assert_eq!(Verb::of(&Method::GET, &jobs, &watch).unwrap(), Verb::Watch);
        assert_eq!(Verb::of(&Method::GET, &job, &q).unwrap(), Verb::Get);
        assert_eq!(Verb::of(&Method::POST, &jobs, &q).unwrap(), Verb::Create);
        assert_eq!(Verb::of(&Method::PUT, &job, &q).unwrap(), Verb::Update);
        assert_eq!(Verb::of(&Method::PATCH, &job, &q).unwrap(), Verb::Patch);
        assert_eq!(Verb::of(&Method::DELETE, &job, &q).unwrap(), Verb::Delete);
        assert_eq!(
            Verb::of(&Method::DELETE, &jobs, &q).unwrap(),
            Verb::DeleteCollection
        );
        assert_eq!(Verb::of(&Method::POST, &job, &q).unwrap_err().code, 405);
        assert_eq!(Verb::of(&Method::PUT, &jobs, &q).unwrap_err().code, 405);
        assert_eq!(Verb::of(&Method::HEAD, &job, &q).unwrap_err().code, 405);
        assert_eq!(
            Verb::of(&Method::POST, &all_leases, &q).unwrap_err().code,
            405
        );
        assert_eq!(
            Verb::of(&Method::GET, &all_leases, &watch).unwrap(),
            Verb::Watch
        );
    }

    #[test]
    fn query_like_kube_rs_sends_it() {
        let uri: Uri = "/apis/rlinf.io/v1alpha1/jobs?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=12&labelSelector=a+in+%28x%2C+y%29"
            .parse()
            .unwrap();
        let q = parse_query(&uri).unwrap();
        assert!(q.watch && q.allow_watch_bookmarks);
        assert_eq!(q.timeout_seconds, Some(290));
        assert_eq!(q.resource_version.as_deref(), Some("12"));
        assert_eq!(q.label_selector.as_deref(), Some("a in (x, y)"));
        let q = parse_query(&"/x?&limit=500&continue=&dryRun=All".parse().unwrap()).unwrap();
        assert_eq!((q.limit, q.continue_token, q.dry_run), (500, None, true));
        assert_eq!(
            parse_query(&"/x".parse().unwrap()).unwrap(),
            Query::default()
        );
    }

    #[test]
    fn bad_query_values_are_400() {
        for bad in [
            "/x?watch=yes",
            "/x?limit=-1",
            "/x?timeoutSeconds=abc",
            "/x?dryRun=Some",
        ] {
            let error = parse_query(&bad.parse().unwrap()).unwrap_err();
            assert_eq!(error.code, 400, "{bad}");
        }
    }
}
