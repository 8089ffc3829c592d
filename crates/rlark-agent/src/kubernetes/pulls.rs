//! Image pulls of a member Pod, from what the kubelet tells: the container statuses
//! ([`super::status::pull_progress`]) and its `Pulling`/`Pulled` Events, which are the only
//! place Kubernetes states an image's size and how long its pull took.
//!
//! The kubelet's messages (`pkg/kubelet/images/image_manager.go`, Kubernetes 1.28+):
//! - `Pulling`: `Pulling image "IMAGE"`;
//! - `Pulled`: `Successfully pulled image "IMAGE" in 2.345s (2.345s including waiting).
//!   Image size: 12345 bytes.` (older kubelets: without the size), or
//!   `Container image "IMAGE" already present on machine`.
//!
//! An Event is untrusted text: a message that does not parse changes nothing.

use k8s_openapi::api::core::v1::Event;
use rlark_api::types::PullProgress;

/// Reason of the kubelet's Event when a pull starts.
pub const REASON_PULLING: &str = "Pulling";
/// Reason of the kubelet's Event when an image is there (pulled or present).
pub const REASON_PULLED: &str = "Pulled";

/// What one `Pulled` Event says about an image.
#[derive(Clone, Debug, PartialEq)]
pub struct Pulled {
    pub image: String,
    /// Bytes, when the kubelet said (1.28+); `None` for an image already present.
    pub size: Option<i64>,
    /// Seconds the pull took (without waiting), when it was pulled now.
    pub seconds: Option<f64>,
}

/// The image named in a kubelet message: the first double-quoted string.
fn quoted(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once('"')?;
    let (image, _) = rest.split_once('"')?;
    (!image.is_empty()).then_some(image)
}

/// `Pulled` message → what it says; `None` when it is not one the kubelet writes.
pub fn parse_pulled(message: &str) -> Option<Pulled> {
    let image = quoted(message)?.to_string();
    if message.starts_with("Container image ") && message.ends_with("already present on machine") {
        return Some(Pulled {
            image,
            size: None,
            seconds: None,
        });
    }
    let rest = message.strip_prefix("Successfully pulled image ")?;
    let seconds = rest
        .split_once(" in ")
        .and_then(|(_, after)| after.split_once(' '))
        .and_then(|(took, _)| parse_duration(took));
    let size = rest
        .split_once("Image size: ")
        .and_then(|(_, after)| after.split_once(" bytes"))
        .and_then(|(n, _)| n.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0);
    Some(Pulled {
        image,
        size,
        seconds,
    })
}

/// A Go duration as the kubelet prints it (`2.345s`, `850ms`, `1m2.5s`, `1h0m3s`) in seconds.
fn parse_duration(text: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|i| *i > 0)?;
        let value: f64 = rest[..split].parse().ok()?;
        let unit_end = rest[split..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |i| split + i);
        let scale = match &rest[split..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "µs" | "us" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    total.is_finite().then_some(total)
}

