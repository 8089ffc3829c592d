//! `/api/v1/rlinf.io/v1alpha1/{nodes,workflows,jobs,tasks,pods,domains}[/{name}]`: RLark's
//! gateway CRUD, as RLark's console calls it, onto rlark's Kubernetes API
//! (`/apis/rlinf.io/v1alpha1/...`).
//!
//! RLark's gateway passes Kubernetes objects and lists through unchanged, and so does this
//! one: a list is the API's `XxxList` (the console reads `items`), an object is the object.
//! What the gateway adds, as RLark's does:
//! - `?namespace=` picks the namespace of the namespaced kinds (Node, Task, Pod); without
//!   it a list covers every namespace, and a get, update, patch or delete by name finds the
//!   one object of that name (400 when several namespaces hold one);
//! - a list passes `limit`, `continue`, `labelSelector` and `fieldSelector` on;
//! - `PUT` without `metadata.resourceVersion` updates the current object (RLark's gateway
//!   always overwrites; with a resourceVersion rlark keeps the conflict check);
//! - `PATCH` is a JSON merge patch whatever the request's content type says;
//! - `DELETE` answers `{"message": "deleted"}`.
//!
//! Everything else (authorization, admission, warnings) is the API's: its `Warning`
//! headers come through, and its errors become `{"error": message}` with its status code.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode};
use rlark_api::agent::local::percent_encode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Gateway;
use super::error::GatewayError;
use super::forward::Caller;

/// Largest request body (an object).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// The API group and version the gateway serves.
const GROUP_VERSION: &str = "rlinf.io/v1alpha1";

/// One of the kinds the gateway serves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kind {
    pub plural: &'static str,
    pub namespaced: bool,
}

/// The kinds of RLark's gateway, with rlark's (and RLark's) scopes.
const KINDS: [Kind; 6] = [
    Kind {
        plural: "nodes",
        namespaced: true,
    },
    Kind {
        plural: "workflows",
        namespaced: false,
    },
    Kind {
        plural: "jobs",
        namespaced: false,
    },
    Kind {
        plural: "tasks",
        namespaced: true,
    },
    Kind {
        plural: "pods",
        namespaced: true,
    },
    Kind {
        plural: "domains",
        namespaced: false,
    },
];

pub(crate) fn kind(plural: &str) -> Result<Kind, GatewayError> {
    KINDS
        .iter()
        .copied()
        .find(|k| k.plural == plural)
        .ok_or_else(|| {
            GatewayError::NotFound(format!(
                "unknown resource {plural:?}: the gateway serves nodes, workflows, jobs, \
                 tasks, pods and domains"
            ))
        })
}

/// Whether `name` can be an object name or namespace (a DNS-1123 subdomain): names go into
/// backend paths, so anything else is refused before it gets there.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), GatewayError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
        && !name.ends_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(GatewayError::BadRequest(format!(
            "invalid {what} {name:?}: a DNS-1123 subdomain (lower case letters, digits, '-' \
             and '.') is expected"
        )))
    }
}

/// The API path of `kind` in `namespace` (all namespaces, or cluster-scoped, for `None`),
/// and of object `name` when given.
pub(crate) fn api_path(kind: Kind, namespace: Option<&str>, name: Option<&str>) -> String {
    let mut path = format!("/apis/{GROUP_VERSION}/");
    if let (true, Some(ns)) = (kind.namespaced, namespace) {
        path.push_str(&format!("namespaces/{ns}/"));
    }
    path.push_str(kind.plural);
    if let Some(name) = name {
        path.push('/');
        path.push_str(name);
    }
    path
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    namespace: Option<String>,
    limit: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ScopeQuery {
    namespace: Option<String>,
}

fn query<T: serde::de::DeserializeOwned + Default>(request: &Request) -> Result<T, GatewayError> {
    match request.uri().query() {
        None => Ok(T::default()),
        Some(_) => axum::extract::Query::<T>::try_from_uri(request.uri())
            .map(|q| q.0)
            .map_err(|e| GatewayError::BadRequest(format!("invalid query: {e}"))),
    }
}

/// The namespace a request names (`?namespace=`, empty meaning none), checked.
fn namespace_param(request: &Request) -> Result<Option<String>, GatewayError> {
    let scope: ScopeQuery = query(request)?;
    let namespace = scope.namespace.filter(|ns| !ns.is_empty());
    if let Some(ns) = &namespace {
        check_name("namespace", ns)?;
    }
    Ok(namespace)
}

async fn body_json(request: Request) -> Result<Value, GatewayError> {
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY)
        .await
        .map_err(|_| GatewayError::BadRequest(format!("body is larger than {MAX_BODY} bytes")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("the body is not a JSON object: {e}")))
}

