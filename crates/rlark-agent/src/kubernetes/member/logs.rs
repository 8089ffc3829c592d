//! `rlark logs` of a Pod the Kubernetes runtime mirrors (docs/tasks.md, "Logs and exec on
//! a member cluster"): the agent's local API (`GET /logs/{namespace}/{pod}`, [`crate::api`])
//! finds the rlark Pod, reads the member Pod it mirrors from the annotation
//! [`MEMBER_POD_ANNOTATION`] and streams the member API's `GET .../pods/{name}/log`.
//!
//! - [`parse_member_pod`] (pure): the annotation → member namespace and name;
//! - [`default_container`] (pure): the container read when the request names none;
//! - [`log_params`] (pure): the local API's options → the member API's;
//! - [`MemberPods`]: the clients, and [`MemberPods::resolve`] / [`MemberPods::log`].

use futures::{AsyncReadExt as _, Stream};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Pod as MemberPod;
use kube::api::{Api, LogParams};
use rlark_api::agent::local::LogOptions;
use rlark_api::types::Pod;

pub use super::MEMBER_POD_ANNOTATION;
/// The annotation kubectl reads for the container of `kubectl logs` / `exec` without `-c`.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Largest piece of a member log sent at once.
const CHUNK: usize = 32 * 1024;

/// Failures of routing a request to a member Pod, each with the HTTP status the local API
/// answers.
#[derive(Debug, thiserror::Error)]
pub enum MemberPodError {
    #[error(
        "pod {namespace}/{pod}: annotation {MEMBER_POD_ANNOTATION}={value:?} is not \
         <namespace>/<name>: {reason}"
    )]
    BadAnnotation {
        namespace: String,
        pod: String,
        value: String,
        reason: String,
    },
    #[error("read pod {namespace}/{pod} from the control plane: {source}")]
    Control {
        namespace: String,
        pod: String,
        source: kube::Error,
    },
    #[error("member pod {namespace}/{pod}: {message}")]
    Member {
        namespace: String,
        pod: String,
        /// The member API's status code (502 when it did not answer with one).
        code: u16,
        message: String,
    },
    #[error("member pod {namespace}/{pod} has no container")]
    NoContainer { namespace: String, pod: String },
}

impl MemberPodError {
    /// The status the local API answers with.
    pub fn status(&self) -> http::StatusCode {
        match self {
            MemberPodError::BadAnnotation { .. } | MemberPodError::NoContainer { .. } => {
                http::StatusCode::CONFLICT
            }
            MemberPodError::Control { .. } => http::StatusCode::BAD_GATEWAY,
            MemberPodError::Member { code, .. } => {
                http::StatusCode::from_u16(*code).unwrap_or(http::StatusCode::BAD_GATEWAY)
            }
        }
    }

    fn member(namespace: &str, pod: &str, error: kube::Error) -> Self {
        let (code, message) = match error {
            kube::Error::Api(status) => (status.code, status.message.clone()),
            other => (502, other.to_string()),
        };
        MemberPodError::Member {
            namespace: namespace.into(),
            pod: pod.into(),
            code,
            message,
        }
    }
}

/// The member namespace and name in `value`, the annotation of rlark Pod `namespace/pod`
/// (pure): both DNS names, nothing else.
pub fn parse_member_pod(
    namespace: &str,
    pod: &str,
    value: &str,
) -> Result<(String, String), MemberPodError> {
    let bad = |reason: String| MemberPodError::BadAnnotation {
        namespace: namespace.into(),
        pod: pod.into(),
        value: value.into(),
        reason,
    };
    let (ns, name) = value.split_once('/').ok_or_else(|| bad("no '/'".into()))?;
    rlark_api::names::dns1123_label(ns).map_err(|e| bad(format!("namespace: {e}")))?;
    rlark_api::names::dns1123_subdomain(name).map_err(|e| bad(format!("name: {e}")))?;
    Ok((ns.to_string(), name.to_string()))
}

/// The container a request without one reads (pure): the one named by
/// [`DEFAULT_CONTAINER_ANNOTATION`] when the Pod has it, else the first container, as
/// kubectl chooses.
pub fn default_container(pod: &MemberPod) -> Option<String> {
    let containers: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DEFAULT_CONTAINER_ANNOTATION))
        .filter(|name| containers.contains(&name.as_str()));
    annotated
        .cloned()
        .or_else(|| containers.first().map(|c| c.to_string()))
}

/// The member API's log parameters for the local API's `options` (pure): `tail` →
/// `tailLines`, `limitBytes`, `follow`, `previous` (the container's previous instance,
/// where the raw runtime reads the previous run).
pub fn log_params(options: &LogOptions, container: &str) -> LogParams {
    LogParams {
        container: Some(container.to_string()),
        follow: options.follow,
        previous: options.previous,
        tail_lines: options.tail.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        limit_bytes: options
            .limit_bytes
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
        ..LogParams::default()
    }
}

/// The clients the local API reaches member Pods with: the control plane's (to read the
/// rlark Pod's annotation) and the member cluster's.
#[derive(Clone)]
pub struct MemberPods {
    control: kube::Client,
    member: kube::Client,
}

impl std::fmt::Debug for MemberPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberPods").finish_non_exhaustive()
    }
}

