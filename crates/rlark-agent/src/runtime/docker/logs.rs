//! A container's output into the replica's `logs/current.log`, so `rlark logs` (the agent's
//! log API, `api.rs`) serves a container replica exactly as a process replica.
//!
//! The engine's log stream (`GET /containers/{id}/logs?follow&timestamps`) is multiplexed
//! ([`Demux`]: 8-byte frame headers, stream 1 = stdout, 2 = stderr) and every message starts
//! with its RFC 3339 timestamp. [`pump`] strips the timestamp, appends the text to
//! `current.log` (rotated as a process replica's is) and keeps the newest timestamp in
//! `logs/docker-since` (rewritten at most once a second): an agent that adopts the
//! container after a restart resumes the stream from there and drops messages not newer
//! than it, so lines are neither lost nor repeated across an agent restart (a message the
//! engine stamped with exactly the recorded time is the one exception: it is dropped).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use http_body_util::BodyExt as _;

use super::client::DockerClient;
use crate::runtime::LogFiles;

/// Name of the file (in `logs/`) holding the timestamp of the last message written.
pub const SINCE_FILE: &str = "docker-since";
/// How often the since file and the log size are checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Largest frame accepted (the engine splits messages at 16 KiB; anything far larger is a
/// broken stream).
const MAX_FRAME: usize = 1 << 20;

/// Sans-IO parser of the engine's multiplexed stream: feed bytes, take whole frames.
#[derive(Debug, Default)]
pub struct Demux {
    buf: Vec<u8>,
}

/// A frame header announcing more than [`MAX_FRAME`] bytes.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("docker stream frame of {0} bytes is larger than the {MAX_FRAME}-byte limit")]
pub struct FrameTooLarge(pub usize);

impl Demux {
    /// Add bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame as (stream number, payload), if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, FrameTooLarge> {
        let Some(header) = self.buf.get(..8) else {
            return Ok(None);
        };
        let stream = header[0];
        let size = usize::try_from(u32::from_be_bytes([
            header[4], header[5], header[6], header[7],
        ]))
        .unwrap_or(usize::MAX);
        if size > MAX_FRAME {
            return Err(FrameTooLarge(size));
        }
        if self.buf.len() < 8 + size {
            return Ok(None);
        }
        let payload = self.buf[8..8 + size].to_vec();
        self.buf.drain(..8 + size);
        Ok(Some((stream, payload)))
    }
}

/// Split a timestamped message (`2026-01-02T03:04:05.123456789Z text`) into its time and
/// text; `None` time when it does not start with one (the whole message is the text).
pub fn split_timestamp(message: &[u8]) -> (Option<DateTime<Utc>>, &[u8]) {
    let Some(space) = message.iter().position(|b| *b == b' ') else {
        return (None, message);
    };
    let parsed = std::str::from_utf8(&message[..space])
        .ok()
        .and_then(|text| DateTime::parse_from_rfc3339(text).ok());
    match parsed {
        Some(time) => (Some(time.with_timezone(&Utc)), &message[space + 1..]),
        None => (None, message),
    }
}

/// The engine's `since` parameter for `time`: `seconds.nanoseconds`.
pub fn since_param(time: DateTime<Utc>) -> String {
    format!("{}.{:09}", time.timestamp(), time.timestamp_subsec_nanos())
}