/// A backend answer with its status, content type and `Warning` headers, and the body.
fn rebuild(status: StatusCode, headers: &http::HeaderMap, body: &Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    for warning in headers.get_all(http::header::WARNING) {
        response
            .headers_mut()
            .append(http::header::WARNING, warning.clone());
    }
    response
}

impl Gateway {
    /// The namespace of the one `kind` object called `name` (any namespace).
    pub(crate) async fn locate(
        &self,
        caller: &Caller,
        kind: Kind,
        name: &str,
    ) -> Result<String, GatewayError> {
        let uri = format!(
            "{}?fieldSelector={}",
            api_path(kind, None, None),
            percent_encode(&format!("metadata.name={name}"))
        );
        let list = self.backend.get(caller, &uri).await?;
        let namespaces: Vec<&str> = list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|o| o["metadata"]["namespace"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        match namespaces.as_slice() {
            [one] => Ok((*one).to_string()),
            [] => Err(GatewayError::NotFound(format!(
                "{} {name:?} not found in any namespace",
                kind.plural
            ))),
            several => Err(GatewayError::BadRequest(format!(
                "{} {name:?} exists in several namespaces ({}): name one with ?namespace=",
                kind.plural,
                several.join(", ")
            ))),
        }
    }

    /// The namespace of the object a by-name request means: `?namespace=`, else (for a
    /// namespaced kind) the only one holding `name`.
    async fn scope_of(
        &self,
        caller: &Caller,
        kind: Kind,
        name: &str,
        given: Option<String>,
    ) -> Result<Option<String>, GatewayError> {
        match (kind.namespaced, given) {
            (false, _) => Ok(None),
            (true, Some(ns)) => Ok(Some(ns)),
            (true, None) => self.locate(caller, kind, name).await.map(Some),
        }
    }
}

/// `GET /api/v1/rlinf.io/v1alpha1/{resource}`.
pub(crate) async fn list(
    State(gateway): State<Gateway>,
    Path(resource): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let kind = kind(&resource)?;
    let q: ListQuery = query(&request)?;
    let namespace = q.namespace.as_deref().filter(|ns| !ns.is_empty());
    if let Some(ns) = namespace {
        check_name("namespace", ns)?;
    }
    let mut params = Vec::new();
    for (name, value) in [
        ("limit", &q.limit),
        ("continue", &q.continue_token),
        ("labelSelector", &q.label_selector),
        ("fieldSelector", &q.field_selector),
    ] {
        if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
            params.push(format!("{name}={}", percent_encode(value)));
        }
    }
    let mut uri = api_path(kind, namespace, None);
    if !params.is_empty() {
        uri.push('?');
        uri.push_str(&params.join("&"));
    }
    gateway
        .backend
        .pass(&caller, Method::GET, &uri, None, Body::empty())
        .await
}

/// `GET /api/v1/rlinf.io/v1alpha1/{resource}/{name}`.
/// What a by-name request addresses: its caller, the kind, and `?namespace=`, checked
/// (with the name) before anything is sent.
fn by_name(
    request: &Request,
    resource: &str,
    name: &str,
) -> Result<(Caller, Kind, Option<String>), GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let kind = kind(resource)?;
    check_name("name", name)?;
    Ok((caller, kind, namespace_param(request)?))
}

/// The API path of object `name` of `kind` (a namespaced kind without a namespace found by
/// name, as the caller).
async fn object_path(
    gateway: &Gateway,
    caller: &Caller,
    kind: Kind,
    name: &str,
    given: Option<String>,
) -> Result<String, GatewayError> {
    let namespace = gateway.scope_of(caller, kind, name, given).await?;
    Ok(api_path(kind, namespace.as_deref(), Some(name)))
}

