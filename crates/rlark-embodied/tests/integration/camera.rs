//! The CameraController over a real unix socket with a tonic client: every RPC with the sim
//! camera, the frame encodings (JPEG and PNG decoded, raw sized, the burned-in counter read
//! back and compared with the sequence number), per-camera errors of CaptureFrames, ordered
//! WatchFrames streams, a slow watcher that skips frames instead of queueing them next to a
//! fast one, the ffmpeg-backed `file` driver (or its clear error without ffmpeg), and the
//! `rtsp` driver reading a live stream from an RTSP server of the test's (`support/rtsp.rs`).

use crate::missing_tool;
use crate::rtsp;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use hyper_util::rt::TokioIo;
use rlark_embodied::camera::{ffmpeg, sim};
use rlark_embodied::{CAMERA_SOCKET, EmbodiedConfig, Running};
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::CameraState;
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use tempfile::TempDir;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Streaming};

type Client = CameraControllerClient<Channel>;

/// Bound of every wait in these tests.
const DEADLINE: Duration = Duration::from_secs(20);

struct Harness {
    dir: TempDir,
    running: Running,
    shutdown: CancellationToken,
}

impl Harness {
    async fn start(yaml: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = EmbodiedConfig::from_yaml(yaml)?;
        let shutdown = CancellationToken::new();
        let running =
            rlark_embodied::serve(config, &dir.path().join("run"), shutdown.clone()).await?;
        Ok(Self {
            dir,
            running,
            shutdown,
        })
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run").join(CAMERA_SOCKET)
    }

    async fn client(&self) -> Result<Client> {
        let channel = rlark_embodied::client::connect(self.socket()).await?;
        // Raw frames are larger than tonic's default 4 MiB limit at big sizes.
        Ok(CameraControllerClient::new(channel).max_decoding_message_size(64 << 20))
    }

    /// A client on its own connection whose HTTP/2 streams may each have at most `window`
    /// bytes in flight (what the transport buffers for a reader that does not read).
    async fn client_with_window(&self, window: u32) -> Result<Client> {
        let socket = self.socket();
        let channel =
            Endpoint::from_static("http://localhost")
                .initial_stream_window_size(window)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?))
                    }
                }))
                .await?;
        Ok(CameraControllerClient::new(channel).max_decoding_message_size(64 << 20))
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        tokio::time::timeout(DEADLINE, self.running.wait())
            .await
            .context("runtime did not stop")??;
        Ok(())
    }
}

fn camera_yaml(id: &str, fields: &str) -> String {
    format!("  - {{id: {id}, {fields}}}\n")
}

fn state_of(value: i32) -> CameraState {
    CameraState::try_from(value).unwrap_or(CameraState::Unspecified)
}

/// Decode a JPEG to (width, height, RGB8).
fn decode_jpeg(data: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let mut decoder = jpeg_decoder::Decoder::new(data);
    let pixels = decoder.decode().context("decode JPEG")?;
    let info = decoder.info().context("JPEG info")?;
    ensure!(
        info.pixel_format == jpeg_decoder::PixelFormat::RGB24,
        "JPEG is {:?}",
        info.pixel_format
    );
    Ok((u32::from(info.width), u32::from(info.height), pixels))
}

/// Decode a PNG to (width, height, RGB8).
fn decode_png(data: &[u8]) -> Result<(u32, u32, Vec<u8>)> {
    let decoder = png::Decoder::new(std::io::Cursor::new(data));
    let mut reader = decoder.read_info().context("PNG header")?;
    let mut pixels = vec![0; reader.output_buffer_size().context("PNG size")?];
    let info = reader.next_frame(&mut pixels).context("decode PNG")?;
    ensure!(
        info.color_type == png::ColorType::Rgb && info.bit_depth == png::BitDepth::Eight,
        "PNG is {:?} {:?}",
        info.color_type,
        info.bit_depth
    );
    pixels.truncate(info.buffer_size());
    Ok((info.width, info.height, pixels))
}

