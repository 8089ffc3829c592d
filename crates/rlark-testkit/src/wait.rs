//! Bounded waiting: [`eventually`] polls a check until it holds, at most [`DEADLINE`], and
//! fails with an error that names what it waited for and what it saw last.
//!
//! ```no_run
//! # async fn demo(pods: kube::Api<rlark_api::types::Pod>) -> anyhow::Result<()> {
//! use rlark_testkit::wait::eventually;
//! let pod = eventually("pod t-0 exists", || async { Ok(pods.get_opt("t-0").await?) }).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

/// Upper bound of [`eventually`] (a state normally arrives well within it: it bounds a
/// test that would otherwise hang, it is not a performance assertion).
pub const DEADLINE: Duration = Duration::from_secs(60);
/// How often [`eventually`] checks.
pub const POLL: Duration = Duration::from_millis(50);

/// What one check found: done with a value, or not yet.
pub trait Progress {
    /// What [`eventually`] returns once the check holds.
    type Value;
    /// `Ok(value)` when done; `Err(seen)` when not yet, with a description of what the check
    /// saw (kept for the timeout error) or `None` when there is nothing to say.
    fn into_progress(self) -> Result<Self::Value, Option<String>>;
}

/// `Some(value)` is done; `None` is not yet.
impl<T> Progress for Option<T> {
    type Value = T;
    fn into_progress(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

/// `Ok(value)` is done; `Err(state)` is not yet, and describes the state seen.
impl<T> Progress for Result<T, String> {
    type Value = T;
    fn into_progress(self) -> Result<T, Option<String>> {
        self.map_err(Some)
    }
}

/// `true` is done.
impl Progress for bool {
    type Value = ();
    fn into_progress(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

/// `value` when it `holds`, else not yet with `value`'s debug form as the state seen: for a
/// check that reads a value and tests it, so that the timeout error shows the last value.
pub fn matching<T: std::fmt::Debug>(value: T, holds: impl FnOnce(&T) -> bool) -> Result<T, String> {
    if holds(&value) {
        Ok(value)
    } else {
        Err(format!("{value:?}"))
    }
}

/// Poll `check` every [`POLL`] until it reports done (see [`Progress`]), at most
/// [`DEADLINE`]; see [`eventually_within`].
pub async fn eventually<P, F, Fut>(what: &str, check: F) -> anyhow::Result<P::Value>
where
    P: Progress,
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<P>>,
{
    eventually_within(DEADLINE, what, check).await
}

/// Poll `check` every [`POLL`] until it reports done, at most `limit` (on tokio's clock, so
/// a paused-time test drives it). An error from `check` counts as not yet (an API call may
/// fail while a server or manager restarts). The timeout error names `what` and the last
/// state or error the check reported.
pub async fn eventually_within<P, F, Fut>(
    limit: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<P::Value>
where
    P: Progress,
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<P>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = None;
    loop {
        match check().await.map(Progress::into_progress) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(seen)) => last = seen.or(last),
            Err(error) => last = Some(format!("error: {error:#}")),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(match last {
                Some(last) => {
                    anyhow::anyhow!(
                        "timed out after {limit:?} waiting for {what}; last seen: {last}"
                    )
                }
                None => anyhow::anyhow!("timed out after {limit:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_once_the_check_holds() {
        let mut calls = 0;
        let value = eventually("the third call", || {
            calls += 1;
            let n = calls;
            async move { Ok((n == 3).then_some(n)) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn times_out_naming_what_and_the_last_state_seen() {
        let start = tokio::time::Instant::now();
        let err = eventually_within(Duration::from_secs(2), "the pod runs", || async {
            Ok(Err::<(), _>("phase Pending".to_string()))
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 2s waiting for the pod runs; last seen: phase Pending"
        );
        assert!(start.elapsed() >= Duration::from_secs(2));
        assert!(start.elapsed() < Duration::from_secs(2) + POLL * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn matching_reports_the_last_value() {
        let mut n = 0;
        let err = eventually_within(Duration::from_secs(1), "n above 100", || {
            n += 1;
            let value = n;
            async move { Ok(matching(value, |v| *v > 100)) }
        })
        .await
        .unwrap_err()
        .to_string();
        let last = n.to_string();
        assert!(err.ends_with(&format!("; last seen: {last}")), "{err}");
        assert_eq!(matching(7, |v| *v == 7), Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_retried_and_reported_when_nothing_else_was_seen() {
        let mut calls = 0;
        let ok = eventually("recovery", || {
            calls += 1;
            let n = calls;
            async move {
                anyhow::ensure!(n > 2, "connection refused");
                Ok(true)
            }
        })
        .await;
        assert!(ok.is_ok(), "{ok:?}");

        let err = eventually_within(Duration::from_secs(1), "the node", || async {
            anyhow::bail!("connection refused") as anyhow::Result<Option<()>>
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 1s waiting for the node; last seen: error: connection refused"
        );
        let err = eventually_within(Duration::from_secs(1), "a flag", || async { Ok(false) })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "timed out after 1s waiting for a flag");
    }
}
