//! Hub side of opening a stream: open a mux stream, write the request header, read the
//! agent's response header within a deadline.
//!
//! The deadline covers everything after `Control::open` (header write and response); for
//! dial-tcp it should be the request's own timeout plus a margin ([`deadline_for`]), so the
//! agent's typed `timeout` answer normally arrives before the hub gives up. When the hub
//! gives up, the stream is dropped, which resets it (RST cancel): nothing stays pending on
//! either side.

use std::io;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tracing::Instrument;

use crate::header::{self, ReadHeaderError, Status, StreamRequest};
use crate::mux::{Control, MuxError, MuxStream};

/// Added to a dial-tcp request's timeout by [`deadline_for`]: time for the agent's answer to
/// travel back.
pub const DIAL_MARGIN: Duration = Duration::from_secs(1);

/// A stream that could not be established: the agent's answer, or the hub's own reason
/// (`timeout` when no answer came in time, `no-such-agent` when the session is gone,
/// `limit` at the stream limit, `bad-request` for a request that cannot be encoded,
/// `internal` for a broken stream or response).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct DialError {
    /// The agent's status, or the hub's own reason; never [`Status::Ok`].
    pub status: Status,
    /// The detail: the agent's response message, or what the hub saw fail.
    pub message: String,
}

impl DialError {
    /// An error with this status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        DialError {
            status,
            message: message.into(),
        }
    }
}

/// The deadline for [`open`]: a dial-tcp request's timeout plus [`DIAL_MARGIN`]; `default`
/// for other requests.
pub fn deadline_for(request: &StreamRequest, default: Duration) -> Duration {
    match request {
        StreamRequest::DialTcp { timeout, .. } => *timeout + DIAL_MARGIN,
        StreamRequest::AgentApi | StreamRequest::Relay(_) => default,
    }
}

/// Opens a stream, writes `request`'s header and reads the response within `deadline`.
///
/// Ok: the stream, positioned at the first payload byte. Err: the agent's status and
/// message, or the hub's own reason (see [`DialError`]). On any error the stream is dropped
/// (RST), so nothing is left pending.
pub async fn open(
    control: &Control,
    request: &StreamRequest,
    deadline: Duration,
) -> Result<MuxStream, DialError> {
    let header = request
        .encode()
        .map_err(|e| DialError::new(Status::BadRequest, e.to_string()))?;
    let mut stream = control.open().map_err(|e| match e {
        MuxError::Limit { .. } | MuxError::IdsExhausted => {
            DialError::new(Status::Limit, e.to_string())
        }
        MuxError::Closed => DialError::new(Status::NoSuchAgent, e.to_string()),
    })?;
    let span = tracing::debug_span!("tunnel_dial", stream = stream.id(), kind = request.kind());
    let exchange = async {
        stream
            .write_all(&header)
            .await
            .map_err(ReadHeaderError::Io)?;
        header::read_response(&mut stream).await
    };
    let result = tokio::time::timeout(deadline, exchange)
        .instrument(span.clone())
        .await;
    let _enter = span.enter();
    match result {
        Err(_) => {
            tracing::debug!(?deadline, "no response in time: stream reset");
            Err(DialError::new(
                Status::Timeout,
                format!("no response from the agent within {deadline:?}"),
            ))
        }
        Ok(Err(ReadHeaderError::Io(e))) => Err(stream_error(control, &e)),
        Ok(Err(ReadHeaderError::Header(e))) => Err(DialError::new(
            Status::Internal,
            format!("bad response header: {e}"),
        )),
        Ok(Ok(response)) if response.status == Status::Ok => Ok(stream),
        Ok(Ok(response)) => {
            tracing::debug!(status = %response.status, message = %response.message, "dial refused");
            Err(DialError::new(response.status, response.message))
        }
    }
}

