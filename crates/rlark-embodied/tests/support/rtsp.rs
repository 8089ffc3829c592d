//! A one-stream RTSP server for the `rtsp` camera driver's tests (no RTSP server package is
//! in Debian's main archive that is small enough to install for one test).
//!
//! A real `ffmpeg` encodes a test pattern to Motion JPEG and sends it as RTP (RFC 2435) to
//! a UDP socket of ours, writing the session description to a file. This server answers
//! RTSP 1.0 (RFC 2326) `OPTIONS`, `DESCRIBE` (that description, with a control attribute),
//! `SETUP` (RTP interleaved on the RTSP connection, as the driver's
//! `-rtsp_transport tcp` asks), `PLAY`, `GET_PARAMETER` and `TEARDOWN`, and after `PLAY`
//! copies every RTP packet onto the connection as an interleaved frame
//! (`$`, channel 0, 16-bit length, packet). Methods are recorded for the tests to check.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::process::{Child, Command};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// Longest wait for ffmpeg to write the session description.
const SDP_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest request head accepted (a test server: anything bigger is a bug in the client).
const MAX_HEAD: usize = 16 * 1024;

pub struct RtspServer {
    addr: SocketAddr,
    methods: Arc<Mutex<Vec<String>>>,
    ffmpeg: Child,
    tasks: Vec<JoinHandle<()>>,
}

