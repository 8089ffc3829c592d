//! The agent's local API as both ends speak it: the hub's routes forward requests for it
//! over `agent-api` streams, the agent serves them. Only the vocabulary lives here (pure
//! parsing and encoding); the agent's server is `rlark_agent::api` (and `rlark_agent::exec`),
//! the hub's routes `rlark-server/src/tunnel/logs.rs` and `.../exec.rs`.
//!
//! - logs: [`logs_path`], [`LogOptions`];
//! - exec: [`exec_path`], [`ExecOptions`], and Kubernetes' remotecommand WebSocket protocol
//!   ([`EXEC_PROTOCOL_V5`], [`EXEC_PROTOCOL_V4`]): [`Channel`], [`encode_frame`],
//!   [`decode_frame`], [`TerminalSize`] (resize messages) and [`ExecOutcome`] (the status
//!   sent on the error channel), shared by the agent, the hub's checks and `rlark exec`.

/// Path of a replica's log on the agent's local API.
pub fn logs_path(namespace: &str, pod: &str) -> String {
    format!("/logs/{namespace}/{pod}")
}

/// Parameters of `GET /logs/...`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Start at the N-th line from the end (`tail`).
    pub tail: Option<u64>,
    /// Keep sending appended bytes until the replica exits (`follow`).
    pub follow: bool,
    /// The run before the current one (`previous`).
    pub previous: bool,
    /// Stop after this many bytes (`limitBytes`).
    pub limit_bytes: Option<u64>,
}

impl LogOptions {
    /// Parse a query string (`tail` (alias `tailLines`, kubectl's name), `follow`, `previous`, `limitBytes`; other parameters
    /// are ignored). Booleans are `true`/`false`/`1`/`0`; numbers are non-negative integers
    /// (`limitBytes` at least 1).
    pub fn parse(query: Option<&str>) -> Result<LogOptions, String> {
        let mut options = LogOptions::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "tail" | "tailLines" => options.tail = Some(parse_number(key, value)?),
                "follow" => options.follow = parse_bool(key, value)?,
                "previous" => options.previous = parse_bool(key, value)?,
                "limitBytes" => {
                    let n = parse_number(key, value)?;
                    if n == 0 {
                        return Err("limitBytes must be at least 1".into());
                    }
                    options.limit_bytes = Some(n);
                }
                _ => {}
            }
        }
        Ok(options)
    }

    /// The query string of these options (no leading `?`; empty for the defaults).
    pub fn to_query(&self) -> String {
        let mut parts = Vec::new();
        if let Some(tail) = self.tail {
            parts.push(format!("tail={tail}"));
        }
        if self.follow {
            parts.push("follow=true".to_string());
        }
        if self.previous {
            parts.push("previous=true".to_string());
        }
        if let Some(limit) = self.limit_bytes {
            parts.push(format!("limitBytes={limit}"));
        }
        parts.join("&")
    }
}

fn parse_number(key: &str, value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key}={value:?} is not a non-negative integer"));
    }
    value
        .parse()
        .map_err(|_| format!("{key}={value:?} is too large"))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{key}={value:?} is not true or false")),
    }
}

/// Path of an exec into a replica on the agent's local API.
pub fn exec_path(namespace: &str, pod: &str) -> String {
    format!("/exec/{namespace}/{pod}")
}

/// Most arguments an exec command may have.
pub const MAX_COMMAND_ARGS: usize = 1024;
/// Most bytes an exec command may have, all arguments together.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Parameters of an exec (`GET /exec/...` on the agent, `.../pods/{pod}/exec` on the
/// server), as Kubernetes' `PodExecOptions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    /// Program and arguments (`command`, repeated; no shell).
    pub command: Vec<String>,
    /// Send the client's channel 0 to the process (`stdin`, default false).
    pub stdin: bool,
    /// Send the process's stdout on channel 1 (`stdout`, default true).
    pub stdout: bool,
    /// Send the process's stderr on channel 2 (`stderr`, default true; merged into stdout
    /// with a terminal).
    pub stderr: bool,
    /// Run the process on a terminal (`tty`, default false).
    pub tty: bool,
}

