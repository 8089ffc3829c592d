//! TensorBoard beside a Kubernetes task's replicas, for its Task's `tensorBoardDir`
//! (docs/ssh.md, "TensorBoard").
//!
//! A raw replica gets a TensorBoard process from its agent (`crate::tasks::tensorboard`); a
//! member Pod gets a **native sidecar** (Kubernetes 1.29+): an init container named
//! [`SIDECAR`] with `restartPolicy: Always`, so that it starts before the main containers,
//! shares the Pod's network (the task proxy reaches `POD_IP:`[`PORT`]), and is stopped when
//! the main containers end (a plain container would keep a Job's Pod running for ever). It
//! runs `tensorboard --logdir DIR --bind_all --port 6006` in the agent's TensorBoard image
//! (`rlark agent --tensorboard-image`, as RLark's sidecar does).
//!
//! The logs must be where both containers see them: when a volume mounted in the first
//! container covers `DIR`, the sidecar mounts that volume at the same path, read-only;
//! otherwise an `emptyDir` ([`VOLUME`]) is mounted at `DIR` in every container. `DIR` must be
//! absolute (it is a path in the container; refused otherwise, the Task fails saying so). A
//! template that already has a container or init container named [`SIDECAR`] is left as it
//! is (the user runs their own).
//!
//! The Pod template carries [`DIR_ANNOTATION`], which [`status`] reads back from the member
//! Pod: the Pod's `status.tensorBoard` has the port while the sidecar runs, else why not
//! (its waiting reason, e.g. an image that cannot be pulled).

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, Pod as MemberPod, PodSpec, Volume, VolumeMount,
};
use rlark_api::types::PodTensorBoard;

/// The sidecar's container name.
pub const SIDECAR: &str = "tensorboard";
/// The port TensorBoard serves on, in the Pod's network (RLark's too).
pub const PORT: i32 = 6006;
/// The `emptyDir` volume shared with the sidecar when no volume of the template covers the
/// log directory.
pub const VOLUME: &str = "rlark-tensorboard";
/// Pod template annotation: the log directory of the injected sidecar.
pub const DIR_ANNOTATION: &str = "rlark.io/tensorboard-dir";
/// The image when the agent is given none (`rlark agent --tensorboard-image`): TensorFlow's
/// official image, which has the `tensorboard` command.
pub const DEFAULT_IMAGE: &str = "tensorflow/tensorflow:2.15.0";

/// Whether `dir` is `mount` or below it (`/data` covers `/data` and `/data/runs`, not
/// `/database`).
fn covers(mount: &str, dir: &str) -> bool {
    let mount = mount.trim_end_matches('/');
    mount.is_empty() || dir == mount || dir.starts_with(&format!("{mount}/"))
}

/// Add the sidecar for log directory `dir` to `pod` (module docs). Returns whether it was
/// added (false: the template has its own [`SIDECAR`]), or why it cannot be.
pub(crate) fn add_sidecar(pod: &mut PodSpec, dir: &str, image: &str) -> Result<bool, String> {
    if !dir.starts_with('/') {
        return Err(format!(
            "tensorBoardDir {dir:?} must be an absolute path in the container for a Kubernetes \
             task"
        ));
    }
    let taken = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .any(|c| c.name == SIDECAR);
    if taken {
        return Ok(false);
    }
    // The longest mount of the first container that covers the directory.
    let shared = pod.containers.first().and_then(|main| {
        main.volume_mounts
            .iter()
            .flatten()
            .filter(|m| covers(&m.mount_path, dir))
            .max_by_key(|m| m.mount_path.len())
            .cloned()
    });
    let mount = match shared {
        Some(mount) => VolumeMount {
            read_only: Some(true),
            ..mount
        },
        None => {
            let volumes = pod.volumes.get_or_insert_with(Vec::new);
            if volumes.iter().any(|v| v.name == VOLUME) {
                return Err(format!(
                    "the Pod template already has a volume named {VOLUME}, which the \
                     TensorBoard sidecar needs"
                ));
            }
            volumes.push(Volume {
                name: VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            });
            let mount = VolumeMount {
                name: VOLUME.to_string(),
                mount_path: dir.to_string(),
                ..Default::default()
            };
            for container in &mut pod.containers {
                container
                    .volume_mounts
                    .get_or_insert_with(Vec::new)
                    .push(mount.clone());
            }
            VolumeMount {
                read_only: Some(true),
                ..mount
            }
        }
    };
    pod.init_containers
        .get_or_insert_with(Vec::new)
        .push(Container {
            name: SIDECAR.to_string(),
            image: Some(image.to_string()),
            restart_policy: Some("Always".to_string()),
            command: Some(vec!["tensorboard".to_string()]),
            args: Some(vec![
                "--logdir".to_string(),
                dir.to_string(),
                "--bind_all".to_string(),
                "--port".to_string(),
                PORT.to_string(),
            ]),
            ports: Some(vec![ContainerPort {
                name: Some(SIDECAR.to_string()),
                container_port: PORT,
                protocol: Some("TCP".to_string()),
                ..Default::default()
            }]),
            volume_mounts: Some(vec![mount]),
            ..Default::default()
        });
    Ok(true)
}

