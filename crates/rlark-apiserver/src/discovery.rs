//! API discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}`,
//! `/apis/{group}/{version}`.
//!
//! Two formats, chosen by `Accept` as kube-apiserver chooses them:
//!
//! - **aggregated** (`apidiscovery.k8s.io/v2` or `v2beta1` `APIGroupDiscoveryList`) on `/api`
//!   and `/apis`: every group, version and resource in one document. kubectl 1.32 and
//!   client-go ask for this first (`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,…`)
//!   and skip the per-group-version requests when they get it;
//! - **legacy** (`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`) for everyone
//!   else (the Python client, kube-rs, older tools).
//!
//! The registry is fixed once the router is built, so every document is rendered once up
//! front; requests only choose one and answer `304 Not Modified` to a matching
//! `If-None-Match`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::registry::{Registry, ResourceType};

/// The Kubernetes version this server reports. kubectl warns when the server is more than
/// one minor version away from it; our kubectl is 1.32 and k8s-openapi's oldest API is 1.33.
pub const KUBERNETES_VERSION: &str = "v1.33.0";
const KUBERNETES_MINOR: &str = "33";

/// Verbs of every main resource (the CRUD handlers serve all of them for every kind).
const RESOURCE_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Verbs of a `/status` subresource.
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];
/// Verbs of a `/log` subresource (core Pods).
const LOG_VERBS: [&str; 1] = ["get"];
/// Verbs of a read-only projection ([`crate::replicas`]).
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];
/// Verbs of the replica Pods' `/exec` (served by the server process through the tunnel).
const EXEC_VERBS: [&str; 2] = ["create", "get"];

/// Verbs of `t`'s main resource.
fn verbs(t: &ResourceType) -> &'static [&'static str] {
    if t.projection.is_some() {
        &READ_VERBS
    } else {
        &RESOURCE_VERBS
    }
}

/// Subresources besides status and scale, with their verbs: `log` and `exec` of core Pods
/// stored as objects (an extra kind with `log_subresource`) and of the replica projection
/// (answered outside this crate there).
fn pod_subresources(t: &ResourceType) -> Vec<(&'static str, &'static [&'static str])> {
    if t.log_subresource || t.projection.is_some() {
        vec![("log", &LOG_VERBS), ("exec", &EXEC_VERBS)]
    } else {
        Vec::new()
    }
}

/// Serves the discovery endpoints listed in the module docs, and nothing deeper (resource
/// URLs belong to the CRUD handlers' fallback). Unknown groups or versions get a 404 `Status`.
pub fn router(registry: Arc<Registry>) -> Router {
    let docs = Arc::new(Documents::build(&registry));
    Router::new()
        .route("/version", get(version))
        .route("/api", get(api))
        .route("/api/v1", get(core_v1))
        .route("/apis", get(apis))
        .route("/apis/{group}", get(group))
        .route("/apis/{group}/{version}", get(group_version))
        .with_state(docs)
}

/// A rendered JSON document with its entity tag.
#[derive(Clone, Debug)]
pub(crate) struct Document {
    pub(crate) body: Bytes,
    /// Quoted, as it goes into `ETag`.
    pub(crate) etag: String,
}

impl Document {
    /// Render `value`; the tag is a SHA-256 of the bytes, so it changes exactly when they do.
    pub(crate) fn new(value: &Value) -> Self {
        let body = Bytes::from(value.to_string());
        let etag = format!("\"{}\"", hex::encode_upper(Sha256::digest(&body)));
        Self { body, etag }
    }

    /// 200 with the body (or 304 when `If-None-Match` names our tag), `Content-Type` as given.
    pub(crate) fn respond(&self, request: &HeaderMap, content_type: &'static str) -> Response {
        let not_modified = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|tag| {
                let tag = tag.trim();
                tag == "*" || tag.trim_start_matches("W/") == self.etag
            });
        let mut response = if not_modified {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            let mut response = self.body.clone().into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        };
        // The tag is hex in quotes, always a valid header value.
        if let Ok(etag) = HeaderValue::from_str(&self.etag) {
            response.headers_mut().insert(header::ETAG, etag);
        }
        response
    }
}

/// One entry of an `Accept` header.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaRange {
    /// `type/subtype`, lowercase (e.g. `application/json`, `*/*`).
    pub essence: String,
    /// Parameters other than `q`, names lowercase, values unquoted, in header order.
    pub params: Vec<(String, String)>,
    /// Quality, 0..=1 (default 1).
    pub q: f32,
}