/// `progress` (one entry per container, from the container statuses) with what the Pod's
/// `events` add: a `Pulled` Event marks its image `Done` (unless a container still reports
/// a pull failure for it: a later retry failed) with its size as `downloaded` and `total`
/// and size over pull time as `speed`; a `Pulling` Event of an image no container status
/// names yet adds it as `Pulling`. Events of other objects must be filtered out by the
/// caller; the order of `events` does not matter.
pub fn with_events(mut progress: Vec<PullProgress>, events: &[&Event]) -> Vec<PullProgress> {
    for event in events {
        let message = event.message.as_deref().unwrap_or_default();
        match event.reason.as_deref() {
            Some(REASON_PULLED) => {
                let Some(pulled) = parse_pulled(message) else {
                    continue;
                };
                for entry in progress.iter_mut().filter(|p| p.image == pulled.image) {
                    if entry.status == "Failed" || entry.status == "BackOff" {
                        continue;
                    }
                    entry.status = "Done".to_string();
                    entry.message = None;
                    if let Some(size) = pulled.size {
                        entry.downloaded = size;
                        entry.total = size;
                        entry.speed = pulled
                            .seconds
                            .filter(|s| *s > 0.0)
                            .map_or(0.0, |s| size as f64 / s);
                    }
                }
            }
            Some(REASON_PULLING) => {
                let Some(image) = quoted(message) else {
                    continue;
                };
                if !progress.iter().any(|p| p.image == image) {
                    progress.push(PullProgress {
                        image: image.to_string(),
                        status: "Pulling".to_string(),
                        ..Default::default()
                    });
                }
            }
            _ => {}
        }
    }
    progress
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(reason: &str, message: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
            "reason": reason, "message": message,
        }))
        .expect("event")
    }

    fn entry(image: &str, status: &str) -> PullProgress {
        PullProgress {
            image: image.into(),
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn pulled_messages_parse_as_the_kubelet_writes_them() {
        let cases = [
            (
                r#"Successfully pulled image "nginx:1.25" in 2.5s (3.1s including waiting). Image size: 70000000 bytes."#,
                Some(("nginx:1.25", Some(70_000_000), Some(2.5))),
            ),
            (
                r#"Successfully pulled image "reg.io/a/b@sha256:ab" in 1m2.5s (1m2.5s including waiting)"#,
                Some(("reg.io/a/b@sha256:ab", None, Some(62.5))),
            ),
            (
                r#"Successfully pulled image "x" in 850ms (850ms including waiting). Image size: 10 bytes."#,
                Some(("x", Some(10), Some(0.85))),
            ),
            (
                r#"Container image "busybox:1" already present on machine"#,
                Some(("busybox:1", None, None)),
            ),
            (
                r#"Successfully pulled image "x" in soon. Image size: -5 bytes."#,
                Some(("x", None, None)),
            ),
            ("Pulled something", None),
            (r#"Successfully pulled image "" in 1s"#, None),
            ("", None),
        ];
        for (message, want) in cases {
            let got = parse_pulled(message);
            let got = got.as_ref().map(|p| (p.image.as_str(), p.size, p.seconds));
            assert_eq!(got, want, "{message}");
        }
    }

    #[test]
    fn durations_in_go_notation() {
        for (text, want) in [
            ("2.345s", Some(2.345)),
            ("1h0m3s", Some(3603.0)),
            ("12µs", Some(12e-6)),
            ("s", None),
            ("3x", None),
            ("", None),
        ] {
            let got = parse_duration(text);
            assert!(
                match (got, want) {
                    (Some(a), Some(b)) => (a - b).abs() < 1e-9,
                    (a, b) => a == b,
                },
                "{text}: {got:?}"
            );
        }
    }

    #[test]
    fn events_complete_the_container_view() {
        let progress = vec![
            entry("big:1", "Pulling"),
            entry("small:1", "Pulling"),
            entry("bad:1", "Failed"),
        ];
        let pulled = event(
            "Pulled",
            r#"Successfully pulled image "big:1" in 4s (4s including waiting). Image size: 400 bytes."#,
        );
        let bad_earlier = event(
            "Pulled",
            r#"Container image "bad:1" already present on machine"#,
        );
        let sidecar = event("Pulling", r#"Pulling image "sidecar:2""#);
        let again = event("Pulling", r#"Pulling image "small:1""#);
        let noise = event("Started", "Started container main");
        let out = with_events(progress, &[&pulled, &bad_earlier, &sidecar, &again, &noise]);
        let view: Vec<(&str, &str, i64, i64, f64)> = out
            .iter()
            .map(|p| {
                (
                    p.image.as_str(),
                    p.status.as_str(),
                    p.downloaded,
                    p.total,
                    p.speed,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("big:1", "Done", 400, 400, 100.0),
                ("small:1", "Pulling", 0, 0, 0.0),
                ("bad:1", "Failed", 0, 0, 0.0),
                ("sidecar:2", "Pulling", 0, 0, 0.0),
            ]
        );
    }
}
