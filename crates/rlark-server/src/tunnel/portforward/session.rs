//! One `kubectl port-forward` connection after the upgrade: SPDY/3.1 frames in and out
//! ([`rlark_tunnel::spdy`]), each forwarded local connection a pair of streams sharing a
//! `requestid` header — `streamtype: error` then `streamtype: data`, both with `port` —
//! relayed to a TCP connection opened by a [`Dialer`].
//!
//! Per pair, as kubelet serves it: both streams get a SYN_REPLY at once; the dial starts
//! with the data stream; on failure the reason is written on the error stream; bytes are
//! copied both ways with half-close (the client's FIN shuts the TCP write side, the
//! target's EOF becomes a FIN on the data stream); at the end both streams get a FIN.
//! kubectl waits for that FIN on the error stream before it forgets a connection, so it
//! is always sent unless the connection itself is gone. A RST_STREAM from kubectl (it
//! resets the data stream once the target's side is done) ends the pair.
//!
//! Flow control: none, as spdystream (kubectl's and kubelet's SPDY library) does — it
//! never sends WINDOW_UPDATE and ignores the ones it gets, so a server enforcing SPDY/3.1
//! windows would stall every pair after 64 KiB. Back-pressure comes from the bounded
//! queues instead: the target is read only as fast as frames reach the client
//! ([`WRITE_QUEUE`]), and a pair whose target reads slowly stops the connection's reader
//! once its [`INBOUND_QUEUE`] is full (head-of-line blocking, as with spdystream's
//! buffered streams).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{Sink, SinkExt as _, Stream, StreamExt as _};
use rlark_tunnel::spdy::frame::{FLAG_FIN, goaway, rst};
use rlark_tunnel::spdy::{Decoder, Encoder, Frame, Headers};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Frames waiting for the client connection.
const WRITE_QUEUE: usize = 64;
/// Chunks from the client waiting for one pair's target.
const INBOUND_QUEUE: usize = 16;
/// Bytes read from a target per DATA frame (kubectl writes 32 KiB frames too).
const READ_CHUNK: usize = 32 * 1024;
/// Most forwarded connections open at once on one client connection, and most error
/// streams waiting for their data stream; more are refused (REFUSED_STREAM).
const MAX_PAIRS: usize = 256;

/// A bidirectional byte stream to a target port.
pub(crate) trait TargetIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> TargetIo for T {}

/// Opens the TCP connection for a forwarded port; `Err` is the text kubectl prints.
pub(crate) trait Dialer: Send + Sync + 'static {
    fn dial(&self, port: u16) -> BoxFuture<'static, Result<Box<dyn TargetIo>, String>>;
}

/// What the connection knows about one of the client's streams.
enum Entry {
    /// An error stream waiting for (or serving) its data stream.
    Error,
    /// A data stream: its chunks go to the pair's task until the client's FIN.
    Data {
        inbound: Option<mpsc::Sender<Bytes>>,
        reset: CancellationToken,
    },
}

/// Serve one connection until the client closes it (or breaks the protocol). `label`
/// names the pod in logs.
pub(crate) async fn serve<I, O>(mut input: I, output: O, dialer: Arc<dyn Dialer>, label: String)
where
    I: Stream<Item = io::Result<Bytes>> + Unpin,
    O: Sink<Bytes, Error = io::Error> + Unpin + Send + 'static,
{
    let encoder = match Encoder::new() {
        Ok(encoder) => encoder,
        Err(error) => {
            tracing::warn!(%error, pod = %label, "port-forward: no SPDY encoder");
            return;
        }
    };
    let (tx, rx) = mpsc::channel::<Frame>(WRITE_QUEUE);
    let writer = tokio::spawn(write_frames(rx, output, encoder));
    let cancel = CancellationToken::new();
    let mut state = State {
        streams: HashMap::new(),
        waiting: HashMap::new(),
        last_id: 0,
        going_away: false,
        tasks: JoinSet::new(),
        tx: tx.clone(),
        dialer,
        cancel: cancel.clone(),
        label: label.clone(),
    };
    let mut decoder = Decoder::default();
    'connection: loop {
        tokio::select! {
            chunk = input.next() => match chunk {
                Some(Ok(bytes)) => decoder.push(&bytes),
                Some(Err(error)) => {
                    tracing::debug!(%error, pod = %label, "port-forward connection failed");
                    break;
                }
                None => break,
            },
            Some(done) = state.tasks.join_next(), if !state.tasks.is_empty() => {
                if let Ok((data_id, error_id)) = done {
                    state.streams.remove(&data_id);
                    if let Some(id) = error_id {
                        state.streams.remove(&id);
                    }
                }
                continue;
            }
        }
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => state.handle(frame).await,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, pod = %label, "port-forward: protocol error; closing");
                    let _ = tx
                        .send(Frame::GoAway {
                            last_good_stream_id: state.last_id,
                            status: goaway::PROTOCOL_ERROR,
                        })
                        .await;
                    break 'connection;
                }
            }
        }
    }
    // The client is gone or done: end every pair (their targets are closed), then let the
    // writer flush what is queued and close the connection.
    cancel.cancel();
    state.streams.clear();
    while state.tasks.join_next().await.is_some() {}
    drop(state);
    drop(tx);
    let _ = writer.await;
    tracing::debug!(pod = %label, "port-forward connection closed");
}

