//! An exec session in a container replica through the Docker engine's exec API.

use std::io;

use futures::StreamExt as _;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rlark_api::agent::local::{Channel, ExecOptions, ExecOutcome, encode_frame};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::runtime::docker::DockerClient;
use crate::runtime::docker::logs::Demux;

use super::process::{Ended, Input, initial_size, pump};
use super::session::{AbortOnDrop, read_in, write_out};
use super::{CHUNK, CLOSE_TIMEOUT, DRAIN_TIMEOUT, GONE_POLL, HANGUP_GRACE, OUT_QUEUE};

/// The container a session execs into.
pub(super) struct DockerSession {
    pub(super) client: DockerClient,
    pub(super) container: String,
}

/// Run one exec session in a container replica through the engine's exec API: the same
/// protocol, statuses and lifecycle as [`run_session`], the process being the engine's
/// (`POST /containers/{id}/exec`, then `/exec/{id}/start` with the connection hijacked; a
/// terminal is sized through `/exec/{id}/resize`). When the client goes away the process
/// gets SIGHUP, then SIGKILL after [`HANGUP_GRACE`] (by its host pid, which the engine
/// reports).
pub(super) async fn run_docker_session<S>(
    ws: WebSocketStream<S>,
    protocol: &'static str,
    options: ExecOptions,
    session: DockerSession,
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
    let DockerSession { client, container } = session;
    let started = async {
        let exec = client
            .exec_create(
                &container,
                &options.command,
                options.stdin,
                options.stdout,
                options.stderr,
                options.tty,
            )
            .await?;
        let stream = client.exec_start(&exec, options.tty).await?;
        Ok::<_, crate::runtime::docker::DockerError>((exec, stream))
    }
    .await;
    let (exec, stream) = match started {
        Ok(started) => started,
        Err(error) => {
            let outcome = ExecOutcome::Failed {
                reason: "InternalError".into(),
                message: format!(
                    "exec {:?} in container {container}: {error}",
                    options.command
                ),
            };
            let _ = out_tx
                .send(encode_frame(Channel::Error, &outcome.to_status()))
                .await;
            drop(out_tx);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
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
    if options.tty
        && let Err(error) = client.exec_resize(&exec, size.height, size.width).await
    {
        tracing::debug!(%error, "exec initial size");
    }
    let (read, write) = tokio::io::split(stream);
    let mut reader = AbortOnDrop(tokio::spawn(pump_engine(read, options.tty, out_tx.clone())));
    let input = Input::Docker {
        write: options.stdin.then_some(write),
        exec: exec.clone(),
        client: client.clone(),
        tty: options.tty,
    };
    let _input = AbortOnDrop(tokio::spawn(read_in(
        source,
        first,
        input,
        options.stdin,
        protocol,
        gone.clone(),
    )));
    let ended = tokio::select! {
        _ = &mut reader.0 => true,
        () = gone.cancelled() => false,
        () = shutdown.cancelled() => false,
    };
    if !ended {
        hang_up_exec(&client, &exec).await;
        return if shutdown.is_cancelled() {
            Ended::Shutdown
        } else {
            Ended::ClientGone
        };
    }
    // The output ended: the process exited (the engine may take a moment to say so).
    let until = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let outcome = loop {
        match client.exec_inspect(&exec).await {
            Ok(state) if !state.running => {
                let code = state
                    .exit_code
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(1);
                break ExecOutcome::Exited(code);
            }
            Ok(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(GONE_POLL).await;
            }
            Ok(_) => {
                break ExecOutcome::Failed {
                    reason: "InternalError".into(),
                    message: "the exec's output ended but the engine says it still runs"
                        .to_string(),
                };
            }
            Err(error) => {
                break ExecOutcome::Failed {
                    reason: "InternalError".into(),
                    message: format!("read the exec's exit code: {error}"),
                };
            }
        }
    };
    if out_tx
        .send(encode_frame(Channel::Error, &outcome.to_status()))
        .await
        .is_ok()
    {
        drop(out_tx);
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.join()).await;
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, gone.cancelled()).await;
    }
    Ended::Finished(outcome)
}

/// Copy an engine exec stream to `out`: raw bytes (a terminal) to channel 1, or the
/// multiplexed frames (stream 1 stdout, 2 stderr) to channels 1 and 2.
async fn pump_engine<R: AsyncRead + Unpin>(mut source: R, tty: bool, out: mpsc::Sender<Vec<u8>>) {
    if tty {
        return pump(source, Channel::Stdout, out).await;
    }
    let mut demux = Demux::default();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match source.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                tracing::debug!(%error, "exec output ended");
                return;
            }
        };
        demux.push(&buf[..n]);
        loop {
            let (stream, payload) = match demux.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, "exec output is corrupt");
                    return;
                }
            };
            let channel = if stream == 2 {
                Channel::Stderr
            } else {
                Channel::Stdout
            };
            for piece in payload.chunks(CHUNK) {
                if out.send(encode_frame(channel, piece)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// SIGHUP to an exec's process, SIGKILL after [`HANGUP_GRACE`] unless it ended.
async fn hang_up_exec(client: &DockerClient, exec: &str) {
    let pid = match client.exec_inspect(exec).await {
        Ok(state) if state.running && state.pid > 1 => state.pid,
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(%error, exec, "cannot find the exec's process to end it");
            return;
        }
    };
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGHUP);
    let until = tokio::time::Instant::now() + HANGUP_GRACE;
    while tokio::time::Instant::now() < until {
        if matches!(client.exec_inspect(exec).await, Ok(state) if !state.running) {
            return;
        }
        tokio::time::sleep(GONE_POLL).await;
    }
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
}
