//! `rlark bench camera`: the camera controller's WatchFrames throughput and latency.
//!
//! Setup, all in this process: the embodied runtime (`rlark_embodied::serve`) with one sim
//! camera, served on `camera-ctrl.sock` in a temporary directory, and gRPC clients each on
//! its own unix-socket connection. For each encoding (JPEG, raw RGB8) and each client count
//! (1, 4), the camera is opened in that encoding and every client watches it: after a
//! warm-up, each client counts the frames and bytes it receives and the latency of every
//! frame (capture timestamp, taken before the frame is rendered and encoded, to receipt by
//! the client). The target (issue 7): at 640x480 JPEG, at least 60 frames/s to each of 4
//! clients with p99 latency at most 50 ms.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail};
use rlark_embodied::camera::{frame, sim};
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::stats::{LatencySummary, PhaseClock, ms};

/// Frames per second each of 4 JPEG clients must get.
const FPS_TARGET: f64 = 60.0;
/// p99 latency of the 4-client JPEG run.
const P99_TARGET_MS: f64 = 50.0;
/// Client counts measured.
const CLIENT_COUNTS: [usize; 2] = [1, 4];
/// Time before each measurement: connections and windows settle, the first (already old)
/// frame of each stream goes by.
const WARM_UP: Duration = Duration::from_secs(1);

/// Options of `rlark bench camera`.
#[derive(Debug, Clone, clap::Args)]
pub struct CameraBenchOptions {
    /// Seconds each scenario is measured (after a 1 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Frame rate of the sim camera.
    #[arg(long, default_value_t = 90)]
    pub fps: u32,
    /// Frame width.
    #[arg(long, default_value_t = 640)]
    pub width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 480)]
    pub height: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Figures of one encoding and client count.
#[derive(Debug, Clone, Serialize)]
pub struct CameraScenario {
    pub encoding: String,
    pub clients: usize,
    /// Frames the camera produced per second during the measurement.
    pub camera_fps: f64,
    /// Frames per second received, the slowest client.
    pub min_client_fps: f64,
    /// Frames per second received, mean over clients.
    pub mean_client_fps: f64,
    /// Payload bytes received per second, all clients together (10^6 bytes).
    pub total_mb_s: f64,
    /// Mean payload size of a frame (bytes).
    pub frame_bytes: f64,
    /// Capture timestamp -> receipt, every frame of every client.
    pub latency: LatencySummary,
    /// Frames the clients skipped (sequence gaps), all clients together.
    pub dropped: u64,
    /// CPU cores busy (process CPU time / wall time): server, camera and clients.
    pub cpu_cores: f64,
    /// CPU cores busy in other processes meanwhile (interference).
    pub other_cores: f64,
    /// This process's CPU per frame the camera produced (µs): rendering, encoding and
    /// serving it to every client.
    pub cpu_us_per_frame: Option<f64>,
}

/// Figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct CameraBenchReport {
    pub width: u32,
    pub height: u32,
    pub fps: u32,
    pub seconds: f64,
    /// Rendering one sim frame (ms, mean), for scale.
    pub render_ms: f64,
    /// Encoding one frame as JPEG (ms, mean) and its size (bytes).
    pub jpeg_encode_ms: f64,
    pub jpeg_bytes: usize,
    /// CPU of rendering one sim frame and encoding it as JPEG, directly (µs): the guard's
    /// baseline for the JPEG scenarios.
    pub direct_jpeg_cpu_us: Option<f64>,
    /// CPU of rendering one sim frame directly (µs): the baseline for the raw scenarios.
    pub direct_raw_cpu_us: Option<f64>,
    pub scenarios: Vec<CameraScenario>,
}

impl CameraBenchReport {
    /// The scenario the target is about: JPEG to 4 clients.
    fn target_scenario(&self) -> Option<&CameraScenario> {
        self.scenarios
            .iter()
            .find(|s| s.encoding == "jpeg" && s.clients == 4)
    }