struct State {
    streams: HashMap<u32, Entry>,
    /// Error streams by `requestid`, waiting for the data stream of the same request.
    waiting: HashMap<String, u32>,
    last_id: u32,
    going_away: bool,
    /// One per pair; each returns its (data, error) stream ids.
    tasks: JoinSet<(u32, Option<u32>)>,
    tx: mpsc::Sender<Frame>,
    dialer: Arc<dyn Dialer>,
    cancel: CancellationToken,
    label: String,
}

impl State {
    async fn send(&self, frame: Frame) {
        // Fails only when the writer is gone, which ends the connection anyway.
        let _ = self.tx.send(frame).await;
    }

    async fn refuse(&self, stream_id: u32, status: u32) {
        self.send(Frame::RstStream { stream_id, status }).await;
    }

    async fn handle(&mut self, frame: Frame) {
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => self.open(stream_id, &headers).await,
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let Some(Entry::Data { inbound, .. }) = self.streams.get_mut(&stream_id) else {
                    // The error stream's FIN, or frames racing a reset: nothing to do.
                    return;
                };
                if !data.is_empty()
                    && let Some(sender) = inbound
                    && sender.send(data).await.is_err()
                {
                    // The pair's task is done writing; later chunks are dropped the same way.
                    *inbound = None;
                }
                if flags & FLAG_FIN != 0 {
                    // Dropping the sender is the FIN for the task: it shuts the target's
                    // write side.
                    *inbound = None;
                }
            }
            Frame::RstStream { stream_id, status } => {
                if let Some(Entry::Data { reset, .. }) = self.streams.remove(&stream_id) {
                    tracing::trace!(stream_id, status, pod = %self.label, "port-forward stream reset");
                    reset.cancel();
                }
            }
            Frame::Ping { id } => {
                // Odd ids are the client's pings; even ones would answer ours (none sent).
                if !id.is_multiple_of(2) {
                    self.send(Frame::Ping { id }).await;
                }
            }
            Frame::GoAway { .. } => self.going_away = true,
            // No flow control (see the module docs); SETTINGS and HEADERS change nothing
            // for a port-forward; the client never answers streams we do not open.
            Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Headers { .. }
            | Frame::SynReply { .. }
            | Frame::Unknown { .. } => {}
        }
    }

    async fn open(&mut self, stream_id: u32, headers: &Headers) {
        // Client streams have odd, increasing ids (SPDY/3.1 2.3.2).
        if stream_id.is_multiple_of(2) || stream_id <= self.last_id {
            self.refuse(stream_id, rst::PROTOCOL_ERROR).await;
            return;
        }
        self.last_id = stream_id;
        if self.going_away || self.streams.len() >= 2 * MAX_PAIRS {
            self.refuse(stream_id, rst::REFUSED_STREAM).await;
            return;
        }
        let request = headers.get("requestid").unwrap_or_default().to_string();
        match headers.get("streamtype") {
            Some("error") => {
                if self.waiting.len() >= MAX_PAIRS || self.waiting.contains_key(&request) {
                    self.refuse(stream_id, rst::REFUSED_STREAM).await;
                    return;
                }
                self.reply(stream_id).await;
                self.streams.insert(stream_id, Entry::Error);
                self.waiting.insert(request, stream_id);
            }
            Some("data") => {
                let error_id = self.waiting.remove(&request);
                self.reply(stream_id).await;
                let port = match headers.get("port").map(str::parse::<u16>) {
                    Some(Ok(port)) if port > 0 => Ok(port),
                    Some(_) => Err(format!(
                        "invalid port {:?}: a port is 1..65535",
                        headers.get("port").unwrap_or_default()
                    )),
                    None => Err("the data stream has no port header".to_string()),
                };
                let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
                let reset = self.cancel.child_token();
                self.streams.insert(
                    stream_id,
                    Entry::Data {
                        inbound: Some(inbound_tx),
                        reset: reset.clone(),
                    },
                );
                let pair = Pair {
                    data_id: stream_id,
                    error_id,
                    request,
                    inbound: inbound_rx,
                    reset,
                    tx: self.tx.clone(),
                };
                let dial = port.map(|port| (port, self.dialer.dial(port)));
                let label = self.label.clone();
                self.tasks.spawn(pair.run(dial, label));
            }
            other => {
                tracing::debug!(stream_id, streamtype = ?other, pod = %self.label, "port-forward: unknown stream type");
                self.refuse(stream_id, rst::PROTOCOL_ERROR).await;
            }
        }
    }

    async fn reply(&self, stream_id: u32) {
        self.send(Frame::SynReply {
            stream_id,
            flags: 0,
            headers: Headers::default(),
        })
        .await;
    }
}

