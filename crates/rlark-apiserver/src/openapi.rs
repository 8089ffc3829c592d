//! OpenAPI documents: `/openapi/v3` (index), `/openapi/v3/{api/v1 | apis/<group>/<version>}`
//! and `/openapi/v2`.
//!
//! kubectl 1.32 reads OpenAPI v3 for `kubectl explain` (it finds a resource's kind through
//! the `x-kubernetes-group-version-kind` of the operations on the resource's paths, then the
//! schema carrying the same GVK) and for `kubectl apply`/`create`/`replace` validation: its
//! `QueryParamVerifierV3` looks for a `fieldValidation` query parameter on the PATCH
//! operation of the kind and, when present, leaves validation to the server instead of
//! validating client-side. `kubectl apply` on built-in kinds also computes strategic merge
//! patches from the v3 schemas when the PATCH operation accepts
//! `application/strategic-merge-patch+json`.
//!
//! Documents are laid out as kube-apiserver lays them out: schema names like
//! `io.rlinf.v1alpha1.Job` / `io.k8s.api.core.v1.Namespace`, `metadata` as
//! `allOf: [{$ref: ObjectMeta}]`, the apimachinery `meta/v1` schemas taken from k8s-openapi
//! (so descriptions are Kubernetes' own), one path per resource URL with kube's operation
//! ids, actions and query parameters.
//!
//! # OpenAPI v2 and protobuf
//!
//! client-go's `OpenAPISchema()` (what kubectl's v2 code paths use) sends only
//! `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf` and decodes the
//! body as gnostic protobuf; a JSON body fails to decode and a 406 fails the request, so
//! either answer is an error *if* kubectl asks. We answer **406 Not Acceptable** to
//! protobuf-only requests (it is the truthful answer, fails fast, and is what kube does for
//! a media type it cannot produce) and serve Swagger 2.0 **JSON** to anyone accepting JSON.
//! This keeps kubectl working because kubectl 1.32 only falls back to v2 when v3 fails:
//! - `explain` fetches v2 only for `--output=plaintext-openapiv2` or when `/openapi/v3`
//!   itself fails (verified against the real kubectl 1.32: `explain` issued no v2 request);
//! - `apply`/`create` validation consults v2 (`QueryParamVerifier`) only when the v3
//!   verifier errors, and client-side schema validation runs only when the server lacks
//!   `fieldValidation`, which our v3 PATCH operations declare;
//! - `apply`'s patcher tries v3 first and ignores v2 errors (it falls back to its compiled-in
//!   types, which cover Namespace and Lease);
//! - `api-resources` uses discovery only.
//!
//! `tests/kubectl_discovery.rs` runs these commands against this router and checks that no
//! `/openapi/v2` request is made.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use crate::discovery::{Document, KUBERNETES_VERSION, accepted_media_ranges};
use crate::error::ApiError;
use crate::registry::{Registry, ResourceType};

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";
const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// Patch bodies every kind accepts.
const PATCH_TYPES: [&str; 2] = [
    "application/json-patch+json",
    "application/merge-patch+json",
];
const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";

/// Serves `/openapi/v2`, `/openapi/v3` and `/openapi/v3/{*path}` for the registry's kinds.
///
/// A group-version document requested with `?hash=` equal to its current hash is served
/// with `Cache-Control: public, immutable`; a stale hash is redirected (301) to the current
/// URL, as kube-apiserver does. All documents carry an `ETag` and honour `If-None-Match`.
pub fn router(registry: Arc<Registry>) -> Router {
    let specs = Arc::new(Specs::build(&registry));
    Router::new()
        .route("/openapi/v2", get(v2))
        .route("/openapi/v3", get(v3_index))
        .route("/openapi/v3/{*path}", get(v3_group_version))
        .with_state(specs)
}

struct Specs {
    v2: Document,
    v3_index: Document,
    /// Keyed by `api/v1` / `apis/<group>/<version>`.
    v3: BTreeMap<String, GroupVersionSpec>,
}

struct GroupVersionSpec {
    document: Document,
    /// Uppercase hex SHA-512 of the document, the `hash` in its URL (kube's format).
    hash: String,
}

impl Specs {
    fn build(registry: &Registry) -> Self {
        let meta_schemas = meta_schemas();
        let mut by_group_version: BTreeMap<String, Vec<&ResourceType>> = BTreeMap::new();
        for rt in registry.all() {
            by_group_version
                .entry(group_version_path(rt))
                .or_default()
                .push(rt);
        }

        let mut v3 = BTreeMap::new();
        let mut index = Map::new();
        let mut v2_paths = Map::new();
        let mut v2_definitions = Map::new();
        for (key, types) in &by_group_version {
            let mut schemas = meta_schemas.clone();
            let mut paths = Map::new();
            for rt in types {
                schemas.insert(definition_name(rt), kind_schema(rt));
                schemas.insert(list_definition_name(rt), list_schema(rt));
                for path in resource_paths(rt) {
                    paths.insert(path.path.clone(), path.to_v3(rt));
                    v2_paths.insert(path.path.clone(), path.to_v2(rt));
                }
            }
            for (name, schema) in &schemas {
                v2_definitions.insert(name.clone(), to_v2_schema(schema));
            }
            let document = json!({
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION},
                "paths": paths,
                "components": {"schemas": schemas},
            });
            let document = Document::new(&document);
            let hash = hex::encode_upper(Sha512::digest(&document.body));
            index.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
            v3.insert(key.clone(), GroupVersionSpec { document, hash });
        }

