//! The entry point for every resource URL: parse the request, authorize it, dispatch on the
//! verb, render the answer, and record metrics and a tracing span per request.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use serde::Deserialize;
use tracing::Instrument;

use crate::Inner;
use crate::audit::deny;
use crate::auth::Identity;
use crate::authz::{self, Decision};
use crate::body;
use crate::error::ApiError;
use crate::fieldvalidation::FieldValidation;
use crate::lifecycle::{DeleteOptions, Propagation, WriteOptions};
use crate::list::{Listed, Page};
use crate::list_body;
use crate::object::key;
use crate::output::{Output, json_response};
use crate::patch;
use crate::request::{self, Query, Subresource, Target, Verb};
use crate::scale;
use crate::selectors::Selectors;
use crate::watch::WatchRequest;
use crate::{podexec, podlog};

/// Serve one request to a resource URL. Never fails: errors become `Status` responses.
/// The request is authorized right after its URL is parsed, before its body is read or the
/// store is touched; a denial is a 403 `Status` and a `denied` audit record.
pub(crate) async fn serve(inner: Arc<Inner>, request: Request) -> Response {
    let started = tokio::time::Instant::now();
    let (parts, body) = request.into_parts();
    let parsed = parse(&inner, &parts);
    let (verb, resource, namespace, name) = match &parsed {
        Ok((target, _, verb)) => (
            verb.as_str(),
            target.rt.plural.clone(),
            target.namespace.clone().unwrap_or_default(),
            target.name.clone().unwrap_or_default(),
        ),
        Err(_) => ("unknown", String::new(), String::new(), String::new()),
    };
    let span = tracing::info_span!("api_request", verb, resource = %resource, namespace = %namespace, name = %name);
    let response = async {
        let result = match parsed {
            Ok((target, query, verb)) => match authorize(&inner, &parts, &target, verb)
                .and_then(|()| rate_limit(&inner, &parts, verb))
            {
                Ok(()) => handle(&inner, target, query, verb, &parts, body).await,
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        match result {
            Ok(response) => response,
            Err(error) => {
                if error.code >= 500 {
                    tracing::warn!(code = error.code, message = %error.message, "request failed");
                } else {
                    tracing::debug!(code = error.code, message = %error.message, "request refused");
                }
                error.into_response()
            }
        }
    }
    .instrument(span)
    .await;
    inner.metrics.observe(
        verb,
        &resource,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

fn parse(inner: &Inner, parts: &Parts) -> Result<(Target, Query, Verb), ApiError> {
    let target = request::parse_path(&inner.registry, parts.uri.path())?;
    let query = request::parse_query(&parts.uri)?;
    let verb = Verb::of(&parts.method, &target, &query)?;
    Ok((target, query, verb))
}

/// Authorize `verb` on `target` for the request's [`Identity`] (401 without one, which the
/// router's `require_identity` layer already rules out).
fn authorize(inner: &Inner, parts: &Parts, target: &Target, verb: Verb) -> Result<(), ApiError> {
    let identity = parts
        .extensions
        .get::<Identity>()
        .ok_or_else(ApiError::unauthorized)?;
    let attrs = authz::resource_attributes(target, verb);
    match authz::authorize(identity, &attrs) {
        Decision::Allow => Ok(()),
        Decision::Deny(reason) => Err(deny(inner, identity, &attrs, attrs.name.as_deref(), reason)),
    }
}

/// Take one write from the caller's rate-limit bucket (reads are not limited): 429 with
/// `Retry-After` when it is empty.
fn rate_limit(inner: &Inner, parts: &Parts, verb: Verb) -> Result<(), ApiError> {
    if matches!(verb, Verb::Get | Verb::List | Verb::Watch) {
        return Ok(());
    }
    match parts.extensions.get::<Identity>() {
        Some(identity) => inner.rate_limiter.check(identity),
        None => Err(ApiError::unauthorized()),
    }
}

fn write_options(query: &Query, parts: &Parts) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        dry_run: query.dry_run,
        field_validation: FieldValidation::parse(query.field_validation.as_deref())?,
        caller: parts.extensions.get::<Identity>().cloned(),
    })
}

/// `DeleteOptions` from the (optional, JSON) body and the query.
async fn delete_options(
    inner: &Inner,
    query: &Query,
    parts: &Parts,
    body: Body,
) -> Result<DeleteOptions, ApiError> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Preconditions {
        uid: Option<String>,
        resource_version: Option<String>,
    }
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct DeleteOptionsBody {
        propagation_policy: Option<String>,
        orphan_dependents: Option<bool>,
        preconditions: Option<Preconditions>,
        dry_run: Option<Vec<String>>,
    }
    let bytes = body::read(body, &parts.headers, inner.options.max_request_bytes).await?;
    let parsed: DeleteOptionsBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        DeleteOptionsBody::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "couldn't decode DeleteOptions: json parse error: {e}"
            ))
        })?
    };
    let mut dry_run = query.dry_run;
    for value in parsed.dry_run.iter().flatten() {
        if value != "All" {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {value:?}: supported values: \"All\""
            )));
        }
        dry_run = true;
    }
    let propagation = match (
        parsed
            .propagation_policy
            .as_deref()
            .or(query.propagation_policy.as_deref()),
        parsed.orphan_dependents,
    ) {
        (Some(policy), _) => Propagation::parse(policy)?,
        (None, Some(true)) => Propagation::Orphan,
        (None, _) => Propagation::Background,
    };
    let preconditions = parsed.preconditions.unwrap_or_default();
    Ok(DeleteOptions {
        propagation,
        precondition_uid: preconditions.uid.filter(|s| !s.is_empty()),
        precondition_resource_version: preconditions.resource_version.filter(|s| !s.is_empty()),
        dry_run,
    })
}