type Dial = BoxFuture<'static, Result<Box<dyn TargetIo>, String>>;

/// One forwarded connection.
struct Pair {
    data_id: u32,
    error_id: Option<u32>,
    request: String,
    inbound: mpsc::Receiver<Bytes>,
    reset: CancellationToken,
    tx: mpsc::Sender<Frame>,
}

impl Pair {
    async fn run(self, dial: Result<(u16, Dial), String>, label: String) -> (u32, Option<u32>) {
        let Pair {
            data_id,
            error_id,
            request,
            inbound,
            reset,
            tx,
        } = self;
        let fin = |stream_id: u32| Frame::Data {
            stream_id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        };
        let outcome = match dial {
            Err(message) => Err(message),
            Ok((port, dial)) => {
                let result = tokio::select! {
                    result = dial => result,
                    () = reset.cancelled() => Err("cancelled".to_string()),
                };
                result.map(|io| (port, io))
            }
        };
        let mut data_open = true;
        match outcome {
            Err(message) => {
                tracing::info!(pod = %label, request = %request, error = %message, "port-forward dial failed");
                if let Some(id) = error_id
                    && !reset.is_cancelled()
                {
                    let _ = tx
                        .send(Frame::Data {
                            stream_id: id,
                            flags: 0,
                            data: Bytes::from(message),
                        })
                        .await;
                }
            }
            Ok((port, io)) => {
                let (up, down) = relay(io, data_id, inbound, &reset, &tx).await;
                data_open = !down.fin_sent;
                tracing::debug!(pod = %label, request = %request, port, up = up, down = down.bytes, "port-forward connection done");
            }
        }
        // kubelet closes both streams at the end of a pair; kubectl waits for the error
        // stream's FIN. A reset data stream gets nothing more.
        if data_open && !reset.is_cancelled() {
            let _ = tx.send(fin(data_id)).await;
        }
        if let Some(id) = error_id {
            let _ = tx.send(fin(id)).await;
        }
        (data_id, error_id)
    }
}

struct Down {
    bytes: u64,
    fin_sent: bool,
}

/// Copy between the client's stream and the target until both directions are done or the
/// stream is reset; returns the bytes sent each way.
async fn relay(
    io: Box<dyn TargetIo>,
    data_id: u32,
    mut inbound: mpsc::Receiver<Bytes>,
    reset: &CancellationToken,
    tx: &mpsc::Sender<Frame>,
) -> (u64, Down) {
    let (mut reader, mut writer) = tokio::io::split(io);
    let up = async {
        let mut total = 0u64;
        while let Some(chunk) = inbound.recv().await {
            if writer.write_all(&chunk).await.is_err() {
                return total;
            }
            total += chunk.len() as u64;
        }
        // The client's FIN: the target sees EOF and may answer, then close.
        let _ = writer.shutdown().await;
        total
    };
    let down = async {
        let mut down = Down {
            bytes: 0,
            fin_sent: false,
        };
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let n = reader.read(&mut buffer).await.unwrap_or(0);
            let frame = Frame::Data {
                stream_id: data_id,
                flags: if n == 0 { FLAG_FIN } else { 0 },
                data: Bytes::copy_from_slice(&buffer[..n]),
            };
            if tx.send(frame).await.is_err() {
                return down;
            }
            if n == 0 {
                down.fin_sent = true;
                return down;
            }
            down.bytes += n as u64;
        }
    };
    tokio::select! {
        (up, down) = async { tokio::join!(up, down) } => (up, down),
        () = reset.cancelled() => (0, Down { bytes: 0, fin_sent: false }),
    }
}

/// Encode frames in order and write them, several per write when they queue up; closes
/// the connection once every sender is gone.
async fn write_frames<O>(mut rx: mpsc::Receiver<Frame>, mut output: O, mut encoder: Encoder)
where
    O: Sink<Bytes, Error = io::Error> + Unpin,
{
    let mut buffer = Vec::new();
    while let Some(frame) = rx.recv().await {
        buffer.clear();
        let mut next = Some(frame);
        while let Some(frame) = next.take() {
            if let Err(error) = encoder.encode(&frame, &mut buffer) {
                tracing::warn!(%error, "port-forward: cannot encode a frame");
                return;
            }
            if buffer.len() < READ_CHUNK {
                next = rx.try_recv().ok();
            }
        }
        if let Err(error) = output.send(Bytes::copy_from_slice(&buffer)).await {
            tracing::debug!(%error, "port-forward: client connection failed");
            return;
        }
    }
    let _ = output.close().await;
}

#[cfg(test)]
mod tests;
