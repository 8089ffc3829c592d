//! The device plugin against a fake kubelet: a `v1beta1.Registration` server on
//! `kubelet.sock` in a temporary device-plugin directory that records every Register call.
//! The runtime (`rlark_embodied::serve`) registers there; the test then talks to the
//! plugin's socket as the kubelet would: options, ListAndWatch, Allocate,
//! GetPreferredAllocation, health flips (a simulated arm fault, a camera device node that
//! disappears and comes back), and kubelet restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use rlark_embodied::robot::service::DETACH_METADATA;
use rlark_embodied::{EmbodiedConfig, ROS_SOCKET, Running};
use rlark_proto::deviceplugin::v1beta1 as api;
use rlark_proto::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use rlark_proto::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use rlark_proto::robot::v1 as robot;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

/// Longest any wait of this test may take.
const LIMIT: Duration = Duration::from_secs(20);

/// Records Register calls.
struct Recorder {
    calls: mpsc::UnboundedSender<api::RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let _ = self.calls.send(request.into_inner());
        Ok(Response::new(api::Empty {}))
    }
}

/// A fake kubelet: the Registration service on `DIR/kubelet.sock`.
struct FakeKubelet {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl FakeKubelet {
    fn start(dir: &Path, calls: mpsc::UnboundedSender<api::RegisterRequest>) -> Result<Self> {
        let listener = UnixListener::bind(dir.join("kubelet.sock"))?;
        let stop = CancellationToken::new();
        let signal = stop.clone();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Recorder { calls }))
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener),
                    signal.cancelled_owned(),
                )
                .await
                .expect("fake kubelet serves");
        });
        Ok(Self { stop, task })
    }

    async fn stop(self) -> Result<()> {
        self.stop.cancel();
        tokio::time::timeout(LIMIT, self.task)
            .await
            .context("fake kubelet did not stop")??;
        Ok(())
    }
}

async fn next_register(
    calls: &mut mpsc::UnboundedReceiver<api::RegisterRequest>,
) -> Result<api::RegisterRequest> {
    tokio::time::timeout(LIMIT, calls.recv())
        .await
        .context("no Register call within the limit")?
        .context("register channel closed")
}

/// The next ListAndWatch message in which `check` holds (earlier ones are skipped).
async fn watch_until(
    stream: &mut Streaming<api::ListAndWatchResponse>,
    what: &str,
    check: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Result<BTreeMap<String, String>> {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .with_context(|| format!("ListAndWatch: no list with {what} within the limit"))??
            .context("ListAndWatch ended")?;
        let health = health_map(&message);
        if check(&health) {
            return Ok(health);
        }
    }
}

fn health_map(message: &api::ListAndWatchResponse) -> BTreeMap<String, String> {
    message
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

fn config(root: &Path) -> String {
    format!(
        r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {{package: rlark_sim, launchFile: arm.launch, args: {{joints: "3"}}}}
      faulty: {{package: rlark_sim, launchFile: arm.launch, args: {{joints: "3", fault: "overcurrent on joint 2"}}}}
  - type: franka
    backend: ros1
    modes:
      impedance: {{package: franka_control, launchFile: impedance.launch}}
  - type: ur
    backend: ros2
    modes:
      drive: {{package: ur_robot_driver, launchFile: ur.launch.py}}
robots:
  - {{id: arm-0, type: sim-arm}}
  - {{id: panda, type: franka, masterPort: 11411}}
  - {{id: ur5, type: ur, domainId: 7}}
cameras:
  - {{id: cam-0, driver: sim, width: 64, height: 48, fps: 10, encoding: jpeg}}
  - {{id: usb-9, driver: v4l2, device: {root}/dev/video9, width: 64, height: 48, fps: 10, encoding: jpeg}}
macvlans:
  - {{parent: eth9, name: robot0, network: 192.0.2.0/24}}
devicePlugin:
  enabled: true
  model: testarm
  kubeletDir: {root}/kubelet
  binDir: {root}/bin
watchdog: 60s
"#,
        root = root.display()
    )
}

async fn allocate(
    plugin: &mut DevicePluginClient<Channel>,
    ids: &[&str],
) -> Result<api::ContainerAllocateResponse, Status> {
    let response = plugin
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        })
        .await?
        .into_inner();
    assert_eq!(response.container_responses.len(), 1);
    Ok(response
        .container_responses
        .into_iter()
        .next()
        .expect("one"))
}

