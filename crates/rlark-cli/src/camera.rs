//! `rlark camera`: talk to the camera controller of `rlark embodied` on this host through
//! its unix socket (`camera-ctrl.sock` in `--socket-dir`): list cameras, open and close
//! them, save a frame to a file, print the frames of a stream.
//!
//! A camera opened here stays open after the command exits (cameras have no owner); close
//! it with `rlark camera close`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use rlark_proto::camera::v1 as pb;
use rlark_proto::camera::v1::CameraState;
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use tonic::transport::Channel;

use super::output::{DataFormat, print_data};
use super::table::align;

#[derive(Debug, Args)]
pub(crate) struct CameraArgs {
    /// Directory of the embodied runtime's sockets.
    #[arg(long, value_name = "DIR", default_value = rlark_proto::sockets::DEFAULT_SOCKET_DIR, global = true)]
    pub socket_dir: PathBuf,
    #[command(subcommand)]
    pub command: CameraCommand,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum EncodingArg {
    Jpeg,
    Png,
    /// RGB8, row-major, no header.
    Raw,
}

impl EncodingArg {
    fn as_str(self) -> &'static str {
        match self {
            EncodingArg::Jpeg => "jpeg",
            EncodingArg::Png => "png",
            EncodingArg::Raw => "raw",
        }
    }

    /// The encoding a file name asks for by its extension.
    fn from_path(path: &Path) -> Option<EncodingArg> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "jpg" | "jpeg" => Some(EncodingArg::Jpeg),
            "png" => Some(EncodingArg::Png),
            "raw" | "rgb" => Some(EncodingArg::Raw),
            _ => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum CameraCommand {
    /// List the cameras (configured ones and V4L2 devices found) with their state.
    List {
        /// Print them as a `CameraList` document (`items`) in JSON or YAML instead of a
        /// table.
        #[arg(short = 'o', long, value_enum)]
        output: Option<DataFormat>,
    },
    /// Show one camera.
    Info {
        id: String,
        /// Print it in JSON or YAML (an item of `camera list -o json|yaml`) instead of
        /// `key: value` lines.
        #[arg(short = 'o', long, value_enum)]
        output: Option<DataFormat>,
    },
    /// Open a camera: start its capture loop. Stays open after this command exits.
    Open {
        id: String,
        /// Frame width (default: the configured one).
        #[arg(long)]
        width: Option<u32>,
        /// Frame height (default: the configured one).
        #[arg(long)]
        height: Option<u32>,
        /// Frames per second (default: the configured rate).
        #[arg(long)]
        fps: Option<u32>,
        /// Default encoding of its frames (default: the configured one).
        #[arg(long, value_enum)]
        encoding: Option<EncodingArg>,
    },
    /// Close a camera.
    Close { id: String },
    /// Save the latest frame of an open camera to a file.
    Frame {
        id: String,
        /// File to write (`-` = standard output).
        #[arg(long, short, value_name = "FILE")]
        out: PathBuf,
        /// Encoding (default: from the file's extension .jpg/.png/.raw, else the camera's).
        #[arg(long, value_enum)]
        encoding: Option<EncodingArg>,
        /// Seconds to wait for a first frame.
        #[arg(long, default_value_t = 5.0)]
        timeout: f64,
    },
    /// Print a line per frame of an open camera as they arrive: sequence, size, bytes,
    /// frames dropped so far, age (capture to receipt).
    Watch {
        id: String,
        /// Stop after N frames (0 = until the stream ends or Ctrl-C).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Encoding (default: the camera's).
        #[arg(long, value_enum)]
        encoding: Option<EncodingArg>,
    },
}

type Client = CameraControllerClient<Channel>;

/// Largest frame the CLI accepts (a raw 8192x8192 frame is 192 MiB).
const MAX_FRAME_BYTES: usize = 256 << 20;

async fn client(dir: &Path) -> anyhow::Result<Client> {
    let socket = dir.join(rlark_proto::sockets::CAMERA_SOCKET);
    if !socket.exists() {
        bail!(
            "no camera controller socket {} (is `rlark embodied` running with cameras? --socket-dir)",
            socket.display()
        );
    }
    Ok(
        CameraControllerClient::new(rlark_proto::client::connect(&socket).await?)
            .max_decoding_message_size(MAX_FRAME_BYTES),
    )
}

/// A gRPC error as the user should read it.
fn rpc_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

fn state(value: i32) -> &'static str {
    match CameraState::try_from(value).unwrap_or(CameraState::Unspecified) {
        CameraState::Closed => "CLOSED",
        CameraState::Open => "OPEN",
        CameraState::Error => "ERROR",
        CameraState::Unspecified => "UNKNOWN",
    }
}