impl Default for ExecOptions {
    /// Kubernetes' defaults, without a command.
    fn default() -> Self {
        ExecOptions {
            command: Vec::new(),
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }
}

impl ExecOptions {
    /// Parse a query string: `command` (repeated, one argument each, percent-encoded, `+`
    /// for a space), `stdin`, `stdout`, `stderr`, `tty` (booleans as for [`LogOptions`]);
    /// `container` and unknown parameters are ignored. The command must have a non-empty
    /// program, at most [`MAX_COMMAND_ARGS`] arguments and [`MAX_COMMAND_BYTES`] bytes, and
    /// at least one of stdin, stdout and stderr must be on.
    pub fn parse(query: Option<&str>) -> Result<ExecOptions, String> {
        let mut options = ExecOptions::default();
        let mut bytes = 0usize;
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "command" => {
                    let argument = percent_decode(value)
                        .map_err(|e| format!("command argument {value:?}: {e}"))?;
                    bytes += argument.len();
                    options.command.push(argument);
                    if options.command.len() > MAX_COMMAND_ARGS {
                        return Err(format!(
                            "the command has more than {MAX_COMMAND_ARGS} arguments"
                        ));
                    }
                    if bytes > MAX_COMMAND_BYTES {
                        return Err(format!(
                            "the command is longer than {MAX_COMMAND_BYTES} bytes"
                        ));
                    }
                }
                "stdin" => options.stdin = parse_bool(key, value)?,
                "stdout" => options.stdout = parse_bool(key, value)?,
                "stderr" => options.stderr = parse_bool(key, value)?,
                "tty" => options.tty = parse_bool(key, value)?,
                _ => {}
            }
        }
        match options.command.first() {
            None => {
                return Err(
                    "no command: pass command=PROGRAM, then command=ARG for each argument".into(),
                );
            }
            Some(program) if program.is_empty() => {
                return Err("the command's program (the first command=) is empty".into());
            }
            Some(_) => {}
        }
        if !(options.stdin || options.stdout || options.stderr) {
            return Err("at least one of stdin, stdout and stderr must be true".into());
        }
        Ok(options)
    }

    /// The query string of these options (no leading `?`): every parameter spelled out,
    /// arguments percent-encoded; [`ExecOptions::parse`] reads it back unchanged.
    pub fn to_query(&self) -> String {
        let mut parts: Vec<String> = self
            .command
            .iter()
            .map(|argument| format!("command={}", percent_encode(argument)))
            .collect();
        for (key, value) in [
            ("stdin", self.stdin),
            ("stdout", self.stdout),
            ("stderr", self.stderr),
            ("tty", self.tty),
        ] {
            parts.push(format!("{key}={value}"));
        }
        parts.join("&")
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Decode a query value: `%XX` escapes, and `+` for a space (form encoding, as Go's
/// `url.Values` writes it). The result must be UTF-8.
pub fn percent_decode(text: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(byte) = bytes.next() {
        match byte {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next(), bytes.next()];
                let value = match hex {
                    [Some(high), Some(low)] => std::str::from_utf8(&[high, low])
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok()),
                    _ => None,
                };
                out.push(value.ok_or_else(|| "a % is not followed by two hex digits".to_string())?);
            }
            other => out.push(other),
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8 once decoded".to_string())
}

/// The preferred exec subprotocol: version 5 adds the close message ([`Channel::Close`]),
/// with which a client ends the process's stdin.
pub const EXEC_PROTOCOL_V5: &str = "v5.channel.k8s.io";
/// The exec subprotocol without the close message (stdin ends with the connection).
pub const EXEC_PROTOCOL_V4: &str = "v4.channel.k8s.io";
/// Largest WebSocket message (and frame) either side of an exec accepts.
pub const MAX_EXEC_MESSAGE: usize = 1024 * 1024;

/// The subprotocol to answer for an offered `Sec-WebSocket-Protocol` list (the header's
/// values, each comma-separated): [`EXEC_PROTOCOL_V5`] when offered, else
/// [`EXEC_PROTOCOL_V4`], else `None` (the base64 variants are not served).
pub fn select_exec_protocol<'a>(
    offered: impl IntoIterator<Item = &'a str>,
) -> Option<&'static str> {
    let offered: Vec<&str> = offered
        .into_iter()
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .collect();
    [EXEC_PROTOCOL_V5, EXEC_PROTOCOL_V4]
        .into_iter()
        .find(|protocol| offered.contains(protocol))
}

