//! Drivers backed by an `ffmpeg` child process: `v4l2` (a USB camera), `rtsp` (a network
//! stream) and `file` (a video file, looped). ffmpeg decodes the input, scales it to the
//! camera's size, resamples it to its fps, and writes raw RGB24 frames to its stdout
//! (`-f rawvideo -pix_fmt rgb24`), which the source reads one frame (`width * height * 3`
//! bytes) at a time. ffmpeg is found on `PATH`; without it these drivers answer
//! `Unavailable` naming the missing program.

use rlark_process::CleanSignals as _;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use super::CameraError;
use super::capture::{RawFrame, Source, Starter};
use super::frame::rgb_len;

/// Lines of ffmpeg's stderr kept for error messages.
const STDERR_LINES: usize = 8;
/// Longest stderr line kept (characters).
const STDERR_LINE_MAX: usize = 300;

/// What ffmpeg reads.
#[derive(Clone, Debug)]
pub(crate) enum Input {
    V4l2 { device: PathBuf },
    Rtsp { url: String },
    File { path: PathBuf },
}

impl Input {
    fn driver(&self) -> &'static str {
        match self {
            Input::V4l2 { .. } => "v4l2",
            Input::Rtsp { .. } => "rtsp",
            Input::File { .. } => "file",
        }
    }

    /// The input as it may appear in messages and logs (an RTSP URL without credentials).
    pub fn describe(&self) -> String {
        match self {
            Input::V4l2 { device } => device.display().to_string(),
            Input::Rtsp { url } => redact_url(url),
            Input::File { path } => path.display().to_string(),
        }
    }
}

/// `url` with any `user:password@` replaced by `***@`.
pub fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some(info) => url.replacen(&format!("{info}@"), "***@", 1),
        None => url.to_string(),
    }
}

/// The `user:password` part of a URL, if it has one.
fn userinfo(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let info = &authority[..authority.rfind('@')?];
    (!info.is_empty()).then_some(info)
}