impl RtspServer {
    /// Start ffmpeg (`ffmpeg` from PATH) and the server on 127.0.0.1; `dir` holds the
    /// session description file.
    pub async fn start(dir: &Path) -> Result<RtspServer> {
        let rtp = UdpSocket::bind("127.0.0.1:0").await?;
        let rtcp = UdpSocket::bind("127.0.0.1:0").await?;
        let (rtp_port, rtcp_port) = (rtp.local_addr()?.port(), rtcp.local_addr()?.port());
        let sdp_path = dir.join("stream.sdp");
        let ffmpeg = Command::new("ffmpeg")
            .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-re"])
            .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=10"])
            // RFC 2435 carries baseline 4:2:0 JPEG with the standard Huffman tables only.
            .args([
                "-pix_fmt", "yuvj420p", "-c:v", "mjpeg", "-huffman", "default",
            ])
            .args(["-q:v", "5", "-f", "rtp", "-sdp_file"])
            .arg(&sdp_path)
            .arg(format!("rtp://127.0.0.1:{rtp_port}?rtcpport={rtcp_port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("spawn ffmpeg (the RTP source)")?;
        let sdp = tokio::time::timeout(SDP_TIMEOUT, async {
            loop {
                match tokio::fs::read_to_string(&sdp_path).await {
                    Ok(text) if text.contains("m=video") => return text,
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
        .await
        .context("ffmpeg wrote no session description")?;
        let sdp = Arc::new(session_description(&sdp)?);

        let (packets, _) = broadcast::channel::<Arc<Vec<u8>>>(256);
        let sender = packets.clone();
        let mut tasks = vec![tokio::spawn(async move {
            let _rtcp = rtcp; // bound, so that ffmpeg's RTCP reports land somewhere
            let mut buffer = vec![0u8; 65_536];
            while let Ok(n) = rtp.recv(&mut buffer).await {
                let _ = sender.send(Arc::new(buffer[..n].to_vec()));
            }
        })];
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let methods = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&methods);
        tasks.push(tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (sdp, packets, recorded) =
                    (Arc::clone(&sdp), packets.subscribe(), Arc::clone(&recorded));
                tokio::spawn(async move {
                    let _ = serve(socket, &sdp, packets, &recorded).await;
                });
            }
        }));
        Ok(RtspServer {
            addr,
            methods,
            ffmpeg,
            tasks,
        })
    }

    /// `rtsp://127.0.0.1:PORT/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("rtsp://{}/{path}", self.addr)
    }

    /// The RTSP methods received so far, in order.
    pub fn methods(&self) -> Vec<String> {
        self.methods.lock().map(|m| m.clone()).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = self.ffmpeg.kill().await;
    }
}

/// ffmpeg's description of its RTP output as an RTSP server describes a stream: no
/// destination port (the client picks the transport in SETUP) and a control URL per media.
fn session_description(sdp: &str) -> Result<String> {
    let mut out = String::new();
    let mut media = false;
    for line in sdp.lines() {
        if let Some(rest) = line.strip_prefix("m=video ") {
            let (_port, format) = rest.split_once(' ').context("m= line")?;
            out.push_str(&format!("m=video 0 {format}\r\n"));
            out.push_str("a=control:trackID=0\r\n");
            media = true;
        } else if !line.is_empty() {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    if !media {
        bail!("no video in ffmpeg's description: {sdp}");
    }
    Ok(out)
}

/// One RTSP connection.
async fn serve(
    socket: TcpStream,
    sdp: &str,
    mut packets: broadcast::Receiver<Arc<Vec<u8>>>,
    methods: &Mutex<Vec<String>>,
) -> Result<()> {
    let (read, mut write) = socket.into_split();
    // Requests are parsed in their own task: a half-read request must not be dropped when
    // a packet is ready first (reading lines is not cancel-safe).
    let (requests_tx, mut requests) = tokio::sync::mpsc::channel(8);
    let reader = tokio::spawn(async move {
        let mut read = BufReader::new(read);
        loop {
            let request = read_request(&mut read).await;
            let last = !matches!(request, Ok(Some(_)));
            if requests_tx.send(request).await.is_err() || last {
                return;
            }
        }
    });
    let _abort = AbortOnDrop(reader);
    let mut playing = false;
    loop {
        tokio::select! {
            request = requests.recv() => {
                let Some((method, url, cseq)) = request.transpose()?.flatten() else {
                    return Ok(());
                };
                methods.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(method.clone());
                let mut head = format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n");
                let mut body = String::new();
                match method.as_str() {
                    "OPTIONS" => head.push_str(
                        "Public: OPTIONS, DESCRIBE, SETUP, PLAY, GET_PARAMETER, TEARDOWN\r\n",
                    ),
                    "DESCRIBE" => {
                        head.push_str(&format!(
                            "Content-Base: {}/\r\nContent-Type: application/sdp\r\n",
                            url.trim_end_matches('/')
                        ));
                        body.push_str(sdp);
                    }
                    "SETUP" => head.push_str(
                        "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\nSession: 7d1e5a\r\n",
                    ),
                    "PLAY" => {
                        head.push_str("Session: 7d1e5a\r\n");
                        playing = true;
                    }
                    "GET_PARAMETER" => head.push_str("Session: 7d1e5a\r\n"),
                    "TEARDOWN" => {
                        head.push_str("\r\n");
                        write.write_all(head.as_bytes()).await?;
                        return Ok(());
                    }
                    _ => head = format!("RTSP/1.0 501 Not Implemented\r\nCSeq: {cseq}\r\n"),
                }
                head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
                write.write_all(head.as_bytes()).await?;
                write.write_all(body.as_bytes()).await?;
            }
            packet = packets.recv(), if playing => {
                let packet = match packet {
                    Ok(packet) => packet,
                    // A slow client skips packets (the decoder resynchronizes on the next
                    // frame), as a live camera would.
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                };
                let length = u16::try_from(packet.len()).context("RTP packet over 64 KiB")?;
                let mut frame = vec![b'$', 0];
                frame.extend_from_slice(&length.to_be_bytes());
                frame.extend_from_slice(&packet);
                write.write_all(&frame).await?;
            }
        }
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The next request's method, URL and CSeq (its body, if any, read and ignored); `None` at
/// the end of the connection. Interleaved frames from the client (RTCP receiver reports)
/// are skipped.
async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(
    read: &mut R,
) -> Result<Option<(String, String, String)>> {
    loop {
        let first = match read.fill_buf().await?.first() {
            None => return Ok(None),
            Some(&byte) => byte,
        };
        if first != b'$' {
            break;
        }
        let mut header = [0u8; 4];
        read.read_exact(&mut header).await?;
        let mut skipped = vec![0u8; usize::from(u16::from_be_bytes([header[2], header[3]]))];
        read.read_exact(&mut skipped).await?;
    }
    let mut lines = Vec::new();
    let mut size = 0;
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        size += line.len();
        if size > MAX_HEAD {
            bail!("request head over {MAX_HEAD} bytes");
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let mut words = lines.first().context("empty request")?.split_whitespace();
    let (method, url) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let header = |name: &str| {
        lines[1..].iter().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    };
    let length = header("Content-Length").map_or(Ok(0), |v| v.parse::<usize>())?;
    if length > MAX_HEAD {
        bail!("request body of {length} bytes");
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await?;
    Ok(Some((
        method.to_string(),
        url.to_string(),
        header("CSeq").unwrap_or_default(),
    )))
}
