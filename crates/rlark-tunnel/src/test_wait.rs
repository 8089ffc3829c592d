//! Bounded waiting for this crate's tests: its unit tests (`crate::test_wait`) and its
//! integration tests (included with `#[path]`). rlark-tunnel's tests cannot use
//! `rlark_testkit::wait`: rlark-testkit depends on rlark-tunnel.

use std::time::Duration;

/// How often [`eventually`] checks.
const POLL: Duration = Duration::from_millis(10);

/// Poll `done` every [`POLL`] until it holds, at most `limit` on tokio's clock; whether it
/// held (checked once more at the deadline).
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    done()
}
