//! `GET /api/v1/namespaces/{ns}/pods/{name}/log` of core Pods stored as objects (an extra
//! kind, [`crate::pod_sources`]): the server checks the request as kube-apiserver does
//! (options, the Pod, the container, whether it has started) and streams what the
//! configured [`PodLogSource`](crate::pod_sources::PodLogSource) returns.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::request::Parts;
use http::{HeaderValue, StatusCode};
use serde_json::Value;

use crate::Inner;
use crate::error::ApiError;
use crate::object::key;
use crate::pod_sources::{LogStream, PodLogError, PodLogRequest};
use crate::request::Target;

/// `PodLogOptions` from the query string. Unknown parameters are ignored.
#[derive(Debug, Default, PartialEq, Eq)]
struct LogOptions {
    container: Option<String>,
    follow: bool,
    previous: bool,
    timestamps: bool,
    tail_lines: Option<u64>,
    limit_bytes: Option<u64>,
    since_seconds: Option<u64>,
    since_time: Option<chrono::DateTime<chrono::Utc>>,
}

fn invalid(field: &str, value: &str, why: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("PodLogOptions is invalid: {field}: Invalid value: {value:?}: {why}"),
    )
}

fn parse_bool(field: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "{field}: Invalid value: {value:?}: must be a boolean"
        ))),
    }
}

/// A non-negative integer (`min` the least valid value).
fn parse_count(field: &str, value: &str, min: u64) -> Result<u64, ApiError> {
    let parsed: i64 = value.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "{field}: Invalid value: {value:?}: must be an integer"
        ))
    })?;
    u64::try_from(parsed)
        .ok()
        .filter(|n| *n >= min)
        .ok_or_else(|| {
            invalid(
                field,
                value,
                &format!("must be greater than or equal to {min}"),
            )
        })
}

fn parse_options(uri: &http::Uri) -> Result<LogOptions, ApiError> {
    let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?
        .0;
    let mut options = LogOptions::default();
    for (key, value) in pairs {
        if value.is_empty() {
            continue;
        }
        match key.as_str() {
            "container" => options.container = Some(value),
            "follow" => options.follow = parse_bool(&key, &value)?,
            "previous" => options.previous = parse_bool(&key, &value)?,
            "timestamps" => options.timestamps = parse_bool(&key, &value)?,
            "tailLines" => options.tail_lines = Some(parse_count(&key, &value, 0)?),
            "limitBytes" => options.limit_bytes = Some(parse_count(&key, &value, 1)?),
            "sinceSeconds" => options.since_seconds = Some(parse_count(&key, &value, 1)?),
            "sinceTime" => {
                let time = chrono::DateTime::parse_from_rfc3339(&value)
                    .map_err(|e| invalid(&key, &value, &format!("not an RFC 3339 time: {e}")))?;
                options.since_time = Some(time.with_timezone(&chrono::Utc));
            }
            _ => {}
        }
    }
    if options.since_seconds.is_some() && options.since_time.is_some() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "PodLogOptions is invalid: sinceSeconds: Forbidden: at most one of sinceTime or sinceSeconds may be specified",
        ));
    }
    Ok(options)
}

/// The names of the Pod spec's `field` list (`containers`, `initContainers`, ...).
pub(crate) fn names(pod: &Value, field: &str) -> Vec<String> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// The container a request reads, as kube-apiserver picks it: the named one (a container,
/// init container or ephemeral container of the spec), or the only container.
fn resolve_container(pod: &Value, pod_name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let containers = names(pod, "containers");
    let init = names(pod, "initContainers");
    let ephemeral = names(pod, "ephemeralContainers");
    match asked {
        Some(name) => {
            if containers
                .iter()
                .chain(&init)
                .chain(&ephemeral)
                .any(|c| c == name)
            {
                Ok(name.to_string())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {name} is not valid for pod {pod_name}"
                )))
            }
        }
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None if containers.is_empty() => Err(ApiError::bad_request(format!(
            "pod {pod_name} has no containers"
        ))),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

/// 400 when the container has no log to read yet, worded as the kubelet words it.
fn check_started(
    pod: &Value,
    pod_name: &str,
    container: &str,
    previous: bool,
) -> Result<(), ApiError> {
    if pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ApiError::bad_request(format!(
            "pod {pod_name} does not have a host assigned"
        )));
    }
    if previous {
        return Ok(());
    }
    let status = [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .filter_map(|field| {
        pod.pointer(&format!("/status/{field}"))
            .and_then(Value::as_array)
    })
    .flatten()
    .find(|s| s.get("name").and_then(Value::as_str) == Some(container));
    let waiting = |reason: &str| {
        ApiError::bad_request(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {reason}"
        ))
    };
    match status {
        None => Err(waiting("ContainerCreating")),
        Some(status) => {
            let state = status.get("state");
            let started =
                state.is_some_and(|s| s.get("running").is_some() || s.get("terminated").is_some());
            let restarted = status
                .get("restartCount")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                > 0;
            match state
                .and_then(|s| s.pointer("/waiting/reason"))
                .and_then(Value::as_str)
            {
                Some(reason) if !started && !restarted => Err(waiting(reason)),
                None if !started && !restarted => Err(waiting("ContainerCreating")),
                _ => Ok(()),
            }
        }
    }
}

