//! One exec session over the WebSocket: the process's lifecycle against the client's, the
//! frames written out and read in, and the status sent at the end.

use futures::{SinkExt as _, StreamExt as _};
use hyper::body::Bytes;
use nix::sys::signal::Signal;
use rlark_api::agent::local::{
    Channel, ExecOptions, ExecOutcome, TerminalSize, decode_frame, encode_frame,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::process::{Ended, Input, Started, hang_up, initial_size, signal_members, start};
use super::target::ProcessTarget;
use super::{CLOSE_TIMEOUT, DRAIN_TIMEOUT, HANGUP_GRACE, OUT_QUEUE};

/// Run one exec session on an upgraded connection (see the module documentation).
pub(super) async fn run_session<S>(
    ws: WebSocketStream<S>,
    protocol: &'static str,
    options: ExecOptions,
    target: ProcessTarget,
    shutdown: CancellationToken,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, mut source) = ws.split();
    let Some((size, first)) = initial_size(&options, &mut source).await else {
        return Ended::ClientGone;
    };

    let gone = CancellationToken::new();
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let writer = AbortOnDrop(tokio::spawn(write_out(sink, out_rx, gone.clone())));
    let started = match start(&options, &target, size, &out_tx) {
        Ok(started) => started,
        Err(message) => {
            let outcome = ExecOutcome::Failed {
                reason: "InternalError".into(),
                message,
            };
            let _ = out_tx
                .send(encode_frame(Channel::Error, &outcome.to_status()))
                .await;
            drop(out_tx);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
            // The client's close answers ours (`read_in` is not running yet: read it here).
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
                while let Some(Ok(message)) = source.next().await {
                    if message.is_close() {
                        return;
                    }
                }
            })
            .await;
            return Ended::Finished(outcome);
        }
    };
    let Started {
        mut child,
        leader,
        session,
        input,
        readers,
    } = started;
    let readers: Vec<AbortOnDrop> = readers.into_iter().map(AbortOnDrop).collect();
    let _input = AbortOnDrop(tokio::spawn(read_in(
        source,
        first,
        input,
        options.stdin,
        protocol,
        gone.clone(),
    )));

    let status = tokio::select! {
        status = child.wait() => Some(status),
        () = gone.cancelled() => None,
        () = shutdown.cancelled() => None,
    };
    let Some(status) = status else {
        // The client went away or the agent stops: hang up on everything the exec started.
        hang_up(leader, session).await;
        if tokio::time::timeout(HANGUP_GRACE, child.wait())
            .await
            .is_err()
        {
            tracing::warn!(pid = leader, "exec process not reaped after SIGKILL");
        }
        return if shutdown.is_cancelled() {
            Ended::Shutdown
        } else {
            Ended::ClientGone
        };
    };
    // Leftovers of the group (and session) would keep the output open: gone with the
    // process, as a replica's are.
    signal_members(leader, session, Signal::SIGKILL);
    let outcome = match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            ExecOutcome::Exited(
                status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(1),
            )
        }
        Err(e) => ExecOutcome::Failed {
            reason: "InternalError".into(),
            message: format!("wait for the process: {e}"),
        },
    };
    let drained = tokio::time::timeout(
        DRAIN_TIMEOUT,
        futures::future::join_all(readers.into_iter().map(AbortOnDrop::join)),
    )
    .await;
    if drained.is_err() {
        tracing::debug!(pid = leader, "exec output still open after the exit; cut");
    }
    if out_tx
        .send(encode_frame(Channel::Error, &outcome.to_status()))
        .await
        .is_ok()
    {
        drop(out_tx);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
        // Keep the connection until the client answers the close (`read_in` sees it).
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, gone.cancelled()).await;
    }
    Ended::Finished(outcome)
}