/// What a valid exec upgrade request carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecUpgrade {
    /// `Sec-WebSocket-Key`.
    pub key: String,
    /// The subprotocol to answer ([`select_exec_protocol`]).
    pub protocol: &'static str,
}

/// Check that `headers` ask for a WebSocket upgrade speaking an exec subprotocol; the error
/// names what is missing.
pub fn exec_upgrade(headers: &http::HeaderMap) -> Result<ExecUpgrade, String> {
    let has = |name: http::header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    if !has(http::header::CONNECTION, "upgrade") || !has(http::header::UPGRADE, "websocket") {
        return Err(format!(
            "exec needs a WebSocket upgrade: send Connection: Upgrade and Upgrade: websocket, \
             with Sec-WebSocket-Protocol {EXEC_PROTOCOL_V5} or {EXEC_PROTOCOL_V4}"
        ));
    }
    if headers
        .get(http::header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        return Err("Sec-WebSocket-Version must be 13".into());
    }
    let key = headers
        .get(http::header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| "Sec-WebSocket-Key is missing".to_string())?
        .to_string();
    let offered: Vec<&str> = headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let protocol = select_exec_protocol(offered.iter().copied()).ok_or_else(|| {
        format!(
            "no exec subprotocol offered (Sec-WebSocket-Protocol: {:?}): use {EXEC_PROTOCOL_V5} \
             or {EXEC_PROTOCOL_V4}",
            offered.join(", ")
        )
    })?;
    Ok(ExecUpgrade { key, protocol })
}

/// The channel of an exec message: its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// Client → process: bytes for its stdin.
    Stdin,
    /// Process → client: its stdout (and, with a terminal, its stderr).
    Stdout,
    /// Process → client: its stderr (never with a terminal).
    Stderr,
    /// Process → client: the final status, once ([`ExecOutcome`]).
    Error,
    /// Client → process: the terminal's new size ([`TerminalSize`]).
    Resize,
    /// Either way (v5 only): the payload's one byte names a channel the sender closes
    /// (a client closing [`Channel::Stdin`] ends the process's input).
    Close,
}

impl Channel {
    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            Channel::Stdin => 0,
            Channel::Stdout => 1,
            Channel::Stderr => 2,
            Channel::Error => 3,
            Channel::Resize => 4,
            Channel::Close => 255,
        }
    }

    /// The channel of a first byte, if it is one.
    pub fn from_byte(byte: u8) -> Option<Channel> {
        Some(match byte {
            0 => Channel::Stdin,
            1 => Channel::Stdout,
            2 => Channel::Stderr,
            3 => Channel::Error,
            4 => Channel::Resize,
            255 => Channel::Close,
            _ => return None,
        })
    }
}

/// One exec message: the channel byte, then the payload.
pub fn encode_frame(channel: Channel, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(payload.len() + 1);
    message.push(channel.byte());
    message.extend_from_slice(payload);
    message
}

/// Split an exec message into its channel and payload. An empty message, an unknown channel
/// byte, and a [`Channel::Close`] whose payload is not one known channel byte are errors.
pub fn decode_frame(message: &[u8]) -> Result<(Channel, &[u8]), String> {
    let (&first, payload) = message
        .split_first()
        .ok_or_else(|| "an empty exec message (no channel byte)".to_string())?;
    let channel =
        Channel::from_byte(first).ok_or_else(|| format!("unknown exec channel {first}"))?;
    if channel == Channel::Close
        && !matches!(payload, [closed] if Channel::from_byte(*closed).is_some())
    {
        return Err(format!(
            "a close message must name one channel, not {} bytes {payload:?}",
            payload.len()
        ));
    }
    Ok((channel, payload))
}