        let v2 = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION},
            "paths": v2_paths,
            "definitions": v2_definitions,
        });
        Self {
            v2: Document::new(&v2),
            v3_index: Document::new(&json!({"paths": index})),
            v3,
        }
    }
}

/// `api/v1` or `apis/<group>/<version>`: the key in `/openapi/v3`'s index.
fn group_version_path(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        format!("api/{}", rt.version)
    } else {
        format!("apis/{}/{}", rt.group, rt.version)
    }
}

/// Schema name as kube-apiserver publishes it: built-in groups by Go package
/// (`io.k8s.api.core.v1.Namespace`, `io.k8s.api.coordination.v1.Lease`), CRD groups by
/// reversed domain (`io.rlinf.v1alpha1.Job`). Built-in groups with dots before `.k8s.io`
/// (e.g. `rbac.authorization.k8s.io`) would need a table; we serve none.
pub fn definition_name(rt: &ResourceType) -> String {
    let prefix = if rt.group.is_empty() {
        "io.k8s.api.core".to_string()
    } else if let Some(short) = rt.group.strip_suffix(".k8s.io") {
        format!("io.k8s.api.{short}")
    } else {
        rt.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{prefix}.{}.{}", rt.version, rt.kind)
}

fn list_definition_name(rt: &ResourceType) -> String {
    let kind_name = definition_name(rt);
    let prefix = kind_name.strip_suffix(&rt.kind).unwrap_or(&kind_name);
    format!("{prefix}{}", rt.list_kind)
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn gvk(rt: &ResourceType, kind: &str) -> Value {
    json!({"group": rt.group, "kind": kind, "version": rt.version})
}

/// apimachinery `meta/v1` schemas (and everything they reference), from k8s-openapi.
fn meta_schemas() -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    generator.subschema_for::<meta::ObjectMeta>();
    generator.subschema_for::<meta::ListMeta>();
    generator.subschema_for::<meta::Status>();
    generator.subschema_for::<meta::DeleteOptions>();
    generator.subschema_for::<meta::Patch>();
    let mut schemas = generator.take_definitions(true);
    add_object_meta_list_semantics(&mut schemas);
    schemas
}

/// k8s-openapi's schemas lack the list-merge extensions kube-apiserver publishes on
/// ObjectMeta; kubectl's OpenAPI-driven strategic merge patch needs them to merge
/// `ownerReferences` by uid and `finalizers` as a set instead of replacing them.
fn add_object_meta_list_semantics(schemas: &mut Map<String, Value>) {
    let Some(properties) = schemas
        .get_mut(OBJECT_META)
        .and_then(|s| s.get_mut("properties"))
    else {
        return;
    };
    let extend = |properties: &mut Value, field: &str, extensions: Value| {
        if let (Some(Value::Object(schema)), Value::Object(extensions)) =
            (properties.get_mut(field), extensions)
        {
            schema.extend(extensions);
        }
    };
    extend(
        properties,
        "finalizers",
        json!({"x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"}),
    );
    extend(
        properties,
        "ownerReferences",
        json!({
            "x-kubernetes-list-map-keys": ["uid"],
            "x-kubernetes-list-type": "map",
            "x-kubernetes-patch-merge-key": "uid",
            "x-kubernetes-patch-strategy": "merge",
        }),
    );
    extend(
        properties,
        "managedFields",
        json!({"x-kubernetes-list-type": "atomic"}),
    );
}

/// The kind's schema as kube-apiserver publishes a CRD: the structural schema with standard
/// `apiVersion`/`kind`, `metadata` pointing at ObjectMeta, and the GVK extension.
fn kind_schema(rt: &ResourceType) -> Value {
    let mut schema = match &rt.schema {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    schema.entry("type").or_insert_with(|| json!("object"));
    let properties = schema.entry("properties").or_insert_with(|| json!({}));
    if let Value::Object(properties) = properties {
        standard_property(properties, "apiVersion", API_VERSION_DESCRIPTION);
        standard_property(properties, "kind", KIND_DESCRIPTION);
        properties.insert(
            "metadata".into(),
            json!({"allOf": [schema_ref(OBJECT_META)], "description": METADATA_DESCRIPTION}),
        );
    }
    schema.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([gvk(rt, &rt.kind)]),
    );
    Value::Object(schema)
}

/// Keep the CRD's own `apiVersion`/`kind` property if it documents itself, else kube's.
fn standard_property(properties: &mut Map<String, Value>, name: &str, description: &str) {
    let documented = properties
        .get(name)
        .and_then(|p| p.get("description"))
        .is_some();
    if !documented {
        properties.insert(
            name.into(),
            json!({"type": "string", "description": description}),
        );
    }
}

fn list_schema(rt: &ResourceType) -> Value {
    json!({
        "description": format!("{} is a list of {}", rt.list_kind, rt.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION_DESCRIPTION},
            "items": {
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", rt.plural),
                "type": "array",
                "items": schema_ref(&definition_name(rt)),
            },
            "kind": {"type": "string", "description": KIND_DESCRIPTION},
            "metadata": {"allOf": [schema_ref(LIST_META)], "description": LIST_METADATA_DESCRIPTION},
        },
        "x-kubernetes-group-version-kind": [gvk(rt, &rt.list_kind)],
    })
}