impl MediaRange {
    /// Value of parameter `name` (lowercase).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is exactly `type_/subtype` (no wildcards).
    pub fn matches_type(&self, type_: &str, subtype: &str) -> bool {
        self.essence.split_once('/') == Some((type_, subtype))
    }

    /// Whether a JSON response satisfies this range if its parameters are acceptable:
    /// `application/json`, `application/*` or `*/*`.
    pub fn accepts_json(&self) -> bool {
        matches!(
            self.essence.as_str(),
            "application/json" | "application/*" | "*/*"
        )
    }
}

/// The media ranges of every `Accept` header of a request, most preferred first: sorted by
/// `q` (stable, so ties keep header order), ranges with `q=0` dropped. Empty when the
/// request has no `Accept`, which means "anything".
pub fn accepted_media_ranges(headers: &HeaderMap) -> Vec<MediaRange> {
    let mut ranges: Vec<MediaRange> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(parse_media_range)
        .filter(|r| r.q > 0.0)
        .collect();
    ranges.sort_by(|a, b| b.q.total_cmp(&a.q));
    ranges
}

fn parse_media_range(text: &str) -> Option<MediaRange> {
    let mut parts = text.split(';');
    let essence = parts.next()?.trim().to_ascii_lowercase();
    if !essence.contains('/') {
        return None;
    }
    let mut params = Vec::new();
    let mut q = 1.0;
    for part in parts {
        let Some((name, value)) = part.split_once('=') else {
            continue;
        };
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim().trim_matches('"').to_string();
        if name == "q" {
            q = value.parse::<f32>().unwrap_or(1.0).clamp(0.0, 1.0);
        } else {
            params.push((name, value));
        }
    }
    Some(MediaRange { essence, params, q })
}

/// Which discovery format a request negotiates for `/api` and `/apis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Legacy,
    Aggregated(AggregatedVersion),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AggregatedVersion {
    V2,
    V2beta1,
}

impl AggregatedVersion {
    /// Position in the per-version document arrays of [`Documents`].
    fn index(self) -> usize {
        match self {
            Self::V2 => 0,
            Self::V2beta1 => 1,
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Self::V2 => "apidiscovery.k8s.io/v2",
            Self::V2beta1 => "apidiscovery.k8s.io/v2beta1",
        }
    }

    /// The response `Content-Type`; client-go reads its parameters to pick the decoder.
    fn content_type(self) -> &'static str {
        match self {
            Self::V2 => "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            Self::V2beta1 => {
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            }
        }
    }
}

/// The first acceptable range decides. Aggregated ranges may carry `profile=nopeer`
/// (newer client-go): we have no peer servers, so that profile is what we serve anyway.
/// Anything unusable falls through to the legacy format rather than 406, because every
/// discovery client understands it.
fn negotiate(headers: &HeaderMap) -> Format {
    for range in accepted_media_ranges(headers) {
        if !range.accepts_json() {
            continue;
        }
        match range.param("as") {
            None => return Format::Legacy,
            Some("APIGroupDiscoveryList") => {
                let profile_ok = matches!(range.param("profile"), None | Some("nopeer"));
                if range.param("g") != Some("apidiscovery.k8s.io") || !profile_ok {
                    continue;
                }
                match range.param("v") {
                    Some("v2") => return Format::Aggregated(AggregatedVersion::V2),
                    Some("v2beta1") => return Format::Aggregated(AggregatedVersion::V2beta1),
                    _ => {}
                }
            }
            Some(_) => {}
        }
    }
    Format::Legacy
}

/// Every discovery response, rendered.
struct Documents {
    version: Document,
    /// `/api` legacy `APIVersions`.
    api_versions: Document,
    /// `/api/v1` `APIResourceList`.
    core_v1: Document,
    /// `/apis` legacy `APIGroupList`.
    group_list: Document,
    /// `/apis/{group}` `APIGroup`.
    groups: HashMap<String, Document>,
    /// `/apis/{group}/{version}` `APIResourceList`.
    group_versions: HashMap<(String, String), Document>,
    /// `/api` aggregated, per version.
    aggregated_core: [Document; 2],
    /// `/apis` aggregated, per version.
    aggregated_groups: [Document; 2],
}