/// A terminal size, as a resize message carries it: `{"Width":W,"Height":H}` (columns and
/// rows, both at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

impl Default for TerminalSize {
    /// 80 × 24.
    fn default() -> Self {
        TerminalSize {
            width: 80,
            height: 24,
        }
    }
}

impl TerminalSize {
    /// The payload of a resize message.
    pub fn to_json(&self) -> Vec<u8> {
        format!("{{\"Width\":{},\"Height\":{}}}", self.width, self.height).into_bytes()
    }

    /// Read the payload of a resize message.
    pub fn parse(payload: &[u8]) -> Result<TerminalSize, String> {
        let size: TerminalSize = serde_json::from_slice(payload)
            .map_err(|e| format!("a resize message is not {{\"Width\":W,\"Height\":H}}: {e}"))?;
        if size.width == 0 || size.height == 0 {
            return Err(format!(
                "a resize to {}x{}: Width and Height must be at least 1",
                size.width, size.height
            ));
        }
        Ok(size)
    }
}

/// How an exec ended, as the agent reports it on [`Channel::Error`] (a `metav1.Status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutcome {
    /// The process exited with this code (`0`: `{"status":"Success"}`; else `Failure`,
    /// reason `NonZeroExitCode`, the code as the `ExitCode` cause; a signal `n` is `128+n`).
    Exited(i32),
    /// The exec failed otherwise (the program could not be started, the agent stopped...).
    Failed {
        /// `metav1.StatusReason` (`InternalError`, ...).
        reason: String,
        /// What went wrong, for humans.
        message: String,
    },
}