    /// Whether the JPEG / 4-client run meets the target.
    pub fn meets_target(&self) -> bool {
        self.target_scenario().is_some_and(|s| {
            s.min_client_fps >= FPS_TARGET
                && s.latency.p99_ms <= P99_TARGET_MS
                && s.latency.count > 0
        })
    }
}

impl std::fmt::Display for CameraBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rlark bench camera: sim camera {}x{} at {} fps, WatchFrames over a unix socket \
             (server, camera and clients in this process), {} s per run after a {} s warm-up",
            self.width,
            self.height,
            self.fps,
            self.seconds,
            WARM_UP.as_secs()
        )?;
        writeln!(
            f,
            "per frame: render {:.2} ms, JPEG encode {:.2} ms ({:.1} KB), raw {:.1} KB",
            self.render_ms,
            self.jpeg_encode_ms,
            self.jpeg_bytes as f64 / 1000.0,
            (self.width as usize * self.height as usize * 3) as f64 / 1000.0
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<9}{:>8}{:>12}{:>18}{:>12}{:>10}{:>10}{:>10}{:>9}{:>7}",
            "encoding",
            "clients",
            "camera fps",
            "fps/client (min)",
            "MB/s total",
            "p50 ms",
            "p99 ms",
            "max ms",
            "dropped",
            "cores"
        )?;
        for s in &self.scenarios {
            writeln!(
                f,
                "{:<9}{:>8}{:>12.1}{:>18}{:>12.1}{:>10.2}{:>10.2}{:>10.2}{:>9}{:>7.2}",
                s.encoding,
                s.clients,
                s.camera_fps,
                format!("{:.1} ({:.1})", s.mean_client_fps, s.min_client_fps),
                s.total_mb_s,
                s.latency.p50_ms,
                s.latency.p99_ms,
                s.latency.max_ms,
                s.dropped,
                s.cpu_cores
            )?;
        }
        writeln!(f)?;
        match self.target_scenario() {
            Some(s) => writeln!(
                f,
                "target: JPEG to 4 clients >= {FPS_TARGET} fps each with p99 <= {P99_TARGET_MS} ms: \
                 slowest client {:.1} fps, p99 {:.2} ms: {}",
                s.min_client_fps,
                s.latency.p99_ms,
                if self.meets_target() {
                    "meets target"
                } else {
                    "BELOW TARGET"
                }
            )?,
            None => writeln!(f, "target: not measured")?,
        }
        let interference: f64 = self
            .scenarios
            .iter()
            .map(|s| s.other_cores)
            .fold(0.0, f64::max);
        if interference > 0.2 {
            writeln!(
                f,
                "note: other processes kept up to {interference:.2} cores busy during the runs"
            )?;
        }
        Ok(())
    }
}

/// Run `rlark bench camera`.
pub async fn run_camera(options: CameraBenchOptions) -> anyhow::Result<CameraBenchReport> {
    if !(options.seconds.is_finite() && options.seconds > 0.0) {
        bail!("--seconds must be positive");
    }
    let seconds = Duration::from_secs_f64(options.seconds);
    let (width, height, fps) = (options.width, options.height, options.fps);
    let costs = frame_costs(width, height)?;

    let dir = tempfile::tempdir()?;
    let socket_dir = dir.path().join("run");
    let yaml = format!(
        "cameras:\n  - {{id: bench, driver: sim, width: {width}, height: {height}, fps: {fps}, encoding: jpeg}}\n"
    );
    let config = rlark_embodied::EmbodiedConfig::from_yaml(&yaml)
        .context("camera settings (--width, --height 1-8192, --fps 1-240)")?;
    let shutdown = CancellationToken::new();
    let running = rlark_embodied::serve(config, &socket_dir, shutdown.clone()).await?;
    let socket = socket_dir.join(rlark_proto::sockets::CAMERA_SOCKET);

    let result = async {
        let mut control = client(&socket).await?;
        let mut scenarios = Vec::new();
        for encoding in ["jpeg", "raw"] {
            control
                .open_camera(pb::OpenCameraRequest {
                    camera_id: "bench".into(),
                    encoding: Some(encoding.into()),
                    ..Default::default()
                })
                .await
                .context("open the bench camera")?;
            for clients in CLIENT_COUNTS {
                scenarios.push(scenario(&socket, encoding, clients, seconds).await?);
            }
            control
                .close_camera(pb::CloseCameraRequest {
                    camera_id: "bench".into(),
                })
                .await
                .context("close the bench camera")?;
        }
        anyhow::Ok(scenarios)
    }
    .await;
    shutdown.cancel();
    running.wait().await?;
    Ok(CameraBenchReport {
        width,
        height,
        fps,
        seconds: options.seconds,
        render_ms: costs.render_ms,
        jpeg_encode_ms: costs.jpeg_encode_ms,
        jpeg_bytes: costs.jpeg_bytes,
        direct_jpeg_cpu_us: costs.jpeg_cpu_us,
        direct_raw_cpu_us: costs.raw_cpu_us,
        scenarios: result?,
    })
}