struct Setup {
    root: tempfile::TempDir,
    running: Running,
    shutdown: CancellationToken,
}

impl Setup {
    fn kubelet_dir(&self) -> PathBuf {
        self.root.path().join("kubelet")
    }
    fn plugin_socket(&self) -> PathBuf {
        self.kubelet_dir().join("rlinf-device-testarm.sock")
    }
    fn socket_dir(&self) -> PathBuf {
        self.root.path().join("run")
    }
}

#[tokio::test]
async fn registers_lists_allocates_and_follows_health_and_kubelet_restarts() -> Result<()> {
    let root = tempfile::tempdir()?;
    std::fs::create_dir_all(root.path().join("kubelet"))?;
    std::fs::create_dir_all(root.path().join("bin"))?;
    std::fs::create_dir_all(root.path().join("dev"))?;
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let kubelet = FakeKubelet::start(&root.path().join("kubelet"), calls_tx.clone())?;

    let config = EmbodiedConfig::from_yaml(&config(root.path()))?;
    let shutdown = CancellationToken::new();
    let running = rlark_embodied::serve(config, &root.path().join("run"), shutdown.clone()).await?;
    let s = Setup {
        root,
        running,
        shutdown,
    };

    // Registration: version, endpoint (the socket's file name), resource, options.
    let registered = next_register(&mut calls).await?;
    assert_eq!(registered.version, "v1beta1");
    assert_eq!(registered.endpoint, "rlinf-device-testarm.sock");
    assert_eq!(registered.resource_name, "rlinf.io/device-testarm");
    let options = registered.options.context("options")?;
    assert!(!options.pre_start_required);
    assert!(options.get_preferred_allocation_available);
    assert!(s.plugin_socket().exists());

    // As the kubelet: dial the endpoint.
    let mut plugin =
        DevicePluginClient::new(rlark_embodied::client::connect(s.plugin_socket()).await?);
    let options = plugin
        .get_device_plugin_options(api::Empty {})
        .await?
        .into_inner();
    assert!(options.get_preferred_allocation_available);

    // The first list: a device per robot and camera; the camera whose device node is
    // missing is unhealthy.
    let mut stream = plugin.list_and_watch(api::Empty {}).await?.into_inner();
    let first = stream.message().await?.context("first list")?;
    let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "robot-arm-0",
            "robot-panda",
            "robot-ur5",
            "camera-cam-0",
            "camera-usb-9"
        ]
    );
    let health = health_map(&first);
    for id in ["robot-arm-0", "robot-panda", "robot-ur5", "camera-cam-0"] {
        assert_eq!(health[id], "Healthy", "{id}: {health:?}");
    }
    assert_eq!(health["camera-usb-9"], "Unhealthy");

    // Allocate one ROS 1 robot: every RLINF_EMBODIED_* variable, ROS_MASTER_URI, mounts.
    let socket_dir = std::path::absolute(s.socket_dir())?;
    let sock = |name: &str| socket_dir.join(name).display().to_string();
    let panda = allocate(&mut plugin, &["robot-panda"]).await?;
    let expected: BTreeMap<String, String> = [
        ("RLINF_EMBODIED_RUNTIME_ENABLED", "1".to_string()),
        ("RLINF_EMBODIED_PATH", "/opt/rlinf/bin".into()),
        ("RLINF_EMBODIED_ROS_ENABLED", "1".into()),
        ("RLINF_EMBODIED_ROS_SOCKET_PATH", sock("ros-ctrl.sock")),
        ("RLINF_EMBODIED_ROS2_ENABLED", "1".into()),
        ("RLINF_EMBODIED_ROS2_SOCKET_PATH", sock("ros2-ctrl.sock")),
        ("RLINF_EMBODIED_CAMERA_ENABLED", "1".into()),
        (
            "RLINF_EMBODIED_CAMERA_SOCKET_PATH",
            sock("camera-ctrl.sock"),
        ),
        ("RLINF_EMBODIED_DEVINIT_ENABLED", "1".into()),
        ("RLINF_EMBODIED_DEVINIT_SOCKET_PATH", sock("devinit.sock")),
        ("ROS_MASTER_URI", "http://127.0.0.1:11411".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(panda.envs, expected);
    let mounts: Vec<(&str, &str, bool)> = panda
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    let socket_dir_text = socket_dir.display().to_string();
    let bin_dir = s.root.path().join("bin").display().to_string();
    assert_eq!(
        mounts,
        [
            (socket_dir_text.as_str(), socket_dir_text.as_str(), true),
            ("/opt/rlinf/bin", bin_dir.as_str(), true)
        ]
    );
    assert_eq!(panda.annotations["rlinf.io/devices"], "robot-panda");
    // The socket paths exist where the env says (the mount shows the same directory).
    assert!(Path::new(&panda.envs["RLINF_EMBODIED_ROS_SOCKET_PATH"]).exists());
    assert!(Path::new(&panda.envs["RLINF_EMBODIED_DEVINIT_SOCKET_PATH"]).exists());

    // One ROS 2 robot: ROS_DOMAIN_ID, no master URI.
    let ur5 = allocate(&mut plugin, &["robot-ur5"]).await?;
    assert_eq!(ur5.envs.get("ROS_DOMAIN_ID").map(String::as_str), Some("7"));
    assert!(!ur5.envs.contains_key("ROS_MASTER_URI"));
    // Two robots, or a camera only: neither.
    for ids in [&["robot-panda", "robot-ur5"][..], &["camera-cam-0"][..]] {
        let response = allocate(&mut plugin, ids).await?;
        assert!(!response.envs.contains_key("ROS_MASTER_URI"), "{ids:?}");
        assert!(!response.envs.contains_key("ROS_DOMAIN_ID"), "{ids:?}");
        assert_eq!(response.envs["RLINF_EMBODIED_RUNTIME_ENABLED"], "1");
        assert_eq!(response.annotations["rlinf.io/devices"], ids.join(","));
    }
    // An ID the plugin never advertised.
    let unknown = allocate(&mut plugin, &["robot-nope"]).await.unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert!(
        unknown.message().contains("robot-nope"),
        "{}",
        unknown.message()
    );

    // Preferred allocation: robots first, in configuration order, must-include kept.
    let preferred = plugin
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![
                api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: ["camera-cam-0", "robot-ur5", "robot-arm-0"]
                        .map(String::from)
                        .to_vec(),
                    must_include_device_i_ds: vec![],
                    allocation_size: 1,
                },
                api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: ["camera-cam-0", "robot-ur5", "robot-arm-0"]
                        .map(String::from)
                        .to_vec(),
                    must_include_device_i_ds: vec!["camera-cam-0".into()],
                    allocation_size: 2,
                },
            ],
        })
        .await?
        .into_inner();
    let chosen: Vec<Vec<String>> = preferred
        .container_responses
        .into_iter()
        .map(|c| c.device_i_ds)
        .collect();
    assert_eq!(
        chosen,
        [
            vec!["robot-arm-0".to_string()],
            vec!["camera-cam-0".into(), "robot-arm-0".into()]
        ]
    );
    plugin
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec!["robot-arm-0".into()],
        })
        .await?;

    // A simulated arm fault puts arm-0 in ERROR: ListAndWatch sends it Unhealthy.
    let mut robots = RobotControllerClient::new(
        rlark_embodied::client::connect(s.socket_dir().join(ROS_SOCKET)).await?,
    );
    let mut start = Request::new(robot::StartRobotRequest {
        robot_id: "arm-0".into(),
        mode: "faulty".into(),
        mode_config: None,
    });
    start
        .metadata_mut()
        .insert(DETACH_METADATA, "true".parse()?);
    robots.start_robot(start).await?;
    let health = watch_until(&mut stream, "robot-arm-0 Unhealthy", |h| {
        h["robot-arm-0"] == "Unhealthy"
    })
    .await?;
    assert_eq!(health["robot-panda"], "Healthy");
    let status = s.running.robots().status("arm-0")?;
    assert_eq!(status.state, robot::RobotState::Error as i32, "{status:?}");

    // ResetRobot recovers it: Healthy again.
    robots
        .reset_robot(robot::ResetRobotRequest {
            robot_id: "arm-0".into(),
        })
        .await?;
    watch_until(&mut stream, "robot-arm-0 Healthy", |h| {
        h["robot-arm-0"] == "Healthy"
    })
    .await?;

    // The camera's device node appears (plugged in): Healthy; removed again: Unhealthy.
    let node = s.root.path().join("dev/video9");
    std::fs::write(&node, b"")?;
    watch_until(&mut stream, "camera-usb-9 Healthy", |h| {
        h["camera-usb-9"] == "Healthy"
    })
    .await?;
    std::fs::remove_file(&node)?;
    watch_until(&mut stream, "camera-usb-9 Unhealthy", |h| {
        h["camera-usb-9"] == "Unhealthy"
    })
    .await?;

    // The kubelet restarts and re-creates kubelet.sock: the plugin registers again.
    kubelet.stop().await?;
    std::fs::remove_file(s.kubelet_dir().join("kubelet.sock"))?;
    let kubelet = FakeKubelet::start(&s.kubelet_dir(), calls_tx.clone())?;
    let again = next_register(&mut calls).await?;
    assert_eq!(again.resource_name, "rlinf.io/device-testarm");
    assert_eq!(again.endpoint, "rlinf-device-testarm.sock");

    // A real kubelet also deletes the plugins' sockets when it starts: the plugin serves a
    // new socket, registers again, and the old ListAndWatch stream ends.
    kubelet.stop().await?;
    std::fs::remove_file(s.kubelet_dir().join("kubelet.sock"))?;
    std::fs::remove_file(s.plugin_socket())?;
    let kubelet = FakeKubelet::start(&s.kubelet_dir(), calls_tx.clone())?;
    let third = next_register(&mut calls).await?;
    assert_eq!(third.endpoint, "rlinf-device-testarm.sock");
    assert!(s.plugin_socket().exists());
    let ended = tokio::time::timeout(LIMIT, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the old ListAndWatch stream did not end");
    let mut plugin =
        DevicePluginClient::new(rlark_embodied::client::connect(s.plugin_socket()).await?);
    let mut stream = plugin.list_and_watch(api::Empty {}).await?.into_inner();
    let list = stream.message().await?.context("list after restart")?;
    assert_eq!(list.devices.len(), 5);

    // Shutdown removes the plugin's socket.
    let plugin_socket = s.plugin_socket();
    s.shutdown.cancel();
    s.running.wait().await?;
    if plugin_socket.exists() {
        bail!("plugin socket left behind after shutdown");
    }
    kubelet.stop().await?;
    Ok(())
}