impl MemberPods {
    /// Route through `control` (the agent's client of the control plane) and `member`.
    pub fn new(control: kube::Client, member: kube::Client) -> Self {
        MemberPods { control, member }
    }

    /// The member client.
    pub fn member(&self) -> &kube::Client {
        &self.member
    }

    /// The member Pod rlark Pod `namespace/pod` mirrors: `None` when there is no such rlark
    /// Pod or it carries no [`MEMBER_POD_ANNOTATION`] (the raw runtime's replicas).
    pub async fn resolve(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<(String, String)>, MemberPodError> {
        let pods: Api<Pod> = Api::namespaced(self.control.clone(), namespace);
        let found = pods
            .get_opt(pod)
            .await
            .map_err(|source| MemberPodError::Control {
                namespace: namespace.into(),
                pod: pod.into(),
                source,
            })?;
        let Some(value) = found
            .as_ref()
            .and_then(|p| p.metadata.annotations.as_ref())
            .and_then(|a| a.get(MEMBER_POD_ANNOTATION))
        else {
            return Ok(None);
        };
        parse_member_pod(namespace, pod, value).map(Some)
    }

    /// The container of member Pod `namespace/name` a request without one uses.
    pub async fn container(&self, namespace: &str, name: &str) -> Result<String, MemberPodError> {
        let api: Api<MemberPod> = Api::namespaced(self.member.clone(), namespace);
        let pod = api
            .get(name)
            .await
            .map_err(|e| MemberPodError::member(namespace, name, e))?;
        default_container(&pod).ok_or_else(|| MemberPodError::NoContainer {
            namespace: namespace.into(),
            pod: name.into(),
        })
    }

    /// The log of `container` (default: [`Self::container`]) of member Pod
    /// `namespace/name` as `options` ask, as a stream of pieces of at most 32 KiB; the
    /// member API's refusal (unknown Pod or container, container waiting to start, no
    /// previous instance, ...) is an error with its code and message.
    pub async fn log(
        &self,
        namespace: &str,
        name: &str,
        options: &LogOptions,
        container: Option<&str>,
    ) -> Result<impl Stream<Item = std::io::Result<Bytes>> + Send + use<>, MemberPodError> {
        let container = match container {
            Some(container) => container.to_string(),
            None => self.container(namespace, name).await?,
        };
        let api: Api<MemberPod> = Api::namespaced(self.member.clone(), namespace);
        let reader = api
            .log_stream(name, &log_params(options, &container))
            .await
            .map_err(|e| MemberPodError::member(namespace, name, e))?;
        Ok(futures::stream::unfold(
            Some(Box::pin(reader)),
            |reader| async move {
                let mut reader = reader?;
                let mut buf = vec![0u8; CHUNK];
                match reader.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(Bytes::from(buf)), Some(reader)))
                    }
                    Err(e) => Some((Err(e), None)),
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    #[test]
    fn the_annotation_names_a_member_pod() {
        assert_eq!(
            parse_member_pod("rlark-k1", "p", "work/actor-0").unwrap(),
            ("work".to_string(), "actor-0".to_string())
        );
        for bad in [
            "actor-0", "/actor-0", "work/", "Work/a", "work/a/b", "../etc/a", "work/a b",
        ] {
            let error = parse_member_pod("rlark-k1", "p", bad).expect_err(bad);
            assert_eq!(error.status(), http::StatusCode::CONFLICT, "{bad}");
            assert!(error.to_string().contains(MEMBER_POD_ANNOTATION), "{error}");
        }
    }

    fn pod(containers: &[&str], default: Option<&str>) -> MemberPod {
        MemberPod {
            metadata: ObjectMeta {
                annotations: default
                    .map(|d| [(DEFAULT_CONTAINER_ANNOTATION.to_string(), d.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .map(|name| Container {
                        name: name.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn the_default_container_is_kubectls() {
        assert_eq!(
            default_container(&pod(&["main", "tb"], None)).as_deref(),
            Some("main")
        );
        assert_eq!(
            default_container(&pod(&["main", "tb"], Some("tb"))).as_deref(),
            Some("tb")
        );
        assert_eq!(
            default_container(&pod(&["main"], Some("gone"))).as_deref(),
            Some("main"),
            "an annotation naming no container is ignored"
        );
        assert_eq!(default_container(&pod(&[], None)), None);
    }

    #[test]
    fn options_map_to_the_member_log_parameters() {
        let options = LogOptions {
            tail: Some(3),
            follow: true,
            previous: true,
            limit_bytes: Some(100),
        };
        let params = log_params(&options, "main");
        assert_eq!(params.container.as_deref(), Some("main"));
        assert!(params.follow && params.previous);
        assert_eq!(params.tail_lines, Some(3));
        assert_eq!(params.limit_bytes, Some(100));
        let params = log_params(&LogOptions::default(), "c");
        assert!(!params.follow && !params.previous);
        assert_eq!((params.tail_lines, params.limit_bytes), (None, None));
    }

    #[test]
    fn member_refusals_keep_their_code() {
        let status = kube::core::Status::failure(
            "container \"main\" is waiting to start: ContainerCreating",
            "BadRequest",
        )
        .with_code(400)
        .boxed();
        let error = MemberPodError::member("work", "a-0", kube::Error::Api(status));
        assert_eq!(error.status(), http::StatusCode::BAD_REQUEST);
        assert!(error.to_string().contains("waiting to start"), "{error}");
    }
}