type Client = CameraControllerClient<tonic::transport::Channel>;

async fn client(socket: &Path) -> anyhow::Result<Client> {
    Ok(
        CameraControllerClient::new(rlark_proto::client::connect(socket).await?)
            // Raw frames of large cameras exceed tonic's default 4 MiB limit.
            .max_decoding_message_size(256 << 20),
    )
}

/// What rendering and encoding one frame costs, measured directly (no server, no client).
struct FrameCosts {
    /// Mean wall time of rendering a sim frame (ms).
    render_ms: f64,
    /// Mean wall time of encoding it as JPEG (ms).
    jpeg_encode_ms: f64,
    jpeg_bytes: usize,
    /// CPU per frame rendered and JPEG-encoded (µs).
    jpeg_cpu_us: Option<f64>,
    /// CPU per frame rendered (µs).
    raw_cpu_us: Option<f64>,
}

/// Mean cost of rendering a sim frame and of encoding it as JPEG, and the JPEG's size.
/// Nothing else of this process runs yet, so its CPU time is this loop's.
fn frame_costs(width: u32, height: u32) -> anyhow::Result<FrameCosts> {
    // At least this many rounds and this much wall time each, so that `/proc`'s 10 ms
    // CPU ticks are a small part of the figure.
    const ROUNDS: u32 = 30;
    const MIN_TIME: Duration = Duration::from_millis(500);
    let mut render = Duration::ZERO;
    let mut encode = Duration::ZERO;
    let mut bytes = 0;
    let clock = PhaseClock::start();
    let mut rounds = 0;
    while rounds < ROUNDS || clock.stop().elapsed < MIN_TIME {
        let i = rounds;
        rounds += 1;
        let start = Instant::now();
        let rgb = sim::render(
            width,
            height,
            Duration::from_millis(u64::from(i) * 33),
            u64::from(i),
            SystemTime::now(),
        );
        render += start.elapsed();
        let start = Instant::now();
        let jpeg = frame::encode_jpeg(&rgb, width, height)?;
        encode += start.elapsed();
        bytes = jpeg.len();
    }
    let jpeg_cpu = clock.stop().cpu;
    // Rendering alone, as long.
    let clock = PhaseClock::start();
    let mut raw_rounds = 0;
    while raw_rounds < ROUNDS || clock.stop().elapsed < MIN_TIME {
        std::hint::black_box(sim::render(
            width,
            height,
            Duration::from_millis(u64::from(raw_rounds) * 33),
            u64::from(raw_rounds),
            SystemTime::now(),
        ));
        raw_rounds += 1;
    }
    let raw_cpu = clock.stop().cpu;
    let per_frame = |cpu: Option<Duration>, rounds: u32| {
        cpu.filter(|d| !d.is_zero())
            .map(|d| d.as_secs_f64() * 1e6 / f64::from(rounds))
    };
    Ok(FrameCosts {
        render_ms: ms(render / rounds),
        jpeg_encode_ms: ms(encode / rounds),
        jpeg_bytes: bytes,
        jpeg_cpu_us: per_frame(jpeg_cpu, rounds),
        raw_cpu_us: per_frame(raw_cpu, raw_rounds),
    })
}