pub(crate) async fn get(
    State(gateway): State<Gateway>,
    Path((resource, name)): Path<(String, String)>,
    request: Request,
) -> Result<Response, GatewayError> {
    let (caller, kind, given) = by_name(&request, &resource, &name)?;
    let uri = object_path(&gateway, &caller, kind, &name, given).await?;
    gateway
        .backend
        .pass(&caller, Method::GET, &uri, None, Body::empty())
        .await
}

/// `POST /api/v1/rlinf.io/v1alpha1/{resource}`: 201 and the created object.
pub(crate) async fn create(
    State(gateway): State<Gateway>,
    Path(resource): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let kind = kind(&resource)?;
    let given = namespace_param(&request)?;
    let body = body_json(request).await?;
    let namespace = if kind.namespaced {
        let from_body = body["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
            .map(str::to_string);
        let namespace = given.or(from_body).ok_or_else(|| {
            GatewayError::BadRequest(format!(
                "{} are namespaced: give ?namespace= or metadata.namespace",
                kind.plural
            ))
        })?;
        check_name("namespace", &namespace)?;
        Some(namespace)
    } else {
        None
    };
    let uri = api_path(kind, namespace.as_deref(), None);
    let answer = gateway
        .backend
        .json(
            &caller,
            Method::POST,
            &uri,
            Some("application/json"),
            Body::from(body.to_string()),
        )
        .await?;
    Ok(rebuild(StatusCode::CREATED, &answer.headers, &answer.body))
}

/// `PUT /api/v1/rlinf.io/v1alpha1/{resource}/{name}`.
pub(crate) async fn update(
    State(gateway): State<Gateway>,
    Path((resource, name)): Path<(String, String)>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let kind = kind(&resource)?;
    check_name("name", &name)?;
    let given = namespace_param(&request)?;
    let mut body = body_json(request).await?;
    if !body.is_object() {
        return Err(GatewayError::BadRequest(
            "the body must be a JSON object".to_string(),
        ));
    }
    let given = given.or_else(|| {
        body["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
            .map(str::to_string)
    });
    let namespace = gateway.scope_of(&caller, kind, &name, given).await?;
    if let Some(ns) = &namespace {
        check_name("namespace", ns)?;
    }
    let uri = api_path(kind, namespace.as_deref(), Some(&name));
    let has_version = body["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|v| !v.is_empty());
    if !has_version {
        let current = gateway.backend.get(&caller, &uri).await?;
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    }
    let answer = gateway
        .backend
        .json(
            &caller,
            Method::PUT,
            &uri,
            Some("application/json"),
            Body::from(body.to_string()),
        )
        .await?;
    Ok(rebuild(answer.status, &answer.headers, &answer.body))
}

/// `PATCH /api/v1/rlinf.io/v1alpha1/{resource}/{name}`: a JSON merge patch.
pub(crate) async fn patch(
    State(gateway): State<Gateway>,
    Path((resource, name)): Path<(String, String)>,
    request: Request,
) -> Result<Response, GatewayError> {
    let (caller, kind, given) = by_name(&request, &resource, &name)?;
    let uri = object_path(&gateway, &caller, kind, &name, given).await?;
    let body = body_json(request).await?;
    let answer = gateway
        .backend
        .json(
            &caller,
            Method::PATCH,
            &uri,
            Some("application/merge-patch+json"),
            Body::from(body.to_string()),
        )
        .await?;
    Ok(rebuild(answer.status, &answer.headers, &answer.body))
}

/// `DELETE /api/v1/rlinf.io/v1alpha1/{resource}/{name}`: `{"message": "deleted"}`.
pub(crate) async fn delete(
    State(gateway): State<Gateway>,
    Path((resource, name)): Path<(String, String)>,
    request: Request,
) -> Result<Response, GatewayError> {
    let (caller, kind, given) = by_name(&request, &resource, &name)?;
    let uri = object_path(&gateway, &caller, kind, &name, given).await?;
    let answer = gateway
        .backend
        .pass(&caller, Method::DELETE, &uri, None, Body::empty())
        .await?;
    let mut response = axum::Json(json!({"message": "deleted"})).into_response();
    for warning in answer.headers().get_all(http::header::WARNING) {
        response
            .headers_mut()
            .append(http::header::WARNING, HeaderValue::clone(warning));
    }
    Ok(response)
}
