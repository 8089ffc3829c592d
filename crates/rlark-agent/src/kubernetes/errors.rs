//! What to do about a failed member API call: fail the Task, adopt the object, or retry
//! later, decided by the response's STATUS CODE (agent-lightning matched substrings of
//! the error text, so a template error without the word "invalid" was retried forever).
//!
//! | response | decision |
//! |---|---|
//! | 422 Unprocessable (`Invalid`), 400 BadRequest, 413 too large | [`Disposition::Fail`] with the API's message |
//! | 409 with reason `AlreadyExists` | [`Disposition::Adopt`] (the object is there: find it by its labels) |
//! | 409 other (a write conflict), 401, 403 (quota, RBAC), 404 (namespace not there yet), 408, 429, 5xx, any other code, no response (network, timeout) | [`Disposition::Retry`] after [`Backoff`]; `retryAfterSeconds` is respected |

use std::time::Duration;

/// A failed call to the member API, as the runtime saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberFailure {
    /// The HTTP status code; `None` when no response came (connect, TLS, timeout).
    pub code: Option<u16>,
    /// The `Status` reason (`Invalid`, `AlreadyExists`, `Forbidden`, ...), empty if none.
    pub reason: String,
    /// The `Status` message, or the transport error's text.
    pub message: String,
    /// `details.retryAfterSeconds` of the `Status`, when given.
    pub retry_after: Option<Duration>,
}

impl MemberFailure {
    /// The failure of a kube-rs call.
    pub fn from_kube(error: &kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => MemberFailure {
                code: Some(status.code),
                reason: status.reason.clone(),
                message: status.message.clone(),
                retry_after: status
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|s| *s > 0)
                    .map(|s| Duration::from_secs(u64::from(s))),
            },
            other => MemberFailure {
                code: None,
                reason: String::new(),
                message: other.to_string(),
                retry_after: None,
            },
        }
    }
}

/// What the runtime does about a [`MemberFailure`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// The request can never succeed: fail the Task with this message.
    Fail(String),
    /// The object exists already: adopt it (it is the Task's if its labels say so).
    Adopt,
    /// Try again later; not before `at_least` (the server's `retryAfterSeconds`) when set.
    Retry {
        /// The server's minimum wait.
        at_least: Option<Duration>,
    },
}

/// The decision for `failure` (module docs).
pub fn classify(failure: &MemberFailure) -> Disposition {
    match failure.code {
        Some(422 | 400 | 413) => Disposition::Fail(format!(
            "the member cluster refused the object ({} {}): {}",
            failure.code.unwrap_or_default(),
            if failure.reason.is_empty() {
                "Invalid"
            } else {
                &failure.reason
            },
            failure.message
        )),
        Some(409) if failure.reason == "AlreadyExists" => Disposition::Adopt,
        _ => Disposition::Retry {
            at_least: failure.retry_after,
        },
    }
}

/// Capped exponential backoff between retries: [`Backoff::INITIAL`], doubling per
/// failure, at most [`Backoff::MAX`]; [`Backoff::reset`] after a success. Sans-IO: the
/// caller sleeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// First delay.
    pub const INITIAL: Duration = Duration::from_secs(1);
    /// Longest delay.
    pub const MAX: Duration = Duration::from_secs(60);

    /// The delay before the next attempt after one more failure (at least `at_least`).
    pub fn next_delay(&mut self, at_least: Option<Duration>) -> Duration {
        let exponent = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        let delay = Self::INITIAL
            .saturating_mul(1u32 << exponent)
            .min(Self::MAX);
        delay.max(at_least.unwrap_or_default())
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A success: the next failure waits [`Backoff::INITIAL`] again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: Option<u16>, reason: &str) -> MemberFailure {
        MemberFailure {
            code,
            reason: reason.into(),
            message: "the message".into(),
            retry_after: None,
        }
    }

    #[test]
    fn classification_by_status_code() {
        let retry = Disposition::Retry { at_least: None };
        let cases: Vec<(Option<u16>, &str, Disposition)> = vec![
            (
                Some(422),
                "Invalid",
                Disposition::Fail(
                    "the member cluster refused the object (422 Invalid): the message".into(),
                ),
            ),
            (
                Some(400),
                "BadRequest",
                Disposition::Fail(
                    "the member cluster refused the object (400 BadRequest): the message".into(),
                ),
            ),
            (
                Some(413),
                "",
                Disposition::Fail(
                    "the member cluster refused the object (413 Invalid): the message".into(),
                ),
            ),
            (Some(409), "AlreadyExists", Disposition::Adopt),
            (Some(409), "Conflict", retry.clone()),
            (Some(403), "Forbidden", retry.clone()),
            (Some(401), "Unauthorized", retry.clone()),
            (Some(404), "NotFound", retry.clone()),
            (Some(429), "TooManyRequests", retry.clone()),
            (Some(500), "InternalError", retry.clone()),
            (Some(503), "ServiceUnavailable", retry.clone()),
            (Some(504), "Timeout", retry.clone()),
            (None, "", retry.clone()),
            // The text does not matter, only the code does.
            (Some(500), "Invalid", retry),
        ];
        for (code, reason, want) in cases {
            assert_eq!(classify(&failure(code, reason)), want, "{code:?} {reason}");
        }
        let mut throttled = failure(Some(429), "TooManyRequests");
        throttled.retry_after = Some(Duration::from_secs(7));
        assert_eq!(
            classify(&throttled),
            Disposition::Retry {
                at_least: Some(Duration::from_secs(7))
            }
        );
    }

    #[test]
    fn from_kube_errors() {
        let status =
            kube::core::Status::failure("Job.batch \"x\" is invalid", "Invalid").with_code(422);
        let f = MemberFailure::from_kube(&kube::Error::Api(Box::new(status)));
        assert_eq!(f.code, Some(422));
        assert_eq!(f.reason, "Invalid");
        assert!(matches!(classify(&f), Disposition::Fail(m) if m.contains("is invalid")));
        let transport = kube::Error::Service("connection refused".into());
        let f = MemberFailure::from_kube(&transport);
        assert_eq!(f.code, None);
        assert_eq!(classify(&f), Disposition::Retry { at_least: None });
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::default();
        let delays: Vec<u64> = (0..9).map(|_| backoff.next_delay(None).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff.failures(), 9);
        for _ in 0..100 {
            assert_eq!(backoff.next_delay(None), Backoff::MAX, "no overflow");
        }
        backoff.reset();
        assert_eq!(
            backoff.next_delay(Some(Duration::from_secs(30))),
            Duration::from_secs(30),
            "the server's retryAfter wins when longer"
        );
        assert_eq!(backoff.next_delay(None), Duration::from_secs(2));
    }
}