fn stream_error(control: &Control, e: &io::Error) -> DialError {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        DialError::new(Status::Limit, format!("agent refused the stream: {e}"))
    } else if control.is_closed() {
        DialError::new(Status::NoSuchAgent, "tunnel session closed")
    } else {
        DialError::new(
            Status::Internal,
            format!("stream failed before the response: {e}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::header::StreamResponse;
    use crate::mux::{Incoming, MuxConfig, Role, Session};
    use crate::transport::memory_pair;

    fn sessions(agent_cfg: MuxConfig) -> (Control, Incoming, Control, Incoming) {
        let (a, b) = memory_pair(16);
        let (hub, hub_in) = Session::new(a, Role::Server, MuxConfig::default());
        let (agent, agent_in) = Session::new(b, Role::Client, agent_cfg);
        (hub, hub_in, agent, agent_in)
    }

    fn dial_req() -> StreamRequest {
        StreamRequest::DialTcp {
            host: "10.0.0.1".into(),
            port: 80,
            timeout: Duration::from_secs(2),
        }
    }

    #[tokio::test]
    async fn ok_positions_the_stream_at_the_payload() {
        let (hub, _hi, _agent, mut agent_in) = sessions(MuxConfig::default());
        let agent_side = tokio::spawn(async move {
            let mut s = agent_in.next().await.unwrap();
            let req = header::read_request(&mut s).await.unwrap();
            assert_eq!(req, dial_req());
            // Response and payload in one write: the hub must not read past the header.
            let mut out = StreamResponse::ok().encode().to_vec();
            out.extend_from_slice(b"payload");
            s.write_all(&out).await.unwrap();
            s.shutdown().await.unwrap();
            s
        });
        let mut s = open(&hub, &dial_req(), deadline_for(&dial_req(), Duration::ZERO))
            .await
            .unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"payload");
        agent_side.await.unwrap();
    }

    #[tokio::test]
    async fn agent_error_comes_back_typed() {
        let (hub, _hi, _agent, mut agent_in) = sessions(MuxConfig::default());
        tokio::spawn(async move {
            let mut s = agent_in.next().await.unwrap();
            header::read_request(&mut s).await.unwrap();
            let resp = StreamResponse::error(Status::Refused, "connection refused");
            s.write_all(&resp.encode()).await.unwrap();
            s.shutdown().await.unwrap();
            let _ = s.read(&mut [0u8; 1]).await;
        });
        let err = open(&hub, &StreamRequest::AgentApi, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err, DialError::new(Status::Refused, "connection refused"));
        assert_eq!(err.to_string(), "refused: connection refused");
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_resets_the_stream() {
        let (hub, _hi, agent, mut agent_in) = sessions(MuxConfig::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut s = agent_in.next().await.unwrap();
            header::read_request(&mut s).await.unwrap();
            // Never answers; sees the hub give up.
            let err = s.read(&mut [0u8; 1]).await.unwrap_err();
            let _ = tx.send(err.kind());
        });
        let start = tokio::time::Instant::now();
        let err = open(&hub, &dial_req(), deadline_for(&dial_req(), Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::Timeout);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(rx.await.unwrap(), io::ErrorKind::ConnectionReset);
        assert_eq!(hub.stats().streams_open, 0);
        assert_eq!(agent.stats().streams_open, 0);
    }

    #[tokio::test]
    async fn hub_side_failures() {
        // Cannot be encoded: nothing is opened.
        let (hub, _hi, _agent, mut agent_in) = sessions(MuxConfig::default());
        let bad = StreamRequest::Relay(Bytes::from(vec![0u8; header::MAX_HEADER_BODY + 1]));
        let err = open(&hub, &bad, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.status, Status::BadRequest);
        assert_eq!(hub.stats().streams_total, 0);

        // The agent drops the stream without answering.
        tokio::spawn(async move {
            let s = agent_in.next().await.unwrap();
            drop(s);
        });
        let err = open(&hub, &StreamRequest::AgentApi, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::Internal, "{err}");

        // Session gone.
        hub.close();
        let err = open(&hub, &StreamRequest::AgentApi, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::NoSuchAgent);
    }

    #[tokio::test]
    async fn agent_stream_limit_is_limit() {
        let (hub, _hi, _agent, _agent_in) = sessions(MuxConfig {
            max_streams: 0,
            ..MuxConfig::default()
        });
        let err = open(&hub, &StreamRequest::AgentApi, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::Limit, "{err}");
    }
}