impl Documents {
    fn build(registry: &Registry) -> Self {
        let core: Vec<&Arc<ResourceType>> = registry
            .all()
            .iter()
            .filter(|t| t.group.is_empty())
            .collect();
        let core_v1: Vec<&Arc<ResourceType>> =
            core.iter().copied().filter(|t| t.version == "v1").collect();

        let mut core_versions: Vec<String> = Vec::new();
        for t in &core {
            if !core_versions.contains(&t.version) {
                core_versions.push(t.version.clone());
            }
        }

        let groups = registry.groups();
        let group_entries: Vec<Value> = groups
            .iter()
            .map(|(g, versions)| api_group(g, versions))
            .collect();

        let mut group_docs = HashMap::new();
        let mut group_version_docs = HashMap::new();
        for ((name, versions), entry) in groups.iter().zip(&group_entries) {
            let mut group = entry.clone();
            group["kind"] = json!("APIGroup");
            group["apiVersion"] = json!("v1");
            group_docs.insert(name.clone(), Document::new(&group));
            for version in versions {
                let types: Vec<&Arc<ResourceType>> = registry
                    .all()
                    .iter()
                    .filter(|t| &t.group == name && &t.version == version)
                    .collect();
                let list = resource_list(&format!("{name}/{version}"), &types);
                group_version_docs.insert((name.clone(), version.clone()), Document::new(&list));
            }
        }

        let aggregated = |version: AggregatedVersion, items: Vec<Value>| {
            Document::new(&json!({
                "kind": "APIGroupDiscoveryList",
                "apiVersion": version.api_version(),
                "metadata": {},
                "items": items,
            }))
        };
        let core_item = || vec![discovery_group("", &core_versions, registry)];
        let group_items = || {
            groups
                .iter()
                .map(|(g, versions)| discovery_group(g, versions, registry))
                .collect::<Vec<_>>()
        };

        Self {
            version: Document::new(&version_info()),
            api_versions: Document::new(&json!({
                "kind": "APIVersions",
                "versions": core_versions,
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
            })),
            core_v1: Document::new(&resource_list("v1", &core_v1)),
            group_list: Document::new(&json!({
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": group_entries,
            })),
            groups: group_docs,
            group_versions: group_version_docs,
            aggregated_core: [
                aggregated(AggregatedVersion::V2, core_item()),
                aggregated(AggregatedVersion::V2beta1, core_item()),
            ],
            aggregated_groups: [
                aggregated(AggregatedVersion::V2, group_items()),
                aggregated(AggregatedVersion::V2beta1, group_items()),
            ],
        }
    }
}

/// What the build knows of itself, for `/version`: set once by the binary
/// ([`set_build_info`]); a server in a test process reports an empty commit and the epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildInfo {
    /// The git commit the binary was built from (empty when unknown).
    pub git_commit: String,
    /// The build date, RFC 3339 (the commit's date unless `SOURCE_DATE_EPOCH` said
    /// otherwise).
    pub build_date: String,
}

static BUILD_INFO: std::sync::OnceLock<BuildInfo> = std::sync::OnceLock::new();

/// Set the build information `/version` reports; the first call wins.
pub fn set_build_info(info: BuildInfo) {
    let _ = BUILD_INFO.set(info);
}

/// `version.Info` as kube-apiserver reports it; kubectl compares `major`/`minor` with its own.
fn version_info() -> Value {
    let build = BUILD_INFO.get().cloned().unwrap_or_default();
    let build_date = if build.build_date.is_empty() {
        "1970-01-01T00:00:00Z".to_string()
    } else {
        build.build_date
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    json!({
        "major": "1",
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("{KUBERNETES_VERSION}+rlark-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": build.git_commit,
        "gitTreeState": "",
        "buildDate": build_date,
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{arch}", std::env::consts::OS),
    })
}

/// An `APIGroup` entry (without kind/apiVersion, as inside `APIGroupList`).
fn api_group(name: &str, versions: &[String]) -> Value {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": entries,
        // The registry lists versions in registration order; the first is preferred.
        "preferredVersion": entries.first().cloned().unwrap_or(Value::Null),
    })
}