/// The TensorBoard of member Pod `pod` when it has the injected sidecar: its port while
/// the sidecar runs, else why it does not (`None`: no sidecar was injected).
pub fn status(pod: &MemberPod) -> Option<PodTensorBoard> {
    let dir = pod.metadata.annotations.as_ref()?.get(DIR_ANNOTATION)?;
    let sidecar = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|list| list.iter().find(|c| c.name == SIDECAR));
    let state = sidecar.and_then(|c| c.state.as_ref());
    let mut out = PodTensorBoard {
        log_dir: Some(dir.clone()),
        ..Default::default()
    };
    match state {
        Some(state) if state.running.is_some() => out.port = Some(PORT),
        Some(state) => {
            out.message = Some(match (&state.waiting, &state.terminated) {
                (Some(waiting), _) => format!(
                    "the TensorBoard sidecar is waiting: {}{}",
                    waiting.reason.as_deref().unwrap_or("no reason given"),
                    waiting
                        .message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ),
                (None, Some(terminated)) => format!(
                    "the TensorBoard sidecar exited with code {}{}",
                    terminated.exit_code,
                    terminated
                        .reason
                        .as_deref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                ),
                (None, None) => "the TensorBoard sidecar has not started".to_string(),
            });
        }
        None => out.message = Some("the TensorBoard sidecar has not started".to_string()),
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod_with(mounts: Vec<VolumeMount>) -> PodSpec {
        PodSpec {
            containers: vec![
                Container {
                    name: "main".into(),
                    volume_mounts: Some(mounts),
                    ..Default::default()
                },
                Container {
                    name: "helper".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    fn sidecar(pod: &PodSpec) -> &Container {
        pod.init_containers
            .iter()
            .flatten()
            .find(|c| c.name == SIDECAR)
            .expect("sidecar")
    }

    #[test]
    fn the_sidecar_is_a_native_sidecar_on_an_empty_dir_shared_with_every_container() {
        let mut pod = pod_with(vec![]);
        assert!(add_sidecar(&mut pod, "/logs/runs", "tb:1").expect("added"));
        let tb = sidecar(&pod);
        assert_eq!(tb.restart_policy.as_deref(), Some("Always"));
        assert_eq!(tb.image.as_deref(), Some("tb:1"));
        assert_eq!(
            tb.args.as_deref().unwrap(),
            ["--logdir", "/logs/runs", "--bind_all", "--port", "6006"]
        );
        assert_eq!(tb.ports.as_ref().unwrap()[0].container_port, PORT);
        let volume = &pod.volumes.as_ref().unwrap()[0];
        assert_eq!(volume.name, VOLUME);
        assert!(volume.empty_dir.is_some());
        for container in &pod.containers {
            let mount = &container.volume_mounts.as_ref().unwrap()[0];
            assert_eq!(
                (mount.name.as_str(), mount.mount_path.as_str()),
                (VOLUME, "/logs/runs")
            );
            assert_eq!(mount.read_only, None, "{} writes the logs", container.name);
        }
        assert_eq!(tb.volume_mounts.as_ref().unwrap()[0].read_only, Some(true));
    }

    #[test]
    fn a_volume_that_covers_the_directory_is_shared_read_only() {
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            sub_path: Some("sub".into()),
            ..Default::default()
        };
        let mut pod = pod_with(vec![
            mount("data", "/data"),
            mount("runs", "/data/runs/"),
            mount("database", "/database"),
        ]);
        add_sidecar(&mut pod, "/data/runs/ppo", "tb:1").expect("added");
        let shared = &sidecar(&pod).volume_mounts.as_ref().unwrap()[0];
        assert_eq!(shared.name, "runs", "the longest covering mount");
        assert_eq!(shared.sub_path.as_deref(), Some("sub"));
        assert_eq!(shared.read_only, Some(true));
        assert!(pod.volumes.is_none(), "no volume added");
        assert!(!covers("/data", "/database"));
        assert!(covers("/", "/anything"));
    }

    #[test]
    fn relative_directories_are_refused_and_a_users_own_sidecar_is_kept() {
        let mut pod = pod_with(vec![]);
        let error = add_sidecar(&mut pod, "runs", "tb:1").expect_err("relative");
        assert!(error.contains("absolute path"), "{error}");
        let mut own = pod_with(vec![]);
        own.containers[1].name = SIDECAR.into();
        assert!(!add_sidecar(&mut own, "/logs", "tb:1").expect("kept"));
        assert!(own.init_containers.is_none() && own.volumes.is_none());
    }

    fn member_pod(state: Option<ContainerState>) -> MemberPod {
        MemberPod {
            metadata: ObjectMeta {
                annotations: Some([(DIR_ANNOTATION.to_string(), "/logs".to_string())].into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                init_container_statuses: state.map(|state| {
                    vec![ContainerStatus {
                        name: SIDECAR.into(),
                        state: Some(state),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_status_has_the_port_while_the_sidecar_runs_else_why_not() {
        let running = status(&member_pod(Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        })))
        .expect("sidecar");
        assert_eq!(running.port, Some(PORT));
        assert_eq!(running.log_dir.as_deref(), Some("/logs"));
        assert_eq!(running.message, None);
        let waiting = status(&member_pod(Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".into()),
                message: Some("pull tb:1: not found".into()),
            }),
            ..Default::default()
        })))
        .expect("sidecar");
        assert_eq!(waiting.port, None);
        assert_eq!(
            waiting.message.as_deref(),
            Some("the TensorBoard sidecar is waiting: ImagePullBackOff: pull tb:1: not found")
        );
        let pending = status(&member_pod(None)).expect("sidecar");
        assert!(pending.message.unwrap().contains("not started"));
        assert_eq!(status(&MemberPod::default()), None, "no sidecar injected");
    }
}