/// Convert a v3 schema to Swagger 2.0: refs into `#/definitions/`, a lone
/// `allOf: [{$ref}]` back into a `$ref` (kube publishes v2 that way), and the keywords v2
/// lacks (`nullable`, `oneOf`, `anyOf`, `not`) dropped, as kube drops them for CRDs.
fn to_v2_schema(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let converted = match key.as_str() {
            "nullable" | "oneOf" | "anyOf" | "not" => continue,
            "$ref" => match value.as_str() {
                Some(reference) => {
                    json!(reference.replace("#/components/schemas/", "#/definitions/"))
                }
                None => value.clone(),
            },
            "properties" | "patternProperties" => match value {
                Value::Object(children) => Value::Object(
                    children
                        .iter()
                        .map(|(k, v)| (k.clone(), to_v2_schema(v)))
                        .collect(),
                ),
                other => other.clone(),
            },
            "items" | "additionalProperties" => match value {
                Value::Array(items) => Value::Array(items.iter().map(to_v2_schema).collect()),
                other => to_v2_schema(other),
            },
            "allOf" => match value {
                Value::Array(items) => Value::Array(items.iter().map(to_v2_schema).collect()),
                other => other.clone(),
            },
            _ => value.clone(),
        };
        out.insert(key.clone(), converted);
    }
    let lone_ref = match out.get("allOf") {
        Some(Value::Array(items)) if items.len() == 1 && !out.contains_key("$ref") => items[0]
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.get("$ref"))
            .cloned(),
        _ => None,
    };
    if let Some(reference) = lone_ref {
        out.remove("allOf");
        out.insert("$ref".into(), reference);
    }
    Value::Object(out)
}

// === paths and operations ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum In {
    Path,
    Query,
}

/// An OpenAPI parameter, rendered inline in both versions.
struct Param {
    name: &'static str,
    location: In,
    type_: &'static str,
    description: &'static str,
}

const fn query(name: &'static str, type_: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: In::Query,
        type_,
        description,
    }
}

const NAME: Param = Param {
    name: "name",
    location: In::Path,
    type_: "string",
    description: "name of the resource",
};
const NAMESPACE: Param = Param {
    name: "namespace",
    location: In::Path,
    type_: "string",
    description: "object name and auth scope, such as for teams and projects",
};
const PRETTY: Param = query(
    "pretty",
    "string",
    "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).",
);
const ALLOW_WATCH_BOOKMARKS: Param = query(
    "allowWatchBookmarks",
    "boolean",
    "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag and bookmarks are sent at the server's discretion. Clients should not assume bookmarks are returned at any specific interval, nor may they assume the server will send any BOOKMARK event during a session. If this is not a watch, this field is ignored.",
);
const CONTINUE: Param = query(
    "continue",
    "string",
    "The continue option should be set when retrieving more results from the server. Since this value is server defined, clients may only use the continue value from a previous query result with identical query parameters (except for the value of continue) and the server may reject a continue value it does not recognize. If the specified continue value is no longer valid whether due to expiration (generally five to fifteen minutes) or a configuration change on the server, the server will respond with a 410 ResourceExpired error together with a continue token.",
);
const FIELD_SELECTOR: Param = query(
    "fieldSelector",
    "string",
    "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
);
const LABEL_SELECTOR: Param = query(
    "labelSelector",
    "string",
    "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
);
const LIMIT: Param = query(
    "limit",
    "integer",
    "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results.",
);
const RESOURCE_VERSION: Param = query(
    "resourceVersion",
    "string",
    "resourceVersion sets a constraint on what resource versions a request may be served from. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset",
);
const RESOURCE_VERSION_MATCH: Param = query(
    "resourceVersionMatch",
    "string",
    "resourceVersionMatch determines how resourceVersion is applied to list calls. It is highly recommended that resourceVersionMatch be set for list calls where resourceVersion is set See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details.\n\nDefaults to unset",
);
const SEND_INITIAL_EVENTS: Param = query(
    "sendInitialEvents",
    "boolean",
    "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection. Once all such events have been sent, a synthetic \"Bookmark\" event will be sent.",
);
const TIMEOUT_SECONDS: Param = query(
    "timeoutSeconds",
    "integer",
    "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity.",
);
const WATCH: Param = query(
    "watch",
    "boolean",
    "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications. Specify resourceVersion.",
);
const DRY_RUN: Param = query(
    "dryRun",
    "string",
    "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed",
);
const FIELD_MANAGER: Param = query(
    "fieldManager",
    "string",
    "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint.",
);
const FIELD_VALIDATION: Param = query(
    "fieldValidation",
    "string",
    "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: This will ignore any unknown fields that are silently dropped from the object, and will ignore all but the last duplicate field that the decoder encounters. - Warn: This will send a warning via the standard warning response header for each unknown field that is dropped from the object, and for each duplicate field that is encountered. The request will still succeed if there are no other errors, and will only persist the last of any duplicate fields. - Strict: This will fail the request with a BadRequest error if any unknown fields would be dropped from the object, or if any duplicate fields are present. The error returned from the server will contain all unknown and duplicate fields encountered.",
);
const GRACE_PERIOD_SECONDS: Param = query(
    "gracePeriodSeconds",
    "integer",
    "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately. If this value is nil, the default grace period for the specified type will be used. Defaults to a per object value if not specified. zero means delete immediately.",
);
const ORPHAN_DEPENDENTS: Param = query(
    "orphanDependents",
    "boolean",
    "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned. If true/false, the \"orphan\" finalizer will be added to/removed from the object's finalizers list. Either this field or PropagationPolicy may be set, but not both.",
);
const PROPAGATION_POLICY: Param = query(
    "propagationPolicy",
    "string",
    "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. The default policy is decided by the existing finalizer set in the metadata.finalizers and the resource-specific default policy. Acceptable values are: 'Orphan' - orphan the dependents; 'Background' - allow the garbage collector to delete the dependents in the background; 'Foreground' - a cascading policy that deletes all dependents in the foreground.",
);