/// The burned-in counter of a frame in any encoding.
fn counter(encoding: &str, data: &[u8], width: u32, height: u32) -> Result<u64> {
    let (w, h, rgb) = match encoding {
        "jpeg" => decode_jpeg(data)?,
        "png" => decode_png(data)?,
        "raw" => (width, height, data.to_vec()),
        other => bail!("unexpected encoding {other}"),
    };
    ensure!(
        (w, h) == (width, height),
        "frame is {w}x{h}, reported {width}x{height}"
    );
    sim::read_counter(&rgb, w, h).context("burned-in counter unreadable")
}

async fn capture(
    client: &mut Client,
    id: &str,
    encoding: Option<&str>,
) -> Result<pb::CaptureFrameResponse> {
    Ok(client
        .capture_frame(pb::CaptureFrameRequest {
            camera_id: id.into(),
            timeout: Some(5.0),
            encoding: encoding.map(Into::into),
        })
        .await?
        .into_inner())
}

async fn open(
    client: &mut Client,
    request: pb::OpenCameraRequest,
) -> Result<pb::OpenCameraResponse> {
    Ok(client.open_camera(request).await?.into_inner())
}

fn open_request(id: &str) -> pb::OpenCameraRequest {
    pb::OpenCameraRequest {
        camera_id: id.into(),
        ..Default::default()
    }
}

async fn next_frame(stream: &mut Streaming<pb::VideoFrame>) -> Result<pb::VideoFrame> {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .context("no frame in time")??
        .context("stream ended")
}