/// The time recorded in `logs_dir/docker-since`, if any.
pub fn read_since(logs_dir: &Path) -> Option<DateTime<Utc>> {
    let text = std::fs::read_to_string(logs_dir.join(SINCE_FILE)).ok()?;
    DateTime::parse_from_rfc3339(text.trim())
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn write_since(path: &Path, time: DateTime<Utc>) {
    let tmp = path.with_extension("tmp");
    let written = std::fs::write(
        &tmp,
        time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    )
    .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(error) = written {
        tracing::debug!(file = %path.display(), %error, "write the docker log position");
    }
}

/// Copy container `id`'s output into `files` until the engine ends the stream (the
/// container stopped) or the stream breaks. Resumes after the time in `logs/docker-since`
/// when there is one. `fresh`: the container was just started, not adopted, so when the
/// log already holds output (an earlier start: a restart, a resume) the restart separator
/// goes in first, as for a process replica ([`LogFiles::open_for_start`]). Errors are
/// logged, not returned: logs are best effort, the replica's supervision never waits on
/// them beyond its drain timeout.
pub async fn pump(client: DockerClient, id: String, files: LogFiles, fresh: bool) {
    let logs_dir: PathBuf = files
        .path()
        .parent()
        .map_or_else(PathBuf::new, Path::to_path_buf);
    let since_path = logs_dir.join(SINCE_FILE);
    let mut last = read_since(&logs_dir);
    let mut body = match client.logs(&id, last.map(since_param).as_deref()).await {
        Ok(body) => body,
        Err(error) => {
            tracing::warn!(container = %id, %error, "cannot follow the container's logs");
            return;
        }
    };
    let opened = match fresh {
        true => files.open_for_start(Utc::now()),
        false => files.open_append(),
    };
    let mut out = match opened {
        Ok(file) => file,
        Err(error) => {
            tracing::warn!(file = %files.path().display(), %error, "cannot open the replica log");
            return;
        }
    };
    let mut demux = Demux::default();
    let mut saved = last;
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            _ = check.tick() => {
                if last != saved && let Some(time) = last {
                    write_since(&since_path, time);
                    saved = last;
                }
                if let Err(error) = files.rotate_if_needed() {
                    tracing::debug!(%error, "rotate the replica log");
                }
                continue;
            }
        };
        let data = match frame {
            None => break,
            Some(Err(error)) => {
                tracing::debug!(container = %id, %error, "container log stream broke");
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        demux.push(&data);
        loop {
            match demux.next_frame() {
                Ok(Some((_stream, message))) => {
                    let (time, text) = split_timestamp(&message);
                    if let (Some(time), Some(seen)) = (time, last)
                        && time <= seen
                    {
                        continue;
                    }
                    if let Err(error) = out.write_all(text) {
                        tracing::debug!(%error, "append to the replica log");
                    }
                    if time.is_some() {
                        last = time;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(container = %id, %error, "container log stream is corrupt");
                    return;
                }
            }
        }
    }
    if last != saved
        && let Some(time) = last
    {
        write_since(&since_path, time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![stream, 0, 0, 0];
        out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_are_taken_whole_whatever_the_chunking() {
        let mut bytes = frame(1, b"2026-01-02T03:04:05.5Z out\n");
        bytes.extend(frame(2, b"err\n"));
        for split in 0..bytes.len() {
            let mut demux = Demux::default();
            let mut got = Vec::new();
            for part in [&bytes[..split], &bytes[split..]] {
                demux.push(part);
                while let Some(frame) = demux.next_frame().unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(
                got,
                vec![
                    (1, b"2026-01-02T03:04:05.5Z out\n".to_vec()),
                    (2, b"err\n".to_vec())
                ],
                "split at {split}"
            );
        }
        let mut huge = Demux::default();
        huge.push(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(huge.next_frame(), Err(FrameTooLarge(0xffff_ffff)));
    }

    #[test]
    fn timestamps_are_split_off_and_round_trip_as_since() {
        let (time, text) = split_timestamp(b"2026-01-02T03:04:05.000000007Z hello world\n");
        let time = time.expect("time");
        assert_eq!(text, b"hello world\n");
        assert_eq!(since_param(time), format!("{}.000000007", time.timestamp()));
        assert_eq!(
            split_timestamp(b"no-time here"),
            (None, &b"no-time here"[..])
        );
        assert_eq!(split_timestamp(b""), (None, &b""[..]));
        let dir = tempfile::tempdir().unwrap();
        write_since(&dir.path().join(SINCE_FILE), time);
        assert_eq!(read_since(dir.path()), Some(time));
    }
}