const LIST_PARAMS: [&Param; 10] = [
    &ALLOW_WATCH_BOOKMARKS,
    &CONTINUE,
    &FIELD_SELECTOR,
    &LABEL_SELECTOR,
    &LIMIT,
    &RESOURCE_VERSION,
    &RESOURCE_VERSION_MATCH,
    &SEND_INITIAL_EVENTS,
    &TIMEOUT_SECONDS,
    &WATCH,
];
const WRITE_PARAMS: [&Param; 3] = [&DRY_RUN, &FIELD_MANAGER, &FIELD_VALIDATION];
const DELETE_PARAMS: [&Param; 4] = [
    &DRY_RUN,
    &GRACE_PERIOD_SECONDS,
    &ORPHAN_DEPENDENTS,
    &PROPAGATION_POLICY,
];

/// What an operation takes as body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    None,
    /// The kind itself (create, replace).
    Object,
    Patch,
    DeleteOptions,
}

struct Operation {
    method: &'static str,
    /// `x-kubernetes-action`.
    action: &'static str,
    operation_id: String,
    description: String,
    params: Vec<&'static Param>,
    body: Body,
    /// Status code, description, schema name.
    responses: Vec<(&'static str, &'static str, String)>,
}

struct PathItem {
    path: String,
    params: Vec<&'static Param>,
    operations: Vec<Operation>,
}

/// Every URL of one resource type with its operations, in kube's layout.
fn resource_paths(rt: &ResourceType) -> Vec<PathItem> {
    let root = if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    };
    let names = OperationNames::new(rt);
    let kind = definition_name(rt);
    let list = list_definition_name(rt);
    let (collection, scope_params): (String, Vec<&'static Param>) = if rt.namespaced {
        (
            format!("{root}/namespaces/{{namespace}}/{}", rt.plural),
            vec![&NAMESPACE, &PRETTY],
        )
    } else {
        (format!("{root}/{}", rt.plural), vec![&PRETTY])
    };
    let with_name = |params: &[&'static Param]| -> Vec<&'static Param> {
        let mut all = vec![&NAME];
        all.extend_from_slice(params);
        all
    };
    let ok = |schema: &str| ("200", "OK", schema.to_string());
    let created = |schema: &str| ("201", "Created", schema.to_string());
    let accepted = |schema: &str| ("202", "Accepted", schema.to_string());

    let mut deletecollection_params: Vec<&'static Param> = DELETE_PARAMS.to_vec();
    deletecollection_params.extend(
        LIST_PARAMS
            .iter()
            .filter(|p| p.name != "watch" && p.name != "allowWatchBookmarks"),
    );

    let mut paths = vec![
        PathItem {
            path: collection.clone(),
            params: scope_params.clone(),
            operations: vec![
                Operation {
                    method: "get",
                    action: "list",
                    operation_id: names.id("list", ""),
                    description: format!("list or watch objects of kind {}", rt.kind),
                    params: LIST_PARAMS.to_vec(),
                    body: Body::None,
                    responses: vec![ok(&list)],
                },
                Operation {
                    method: "post",
                    action: "post",
                    operation_id: names.id("create", ""),
                    description: format!("create {}", article(&rt.kind)),
                    params: WRITE_PARAMS.to_vec(),
                    body: Body::Object,
                    responses: vec![ok(&kind), created(&kind), accepted(&kind)],
                },
                Operation {
                    method: "delete",
                    action: "deletecollection",
                    operation_id: names.id("deleteCollection", ""),
                    description: format!("delete collection of {}", rt.kind),
                    params: deletecollection_params,
                    body: Body::DeleteOptions,
                    responses: vec![ok(STATUS)],
                },
            ],
        },
        PathItem {
            path: format!("{collection}/{{name}}"),
            params: with_name(&scope_params),
            operations: vec![
                Operation {
                    method: "get",
                    action: "get",
                    operation_id: names.id("read", ""),
                    description: format!("read the specified {}", rt.kind),
                    params: vec![&RESOURCE_VERSION],
                    body: Body::None,
                    responses: vec![ok(&kind)],
                },
                Operation {
                    method: "put",
                    action: "put",
                    operation_id: names.id("replace", ""),
                    description: format!("replace the specified {}", rt.kind),
                    params: WRITE_PARAMS.to_vec(),
                    body: Body::Object,
                    responses: vec![ok(&kind), created(&kind)],
                },
                Operation {
                    method: "delete",
                    action: "delete",
                    operation_id: names.id("delete", ""),
                    description: format!("delete {}", article(&rt.kind)),
                    params: DELETE_PARAMS.to_vec(),
                    body: Body::DeleteOptions,
                    responses: vec![ok(STATUS), accepted(STATUS)],
                },
                Operation {
                    method: "patch",
                    action: "patch",
                    operation_id: names.id("patch", ""),
                    description: format!("partially update the specified {}", rt.kind),
                    params: WRITE_PARAMS.to_vec(),
                    body: Body::Patch,
                    responses: vec![ok(&kind), created(&kind)],
                },
            ],
        },
    ];
    if rt.projection.is_some() {
        // A read-only view: its writes are 405, so the document offers reads only.
        for item in &mut paths {
            item.operations.retain(|o| o.method == "get");
        }
    }
    if rt.status_subresource {
        paths.push(PathItem {
            path: format!("{collection}/{{name}}/status"),
            params: with_name(&scope_params),
            operations: vec![
                Operation {
                    method: "get",
                    action: "get",
                    operation_id: names.id("read", "Status"),
                    description: format!("read status of the specified {}", rt.kind),
                    params: vec![&RESOURCE_VERSION],
                    body: Body::None,
                    responses: vec![ok(&kind)],
                },
                Operation {
                    method: "put",
                    action: "put",
                    operation_id: names.id("replace", "Status"),
                    description: format!("replace status of the specified {}", rt.kind),
                    params: WRITE_PARAMS.to_vec(),
                    body: Body::Object,
                    responses: vec![ok(&kind), created(&kind)],
                },
                Operation {
                    method: "patch",
                    action: "patch",
                    operation_id: names.id("patch", "Status"),
                    description: format!("partially update status of the specified {}", rt.kind),
                    params: WRITE_PARAMS.to_vec(),
                    body: Body::Patch,
                    responses: vec![ok(&kind), created(&kind)],
                },
            ],
        });
    }
    if rt.namespaced {
        paths.push(PathItem {
            path: format!("{root}/{}", rt.plural),
            params: vec![&PRETTY],
            operations: vec![Operation {
                method: "get",
                action: "list",
                operation_id: names.id_all_namespaces(),
                description: format!("list or watch objects of kind {}", rt.kind),
                params: LIST_PARAMS.to_vec(),
                body: Body::None,
                responses: vec![ok(&list)],
            }],
        });
    }
    paths
}

