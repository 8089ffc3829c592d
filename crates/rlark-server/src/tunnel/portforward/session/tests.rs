//! The session against a scripted client speaking the codec, over in-memory pipes; targets
//! are in-memory echo servers.

use std::time::Duration;

use rlark_tunnel::spdy::frame::FLAG_FIN;
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};
use tokio_util::codec::{BytesCodec, FramedWrite};
use tokio_util::io::ReaderStream;

use super::*;

/// Port 7 echoes until EOF, then closes; port 9 is refused.
struct EchoDialer;

impl Dialer for EchoDialer {
    fn dial(&self, port: u16) -> BoxFuture<'static, Result<Box<dyn TargetIo>, String>> {
        Box::pin(async move {
            if port != 7 {
                return Err(format!("dial 127.0.0.1:{port}: connection refused"));
            }
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(theirs);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
            Ok(Box::new(ours) as Box<dyn TargetIo>)
        })
    }
}

struct Client {
    encoder: Encoder,
    decoder: Decoder,
    read: ReadHalf<DuplexStream>,
    write: WriteHalf<DuplexStream>,
}

const WAIT: Duration = Duration::from_secs(10);

impl Client {
    fn start() -> Client {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let (server_read, server_write) = tokio::io::split(server);
        tokio::spawn(serve(
            ReaderStream::new(server_read),
            FramedWrite::new(server_write, BytesCodec::new()),
            Arc::new(EchoDialer),
            "test/pod".into(),
        ));
        let (read, write) = tokio::io::split(client);
        Client {
            encoder: Encoder::new().unwrap(),
            decoder: Decoder::default(),
            read,
            write,
        }
    }

    async fn send(&mut self, frame: Frame) {
        let mut wire = Vec::new();
        self.encoder.encode(&frame, &mut wire).unwrap();
        self.write.write_all(&wire).await.unwrap();
    }

    async fn syn(&mut self, stream_id: u32, kind: &str, port: &str, request: &str) {
        let headers = Headers(vec![
            ("streamtype".into(), kind.into()),
            ("port".into(), port.into()),
            ("requestid".into(), request.into()),
        ]);
        self.send(Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers,
        })
        .await;
    }

    async fn data(&mut self, stream_id: u32, flags: u8, data: &'static [u8]) {
        self.send(Frame::Data {
            stream_id,
            flags,
            data: Bytes::from_static(data),
        })
        .await;
    }

    /// The next frame, or `None` at the end of the connection.
    async fn next(&mut self) -> Option<Frame> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(frame) = self.decoder.next_frame().unwrap() {
                    return Some(frame);
                }
                let mut buffer = [0u8; 4096];
                let n = self.read.read(&mut buffer).await.unwrap();
                if n == 0 {
                    return None;
                }
                self.decoder.push(&buffer[..n]);
            }
        })
        .await
        .expect("a frame in time")
    }

    /// Frames until `done` says so (the last one included).
    async fn until(&mut self, mut done: impl FnMut(&Frame) -> bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
        panic!("the connection ended first: {frames:?}");
    }
}

fn is_fin(frame: &Frame, id: u32) -> bool {
    matches!(frame, Frame::Data { stream_id, flags, .. } if *stream_id == id && flags & FLAG_FIN != 0)
}