async fn watch(
    client: &mut Client,
    id: &str,
    encoding: Option<&str>,
) -> Result<Streaming<pb::VideoFrame>> {
    Ok(client
        .watch_frames(pb::WatchFramesRequest {
            camera_id: id.into(),
            encoding: encoding.map(Into::into),
        })
        .await?
        .into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_with_the_sim_camera() -> Result<()> {
    let yaml = format!(
        "cameras:\n{}{}",
        camera_yaml(
            "cam-0",
            "driver: sim, width: 320, height: 240, fps: 30, encoding: jpeg"
        ),
        camera_yaml(
            "cam-1",
            "driver: sim, width: 64, height: 48, fps: 5, encoding: png"
        ),
    );
    let harness = Harness::start(&yaml).await?;
    let mut client = harness.client().await?;

    // ListCameras / GetCameraInfo.
    let list = client
        .list_cameras(pb::ListCamerasRequest {})
        .await?
        .into_inner()
        .cameras;
    let configured: Vec<&pb::CameraDescriptor> =
        list.iter().filter(|c| c.camera_type == "sim").collect();
    assert_eq!(configured.len(), 2, "{list:?}");
    let cam0 = configured[0];
    assert_eq!(cam0.camera_id, "cam-0");
    assert_eq!((cam0.width, cam0.height, cam0.fps), (320, 240, 30));
    assert_eq!(cam0.encoding, "jpeg");
    assert_eq!(state_of(cam0.state), CameraState::Closed);
    assert!(
        cam0.supported_resolutions
            .iter()
            .any(|r| (r.width, r.height) == (320, 240))
    );
    let info = client
        .get_camera_info(pb::GetCameraInfoRequest {
            camera_id: "cam-1".into(),
        })
        .await?
        .into_inner()
        .camera
        .context("camera")?;
    assert_eq!(
        (info.camera_id.as_str(), info.encoding.as_str()),
        ("cam-1", "png")
    );
    let e = client
        .get_camera_info(pb::GetCameraInfoRequest {
            camera_id: "nope".into(),
        })
        .await
        .expect_err("unknown camera");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nope"), "{e:?}");
    let e = client
        .get_camera_info(pb::GetCameraInfoRequest::default())
        .await
        .expect_err("no id");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Nothing is read from a closed camera.
    let e = capture(&mut client, "cam-0", None)
        .await
        .expect_err("not open");
    let status = e.downcast_ref::<tonic::Status>().context("status")?;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("not open"), "{status:?}");
    let e = watch(&mut client, "cam-0", None)
        .await
        .expect_err("not open");
    let status = e.downcast_ref::<tonic::Status>().context("status")?;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");

    // Bad open requests.
    for (request, needle) in [
        (
            pb::OpenCameraRequest {
                width: Some(0),
                ..open_request("cam-0")
            },
            "width 0",
        ),
        (
            pb::OpenCameraRequest {
                fps: Some(1000),
                ..open_request("cam-0")
            },
            "fps 1000",
        ),
        (
            pb::OpenCameraRequest {
                encoding: Some("h264".into()),
                ..open_request("cam-0")
            },
            "h264",
        ),
    ] {
        let e = client.open_camera(request).await.expect_err("bad open");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(needle), "{e:?}");
    }

    // Open; again with the same settings is fine, with another size it is not.
    let opened = open(&mut client, open_request("cam-0")).await?;
    assert_eq!(state_of(opened.state), CameraState::Open);
    assert_eq!(
        (
            opened.encoding.as_str(),
            opened.width,
            opened.height,
            opened.fps
        ),
        ("jpeg", 320, 240, 30)
    );
    open(
        &mut client,
        pb::OpenCameraRequest {
            width: Some(320),
            ..open_request("cam-0")
        },
    )
    .await?;
    let e = client
        .open_camera(pb::OpenCameraRequest {
            width: Some(640),
            ..open_request("cam-0")
        })
        .await
        .expect_err("other size while open");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("close it first"), "{e:?}");

    // JPEG frames decode to the configured size; the burned-in counter is the sequence
    // number and increases.
    let first = capture(&mut client, "cam-0", None).await?;
    assert_eq!(first.encoding, "jpeg");
    assert_eq!(&first.data[..2], &[0xFF, 0xD8]);
    assert_eq!(counter("jpeg", &first.data, 320, 240)?, first.sequence);
    assert!(first.timestamp_ns > 0);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let later = loop {
        let frame = capture(&mut client, "cam-0", None).await?;
        if frame.sequence > first.sequence {
            break frame;
        }
        ensure!(tokio::time::Instant::now() < deadline, "no new frame");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let later_counter = counter("jpeg", &later.data, 320, 240)?;
    assert_eq!(later_counter, later.sequence);
    assert!(later_counter > first.sequence);
    assert!(later.timestamp_ns > first.timestamp_ns);

    // PNG (lossless) and raw of the same camera.
    let png = capture(&mut client, "cam-0", Some("png")).await?;
    assert_eq!(png.encoding, "png");
    assert_eq!(counter("png", &png.data, 320, 240)?, png.sequence);
    let raw = capture(&mut client, "cam-0", Some("raw")).await?;
    assert_eq!(
        (raw.encoding.as_str(), raw.width, raw.height),
        ("raw", 320, 240)
    );
    assert_eq!(raw.data.len(), 320 * 240 * 3);
    assert_eq!(counter("raw", &raw.data, 320, 240)?, raw.sequence);
    let e = client
        .capture_frame(pb::CaptureFrameRequest {
            camera_id: "cam-0".into(),
            timeout: Some(-1.0),
            encoding: None,
        })
        .await
        .expect_err("negative timeout");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    let info = client
        .get_camera_info(pb::GetCameraInfoRequest {
            camera_id: "cam-0".into(),
        })
        .await?
        .into_inner()
        .camera
        .context("camera")?;
    assert_eq!(state_of(info.state), CameraState::Open);
    assert!(info.last_sequence >= raw.sequence);

    // CaptureFrames: one good camera, an unknown one, a closed one; duplicates read once.
    let frames = client
        .capture_frames(pb::CaptureFramesRequest {
            camera_ids: vec![
                "cam-0".into(),
                "nope".into(),
                "cam-0".into(),
                "cam-1".into(),
            ],
            timeout: Some(5.0),
            encoding: None,
        })
        .await?
        .into_inner()
        .frames;
    let ids: Vec<&str> = frames.iter().map(|f| f.camera_id.as_str()).collect();
    assert_eq!(ids, ["cam-0", "nope", "cam-1"]);
    assert_eq!(frames[0].error_code, 0, "{:?}", frames[0].error);
    assert_eq!(
        counter("jpeg", &frames[0].data, 320, 240)?,
        frames[0].sequence
    );
    assert_eq!(frames[1].error_code, Code::NotFound as i32);
    assert!(frames[1].data.is_empty());
    assert_eq!(frames[2].error_code, Code::FailedPrecondition as i32);
    assert!(frames[2].error.contains("not open"), "{}", frames[2].error);

    // Close: frames stop; closing again is a no-op; unknown cameras are NotFound.
    let closed = client
        .close_camera(pb::CloseCameraRequest {
            camera_id: "cam-0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(state_of(closed.state), CameraState::Closed);
    let e = capture(&mut client, "cam-0", None)
        .await
        .expect_err("closed");
    let status = e.downcast_ref::<tonic::Status>().context("status")?;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    client
        .close_camera(pb::CloseCameraRequest {
            camera_id: "cam-0".into(),
        })
        .await?;
    let e = client
        .close_camera(pb::CloseCameraRequest {
            camera_id: "nope".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Reopened with other settings: a new session, sequence numbers from 1 again.
    let opened = open(
        &mut client,
        pb::OpenCameraRequest {
            width: Some(160),
            height: Some(120),
            fps: Some(60),
            encoding: Some("raw".into()),
            ..open_request("cam-0")
        },
    )
    .await?;
    assert_eq!((opened.width, opened.height, opened.fps), (160, 120, 60));
    let frame = capture(&mut client, "cam-0", None).await?;
    assert_eq!(
        (frame.encoding.as_str(), frame.data.len()),
        ("raw", 160 * 120 * 3)
    );
    assert!(
        frame.sequence < later.sequence,
        "sequence restarted: {}",
        frame.sequence
    );
    assert_eq!(counter("raw", &frame.data, 160, 120)?, frame.sequence);

    harness.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_frames_delivers_frames_in_order() -> Result<()> {
    let yaml = format!(
        "cameras:\n{}",
        camera_yaml(
            "cam-0",
            "driver: sim, width: 160, height: 120, fps: 60, encoding: jpeg"
        )
    );
    let harness = Harness::start(&yaml).await?;
    let mut client = harness.client().await?;
    open(&mut client, open_request("cam-0")).await?;

    let mut stream = watch(&mut client, "cam-0", None).await?;
    let mut last: Option<pb::VideoFrame> = None;
    let mut gaps = 0;
    for _ in 0..100 {
        let frame = next_frame(&mut stream).await?;
        assert_eq!(
            (frame.width, frame.height, frame.encoding.as_str()),
            (160, 120, "jpeg")
        );
        assert!(frame.keyframe);
        assert_eq!(counter("jpeg", &frame.data, 160, 120)?, frame.sequence);
        if let Some(previous) = &last {
            assert!(
                frame.sequence > previous.sequence,
                "sequence {} after {}",
                frame.sequence,
                previous.sequence
            );
            assert!(frame.timestamp_ns >= previous.timestamp_ns);
            gaps += frame.sequence - previous.sequence - 1;
        }
        last = Some(frame);
    }
    // `dropped` is the sum of the gaps this stream saw.
    assert_eq!(last.context("frames")?.dropped, gaps);

    // A watcher in another encoding gets the same frames in it.
    let mut png = watch(&mut client, "cam-0", Some("png")).await?;
    let frame = next_frame(&mut png).await?;
    assert_eq!(frame.encoding, "png");
    assert_eq!(counter("png", &frame.data, 160, 120)?, frame.sequence);

    // Closing the camera ends its streams with FailedPrecondition.
    let mut closer = client.clone();
    closer
        .close_camera(pb::CloseCameraRequest {
            camera_id: "cam-0".into(),
        })
        .await?;
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .context("stream did not end")?;
    let status = end.expect_err("closed camera ends the stream with a status");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("closed"), "{status:?}");

    // Shutdown ends a live stream too, and the runtime stops in time.
    open(&mut client, open_request("cam-0")).await?;
    let mut stream = watch(&mut client, "cam-0", None).await?;
    next_frame(&mut stream).await?;
    harness.shutdown.cancel();
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .context("stream did not end at shutdown")?;
    assert!(!matches!(end, Ok(Some(_))));
    harness.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_skips_frames_and_does_not_hold_back_a_fast_one() -> Result<()> {
    // What the transport may buffer for a stream the client does not read: the HTTP/2
    // stream window in the client (here 1 MiB, about 4.5 raw frames of 230 KB), plus a
    // frame or two in the server's HTTP/2 and gRPC send buffers. Reads needed to catch up
    // are bounded by that (+1 for the catching-up read, +1 spare); a queue would need ~36.
    const WINDOW: u32 = 1 << 20;
    const FRAME: u64 = 320 * 240 * 3;
    let in_flight = (u64::from(WINDOW)).div_ceil(FRAME) + 4;
    let yaml = format!(
        "cameras:\n{}",
        camera_yaml(
            "cam-0",
            "driver: sim, width: 320, height: 240, fps: 60, encoding: raw"
        )
    );
    let harness = Harness::start(&yaml).await?;
    let mut client = harness.client().await?;
    open(&mut client, open_request("cam-0")).await?;

    // The fast watcher, on its own connection, reads 90 frames as fast as it can.
    let mut fast_client = harness.client_with_window(WINDOW).await?;
    let mut fast = watch(&mut fast_client, "cam-0", None).await?;
    let fast_task = tokio::spawn(async move {
        let mut frames = Vec::new();
        for _ in 0..90 {
            frames.push(next_frame(&mut fast).await?.sequence);
        }
        anyhow::Ok(frames)
    });

    let mut slow_client = harness.client_with_window(WINDOW).await?;
    let mut slow = watch(&mut slow_client, "cam-0", None).await?;
    let mut previous = next_frame(&mut slow).await?;
    for round in 0..4 {
        // 600 ms is about 36 frames at 60 fps: a queue would hold them all.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let latest = capture(&mut client, "cam-0", None).await?.sequence;
        // What was in flight comes first; within that many reads the stream is at (or
        // past) the frame that was latest after the sleep.
        let mut reads = 0;
        let caught_up = loop {
            let frame = next_frame(&mut slow).await?;
            reads += 1;
            assert!(frame.sequence > previous.sequence);
            let gap = frame.sequence - previous.sequence - 1;
            assert_eq!(
                frame.dropped,
                previous.dropped + gap,
                "dropped counts the gaps"
            );
            previous = frame;
            if previous.sequence >= latest {
                break reads;
            }
            if reads == in_flight {
                bail!(
                    "round {round}: after {reads} reads the slow watcher is at frame {}, \
                     the camera was at {latest} before them: frames are queueing",
                    previous.sequence
                );
            }
        };
        eprintln!(
            "round {round}: caught up with frame {latest} in {caught_up} reads (bound {in_flight}), {} dropped so far",
            previous.dropped
        );
    }
    assert!(previous.dropped > 0, "a slow watcher skips frames");

    let fast_frames = tokio::time::timeout(DEADLINE, fast_task)
        .await
        .context("fast watcher did not get its frames")???;
    assert!(fast_frames.windows(2).all(|w| w[0] < w[1]));
    let span = fast_frames[fast_frames.len() - 1] - fast_frames[0] + 1;
    // Not held back by the slow one: it saw most of the frames of its span (the slow
    // watcher slept through ~24 frames at a time meanwhile).
    assert!(
        span <= 3 * fast_frames.len() as u64,
        "fast watcher got {} of {span} frames",
        fast_frames.len()
    );
    harness.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_driver_reads_a_video_through_ffmpeg() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let video = dir.path().join("clip.avi");
    let missing = dir.path().join("missing.avi");
    let yaml = format!(
        "cameras:\n{}{}{}{}",
        camera_yaml(
            "file-0",
            &format!(
                "driver: file, path: {}, width: 80, height: 60, fps: 10, encoding: jpeg",
                video.display()
            )
        ),
        camera_yaml(
            "file-missing",
            &format!(
                "driver: file, path: {}, width: 80, height: 60, fps: 10, encoding: jpeg",
                missing.display()
            )
        ),
        // Nothing listens on port 1 of the loopback address.
        camera_yaml(
            "rtsp-0",
            "driver: rtsp, url: \"rtsp://viewer:s3cret@127.0.0.1:1/none\", width: 80, height: 60, fps: 10, encoding: jpeg"
        ),
        camera_yaml(
            "usb-0",
            "driver: v4l2, device: /dev/video-rlark-test-none, width: 80, height: 60, fps: 10, encoding: jpeg"
        ),
    );
    let harness = Harness::start(&yaml).await?;
    let mut client = harness.client().await?;

    if ffmpeg::find_ffmpeg().is_none() {
        // Without ffmpeg the driver says what is missing.
        let e = client
            .open_camera(open_request("file-0"))
            .await
            .expect_err("no ffmpeg");
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("needs ffmpeg"), "{e:?}");
        let info = client
            .get_camera_info(pb::GetCameraInfoRequest {
                camera_id: "file-0".into(),
            })
            .await?
            .into_inner()
            .camera
            .context("camera")?;
        assert_eq!(state_of(info.state), CameraState::Closed);
        assert!(info.message.contains("needs ffmpeg"), "{info:?}");
        missing_tool::skip_or_fail("ffmpeg is not installed: the file driver's decoding part");
        return harness.stop().await;
    }

    make_clip(&video).await?;
    let opened = open(&mut client, open_request("file-0")).await?;
    assert_eq!(state_of(opened.state), CameraState::Open);
    let frame = capture(&mut client, "file-0", None).await?;
    let (w, h, _) = decode_jpeg(&frame.data)?;
    assert_eq!((w, h), (80, 60));
    let mut stream = watch(&mut client, "file-0", Some("raw")).await?;
    let a = next_frame(&mut stream).await?;
    let b = next_frame(&mut stream).await?;
    assert!(b.sequence > a.sequence);
    assert_eq!(b.data.len(), 80 * 60 * 3);

    // ffmpeg dies: the camera is in ERROR (its watchers' streams end with Unavailable),
    // health listeners are told, and the capture restarts by itself.
    let mut changes = harness.running.cameras().changes();
    changes.borrow_and_update();
    let pid = ffmpeg_pid_reading(&video).context("the camera's ffmpeg process")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .context("stream did not end")?;
    let status = end.expect_err("a failed capture ends the stream with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("ffmpeg exited"), "{status:?}");
    let info = camera_info(&mut client, "file-0").await?;
    assert_eq!(state_of(info.state), CameraState::Error, "{info:?}");
    assert!(info.message.contains("ffmpeg exited"), "{info:?}");
    tokio::time::timeout(DEADLINE, changes.changed())
        .await
        .context("no state change reported")??;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let info = camera_info(&mut client, "file-0").await?;
        if state_of(info.state) == CameraState::Open && info.last_sequence > 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the capture did not recover: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let frame = capture(&mut client, "file-0", Some("raw")).await?;
    assert_eq!(frame.data.len(), 80 * 60 * 3);

    let e = client
        .open_camera(open_request("file-missing"))
        .await
        .expect_err("missing file");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("missing.avi"), "{e:?}");
    let e = client
        .open_camera(open_request("rtsp-0"))
        .await
        .expect_err("no RTSP server");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("ffmpeg exited"), "{e:?}");
    assert!(!e.message().contains("s3cret"), "credentials leak: {e:?}");
    let e = client
        .open_camera(open_request("usb-0"))
        .await
        .expect_err("no such device");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message()
            .contains("/dev/video-rlark-test-none does not exist"),
        "{e:?}"
    );
    let info = camera_info(&mut client, "usb-0").await?;
    assert_eq!(state_of(info.state), CameraState::Closed);
    harness.stop().await
}

/// The `rtsp` driver against a live stream: RTSP over TCP with RTP interleaved (what the
/// driver asks for), Motion JPEG from a real ffmpeg encoder, scaled to the camera's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtsp_driver_reads_a_live_stream() -> Result<()> {
    if ffmpeg::find_ffmpeg().is_none() {
        missing_tool::skip_or_fail("ffmpeg is not installed: the rtsp driver and its test source");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let server = rtsp::RtspServer::start(dir.path()).await?;
    let yaml = format!(
        "cameras:\n{}",
        camera_yaml(
            "rtsp-live",
            &format!(
                "driver: rtsp, url: \"{}\", width: 80, height: 60, fps: 10, encoding: jpeg",
                server.url("live")
            )
        )
    );
    let harness = Harness::start(&yaml).await?;
    let mut client = harness.client().await?;

    let opened = open(&mut client, open_request("rtsp-live")).await?;
    assert_eq!(state_of(opened.state), CameraState::Open, "{opened:?}");
    let frame = capture(&mut client, "rtsp-live", None).await?;
    let (w, h, _) = decode_jpeg(&frame.data)?;
    assert_eq!((w, h), (80, 60));
    let mut stream = watch(&mut client, "rtsp-live", Some("raw")).await?;
    let a = next_frame(&mut stream).await?;
    let b = next_frame(&mut stream).await?;
    assert!(
        b.sequence > a.sequence,
        "{} then {}",
        a.sequence,
        b.sequence
    );
    assert_eq!(b.data.len(), 80 * 60 * 3);
    // ffmpeg's testsrc draws a colour bar pattern: a decoded frame is not one flat colour
    // (what a stream of nothing would scale to).
    let first = &b.data[..3];
    assert!(
        b.data.chunks(3).any(|pixel| pixel != first),
        "the frame is one colour"
    );
    let methods = server.methods();
    for method in ["DESCRIBE", "SETUP", "PLAY"] {
        assert!(
            methods.iter().any(|m| m == method),
            "no {method}: {methods:?}"
        );
    }

    harness.stop().await?;
    server.stop().await;
    Ok(())
}

async fn camera_info(client: &mut Client, id: &str) -> Result<pb::CameraDescriptor> {
    client
        .get_camera_info(pb::GetCameraInfoRequest {
            camera_id: id.into(),
        })
        .await?
        .into_inner()
        .camera
        .context("no camera in the response")
}

/// The ffmpeg process (a child of this test process) whose command line names `input`.
fn ffmpeg_pid_reading(input: &Path) -> Option<i32> {
    let me = std::process::id().to_string();
    let input = input.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the parenthesized command name: state, then the parent PID.
            let parent = stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?;
            (parent == me && cmdline.contains("ffmpeg") && cmdline.contains(&input)).then_some(pid)
        })
}