/// "a Job", "an Addon" (kube's operation descriptions).
fn article(kind: &str) -> String {
    let vowel = kind.chars().next().is_some_and(|c| "AEIOU".contains(c));
    format!("{} {kind}", if vowel { "an" } else { "a" })
}

/// kube's operation ids: `listRlinfIoV1alpha1NamespacedTask`, `readCoreV1Namespace`,
/// `patchCoordinationV1NamespacedLease`, `listRlinfIoV1alpha1TaskForAllNamespaces`.
struct OperationNames {
    /// `RlinfIoV1alpha1`, `CoreV1`, `CoordinationV1`.
    group_version: String,
    /// `Namespaced` or empty.
    scope: &'static str,
    kind: String,
    /// `rlinfIo_v1alpha1`, `core_v1`, `coordination_v1`.
    tag: String,
}

impl OperationNames {
    fn new(rt: &ResourceType) -> Self {
        let group_words: Vec<&str> = if rt.group.is_empty() {
            vec!["core"]
        } else if let Some(short) = rt.group.strip_suffix(".k8s.io") {
            short.split(['.', '-']).collect()
        } else {
            rt.group.split(['.', '-']).collect()
        };
        let group: String = group_words.iter().map(|w| capitalize(w)).collect();
        let tag_group = lower_first(&group);
        Self {
            group_version: format!("{group}{}", capitalize(&rt.version)),
            scope: if rt.namespaced { "Namespaced" } else { "" },
            kind: rt.kind.clone(),
            tag: format!("{tag_group}_{}", rt.version),
        }
    }

    fn id(&self, verb: &str, suffix: &str) -> String {
        format!(
            "{verb}{}{}{}{suffix}",
            self.group_version, self.scope, self.kind
        )
    }

    fn id_all_namespaces(&self) -> String {
        format!("list{}{}ForAllNamespaces", self.group_version, self.kind)
    }
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn lower_first(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn patch_types(rt: &ResourceType) -> Vec<&'static str> {
    let mut types = PATCH_TYPES.to_vec();
    if rt.strategic_merge_patch {
        types.push(STRATEGIC_MERGE_PATCH);
    }
    types
}

impl Param {
    fn to_v3(&self) -> Value {
        let mut param = json!({
            "name": self.name,
            "in": if self.location == In::Path { "path" } else { "query" },
            "description": self.description,
            "schema": {"type": self.type_, "uniqueItems": true},
        });
        if self.location == In::Path {
            param["required"] = json!(true);
        }
        param
    }

    fn to_v2(&self) -> Value {
        let mut param = json!({
            "name": self.name,
            "in": if self.location == In::Path { "path" } else { "query" },
            "description": self.description,
            "type": self.type_,
            "uniqueItems": true,
        });
        if self.location == In::Path {
            param["required"] = json!(true);
        }
        param
    }
}

impl PathItem {
    fn to_v3(&self, rt: &ResourceType) -> Value {
        let mut item = Map::new();
        for op in &self.operations {
            let mut operation = json!({
                "tags": [OperationNames::new(rt).tag],
                "description": op.description,
                "operationId": op.operation_id,
                "parameters": op.params.iter().map(|p| p.to_v3()).collect::<Vec<_>>(),
            });
            let body_schema = |name: &str| json!({"schema": schema_ref(name)});
            match op.body {
                Body::None => {}
                Body::Object => {
                    operation["requestBody"] = json!({
                        "content": {"application/json": body_schema(&definition_name(rt)), "application/yaml": body_schema(&definition_name(rt))},
                        "required": true,
                    });
                }
                Body::Patch => {
                    let content: Map<String, Value> = patch_types(rt)
                        .into_iter()
                        .map(|t| (t.to_string(), body_schema(PATCH)))
                        .collect();
                    operation["requestBody"] = json!({"content": content, "required": true});
                }
                Body::DeleteOptions => {
                    operation["requestBody"] =
                        json!({"content": {"application/json": body_schema(DELETE_OPTIONS)}});
                }
            }
            let mut responses = Map::new();
            for (code, description, schema) in &op.responses {
                responses.insert(
                    code.to_string(),
                    json!({"description": description, "content": {"application/json": body_schema(schema)}}),
                );
            }
            responses.insert("401".into(), json!({"description": "Unauthorized"}));
            operation["responses"] = Value::Object(responses);
            operation["x-kubernetes-action"] = json!(op.action);
            operation["x-kubernetes-group-version-kind"] = gvk(rt, &rt.kind);
            item.insert(op.method.into(), operation);
        }
        item.insert(
            "parameters".into(),
            json!(self.params.iter().map(|p| p.to_v3()).collect::<Vec<_>>()),
        );
        Value::Object(item)
    }