impl ExecOutcome {
    /// The `Status` JSON sent on the error channel.
    pub fn to_status(&self) -> Vec<u8> {
        let status = match self {
            ExecOutcome::Exited(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
            ExecOutcome::Exited(code) => serde_json::json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("command terminated with non-zero exit code: exit status {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            }),
            ExecOutcome::Failed { reason, message } => serde_json::json!({
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
            }),
        };
        status.to_string().into_bytes()
    }

    /// Read a `Status` received on the error channel.
    pub fn parse(payload: &[u8]) -> Result<ExecOutcome, String> {
        let status: serde_json::Value = serde_json::from_slice(payload)
            .map_err(|e| format!("the exec status is not JSON: {e}"))?;
        let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
        match status["status"].as_str() {
            Some("Success") => Ok(ExecOutcome::Exited(0)),
            Some("Failure") => {
                let reason = text(&status["reason"]);
                if reason == "NonZeroExitCode" {
                    let code = status["details"]["causes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|cause| cause["reason"] == "ExitCode")
                        .and_then(|cause| cause["message"].as_str()?.parse::<i32>().ok());
                    if let Some(code) = code {
                        return Ok(ExecOutcome::Exited(code));
                    }
                }
                Ok(ExecOutcome::Failed {
                    reason,
                    message: text(&status["message"]),
                })
            }
            other => Err(format!(
                "the exec status says neither Success nor Failure: {other:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_print() {
        assert_eq!(LogOptions::parse(None), Ok(LogOptions::default()));
        let options =
            LogOptions::parse(Some("tail=3&follow=true&previous=0&limitBytes=10&x=y")).unwrap();
        assert_eq!(
            options,
            LogOptions {
                tail: Some(3),
                follow: true,
                previous: false,
                limit_bytes: Some(10),
            }
        );
        assert_eq!(options.to_query(), "tail=3&follow=true&limitBytes=10");
        for bad in ["tail=-1", "tail=x", "follow=yes", "limitBytes=0", "tail=+1"] {
            assert!(LogOptions::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubectl_names_are_accepted_and_passed_on_canonically() {
        let q = LogOptions::parse(Some("tailLines=5&follow=1&previous=false&limitBytes=9&x=1"))
            .unwrap();
        assert_eq!(q.to_query(), "tail=5&follow=true&limitBytes=9");
        assert_eq!(LogOptions::parse(None).unwrap().to_query(), "");
        for bad in ["tail=-2", "follow=maybe", "limitBytes=0", "tail="] {
            assert!(LogOptions::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn exec_options_parse_and_print() {
        let options = ExecOptions::parse(Some(
            "command=sh&command=-c&command=echo+%22a%20b%22%3B%20exit%203&stdin=true&tty=1&container=x&other=y",
        ))
        .unwrap();
        assert_eq!(
            options,
            ExecOptions {
                command: vec!["sh".into(), "-c".into(), "echo \"a b\"; exit 3".into()],
                stdin: true,
                stdout: true,
                stderr: true,
                tty: true,
            }
        );
        assert_eq!(
            options.to_query(),
            "command=sh&command=-c&command=echo%20%22a%20b%22%3B%20exit%203\
             &stdin=true&stdout=true&stderr=true&tty=true"
        );
        assert_eq!(ExecOptions::parse(Some(&options.to_query())), Ok(options));
        // Every byte survives the trip, non-ASCII and `+` and `%` included.
        let odd = ExecOptions {
            command: vec!["prog".into(), "a+b%c&d=e ü\n".into(), String::new()],
            ..ExecOptions::default()
        };
        assert_eq!(ExecOptions::parse(Some(&odd.to_query())), Ok(odd));
        let defaults = ExecOptions::parse(Some("command=ls")).unwrap();
        assert!(!defaults.stdin && defaults.stdout && defaults.stderr && !defaults.tty);
    }

    #[test]
    fn bad_exec_options_are_named() {
        let error = |query: &str| ExecOptions::parse(Some(query)).unwrap_err();
        assert!(ExecOptions::parse(None).unwrap_err().contains("no command"));
        assert!(error("stdin=true").contains("no command"));
        assert!(error("command=").contains("program"));
        assert!(error("command=ls&tty=yes").contains("tty"));
        assert!(error("command=%zz").contains("hex"));
        assert!(error("command=%4").contains("hex"));
        assert!(error("command=%FF").contains("UTF-8"));
        assert!(error("command=ls&stdout=false&stderr=false").contains("at least one"));
        let many = vec!["command=x"; MAX_COMMAND_ARGS + 1].join("&");
        assert!(error(&many).contains("arguments"));
        let long = format!("command={}", "x".repeat(MAX_COMMAND_BYTES + 1));
        assert!(error(&long).contains("bytes"));
    }

    #[test]
    fn paths() {
        assert_eq!(exec_path("rlark-a", "t-0"), "/exec/rlark-a/t-0");
        assert_eq!(logs_path("rlark-a", "t-0"), "/logs/rlark-a/t-0");
    }

    #[test]
    fn protocols_are_negotiated() {
        assert_eq!(
            select_exec_protocol(["v4.channel.k8s.io, v5.channel.k8s.io"]),
            Some(EXEC_PROTOCOL_V5)
        );
        assert_eq!(
            select_exec_protocol(["base64.channel.k8s.io", "v4.channel.k8s.io"]),
            Some(EXEC_PROTOCOL_V4)
        );
        assert_eq!(select_exec_protocol(["channel.k8s.io"]), None);
        assert_eq!(select_exec_protocol([]), None);
    }

    #[test]
    fn frames_encode_and_decode() {
        for channel in [
            Channel::Stdin,
            Channel::Stdout,
            Channel::Stderr,
            Channel::Error,
            Channel::Resize,
        ] {
            let message = encode_frame(channel, b"payload");
            assert_eq!(message[0], channel.byte());
            assert_eq!(decode_frame(&message), Ok((channel, &b"payload"[..])));
            assert_eq!(Channel::from_byte(channel.byte()), Some(channel));
        }
        assert_eq!(encode_frame(Channel::Stdout, b""), [1]);
        assert_eq!(decode_frame(&[2]), Ok((Channel::Stderr, &b""[..])));
        let close = encode_frame(Channel::Close, &[Channel::Stdin.byte()]);
        assert_eq!(close, [255, 0]);
        assert_eq!(decode_frame(&close), Ok((Channel::Close, &[0u8][..])));
        assert!(decode_frame(&[]).unwrap_err().contains("empty"));
        assert!(
            decode_frame(&[7, 1])
                .unwrap_err()
                .contains("unknown exec channel 7")
        );
        assert!(decode_frame(&[255]).is_err());
        assert!(decode_frame(&[255, 0, 1]).is_err());
        assert!(decode_frame(&[255, 9]).is_err());
    }

    #[test]
    fn resize_messages() {
        let size = TerminalSize {
            width: 100,
            height: 40,
        };
        assert_eq!(size.to_json(), br#"{"Width":100,"Height":40}"#);
        assert_eq!(TerminalSize::parse(&size.to_json()), Ok(size));
        assert_eq!(
            TerminalSize::parse(br#"{"Height":2,"Width":3,"x":1}"#),
            Ok(TerminalSize {
                width: 3,
                height: 2
            })
        );
        for bad in [
            &br#"{"Width":0,"Height":40}"#[..],
            br#"{"Width":70000,"Height":40}"#,
            br#"{"Width":80}"#,
            b"80x24",
        ] {
            assert!(TerminalSize::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            TerminalSize::default(),
            TerminalSize {
                width: 80,
                height: 24
            }
        );
    }

    #[test]
    fn statuses_round_trip() {
        assert_eq!(
            ExecOutcome::Exited(0).to_status(),
            br#"{"metadata":{},"status":"Success"}"#
        );
        let three: serde_json::Value =
            serde_json::from_slice(&ExecOutcome::Exited(3).to_status()).unwrap();
        assert_eq!(three["reason"], "NonZeroExitCode");
        assert_eq!(three["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(three["details"]["causes"][0]["message"], "3");
        assert!(
            three["message"]
                .as_str()
                .unwrap()
                .starts_with("command terminated with non-zero exit code: ")
        );
        for outcome in [
            ExecOutcome::Exited(0),
            ExecOutcome::Exited(3),
            ExecOutcome::Exited(137),
            ExecOutcome::Failed {
                reason: "InternalError".into(),
                message: "start \"nope\": not found".into(),
            },
        ] {
            assert_eq!(ExecOutcome::parse(&outcome.to_status()), Ok(outcome));
        }
        // kubelet's wording of the same thing.
        let kubelet = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 7], exit code 7","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;
        assert_eq!(ExecOutcome::parse(kubelet), Ok(ExecOutcome::Exited(7)));
        assert!(ExecOutcome::parse(b"{}").is_err());
        assert!(ExecOutcome::parse(b"nope").is_err());
    }

    #[test]
    fn exec_upgrades_are_checked() {
        let mut headers = http::HeaderMap::new();
        let error = |headers: &http::HeaderMap| exec_upgrade(headers).unwrap_err();
        assert!(error(&headers).contains("WebSocket upgrade"));
        headers.insert("connection", "keep-alive, Upgrade".parse().unwrap());
        headers.insert("upgrade", "websocket".parse().unwrap());
        assert!(error(&headers).contains("Version"));
        headers.insert("sec-websocket-version", "13".parse().unwrap());
        assert!(error(&headers).contains("Key"));
        headers.insert(
            "sec-websocket-key",
            "dGhlIHNhbXBsZSBub25jZQ==".parse().unwrap(),
        );
        assert!(error(&headers).contains("subprotocol"));
        headers.insert(
            "sec-websocket-protocol",
            "base64.channel.k8s.io".parse().unwrap(),
        );
        assert!(error(&headers).contains("base64.channel.k8s.io"));
        headers.append(
            "sec-websocket-protocol",
            "v4.channel.k8s.io".parse().unwrap(),
        );
        assert_eq!(
            exec_upgrade(&headers),
            Ok(ExecUpgrade {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into(),
                protocol: EXEC_PROTOCOL_V4,
            })
        );
    }
}