/// Send queued messages to the client; once the queue is closed, a normal close. Cancels
/// `gone` when the client cannot be written to.
pub(super) async fn write_out<S>(
    mut sink: futures::stream::SplitSink<WebSocketStream<S>, Message>,
    mut queue: mpsc::Receiver<Vec<u8>>,
    gone: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(message) = queue.recv().await {
        if let Err(error) = sink.send(Message::Binary(Bytes::from(message))).await {
            tracing::debug!(%error, "exec client went away (write)");
            gone.cancel();
            return;
        }
    }
    let close = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    if let Err(error) = sink.send(Message::Close(Some(close))).await {
        tracing::debug!(%error, "exec close");
    }
    let _ = sink.close().await;
}

/// Apply the client's messages: stdin, resizes, the close of stdin. Cancels `gone` when the
/// client goes away (close message, error, end of stream).
pub(super) async fn read_in<S>(
    mut source: futures::stream::SplitStream<WebSocketStream<S>>,
    first: Option<Message>,
    mut input: Input,
    stdin: bool,
    protocol: &'static str,
    gone: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut next = first;
    loop {
        let message = match next.take() {
            Some(message) => message,
            None => match source.next().await {
                Some(Ok(message)) => message,
                Some(Err(error)) => {
                    tracing::debug!(%error, "exec client went away (read)");
                    gone.cancel();
                    return;
                }
                None => {
                    gone.cancel();
                    return;
                }
            },
        };
        let bytes = match message {
            Message::Binary(bytes) => bytes,
            Message::Close(_) => {
                gone.cancel();
                return;
            }
            // Pings are answered by tungstenite; text (the base64 protocols) is not served.
            _ => continue,
        };
        let (channel, payload) = match decode_frame(&bytes) {
            Ok(frame) => frame,
            Err(error) => {
                tracing::debug!(%error, "exec message ignored");
                continue;
            }
        };
        match channel {
            Channel::Stdin if stdin => {
                let written = match &mut input {
                    Input::Pipe(pipe) => pipe.write_all(payload).await,
                    Input::Pty(pty) => pty.write_all(payload).await,
                    Input::Docker {
                        write: Some(write), ..
                    } => write.write_all(payload).await,
                    Input::Docker { write: None, .. } | Input::None => Ok(()),
                };
                if let Err(error) = written {
                    // The process closed its input (or exited): later stdin goes nowhere.
                    tracing::debug!(%error, "exec stdin closed by the process");
                    if matches!(input, Input::Pipe(_)) {
                        input = Input::None;
                    }
                }
            }
            Channel::Resize => {
                if let Input::Docker {
                    exec,
                    client,
                    tty: true,
                    ..
                } = &input
                {
                    match TerminalSize::parse(payload) {
                        Ok(size) => {
                            if let Err(error) =
                                client.exec_resize(exec, size.height, size.width).await
                            {
                                tracing::debug!(%error, "exec resize");
                            }
                        }
                        Err(error) => tracing::debug!(%error, "exec resize ignored"),
                    }
                }
                if let Input::Pty(pty) = &input {
                    match TerminalSize::parse(payload) {
                        Ok(size) => {
                            if let Err(error) =
                                pty.resize(pty_process::Size::new(size.height, size.width))
                            {
                                tracing::debug!(%error, "exec resize");
                            }
                        }
                        Err(error) => tracing::debug!(%error, "exec resize ignored"),
                    }
                }
            }
            Channel::Close
                if protocol == rlark_api::agent::local::EXEC_PROTOCOL_V5
                    && payload == [Channel::Stdin.byte()] =>
            {
                // A pipe ends (the process reads its end of input); a terminal has none.
                if matches!(input, Input::Pipe(_)) {
                    input = Input::None;
                }
                if let Input::Docker {
                    write, tty: false, ..
                } = &mut input
                    && let Some(mut half) = write.take()
                {
                    // Half-closes the engine stream: the engine closes the process's stdin.
                    let _ = half.shutdown().await;
                }
            }
            _ => {}
        }
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl AbortOnDrop {
    /// Wait for the task (it is aborted if this future is dropped first).
    pub(super) async fn join(mut self) {
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