    fn to_v2(&self, rt: &ResourceType) -> Value {
        let definition = |name: &str| json!({"$ref": format!("#/definitions/{name}")});
        let mut item = Map::new();
        for op in &self.operations {
            let mut params: Vec<Value> = op.params.iter().map(|p| p.to_v2()).collect();
            let body = |name: &str| json!({"name": "body", "in": "body", "required": true, "schema": definition(name)});
            let consumes: Vec<&str> = match op.body {
                Body::None => vec!["*/*"],
                Body::Object => {
                    params.insert(0, body(&definition_name(rt)));
                    vec!["*/*"]
                }
                Body::Patch => {
                    params.insert(0, body(PATCH));
                    patch_types(rt)
                }
                Body::DeleteOptions => {
                    params.insert(
                        0,
                        json!({"name": "body", "in": "body", "schema": definition(DELETE_OPTIONS)}),
                    );
                    vec!["*/*"]
                }
            };
            let mut responses = Map::new();
            for (code, description, schema) in &op.responses {
                responses.insert(
                    code.to_string(),
                    json!({"description": description, "schema": definition(schema)}),
                );
            }
            responses.insert("401".into(), json!({"description": "Unauthorized"}));
            item.insert(
                op.method.into(),
                json!({
                    "tags": [OperationNames::new(rt).tag],
                    "description": op.description,
                    "consumes": consumes,
                    "produces": ["application/json"],
                    "schemes": ["https"],
                    "operationId": op.operation_id,
                    "parameters": params,
                    "responses": responses,
                    "x-kubernetes-action": op.action,
                    "x-kubernetes-group-version-kind": gvk(rt, &rt.kind),
                }),
            );
        }
        item.insert(
            "parameters".into(),
            json!(self.params.iter().map(|p| p.to_v2()).collect::<Vec<_>>()),
        );
        Value::Object(item)
    }
}

// === handlers ===

/// Whether a JSON document may be sent: no `Accept`, or some range accepting JSON.
fn accepts_json(headers: &HeaderMap) -> bool {
    let ranges = accepted_media_ranges(headers);
    ranges.is_empty() || ranges.iter().any(|r| r.accepts_json())
}

fn not_acceptable() -> Response {
    ApiError::not_acceptable("only the following media types are accepted: application/json")
        .into_response()
}

/// kube-apiserver marks every response `no-cache, private` unless the handler decided
/// otherwise; only hash-addressed v3 documents are cacheable.
fn no_cache(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    response
}

async fn v2(State(specs): State<Arc<Specs>>, headers: HeaderMap) -> Response {
    if !accepts_json(&headers) {
        return not_acceptable();
    }
    no_cache(specs.v2.respond(&headers, "application/json"))
}

async fn v3_index(State(specs): State<Arc<Specs>>, headers: HeaderMap) -> Response {
    no_cache(specs.v3_index.respond(&headers, "application/json"))
}

async fn v3_group_version(
    State(specs): State<Arc<Specs>>,
    Path(path): Path<String>,
    RawQuery(raw_query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let key = path.trim_matches('/');
    let Some(spec) = specs.v3.get(key) else {
        return ApiError::path_not_found("the server could not find the requested resource")
            .into_response();
    };
    if !accepts_json(&headers) {
        return not_acceptable();
    }
    let requested_hash = raw_query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "hash")
        .map(|(_, value)| value.to_string());
    match requested_hash {
        None => no_cache(spec.document.respond(&headers, "application/json")),
        Some(hash) if hash != spec.hash => {
            // kube answers 301 (not 308) so clients re-fetch with GET at the current URL.
            let location = format!("/openapi/v3/{key}?hash={}", spec.hash);
            match HeaderValue::from_str(&location) {
                Ok(location) => (
                    StatusCode::MOVED_PERMANENTLY,
                    [(header::LOCATION, location)],
                )
                    .into_response(),
                // The key came from our own table and the hash is hex: always a valid header.
                Err(_) => ApiError::internal("unencodable redirect location").into_response(),
            }
        }
        Some(_) => {
            let mut response = spec.document.respond(&headers, "application/json");
            let expires = (chrono::Utc::now() + chrono::TimeDelta::days(365))
                .format("%a, %d %b %Y %H:%M:%S GMT");
            let response_headers = response.headers_mut();
            response_headers.insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, immutable"),
            );
            // Content depends on Accept (JSON or protobuf in kube); caches must key on it.
            response_headers.insert(header::VARY, HeaderValue::from_static("Accept"));
            if let Ok(expires) = HeaderValue::from_str(&expires.to_string()) {
                response_headers.insert(header::EXPIRES, expires);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;

    /// Building the registry and documents takes a while in debug builds; share one router.
    fn app() -> Router {
        static APP: std::sync::OnceLock<Router> = std::sync::OnceLock::new();
        APP.get_or_init(|| router(Arc::new(Registry::builtin())))
            .clone()
    }

    async fn get(path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, Value) {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
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

    fn gv_url(index: &Value, key: &str) -> String {
        index["paths"][key]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn names_follow_kubernetes() {
        let namespace = ResourceType::namespace();
        let lease = ResourceType::lease();
        assert_eq!(definition_name(&namespace), "io.k8s.api.core.v1.Namespace");
        assert_eq!(
            list_definition_name(&namespace),
            "io.k8s.api.core.v1.NamespaceList"
        );
        assert_eq!(definition_name(&lease), "io.k8s.api.coordination.v1.Lease");
        let names = OperationNames::new(&lease);
        assert_eq!(names.id("patch", ""), "patchCoordinationV1NamespacedLease");
        assert_eq!(
            names.id_all_namespaces(),
            "listCoordinationV1LeaseForAllNamespaces"
        );
        assert_eq!(names.tag, "coordination_v1");
        assert_eq!(
            OperationNames::new(&namespace).id("read", "Status"),
            "readCoreV1NamespaceStatus"
        );
        let registry = Registry::builtin();
        let job = registry.get("rlinf.io", "v1alpha1", "jobs").unwrap();
        assert_eq!(definition_name(&job), "io.rlinf.v1alpha1.Job");
        assert_eq!(list_definition_name(&job), "io.rlinf.v1alpha1.JobList");
        assert_eq!(OperationNames::new(&job).tag, "rlinfIo_v1alpha1");
        assert_eq!(article("Addon"), "an Addon");
    }

    #[test]
    fn meta_schemas_come_from_k8s_openapi() {
        let schemas = meta_schemas();
        for name in [OBJECT_META, LIST_META, STATUS, DELETE_OPTIONS, PATCH] {
            assert!(schemas.contains_key(name), "{name}");
        }
        // Transitive references are included and refs point into components.
        assert!(schemas.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.Time"));
        assert!(schemas.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference"));
        let meta = &schemas[OBJECT_META];
        let created = &meta["properties"]["creationTimestamp"];
        assert_eq!(
            created["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Time"
        );
        assert!(
            created["description"]
                .as_str()
                .unwrap()
                .starts_with("CreationTimestamp")
        );
        assert_eq!(
            meta["properties"]["ownerReferences"]["x-kubernetes-patch-merge-key"],
            "uid"
        );
        // Every $ref resolves within the set.
        let text = Value::Object(schemas.clone()).to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "dangling ref {name}");
        }
    }

    #[tokio::test]
    async fn index_lists_every_group_version() {
        let (status, _, index) = get("/openapi/v3", &[]).await;
        assert_eq!(status, StatusCode::OK);
        for key in [
            "api/v1",
            "apis/coordination.k8s.io/v1",
            "apis/rlinf.io/v1alpha1",
        ] {
            let url = gv_url(&index, key);
            assert!(
                url.starts_with(&format!("/openapi/v3/{key}?hash=")),
                "{url}"
            );
            assert_eq!(url.split("hash=").nth(1).unwrap().len(), 128);
        }
    }

    #[tokio::test]
    async fn rlinf_document() {
        let (_, _, index) = get("/openapi/v3", &[]).await;
        let url = gv_url(&index, "apis/rlinf.io/v1alpha1");
        let (status, headers, doc) = get(&url, &[("accept", "application/json")]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CACHE_CONTROL], "public, immutable");
        assert!(headers.contains_key(header::EXPIRES));
        assert!(headers.contains_key(header::ETAG));
        assert_eq!(doc["openapi"], "3.0.0");

        let schemas = &doc["components"]["schemas"];
        let job = &schemas["io.rlinf.v1alpha1.Job"];
        assert_eq!(
            job["x-kubernetes-group-version-kind"],
            json!([{"group": "rlinf.io", "kind": "Job", "version": "v1alpha1"}])
        );
        assert_eq!(
            job["properties"]["metadata"]["allOf"][0]["$ref"],
            format!("#/components/schemas/{OBJECT_META}")
        );
        assert_eq!(job["properties"]["kind"]["type"], "string");
        assert!(job["properties"]["spec"]["properties"]["tasks"].is_object());
        assert_eq!(
            schemas["io.rlinf.v1alpha1.JobList"]["x-kubernetes-group-version-kind"][0]["kind"],
            "JobList"
        );
        assert!(schemas[OBJECT_META].is_object());

        // Jobs are cluster-scoped, tasks namespaced.
        let paths = &doc["paths"];
        let job_item = &paths["/apis/rlinf.io/v1alpha1/jobs/{name}"];
        let patch = &job_item["patch"];
        assert_eq!(patch["x-kubernetes-action"], "patch");
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "rlinf.io", "kind": "Job", "version": "v1alpha1"})
        );
        let params: Vec<&str> = patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(params, ["dryRun", "fieldManager", "fieldValidation"]);
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["in"] == "query")
        );
        let content = patch["requestBody"]["content"].as_object().unwrap();
        assert!(content.contains_key("application/merge-patch+json"));
        assert!(content.contains_key("application/json-patch+json"));
        assert!(!content.contains_key(STRATEGIC_MERGE_PATCH));
        assert_eq!(job_item["get"]["operationId"], "readRlinfIoV1alpha1Job");
        assert!(paths["/apis/rlinf.io/v1alpha1/jobs/{name}/status"]["patch"].is_object());
        assert_eq!(
            paths["/apis/rlinf.io/v1alpha1/jobs"]["get"]["x-kubernetes-action"],
            "list"
        );
        assert_eq!(
            paths["/apis/rlinf.io/v1alpha1/jobs"]["post"]["x-kubernetes-action"],
            "post"
        );
        assert_eq!(
            paths["/apis/rlinf.io/v1alpha1/jobs"]["delete"]["x-kubernetes-action"],
            "deletecollection"
        );
        let tasks = &paths["/apis/rlinf.io/v1alpha1/namespaces/{namespace}/tasks/{name}"];
        assert_eq!(
            tasks["patch"]["operationId"],
            "patchRlinfIoV1alpha1NamespacedTask"
        );
        let path_params: Vec<&str> = tasks["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(path_params, ["name", "namespace", "pretty"]);
        assert_eq!(
            paths["/apis/rlinf.io/v1alpha1/tasks"]["get"]["operationId"],
            "listRlinfIoV1alpha1TaskForAllNamespaces"
        );

        // Every $ref in the document resolves inside it.
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(schemas.get(name).is_some(), "dangling ref {name}");
        }
    }