fn payload(frames: &[Frame], id: u32) -> Vec<u8> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Data {
                stream_id, data, ..
            } if *stream_id == id => Some(data.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn bytes_round_trip_with_half_close_and_both_fins() {
    let mut client = Client::start();
    client.syn(1, "error", "7", "0").await;
    client.data(1, FLAG_FIN, b"").await; // kubectl closes its side of the error stream
    client.syn(3, "data", "7", "0").await;
    client.data(3, 0, b"hello ").await;
    client.data(3, FLAG_FIN, b"world").await;
    let frames = client.until(|f| is_fin(f, 1)).await;
    assert!(frames.contains(&Frame::SynReply {
        stream_id: 1,
        flags: 0,
        headers: Headers::default()
    }));
    assert!(frames.iter().any(|f| is_fin(f, 3)), "{frames:?}");
    assert_eq!(payload(&frames, 3), b"hello world");
    assert_eq!(payload(&frames, 1), b"");
    // The data stream's FIN comes before the error stream's.
    let data_fin = frames.iter().position(|f| is_fin(f, 3)).unwrap();
    assert!(data_fin < frames.len() - 1);

    // A second pair on the same connection, reset by the client before the target's end
    // (kubectl resets the data stream once it is done): the error stream still ends.
    client.syn(5, "error", "7", "1").await;
    client.syn(7, "data", "7", "1").await;
    client.data(7, 0, b"ping").await;
    let frames = client
        .until(|f| payload(std::slice::from_ref(f), 7) == b"ping")
        .await;
    assert!(frames.iter().all(|f| !is_fin(f, 5)));
    client
        .send(Frame::RstStream {
            stream_id: 7,
            status: rst::CANCEL,
        })
        .await;
    client.until(|f| is_fin(f, 5)).await;
}

#[tokio::test]
async fn dial_failures_are_written_on_the_error_stream() {
    let mut client = Client::start();
    client.syn(1, "error", "9", "0").await;
    client.syn(3, "data", "9", "0").await;
    let frames = client.until(|f| is_fin(f, 1)).await;
    assert_eq!(
        String::from_utf8(payload(&frames, 1)).unwrap(),
        "dial 127.0.0.1:9: connection refused"
    );
    assert!(frames.iter().any(|f| is_fin(f, 3)), "{frames:?}");

    client.syn(5, "error", "x", "1").await;
    client.syn(7, "data", "x", "1").await;
    let frames = client.until(|f| is_fin(f, 5)).await;
    assert!(
        String::from_utf8(payload(&frames, 5))
            .unwrap()
            .contains("invalid port \"x\"")
    );
}

#[tokio::test]
async fn pings_are_answered_and_bad_streams_refused() {
    let mut client = Client::start();
    client.send(Frame::Ping { id: 1 }).await;
    assert_eq!(client.next().await, Some(Frame::Ping { id: 1 }));
    // An even (server-side) id, a repeated id, an unknown stream type.
    client.syn(2, "data", "7", "0").await;
    assert!(matches!(
        client.next().await,
        Some(Frame::RstStream { stream_id: 2, status }) if status == rst::PROTOCOL_ERROR
    ));
    client.syn(5, "other", "7", "0").await;
    assert!(matches!(
        client.next().await,
        Some(Frame::RstStream { stream_id: 5, .. })
    ));
    client.syn(5, "error", "7", "0").await;
    assert!(matches!(
        client.next().await,
        Some(Frame::RstStream { stream_id: 5, .. })
    ));
    // Window updates and settings are accepted and ignored.
    client
        .send(Frame::WindowUpdate {
            stream_id: 0,
            delta: 1,
        })
        .await;
    client
        .send(Frame::Settings {
            flags: 0,
            entries: vec![(0, 7, 1 << 20)],
        })
        .await;
    client.send(Frame::Ping { id: 3 }).await;
    assert_eq!(client.next().await, Some(Frame::Ping { id: 3 }));
}

#[tokio::test]
async fn garbage_ends_the_connection_with_goaway() {
    let mut client = Client::start();
    client
        .write
        .write_all(&[0x80, 2, 0, 1, 0, 0, 0, 0])
        .await
        .unwrap();
    assert!(matches!(
        client.next().await,
        Some(Frame::GoAway { status, .. }) if status == goaway::PROTOCOL_ERROR
    ));
    assert_eq!(client.next().await, None);
}

#[tokio::test]
async fn the_connection_closes_when_the_client_does() {
    let mut client = Client::start();
    client.syn(1, "error", "7", "0").await;
    client.syn(3, "data", "7", "0").await;
    client.data(3, 0, b"x").await;
    client
        .until(|f| payload(std::slice::from_ref(f), 3) == b"x")
        .await;
    client.write.shutdown().await.unwrap();
    // Pairs end with the connection; whatever is queued is flushed, then EOF.
    while client.next().await.is_some() {}
}