/// A 2-second test clip made by ffmpeg itself.
async fn make_clip(path: &Path) -> Result<()> {
    let output = tokio::process::Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-nostdin",
            "-f",
            "lavfi",
            "-i",
        ])
        .arg("testsrc=size=160x120:rate=10")
        .args(["-t", "2", "-c:v", "mjpeg", "-y"])
        .arg(path)
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "ffmpeg could not make a test clip: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

#[tokio::test]
async fn watch_cameras_sends_the_list_now_and_after_each_open_and_close() -> Result<()> {
    let yaml = format!(
        "cameras:\n{}",
        camera_yaml(
            "cam-0",
            "driver: sim, width: 64, height: 48, fps: 10, encoding: jpeg"
        )
    );
    let h = Harness::start(&yaml).await?;
    let mut client = h.client().await?;
    let mut lists = client
        .watch_cameras(pb::WatchCamerasRequest {})
        .await?
        .into_inner();
    let mut next = async || -> Result<pb::CameraState> {
        let list = tokio::time::timeout(DEADLINE, lists.message())
            .await
            .context("a list in time")??
            .context("the watch ended")?;
        ensure!(list.cameras.len() == 1, "{list:?}");
        Ok(pb::CameraState::try_from(list.cameras[0].state)?)
    };
    assert_eq!(next().await?, pb::CameraState::Closed);
    open(&mut client, open_request("cam-0")).await?;
    assert_eq!(next().await?, pb::CameraState::Open);
    client
        .close_camera(pb::CloseCameraRequest {
            camera_id: "cam-0".into(),
        })
        .await?;
    assert_eq!(next().await?, pb::CameraState::Closed);
    Ok(())
}