    #[tokio::test]
    async fn builtin_kinds_accept_strategic_merge_patch() {
        let (_, _, index) = get("/openapi/v3", &[]).await;
        let (_, _, core) = get(&gv_url(&index, "api/v1"), &[]).await;
        let ns = &core["paths"]["/api/v1/namespaces/{name}"]["patch"];
        assert!(
            ns["requestBody"]["content"]
                .get(STRATEGIC_MERGE_PATCH)
                .is_some()
        );
        assert_eq!(ns["operationId"], "patchCoreV1Namespace");
        assert!(core["components"]["schemas"]["io.k8s.api.core.v1.Namespace"].is_object());
        // Core Pods, the replicas' read-only view, offer reads only.
        let pod = &core["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"];
        assert_eq!(pod["get"]["operationId"], "readCoreV1NamespacedPod");
        for write in ["put", "patch", "delete"] {
            assert!(pod.get(write).is_none(), "{write}");
        }
        let pods = &core["paths"]["/api/v1/namespaces/{namespace}/pods"];
        assert!(pods.get("get").is_some() && pods.get("post").is_none());
        let (_, _, coordination) = get(&gv_url(&index, "apis/coordination.k8s.io/v1"), &[]).await;
        let lease = &coordination["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"];
        assert!(
            lease["patch"]["requestBody"]["content"]
                .get(STRATEGIC_MERGE_PATCH)
                .is_some()
        );
    }

