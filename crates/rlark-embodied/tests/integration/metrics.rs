//! `GET /metrics` of the embodied runtime (`--metrics-listen`): the runtime with the sim
//! configuration (examples/embodied/sim.yaml), cam-0 opened over its unix socket with a
//! tonic client, then a scrape: arm-0's state in `rlark_embodied_robots{state}`, cam-0's
//! frames counted, the camera open, a slow WatchFrames reader's skipped frames counted. A bad address fails before any socket exists.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use hyper_util::rt::TokioIo;
use rlark_embodied::{CAMERA_SOCKET, EmbodiedConfig, ServeError, ServeOptions};
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Uri};

/// Bound of every wait in these tests.
const DEADLINE: Duration = Duration::from_secs(20);

fn sim_config() -> Result<EmbodiedConfig> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/embodied/sim.yaml");
    Ok(EmbodiedConfig::from_file(&path)?)
}

/// One `GET path` over HTTP/1.1; returns the status line and body.
async fn get(addr: SocketAddr, path: &str) -> Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    tokio::time::timeout(DEADLINE, stream.read_to_string(&mut response))
        .await
        .context("metrics response timed out")??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no end of headers")?;
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// The value of the sample line starting with `series` (name and labels).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Watch cam-0 on a connection with a small stream window, reading slowly until a frame
/// reports skipped frames; returns how many the stream skipped.
async fn slow_watcher_skips(socket: &Path) -> Result<u64> {
    let socket = socket.to_path_buf();
    let channel = Endpoint::from_static("http://localhost")
        .initial_stream_window_size(64 << 10)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await?;
    let mut client = CameraControllerClient::new(channel).max_decoding_message_size(64 << 20);
    let mut stream = client
        .watch_frames(pb::WatchFramesRequest {
            camera_id: "cam-0".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let read = async {
        loop {
            let frame = stream.message().await?.context("WatchFrames ended")?;
            if frame.dropped > 0 {
                return anyhow::Ok(frame.dropped);
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .context("the slow watcher never skipped a frame")?
}

#[tokio::test]
async fn metrics_report_robot_states_and_camera_frames() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shutdown = CancellationToken::new();
    let options = ServeOptions {
        metrics_listen: Some("127.0.0.1:0".parse()?),
    };
    let running = rlark_embodied::serve_with(
        sim_config()?,
        &dir.path().join("run"),
        options,
        shutdown.clone(),
    )
    .await?;
    let addr = running.metrics_addr().context("no metrics address")?;
    ensure!(addr.port() != 0, "port 0 was not resolved: {addr}");

    // Before any camera opens: arm-0 is stopped, nothing open.
    let (status, body) = get(addr, "/metrics").await?;
    ensure!(status.contains("200"), "{status}\n{body}");
    ensure!(
        sample(&body, "rlark_embodied_robots{state=\"stopped\"}") == Some(1.0),
        "{body}"
    );
    ensure!(
        sample(&body, "rlark_embodied_cameras_open") == Some(0.0),
        "{body}"
    );

    // Open cam-0 and take a frame over the unix socket.
    let socket = dir.path().join("run").join(CAMERA_SOCKET);
    let channel = rlark_embodied::client::connect(socket.clone()).await?;
    let mut client = CameraControllerClient::new(channel).max_decoding_message_size(64 << 20);
    client
        .open_camera(pb::OpenCameraRequest {
            camera_id: "cam-0".into(),
            ..Default::default()
        })
        .await?;
    let frame = client
        .capture_frame(pb::CaptureFrameRequest {
            camera_id: "cam-0".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(frame.sequence > 0, "no frame (sequence 0)");

    // A slow WatchFrames reader (small HTTP/2 window, so little is buffered) skips frames.
    let skipped = slow_watcher_skips(&socket).await?;

    let (status, body) = get(addr, "/metrics").await?;
    ensure!(status.contains("200"), "{status}\n{body}");
    let state = running.robots().status("arm-0")?.state;
    let state = rlark_proto::robot::v1::RobotState::try_from(state)?;
    let series = format!(
        "rlark_embodied_robots{{state=\"{}\"}}",
        rlark_embodied::metrics::state_label(state)
    );
    ensure!(sample(&body, &series) == Some(1.0), "{series}\n{body}");
    let frames = sample(
        &body,
        "rlark_embodied_camera_frames_total{camera=\"cam-0\"}",
    );
    ensure!(frames.is_some_and(|n| n > 0.0), "{body}");
    ensure!(
        sample(&body, "rlark_embodied_cameras_open") == Some(1.0),
        "{body}"
    );
    let dropped = sample(
        &body,
        "rlark_embodied_watch_frames_dropped_total{camera=\"cam-0\"}",
    );
    ensure!(
        dropped.is_some_and(|n| n >= skipped as f64),
        "skipped {skipped}\n{body}"
    );

    let (status, _) = get(addr, "/").await?;
    ensure!(status.contains("404"), "{status}");

    shutdown.cancel();
    tokio::time::timeout(DEADLINE, running.wait())
        .await
        .context("runtime did not stop")??;
    Ok(())
}

#[tokio::test]
async fn a_busy_metrics_address_fails_before_any_socket() -> Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?;
    let dir = tempfile::tempdir()?;
    let run_dir = dir.path().join("run");
    let options = ServeOptions {
        metrics_listen: Some(addr),
    };
    let result =
        rlark_embodied::serve_with(sim_config()?, &run_dir, options, CancellationToken::new())
            .await;
    match result {
        Err(e @ ServeError::Metrics { .. }) => {
            let text = e.to_string();
            ensure!(text.contains("--metrics-listen"), "{text}");
            ensure!(text.contains(&addr.to_string()), "{text}");
        }
        Err(e) => anyhow::bail!("unexpected error: {e}"),
        Ok(_) => anyhow::bail!("a taken address was accepted"),
    }
    ensure!(!run_dir.exists(), "the socket directory was created");
    Ok(())
}