#[tokio::test]
async fn waits_for_a_kubelet_that_is_not_there_yet() -> Result<()> {
    let root = tempfile::tempdir()?;
    let dir = root.path().join("kubelet");
    std::fs::create_dir_all(&dir)?;
    let yaml = format!(
        r#"
types:
  - type: sim-arm
    backend: sim
    modes:
      idle: {{package: rlark_sim, launchFile: arm.launch}}
robots:
  - {{id: arm-0, type: sim-arm}}
devicePlugin: {{enabled: true, kubeletDir: {}}}
"#,
        dir.display()
    );
    let shutdown = CancellationToken::new();
    let running = rlark_embodied::serve(
        EmbodiedConfig::from_yaml(&yaml)?,
        &root.path().join("run"),
        shutdown.clone(),
    )
    .await?;
    // The plugin serves before any kubelet exists, then registers once one appears.
    let socket = dir.join("rlinf-device.sock");
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !socket.exists() {
        if tokio::time::Instant::now() >= deadline {
            bail!("plugin socket {} never appeared", socket.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let kubelet = FakeKubelet::start(&dir, calls_tx)?;
    let registered = next_register(&mut calls).await?;
    assert_eq!(registered.resource_name, "rlinf.io/device");
    assert_eq!(registered.endpoint, "rlinf-device.sock");
    shutdown.cancel();
    running.wait().await?;
    kubelet.stop().await?;
    Ok(())
}

#[test]
fn device_plugin_configuration_is_validated_with_field_paths() {
    let yaml = r#"
types:
  - type: sim-arm
    backend: sim
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch}
robots:
  - {id: arm-0-with-a-name-long-enough-to-pass-the-kubelet-limit-of-63-chars, type: sim-arm}
devicePlugin: {enabled: true, model: "bad model!", kubeletDir: relative/dir}
"#;
    let error = EmbodiedConfig::from_yaml(yaml).unwrap_err().to_string();
    for needle in [
        "devicePlugin.model: \"bad model!\" does not make a resource name",
        "devicePlugin.kubeletDir: relative/dir must be an absolute path",
        "robots[0].id: device ID \"robot-arm-0-with",
    ] {
        assert!(error.contains(needle), "{error}\n lacks {needle:?}");
    }
    let error = EmbodiedConfig::from_yaml("devicePlugin: {enabled: true}\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("devicePlugin.enabled: the device plugin advertises robots and cameras"),
        "{error}"
    );
    let error = EmbodiedConfig::from_yaml("devicePlugin: {enabeld: true}\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("devicePlugin"), "{error}");
}