    #[tokio::test]
    async fn hash_handling() {
        let (status, headers, _) = get("/openapi/v3/apis/rlinf.io/v1alpha1?hash=STALE", &[]).await;
        assert_eq!(status, StatusCode::MOVED_PERMANENTLY);
        let location = headers[header::LOCATION].to_str().unwrap();
        assert!(location.starts_with("/openapi/v3/apis/rlinf.io/v1alpha1?hash="));
        let (status, headers, _) = get("/openapi/v3/apis/rlinf.io/v1alpha1", &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CACHE_CONTROL], "no-cache, private");
        let etag = headers[header::ETAG].to_str().unwrap().to_string();
        let (status, _, _) = get(
            "/openapi/v3/apis/rlinf.io/v1alpha1",
            &[("if-none-match", &etag)],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        let (status, _, body) = get("/openapi/v3/apis/nope.io/v1", &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["kind"], "Status");
    }

    #[tokio::test]
    async fn v2_json_and_protobuf() {
        let (status, _, body) = get(
            "/openapi/v2",
            &[(
                "accept",
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
            )],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
        assert_eq!(body["reason"], "NotAcceptable");

        let (status, _, doc) = get("/openapi/v2", &[("accept", "application/json")]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(doc["swagger"], "2.0");
        let definitions = &doc["definitions"];
        let job = &definitions["io.rlinf.v1alpha1.Job"];
        assert_eq!(
            job["properties"]["metadata"]["$ref"],
            format!("#/definitions/{OBJECT_META}")
        );
        assert!(job["properties"]["metadata"].get("allOf").is_none());
        assert_eq!(job["x-kubernetes-group-version-kind"][0]["kind"], "Job");
        assert!(definitions["io.k8s.api.core.v1.Namespace"].is_object());
        assert!(definitions["io.k8s.api.coordination.v1.Lease"].is_object());
        let patch = &doc["paths"]["/api/v1/namespaces/{name}"]["patch"];
        assert!(
            patch["consumes"]
                .as_array()
                .unwrap()
                .contains(&json!(STRATEGIC_MERGE_PATCH))
        );
        assert_eq!(patch["parameters"][0]["in"], "body");
        let text = doc.to_string();
        assert!(!text.contains("#/components/"));
        for piece in text.split("#/definitions/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(definitions.get(name).is_some(), "dangling ref {name}");
        }
        assert!(!text.contains("\"nullable\""));
    }

    #[test]
    fn v2_conversion_is_schema_aware() {
        let v3 = json!({
            "type": "object",
            "properties": {
                "nullable": {"type": "string", "nullable": true},
                "meta": {"allOf": [{"$ref": "#/components/schemas/X"}], "description": "d"},
                "either": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
                "list": {"type": "array", "items": {"$ref": "#/components/schemas/Y"}}
            }
        });
        let v2 = to_v2_schema(&v3);
        assert_eq!(v2["properties"]["nullable"], json!({"type": "string"}));
        assert_eq!(
            v2["properties"]["meta"],
            json!({"description": "d", "$ref": "#/definitions/X"})
        );
        assert_eq!(
            v2["properties"]["either"],
            json!({"x-kubernetes-int-or-string": true})
        );
        assert_eq!(v2["properties"]["list"]["items"]["$ref"], "#/definitions/Y");
    }
}