/// Stop after `limit` bytes (the last chunk cut).
fn limit_stream(stream: LogStream, limit: u64) -> LogStream {
    stream
        .scan(limit, |left, chunk: Bytes| {
            if *left == 0 {
                return futures::future::ready(None);
            }
            let take = usize::try_from(*left)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            *left -= take as u64;
            futures::future::ready(Some(chunk.slice(..take)))
        })
        .boxed()
}

/// Serve one log request for `target` (a core Pod with `Subresource::Log`).
pub(crate) async fn serve(
    inner: &Arc<Inner>,
    target: &Target,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let Some(logs) = &inner.options.pod_sources.logs else {
        return Err(ApiError::path_not_found(
            "the server could not find the requested resource",
        ));
    };
    let options = parse_options(&parts.uri)?;
    let rt = &target.rt;
    let namespace = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let pod = inner
        .store
        .get(&key(rt, &namespace, &name))
        .await
        .map_err(|e| ApiError::from_store(e, rt, &name))?
        .ok_or_else(|| ApiError::not_found(rt, &name))?;
    let container = resolve_container(&pod, &name, options.container.as_deref())?;
    check_started(&pod, &name, &container, options.previous)?;
    let since_seconds = match (options.since_seconds, options.since_time) {
        (Some(seconds), _) => Some(seconds),
        (None, Some(time)) => {
            let elapsed = chrono::Utc::now().signed_duration_since(time).num_seconds();
            Some(u64::try_from(elapsed).unwrap_or(0))
        }
        (None, None) => None,
    };
    let request = PodLogRequest {
        namespace,
        pod: name,
        container,
        follow: options.follow,
        previous: options.previous,
        tail_lines: options.tail_lines,
        since_seconds,
        timestamps: options.timestamps,
    };
    let stream = logs.open(&request).map_err(|error| match error {
        PodLogError::BadRequest(message) => ApiError::bad_request(message),
        PodLogError::NotFound(message) => ApiError::new(404, "NotFound", message),
    })?;
    tracing::debug!(namespace = %request.namespace, pod = %request.pod, container = %request.container, follow = request.follow, "serving pod log");
    let stream = match options.limit_bytes {
        Some(limit) => limit_stream(stream, limit),
        None => stream,
    };
    // A follow stream outlives no server: it ends when the process shuts down.
    let stream = stream.take_until(inner.shutdown.clone().cancelled_owned());
    let mut response = Response::new(Body::from_stream(stream.map(Ok::<_, Infallible>)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn options(query: &str) -> Result<LogOptions, ApiError> {
        parse_options(&format!("/x?{query}").parse().unwrap())
    }

    #[test]
    fn options_are_parsed_and_checked() {
        let parsed =
            options("container=c&follow=true&tailLines=3&limitBytes=10&timestamps=1").unwrap();
        assert_eq!(parsed.container.as_deref(), Some("c"));
        assert!(parsed.follow && parsed.timestamps && !parsed.previous);
        assert_eq!((parsed.tail_lines, parsed.limit_bytes), (Some(3), Some(10)));
        for (bad, code) in [
            ("tailLines=-1", 422),
            ("limitBytes=0", 422),
            ("sinceSeconds=0", 422),
            ("tailLines=x", 400),
            ("follow=maybe", 400),
            ("sinceTime=yesterday", 422),
            ("sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z", 422),
        ] {
            assert_eq!(options(bad).unwrap_err().code, code, "{bad}");
        }
    }

    #[test]
    fn container_is_resolved_like_kube_apiserver() {
        let one = json!({"spec": {"containers": [{"name": "main"}]}});
        assert_eq!(resolve_container(&one, "p", None).unwrap(), "main");
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}});
        assert_eq!(
            resolve_container(&two, "p", None).unwrap_err().message,
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
        );
        assert_eq!(resolve_container(&two, "p", Some("i")).unwrap(), "i");
        assert_eq!(
            resolve_container(&two, "p", Some("z")).unwrap_err().message,
            "container z is not valid for pod p"
        );
    }

    #[test]
    fn a_container_that_has_not_started_has_no_log() {
        let unscheduled = json!({"spec": {"containers": [{"name": "c"}]}});
        assert_eq!(
            check_started(&unscheduled, "p", "c", false)
                .unwrap_err()
                .message,
            "pod p does not have a host assigned"
        );
        let pulling = json!({"spec": {"nodeName": "n"}, "status": {"containerStatuses": [
            {"name": "c", "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
        assert_eq!(
            check_started(&pulling, "p", "c", false)
                .unwrap_err()
                .message,
            "container \"c\" in pod \"p\" is waiting to start: ErrImagePull"
        );
        let crashed = json!({"spec": {"nodeName": "n"}, "status": {"containerStatuses": [
            {"name": "c", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert!(check_started(&crashed, "p", "c", false).is_ok());
        let running = json!({"spec": {"nodeName": "n"}, "status": {"containerStatuses": [
            {"name": "c", "restartCount": 0, "state": {"running": {}}}]}});
        assert!(check_started(&running, "p", "c", false).is_ok());
    }

    #[tokio::test]
    async fn limit_bytes_cuts_the_stream() {
        let stream = futures::stream::iter([Bytes::from("hello "), Bytes::from("world")]).boxed();
        let text: Vec<Bytes> = limit_stream(stream, 8).collect().await;
        assert_eq!(text.concat(), b"hello wo");
    }
}