/// A legacy `APIResourceList` for one group/version.
fn resource_list(group_version: &str, types: &[&Arc<ResourceType>]) -> Value {
    let mut resources = Vec::new();
    for t in types {
        let mut resource = json!({
            "name": t.plural,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": verbs(t),
        });
        if !t.short_names.is_empty() {
            resource["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            resource["categories"] = json!(t.categories);
        }
        resource["storageVersionHash"] = json!(storage_version_hash(t));
        resources.push(resource);
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": STATUS_VERBS,
            }));
        }
        for (sub, sub_verbs) in pod_subresources(t) {
            resources.push(json!({
                "name": format!("{}/{sub}", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": sub_verbs,
            }));
        }
        if t.scale_subresource {
            resources.push(json!({
                "name": format!("{}/scale", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": STATUS_VERBS,
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

/// One `APIGroupDiscovery` item of the aggregated format.
fn discovery_group(name: &str, versions: &[String], registry: &Registry) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| {
            let resources: Vec<Value> = registry
                .all()
                .iter()
                .filter(|t| t.group == name && &t.version == version)
                .map(|t| discovery_resource(t))
                .collect();
            json!({"version": version, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({
        "metadata": {"name": name, "creationTimestamp": null},
        "versions": versions,
    })
}

fn discovery_resource(t: &ResourceType) -> Value {
    let response_kind = json!({"group": t.group, "version": t.version, "kind": t.kind});
    let mut resource = json!({
        "resource": t.plural,
        "responseKind": response_kind,
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.singular,
        "verbs": verbs(t),
    });
    if !t.short_names.is_empty() {
        resource["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        resource["categories"] = json!(t.categories);
    }
    let mut subresources = Vec::new();
    if t.status_subresource {
        subresources.push(json!({
            "subresource": "status",
            "responseKind": response_kind,
            "verbs": STATUS_VERBS,
        }));
    }
    for (sub, sub_verbs) in pod_subresources(t) {
        subresources.push(json!({
            "subresource": sub,
            "responseKind": {"group": "", "version": "v1", "kind": "Pod"},
            "verbs": sub_verbs,
        }));
    }
    if t.scale_subresource {
        subresources.push(json!({
            "subresource": "scale",
            "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
            "verbs": STATUS_VERBS,
        }));
    }
    if !subresources.is_empty() {
        resource["subresources"] = json!(subresources);
    }
    resource
}

/// kube's `StorageVersionHash`: base64 of the first 8 bytes of SHA-256(`group/version/kind`).
/// Clients only compare it for equality (to notice storage migrations).
fn storage_version_hash(t: &ResourceType) -> String {
    let digest = Sha256::digest(format!("{}/{}/{}", t.group, t.version, t.kind).as_bytes());
    base64_standard(&digest[..8])
}

/// Standard base64 with padding (RFC 4648 §4); avoids a dependency for 8 bytes.
fn base64_standard(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn not_found() -> Response {
    ApiError::path_not_found("the server could not find the requested resource").into_response()
}

/// Aggregated responses vary by `Accept`; caches must not mix the two formats.
fn with_vary(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    response
}

async fn version(State(docs): State<Arc<Documents>>, headers: HeaderMap) -> Response {
    docs.version.respond(&headers, "application/json")
}

async fn api(State(docs): State<Arc<Documents>>, headers: HeaderMap) -> Response {
    with_vary(match negotiate(&headers) {
        Format::Aggregated(v) => {
            docs.aggregated_core[v.index()].respond(&headers, v.content_type())
        }
        Format::Legacy => docs.api_versions.respond(&headers, "application/json"),
    })
}

async fn core_v1(State(docs): State<Arc<Documents>>, headers: HeaderMap) -> Response {
    docs.core_v1.respond(&headers, "application/json")
}

async fn apis(State(docs): State<Arc<Documents>>, headers: HeaderMap) -> Response {
    with_vary(match negotiate(&headers) {
        Format::Aggregated(v) => {
            docs.aggregated_groups[v.index()].respond(&headers, v.content_type())
        }
        Format::Legacy => docs.group_list.respond(&headers, "application/json"),
    })
}

async fn group(
    State(docs): State<Arc<Documents>>,
    Path(group): Path<String>,
    headers: HeaderMap,
) -> Response {
    match docs.groups.get(&group) {
        Some(doc) => doc.respond(&headers, "application/json"),
        None => not_found(),
    }
}

async fn group_version(
    State(docs): State<Arc<Documents>>,
    Path((group, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    match docs.group_versions.get(&(group, version)) {
        Some(doc) => doc.respond(&headers, "application/json"),
        None => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    const KUBECTL_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    /// Building the registry and documents takes a while in debug builds; share one router.
    fn app() -> Router {
        static APP: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
        APP.get_or_init(|| router(Arc::new(Registry::builtin())))
            .clone()
    }

    async fn get(path: &str, accept: Option<&str>) -> (StatusCode, HeaderMap, Value) {
        let mut request = Request::get(path);
        if let Some(accept) = accept {
            request = request.header(header::ACCEPT, accept);
        }
        let response = app()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        (status, headers, value)
    }

    #[test]
    fn media_ranges_parse_and_sort() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "text/plain;q=0.2, application/json ;as=Table; v=v1;g=\"meta.k8s.io\", */*;q=0",
            ),
        );
        let ranges = accepted_media_ranges(&headers);
        assert_eq!(ranges.len(), 2);
        assert_eq!(ranges[0].essence, "application/json");
        assert_eq!(ranges[0].param("g"), Some("meta.k8s.io"));
        assert_eq!(ranges[1].essence, "text/plain");
        assert!(ranges[1].q < 0.3);
    }

    #[test]
    fn negotiation() {
        let headers = |accept: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
            h
        };
        assert_eq!(
            negotiate(&headers(KUBECTL_ACCEPT)),
            Format::Aggregated(AggregatedVersion::V2)
        );
        assert_eq!(
            negotiate(&headers(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            )),
            Format::Aggregated(AggregatedVersion::V2beta1)
        );
        assert_eq!(
            negotiate(&headers(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer"
            )),
            Format::Aggregated(AggregatedVersion::V2)
        );
        assert_eq!(
            negotiate(&headers(
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
            )),
            Format::Legacy
        );
        assert_eq!(negotiate(&headers("application/json")), Format::Legacy);
        assert_eq!(negotiate(&HeaderMap::new()), Format::Legacy);
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        assert_eq!(base64_standard(b""), "");
        assert_eq!(base64_standard(b"f"), "Zg==");
        assert_eq!(base64_standard(b"fo"), "Zm8=");
        assert_eq!(base64_standard(b"foo"), "Zm9v");
        assert_eq!(base64_standard(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_standard(&[0xff; 8]), "//////////8=");
    }

    #[tokio::test]
    async fn version_is_1_33() {
        let (status, _, body) = get("/version", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["major"], "1");
        assert_eq!(body["minor"], "33");
        assert!(
            body["gitVersion"]
                .as_str()
                .unwrap()
                .starts_with("v1.33.0+rlark-")
        );
    }

    #[tokio::test]
    async fn legacy_documents() {
        let (_, _, api) = get("/api", None).await;
        assert_eq!(api["kind"], "APIVersions");
        assert_eq!(api["versions"], json!(["v1"]));

        let (_, _, core) = get("/api/v1", Some("application/json")).await;
        assert_eq!(core["groupVersion"], "v1");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "namespaces",
                "namespaces/status",
                "events",
                "pods",
                "pods/log",
                "pods/exec"
            ]
        );
        // Core Pods are the read-only view of rlark's replicas.
        assert_eq!(core["resources"][3]["verbs"], json!(READ_VERBS));
        assert_eq!(core["resources"][5]["verbs"], json!(EXEC_VERBS));
        assert_eq!(core["resources"][0]["shortNames"], json!(["ns"]));
        assert_eq!(core["resources"][0]["namespaced"], false);
        assert_eq!(
            core["resources"][1]["verbs"],
            json!(["get", "patch", "update"])
        );

        let (_, _, apis) = get("/apis", None).await;
        assert_eq!(apis["kind"], "APIGroupList");
        let groups: Vec<&str> = apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert!(
            groups.contains(&"rlinf.io") && groups.contains(&"coordination.k8s.io"),
            "{groups:?}"
        );
        let rlinf = apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "rlinf.io")
            .unwrap();
        assert_eq!(
            rlinf["preferredVersion"],
            json!({"groupVersion": "rlinf.io/v1alpha1", "version": "v1alpha1"})
        );

        let (_, _, group) = get("/apis/coordination.k8s.io", None).await;
        assert_eq!(group["kind"], "APIGroup");
        assert_eq!(
            group["versions"][0]["groupVersion"],
            "coordination.k8s.io/v1"
        );

        let (_, _, leases) = get("/apis/coordination.k8s.io/v1", None).await;
        assert_eq!(leases["resources"][0]["name"], "leases");
        assert_eq!(leases["resources"][0]["namespaced"], true);
        assert_eq!(leases["resources"][0]["verbs"], json!(RESOURCE_VERBS));
        assert!(
            leases["resources"][0]["storageVersionHash"]
                .as_str()
                .unwrap()
                .len()
                == 12
        );

        let (_, _, rlinf) = get("/apis/rlinf.io/v1alpha1", None).await;
        let jobs = rlinf["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "jobs")
            .unwrap();
        assert_eq!(jobs["kind"], "Job");
        assert!(
            rlinf["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "jobs/status")
        );
    }

    /// kube-rs and other typed clients decode these with the k8s-openapi types.
    #[tokio::test]
    async fn legacy_documents_decode_as_kubernetes_types() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
            APIGroup, APIGroupList, APIResourceList, APIVersions,
        };
        let (_, _, api) = get("/api", None).await;
        serde_json::from_value::<APIVersions>(api).unwrap();
        let (_, _, core) = get("/api/v1", None).await;
        assert_eq!(
            serde_json::from_value::<APIResourceList>(core)
                .unwrap()
                .resources
                .len(),
            6
        );
        let (_, _, apis) = get("/apis", None).await;
        let groups = serde_json::from_value::<APIGroupList>(apis).unwrap().groups;
        for group in groups {
            let (_, _, doc) = get(&format!("/apis/{}", group.name), None).await;
            serde_json::from_value::<APIGroup>(doc).unwrap();
            for version in group.versions {
                let (_, _, doc) = get(&format!("/apis/{}", version.group_version), None).await;
                let list = serde_json::from_value::<APIResourceList>(doc).unwrap();
                assert_eq!(list.group_version, version.group_version);
                assert!(!list.resources.is_empty());
            }
        }
    }

    #[tokio::test]
    async fn aggregated_documents() {
        let (status, headers, apis) = get("/apis", Some(KUBECTL_ACCEPT)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        );
        assert_eq!(headers[header::VARY], "Accept");
        assert_eq!(apis["kind"], "APIGroupDiscoveryList");
        assert_eq!(apis["apiVersion"], "apidiscovery.k8s.io/v2");
        let rlinf = apis["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "rlinf.io")
            .unwrap();
        let version = &rlinf["versions"][0];
        assert_eq!(version["version"], "v1alpha1");
        assert_eq!(version["freshness"], "Current");
        let jobs = version["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "jobs")
            .unwrap();
        assert_eq!(
            jobs["responseKind"],
            json!({"group": "rlinf.io", "version": "v1alpha1", "kind": "Job"})
        );
        assert_eq!(jobs["singularResource"], "job");
        assert_eq!(jobs["subresources"][0]["subresource"], "status");

        let (_, headers, core) = get(
            "/api",
            Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"),
        )
        .await;
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        );
        assert_eq!(core["apiVersion"], "apidiscovery.k8s.io/v2beta1");
        assert_eq!(core["items"][0]["metadata"]["name"], "");
        let ns = &core["items"][0]["versions"][0]["resources"][0];
        assert_eq!(ns["resource"], "namespaces");
        assert_eq!(ns["scope"], "Cluster");
        assert_eq!(ns["shortNames"], json!(["ns"]));
    }

    #[tokio::test]
    async fn unknown_groups_are_404_status() {
        for path in [
            "/apis/nope.io",
            "/apis/rlinf.io/v9",
            "/apis/coordination.k8s.io/v1beta1",
        ] {
            let (status, _, body) = get(path, None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(body["kind"], "Status");
            assert_eq!(body["reason"], "NotFound");
        }
    }

    #[tokio::test]
    async fn etag_revalidation() {
        let (_, headers, _) = get("/apis", Some(KUBECTL_ACCEPT)).await;
        let etag = headers[header::ETAG].to_str().unwrap().to_string();
        let request = Request::get("/apis")
            .header(header::ACCEPT, KUBECTL_ACCEPT)
            .header(header::IF_NONE_MATCH, &etag)
            .body(Body::empty())
            .unwrap();
        let response = app().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        // The legacy document has a different tag, so a cached aggregated copy is not reused.
        let (_, legacy, _) = get("/apis", None).await;
        assert_ne!(legacy[header::ETAG].to_str().unwrap(), etag);
    }
}