/// What one watching client measured.
#[derive(Default)]
struct ClientFigures {
    frames: u64,
    bytes: u64,
    latencies: Vec<Duration>,
    first_sequence: Option<u64>,
    last_sequence: u64,
    dropped: u64,
}

async fn scenario(
    socket: &Path,
    encoding: &str,
    clients: usize,
    seconds: Duration,
) -> anyhow::Result<CameraScenario> {
    let start = Instant::now();
    let measure_from = start + WARM_UP;
    let end = measure_from + seconds;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let socket: PathBuf = socket.to_path_buf();
        let encoding = encoding.to_string();
        tasks.push(tokio::spawn(async move {
            watch_client(&socket, &encoding, measure_from, end).await
        }));
    }
    // CPU is measured over the measurement window only.
    tokio::time::sleep_until(tokio::time::Instant::from_std(measure_from)).await;
    let clock = PhaseClock::start();
    tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
    let times = clock.stop();
    let mut figures = Vec::new();
    for task in tasks {
        figures.push(task.await.context("watch client task")??);
    }

    let window = seconds.as_secs_f64();
    let rates: Vec<f64> = figures.iter().map(|c| c.frames as f64 / window).collect();
    let first = figures.iter().filter_map(|c| c.first_sequence).min();
    let last = figures.iter().map(|c| c.last_sequence).max().unwrap_or(0);
    let camera_frames = first.map_or(0, |first| last.saturating_sub(first) + 1);
    let mut latencies: Vec<Duration> = figures.iter().flat_map(|c| c.latencies.clone()).collect();
    let bytes: u64 = figures.iter().map(|c| c.bytes).sum();
    let frames: u64 = figures.iter().map(|c| c.frames).sum();
    let cores =
        |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() / times.elapsed.as_secs_f64());
    Ok(CameraScenario {
        encoding: encoding.into(),
        clients,
        camera_fps: camera_frames as f64 / window,
        min_client_fps: rates.iter().copied().fold(f64::INFINITY, f64::min),
        mean_client_fps: rates.iter().sum::<f64>() / rates.len().max(1) as f64,
        total_mb_s: bytes as f64 / window / 1e6,
        frame_bytes: if frames == 0 {
            0.0
        } else {
            bytes as f64 / frames as f64
        },
        latency: LatencySummary::from_samples(&mut latencies),
        dropped: figures.iter().map(|c| c.dropped).sum(),
        cpu_cores: cores(times.cpu),
        other_cores: cores(times.others),
        cpu_us_per_frame: times
            .cpu
            .filter(|_| camera_frames > 0)
            .map(|d| d.as_secs_f64() * 1e6 / camera_frames as f64),
    })
}

/// Watch the bench camera until `end`, counting what arrives from `measure_from` on.
async fn watch_client(
    socket: &Path,
    encoding: &str,
    measure_from: Instant,
    end: Instant,
) -> anyhow::Result<ClientFigures> {
    let mut client = client(socket).await?;
    let mut stream = client
        .watch_frames(pb::WatchFramesRequest {
            camera_id: "bench".into(),
            encoding: Some(encoding.into()),
        })
        .await
        .context("WatchFrames")?
        .into_inner();
    let mut figures = ClientFigures::default();
    let mut previous: Option<u64> = None;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let frame = match tokio::time::timeout(end - now, stream.message()).await {
            Err(_) => break,
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => bail!("the frame stream ended"),
            Ok(Err(status)) => bail!("the frame stream failed: {status}"),
        };
        let received = SystemTime::now();
        let sequence = frame.sequence;
        let gap = previous.map_or(0, |p| sequence.saturating_sub(p + 1));
        previous = Some(sequence);
        if Instant::now() < measure_from {
            continue;
        }
        let captured = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(frame.timestamp_ns).unwrap_or(0));
        figures
            .latencies
            .push(received.duration_since(captured).unwrap_or_default());
        figures.frames += 1;
        figures.bytes += frame.data.len() as u64;
        figures.first_sequence.get_or_insert(sequence);
        figures.last_sequence = sequence;
        figures.dropped += gap;
    }
    Ok(figures)
}