/// The `ffmpeg` program on `PATH`, if any.
pub fn find_ffmpeg() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("ffmpeg"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// ffmpeg's arguments for `input` at `width`x`height`, `fps`.
pub(crate) fn arguments(input: &Input, width: u32, height: u32, fps: u32) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-hide_banner", "-nostdin", "-loglevel", "error"]
        .iter()
        .map(OsString::from)
        .collect();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    match input {
        Input::V4l2 { device } => {
            // Ask the device for the size and rate; the filters below fix what it cannot do.
            push(&["-f", "v4l2", "-framerate", &fps.to_string()]);
            push(&["-video_size", &format!("{width}x{height}"), "-i"]);
            args.push(device.as_os_str().to_owned());
        }
        Input::Rtsp { url } => {
            // TCP: no lost packets (and so no smeared frames) on lossy networks.
            push(&["-rtsp_transport", "tcp", "-i", url]);
        }
        Input::File { path } => {
            // Real-time pace, looped: the file behaves like a camera that never ends.
            push(&["-re", "-stream_loop", "-1", "-i"]);
            args.push(path.as_os_str().to_owned());
        }
    }
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&["-an", "-vf", &format!("scale={width}:{height},fps={fps}")]);
    push(&["-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]);
    args
}

/// Starts ffmpeg for one camera.
pub(crate) struct FfmpegStarter {
    pub camera_id: String,
    pub input: Input,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
}

#[async_trait::async_trait]
impl Starter for FfmpegStarter {
    async fn start(&self) -> Result<Box<dyn Source>, CameraError> {
        let id = &self.camera_id;
        let Some(program) = find_ffmpeg() else {
            return Err(CameraError::Unavailable(format!(
                "camera {id:?} ({} driver) needs ffmpeg, which is not installed (no ffmpeg on PATH)",
                self.input.driver()
            )));
        };
        match &self.input {
            Input::V4l2 { device } if !device.exists() => {
                return Err(CameraError::Unavailable(format!(
                    "camera {id:?}: V4L2 device {} does not exist (unplugged?)",
                    device.display()
                )));
            }
            Input::File { path } if !path.is_file() => {
                return Err(CameraError::FailedPrecondition(format!(
                    "camera {id:?}: video file {} does not exist",
                    path.display()
                )));
            }
            _ => {}
        }
        let mut child = Command::new(&program)
            .args(arguments(&self.input, self.width, self.height, self.fps))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .clean_signals()
            .spawn()
            .map_err(|e| {
                CameraError::Unavailable(format!("camera {id:?}: start {}: {e}", program.display()))
            })?;
        let stdout = child.stdout.take().ok_or_else(|| {
            CameraError::Internal(format!("camera {id:?}: ffmpeg has no stdout pipe"))
        })?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            let camera = id.clone();
            // ffmpeg prints the URL it failed on, credentials included.
            let secret = match &self.input {
                Input::Rtsp { url } => userinfo(url).map(|info| format!("{info}@")),
                _ => None,
            };
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = match &secret {
                        Some(secret) => line.replace(secret.as_str(), "***@"),
                        None => line,
                    };
                    let line: String = line.chars().take(STDERR_LINE_MAX).collect();
                    tracing::debug!(camera = %camera, line = %line, "ffmpeg");
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if tail.len() == STDERR_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        tracing::info!(
            camera = %id,
            driver = self.input.driver(),
            input = %self.input.describe(),
            pid = child.id(),
            "started ffmpeg"
        );
        Ok(Box::new(FfmpegSource {
            camera_id: id.clone(),
            child,
            stdout,
            frame_len: rgb_len(self.width, self.height),
            stderr_tail,
        }))
    }
}

/// A running ffmpeg; killed when dropped.
struct FfmpegSource {
    camera_id: String,
    child: Child,
    stdout: ChildStdout,
    frame_len: usize,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl FfmpegSource {
    /// Why ffmpeg stopped delivering: its exit status and last error lines.
    async fn failure(&mut self, read_error: std::io::Error) -> CameraError {
        // It usually exits right after closing its stdout; give it a moment.
        let status = tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await;
        let tail: Vec<String> = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        let said = if tail.is_empty() {
            String::new()
        } else {
            format!(": {}", tail.join(" | "))
        };
        let id = &self.camera_id;
        CameraError::Unavailable(match status {
            Ok(Ok(status)) => format!("camera {id:?}: ffmpeg exited ({status}){said}"),
            _ => format!("camera {id:?}: read frame from ffmpeg: {read_error}{said}"),
        })
    }
}

#[async_trait::async_trait]
impl Source for FfmpegSource {
    async fn next_frame(&mut self, _sequence: u64) -> Result<RawFrame, CameraError> {
        let mut rgb = vec![0u8; self.frame_len];
        match self.stdout.read_exact(&mut rgb).await {
            Ok(_) => Ok(RawFrame {
                rgb,
                captured: SystemTime::now(),
            }),
            Err(e) => Err(self.failure(e).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn arguments_decode_to_raw_rgb_at_the_camera_size() {
        let file = arguments(
            &Input::File {
                path: "/v/a.mp4".into(),
            },
            320,
            240,
            15,
        );
        assert_eq!(
            text(&file),
            "-hide_banner -nostdin -loglevel error -re -stream_loop -1 -i /v/a.mp4 -an \
             -vf scale=320:240,fps=15 -f rawvideo -pix_fmt rgb24 pipe:1"
        );
        let v4l2 = text(&arguments(
            &Input::V4l2 {
                device: "/dev/video2".into(),
            },
            640,
            480,
            30,
        ));
        assert!(
            v4l2.contains("-f v4l2 -framerate 30 -video_size 640x480 -i /dev/video2"),
            "{v4l2}"
        );
        let rtsp = text(&arguments(
            &Input::Rtsp {
                url: "rtsp://cam/s".into(),
            },
            640,
            480,
            30,
        ));
        assert!(
            rtsp.contains("-rtsp_transport tcp -i rtsp://cam/s"),
            "{rtsp}"
        );
    }

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact_url("rtsp://admin:secret@10.0.0.5:554/stream"),
            "rtsp://***@10.0.0.5:554/stream"
        );
        assert_eq!(redact_url("rtsp://cam/a@b"), "rtsp://cam/a@b");
        assert_eq!(redact_url("rtsp://@cam/a"), "rtsp://@cam/a");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