const LIST_HEADER: [&str; 7] = ["ID", "TYPE", "STATE", "SIZE", "FPS", "ENCODING", "NAME"];

fn list_row(c: &pb::CameraDescriptor) -> Vec<String> {
    vec![
        c.camera_id.clone(),
        c.camera_type.clone(),
        state(c.state).into(),
        format!("{}x{}", c.width, c.height),
        c.fps.to_string(),
        c.encoding.clone(),
        c.name.clone(),
    ]
}

/// A camera as `camera list -o json|yaml` prints it.
fn camera_json(c: &pb::CameraDescriptor) -> serde_json::Value {
    serde_json::json!({
        "id": c.camera_id,
        "name": c.name,
        "type": c.camera_type,
        "serialNumber": c.serial_number,
        "state": state(c.state),
        "width": c.width,
        "height": c.height,
        "fps": c.fps,
        "encoding": c.encoding,
        "pixelFormat": c.pixel_format,
        "supportedResolutions": c
            .supported_resolutions
            .iter()
            .map(|r| serde_json::json!({"width": r.width, "height": r.height}))
            .collect::<Vec<_>>(),
        "supportedFps": c.supported_fps,
        "lastSequence": c.last_sequence,
        "message": c.message,
    })
}

fn header(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `rlark camera info`: one `key: value` line per field that has a value.
fn info_text(c: &pb::CameraDescriptor) -> String {
    let resolutions: Vec<String> = c
        .supported_resolutions
        .iter()
        .map(|r| format!("{}x{}", r.width, r.height))
        .collect();
    let rates: Vec<String> = c.supported_fps.iter().map(u32::to_string).collect();
    let fields = [
        ("id", c.camera_id.clone()),
        ("name", c.name.clone()),
        ("type", c.camera_type.clone()),
        ("serial", c.serial_number.clone()),
        ("state", state(c.state).into()),
        ("size", format!("{}x{}", c.width, c.height)),
        ("fps", c.fps.to_string()),
        ("encoding", c.encoding.clone()),
        ("pixel format", c.pixel_format.clone()),
        ("resolutions", resolutions.join(", ")),
        ("rates", rates.join(", ")),
        (
            "last frame",
            match c.last_sequence {
                0 => String::new(),
                n => n.to_string(),
            },
        ),
        ("message", c.message.clone()),
    ];
    fields
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| format!("{key}: {value}\n"))
        .collect()
}

/// Time from a capture timestamp (ns since the epoch) to now.
fn age(timestamp_ns: i64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(Duration::from_nanos(
        u64::try_from(timestamp_ns).unwrap_or(0),
    ))
}