async fn handle(
    inner: &Arc<Inner>,
    target: Target,
    query: Query,
    verb: Verb,
    parts: &Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let rt = Arc::clone(&target.rt);
    let namespace = target.namespace.as_deref();
    // `Verb::of` only yields object verbs for URLs with a name.
    let name = target.name.as_deref().unwrap_or("");
    let output = Output::of(&parts.headers);
    let object_response =
        |status: StatusCode, object: &Arc<serde_json::Value>, warnings: &[String]| {
            let rendered = output.object(&rt, object, true);
            json_response(
                status,
                serde_json::to_vec(&*rendered).unwrap_or_default(),
                warnings,
            )
        };
    let (headers, limit) = (&parts.headers, inner.options.max_request_bytes);
    let read_body = move |body: Body| body::read(body, headers, limit);
    let media_type = body::media_type(&parts.headers);
    if let Some(projection) = &rt.projection
        && !matches!(verb, Verb::Get | Verb::List | Verb::Watch)
    {
        return Err(ApiError::method_not_allowed(format!(
            "{} are read-only: {}",
            rt.qualified_name(),
            projection.read_only_because
        )));
    }
    match target.subresource {
        Some(Subresource::Log) => return podlog::serve(inner, &target, parts).await,
        Some(Subresource::Exec) => return podexec::serve(inner, &target, parts).await,
        Some(Subresource::Scale) => {
            let body = match verb {
                Verb::Get => None,
                _ => Some((media_type.to_string(), read_body(body).await?)),
            };
            let options = write_options(&query, parts)?;
            return scale::serve(inner, &target, verb, body, options).await;
        }
        None => {}
    }
    match verb {
        Verb::Get => {
            let key = key(&rt, namespace.unwrap_or(""), name);
            let object = inner
                .store
                .get(&key)
                .await
                .map_err(|e| ApiError::from_store(e, &rt, name))?
                .ok_or_else(|| ApiError::not_found(&rt, name))?;
            Ok(object_response(StatusCode::OK, &rt.present(object), &[]))
        }
        Verb::List => {
            let selectors = Selectors::parse(
                query.label_selector.as_deref(),
                query.field_selector.as_deref(),
                &rt,
            )?;
            let page = inner.list_page(&rt, namespace, &selectors, &query).await?;
            Ok(list_body::response(output, rt, page))
        }
        Verb::Watch => {
            let mut selectors = Selectors::parse(
                query.label_selector.as_deref(),
                query.field_selector.as_deref(),
                &rt,
            )?;
            if let Some(name) = &target.name {
                selectors.fields.require_name(name);
            }
            let namespace = target.namespace.clone();
            inner
                .watch(WatchRequest {
                    rt,
                    namespace,
                    selectors,
                    query,
                    output,
                    identity: parts.extensions.get::<Identity>().cloned(),
                })
                .await
        }
        Verb::Create => {
            let decoded = body::decode_object(&read_body(body).await?, &media_type)?;
            if let Some(identity) = parts.extensions.get::<Identity>() {
                inner
                    .check_quotas(identity, &rt, namespace.unwrap_or(""))
                    .await?;
            }
            let written = inner
                .create(&rt, namespace, decoded, write_options(&query, parts)?)
                .await?;
            Ok(object_response(
                StatusCode::CREATED,
                &written.object,
                &written.warnings,
            ))
        }
        Verb::Update => {
            let decoded = body::decode_object(&read_body(body).await?, &media_type)?;
            let written = inner
                .update(
                    &rt,
                    namespace,
                    name,
                    target.status,
                    decoded,
                    write_options(&query, parts)?,
                )
                .await?;
            Ok(object_response(
                StatusCode::OK,
                &written.object,
                &written.warnings,
            ))
        }
        Verb::Patch => {
            let decoded = patch::decode(&rt, &media_type, &read_body(body).await?)?;
            let written = inner
                .patch(
                    &rt,
                    namespace.unwrap_or(""),
                    name,
                    target.status,
                    decoded,
                    write_options(&query, parts)?,
                )
                .await?;
            Ok(object_response(
                StatusCode::OK,
                &written.object,
                &written.warnings,
            ))
        }
        Verb::Delete => {
            let options = delete_options(inner, &query, parts, body).await?;
            let object = inner
                .delete(&rt, namespace.unwrap_or(""), name, &options)
                .await?;
            Ok(object_response(StatusCode::OK, &object, &[]))
        }
        Verb::DeleteCollection => {
            let selectors = Selectors::parse(
                query.label_selector.as_deref(),
                query.field_selector.as_deref(),
                &rt,
            )?;
            let options = delete_options(inner, &query, parts, body).await?;
            let (items, revision) = inner
                .delete_collection(&rt, namespace, &selectors, &options)
                .await?;
            let page = Page {
                items: items.into_iter().map(Listed::new).collect(),
                revision,
                continue_token: None,
                remaining: None,
            };
            Ok(list_body::response(Output::Object, rt, page))
        }
    }
}
