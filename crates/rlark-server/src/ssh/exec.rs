//! A command in a replica for an SSH channel: the same agent exec `kubectl exec` and
//! `rlark exec` reach (`GET /exec/{ns}/{pod}` on the agent's local API, through an
//! `agent-api` tunnel stream, remotecommand `v5.channel.k8s.io`), spoken here by the server
//! itself instead of relayed from a client.

use crate::tunnel::{HubStream, StreamShare};
use futures::{SinkExt as _, StreamExt as _};
use rlark_api::agent::local::{
    Channel, EXEC_PROTOCOL_V5, ExecOptions, ExecOutcome, MAX_EXEC_MESSAGE, TerminalSize,
    decode_frame, encode_frame, exec_path,
};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use crate::task_access::Replica;
use crate::tunnel::Hub;

/// An exec session with the agent.
pub(crate) struct AgentExec {
    ws: WebSocketStream<HubStream>,
}

/// What the agent sent.
pub(crate) enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The end, with how the command ended.
    Exited(ExecOutcome),
}

/// The sending half of an exec: input, terminal size, end of input.
pub(crate) struct ExecInput {
    sink: futures::stream::SplitSink<WebSocketStream<HubStream>, Message>,
}

/// The receiving half of an exec: output, then how it ended.
pub(crate) struct ExecOutput {
    stream: futures::stream::SplitStream<WebSocketStream<HubStream>>,
}

impl AgentExec {
    /// Start `options` in `replica` through its agent, the stream counted in `share` (its
    /// user's share of the agent's streams); the error is for the user.
    pub(crate) async fn start(
        hub: &Hub,
        replica: &Replica,
        options: &ExecOptions,
        share: StreamShare,
    ) -> Result<AgentExec, String> {
        let stream = hub
            .dial_agent_api(replica.cluster(), replica.node())
            .await
            .map_err(|e| format!("reach the agent of cluster {:?}: {e}", replica.cluster()))?
            .with_share(share);
        let url = format!(
            "ws://agent{}?{}",
            exec_path(&replica.namespace, &replica.pod_name),
            options.to_query()
        );
        let mut request = url
            .into_client_request()
            .map_err(|e| format!("exec request: {e}"))?;
        request.headers_mut().insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            http::HeaderValue::from_static(EXEC_PROTOCOL_V5),
        );
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_EXEC_MESSAGE))
            .max_frame_size(Some(MAX_EXEC_MESSAGE));
        let deadline = hub.config().dial_timeout;
        let handshake = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
        match tokio::time::timeout(deadline, handshake).await {
            Ok(Ok((ws, _))) => Ok(AgentExec { ws }),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
                let body = response
                    .body()
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                Err(format!(
                    "the agent refused the exec ({}): {body}",
                    response.status()
                ))
            }
            Ok(Err(error)) => Err(format!("exec handshake with the agent: {error}")),
            Err(_) => Err(format!("the agent did not answer within {deadline:?}")),
        }
    }

    /// Split into the input and output halves, so that each direction waits only on itself.
    pub(crate) fn split(self) -> (ExecInput, ExecOutput) {
        let (sink, stream) = self.ws.split();
        (ExecInput { sink }, ExecOutput { stream })
    }
}

impl ExecInput {
    /// Send input bytes.
    pub(crate) async fn stdin(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.send(Channel::Stdin, bytes).await
    }

    /// End the input (the command sees end of file; ignored with a terminal).
    pub(crate) async fn close_stdin(&mut self) -> Result<(), String> {
        self.send(Channel::Close, &[Channel::Stdin.byte()]).await
    }

    /// Resize the terminal.
    pub(crate) async fn resize(&mut self, size: TerminalSize) -> Result<(), String> {
        self.send(Channel::Resize, &size.to_json()).await
    }

    async fn send(&mut self, channel: Channel, payload: &[u8]) -> Result<(), String> {
        self.sink
            .send(Message::Binary(encode_frame(channel, payload).into()))
            .await
            .map_err(|e| format!("send to the agent: {e}"))
    }

    /// Close the WebSocket (the agent hangs the command up if it still runs).
    pub(crate) async fn close(mut self) {
        let _ = self.sink.close().await;
    }
}

impl ExecOutput {
    /// The next output; `Exited` once at the end (a connection that ends without a status
    /// is a failure).
    pub(crate) async fn next(&mut self) -> Output {
        loop {
            let message = match self.stream.next().await {
                Some(Ok(message)) => message,
                Some(Err(error)) => {
                    return Output::Exited(ExecOutcome::Failed {
                        reason: "InternalError".into(),
                        message: format!("the connection to the agent broke: {error}"),
                    });
                }
                None => {
                    return Output::Exited(ExecOutcome::Failed {
                        reason: "InternalError".into(),
                        message: "the agent closed the exec without a status".into(),
                    });
                }
            };
            let data = match message {
                Message::Binary(data) => data,
                Message::Close(_) => {
                    return Output::Exited(ExecOutcome::Failed {
                        reason: "InternalError".into(),
                        message: "the agent closed the exec without a status".into(),
                    });
                }
                _ => continue,
            };
            let Ok((channel, payload)) = decode_frame(&data) else {
                continue;
            };
            match channel {
                Channel::Stdout => return Output::Stdout(data.slice(1..)),
                Channel::Stderr => return Output::Stderr(data.slice(1..)),
                Channel::Error => {
                    return Output::Exited(ExecOutcome::parse(payload).unwrap_or_else(|message| {
                        ExecOutcome::Failed {
                            reason: "InternalError".into(),
                            message,
                        }
                    }));
                }
                _ => {}
            }
        }
    }
}