pub(crate) async fn camera(args: CameraArgs) -> anyhow::Result<()> {
    let dir = args.socket_dir;
    match args.command {
        CameraCommand::List { output } => {
            let cameras = client(&dir)
                .await?
                .list_cameras(pb::ListCamerasRequest {})
                .await
                .map_err(rpc_error)?
                .into_inner()
                .cameras;
            if let Some(format) = output {
                let items: Vec<serde_json::Value> = cameras.iter().map(camera_json).collect();
                return print_data(
                    &serde_json::json!({"kind": "CameraList", "items": items}),
                    format,
                );
            }
            let mut lines = vec![header(&LIST_HEADER)];
            lines.extend(cameras.iter().map(list_row));
            print!("{}", align(&lines));
        }
        CameraCommand::Info { id, output } => {
            let camera = client(&dir)
                .await?
                .get_camera_info(pb::GetCameraInfoRequest { camera_id: id })
                .await
                .map_err(rpc_error)?
                .into_inner()
                .camera
                .context("the controller sent no camera")?;
            match output {
                Some(format) => print_data(&camera_json(&camera), format)?,
                None => print!("{}", info_text(&camera)),
            }
        }
        CameraCommand::Open {
            id,
            width,
            height,
            fps,
            encoding,
        } => {
            let opened = client(&dir)
                .await?
                .open_camera(pb::OpenCameraRequest {
                    camera_id: id.clone(),
                    width,
                    height,
                    fps,
                    encoding: encoding.map(|e| e.as_str().into()),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            println!(
                "camera/{id} opened ({}, {}x{} at {} fps, {})",
                state(opened.state),
                opened.width,
                opened.height,
                opened.fps,
                opened.encoding
            );
        }
        CameraCommand::Close { id } => {
            let closed = client(&dir)
                .await?
                .close_camera(pb::CloseCameraRequest {
                    camera_id: id.clone(),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            println!("camera/{id} closed ({})", state(closed.state));
        }
        CameraCommand::Frame {
            id,
            out,
            encoding,
            timeout,
        } => {
            let encoding = encoding.or_else(|| EncodingArg::from_path(&out));
            let frame = client(&dir)
                .await?
                .capture_frame(pb::CaptureFrameRequest {
                    camera_id: id.clone(),
                    timeout: Some(timeout),
                    encoding: encoding.map(|e| e.as_str().into()),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            let summary = format!(
                "camera/{id} frame {} ({}x{} {}, {} bytes)",
                frame.sequence,
                frame.width,
                frame.height,
                frame.encoding,
                frame.data.len()
            );
            if out == Path::new("-") {
                use std::io::Write as _;
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&frame.data)?;
                stdout.flush()?;
                eprintln!("{summary}");
            } else {
                std::fs::write(&out, &frame.data)
                    .with_context(|| format!("write {}", out.display()))?;
                println!("{summary} written to {}", out.display());
            }
        }
        CameraCommand::Watch {
            id,
            count,
            encoding,
        } => {
            let mut stream = client(&dir)
                .await?
                .watch_frames(pb::WatchFramesRequest {
                    camera_id: id,
                    encoding: encoding.map(|e| e.as_str().into()),
                })
                .await
                .map_err(rpc_error)?
                .into_inner();
            let mut received = 0u64;
            while count == 0 || received < count {
                let Some(frame) = stream.message().await.map_err(rpc_error)? else {
                    break;
                };
                received += 1;
                println!(
                    "frame {} {}x{} {} {} bytes dropped {} age {:.1} ms",
                    frame.sequence,
                    frame.width,
                    frame.height,
                    frame.encoding,
                    frame.data.len(),
                    frame.dropped,
                    age(frame.timestamp_ns).as_secs_f64() * 1000.0
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use super::*;
    use clap::Parser as _;

    fn parse(args: &[&str]) -> Result<CameraArgs, clap::Error> {
        let cli = Cli::try_parse_from(["rlark", "camera"].iter().chain(args))?;
        match cli.command {
            Command::Camera(args) => Ok(args),
            other => panic!("not camera: {other:?}"),
        }
    }

    #[test]
    fn parses_camera_commands() {
        let args =
            parse(&["--socket-dir", "/tmp/s", "frame", "cam-0", "--out", "f.png"]).expect("parse");
        assert_eq!(args.socket_dir, PathBuf::from("/tmp/s"));
        let CameraCommand::Frame {
            id, out, encoding, ..
        } = args.command
        else {
            panic!("not frame")
        };
        assert_eq!((id.as_str(), encoding), ("cam-0", None));
        assert_eq!(EncodingArg::from_path(&out), Some(EncodingArg::Png));
        assert_eq!(
            EncodingArg::from_path(Path::new("x.JPG")),
            Some(EncodingArg::Jpeg)
        );
        assert_eq!(EncodingArg::from_path(Path::new("x.bin")), None);

        let args = parse(&["open", "cam-0", "--width", "320", "--encoding", "raw"]).expect("open");
        assert!(matches!(
            args.command,
            CameraCommand::Open {
                width: Some(320),
                encoding: Some(EncodingArg::Raw),
                ..
            }
        ));
        let args = parse(&["watch", "cam-0", "--count", "3"]).expect("watch");
        assert!(matches!(
            args.command,
            CameraCommand::Watch { count: 3, .. }
        ));
        assert_eq!(args.socket_dir, PathBuf::from("/var/run/rlark"));
        assert!(parse(&["frame", "cam-0"]).is_err(), "--out is required");
        assert!(parse(&["open", "cam-0", "--encoding", "h264"]).is_err());
    }

    #[test]
    fn info_lists_what_is_set() {
        let camera = pb::CameraDescriptor {
            camera_id: "cam-0".into(),
            name: "cam-0".into(),
            camera_type: "sim".into(),
            state: CameraState::Error as i32,
            width: 640,
            height: 480,
            fps: 30,
            encoding: "jpeg".into(),
            supported_resolutions: vec![pb::Resolution {
                width: 640,
                height: 480,
            }],
            message: "ffmpeg exited".into(),
            ..Default::default()
        };
        assert_eq!(
            info_text(&camera),
            "id: cam-0\nname: cam-0\ntype: sim\nstate: ERROR\nsize: 640x480\nfps: 30\n\
             encoding: jpeg\nresolutions: 640x480\nmessage: ffmpeg exited\n"
        );
    }
}
