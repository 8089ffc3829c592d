//! The reconcile loop the Job, Workflow, Task and Domain controllers share: a kube-runtime
//! [`Controller`] run until shutdown, each reconcile counted and timed, each failure
//! requeued by one error policy.
//!
//! A controller builds its [`Controller`] with its own triggers (`Controller::new`, `owns`,
//! `watches_stream`, ...) and implements [`Reconciler`]: its name, the key and span of an
//! object, its pass, and where it departs from the shared policy. [`run`] adds the rest:
//!
//! - graceful shutdown on the token (in-flight reconciles finish);
//! - per reconcile, in the controller's span: `rlark_controller_reconciles_total
//!   {controller, result}` and `rlark_controller_reconcile_duration_seconds{controller}`
//!   ([`Metrics::measure`]); a success resets the object's backoff;
//! - the error policy ([`retry`]): a 409 Conflict is retried after [`CONFLICT_REQUEUE`]
//!   (logged at debug, the backoff untouched); a 404 Not Found after [`VANISHED_REQUEUE`]
//!   where [`Reconciler::RECHECK_VANISHED`] says so (the Job controller); any other failure
//!   after the object's next [`ErrorBackoff`] delay (500 ms doubling to 5 minutes), logged
//!   as a warning with `retry_in_ms`;
//! - every error the controller's stream yields, logged at debug (`reconcile failed`).
//!
//! The logs keep each controller's field (`job = %name`, `task = %namespace/name`) and
//! target (its module): `policy_log!` writes a controller's [`Reconciler::log`].
//!
//! The Node controller is a periodic check, not a kube-runtime controller: it only shares
//! the reconcile metrics ([`Metrics::measure`]).

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::runtime::controller::{Action, Controller};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::{ErrorBackoff, Metrics};
use crate::error::Error;

/// Requeue after a write conflicted (409): soon, on fresh data.
pub const CONFLICT_REQUEUE: Duration = Duration::from_millis(100);
/// Requeue after the object vanished during the pass (404), where the controller rechecks
/// such objects ([`Reconciler::RECHECK_VANISHED`]).
pub const VANISHED_REQUEUE: Duration = Duration::from_millis(500);

/// What a controller tells [`run`] about itself.
pub trait Reconciler: Send + Sync + Sized + 'static {
    /// The kind it reconciles.
    type Object: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// Name in metrics (`controller` label) and logs.
    const CONTROLLER: &'static str;

    /// Debug message of a conflicted write.
    const CONFLICT_MESSAGE: &'static str = "write conflicted; retrying";

    /// Whether a 404 (the object, or one it was writing, deleted during the pass) is
    /// rechecked after [`VANISHED_REQUEUE`] with a debug log, rather than retried with
    /// backoff as a failure.
    const RECHECK_VANISHED: bool = false;

    /// The object's key in the backoff and the logs (default: its name).
    fn key(object: &Self::Object) -> String {
        object.name_any()
    }

    /// The span a pass over `object` runs in.
    fn span(object: &Self::Object) -> tracing::Span;

    /// One pass over `object`.
    fn reconcile(
        self: Arc<Self>,
        object: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Error>> + Send + 'static;

    /// Write `log` in the controller's module, with its field: implement it with
    /// `policy_log!`.
    fn log(log: Log<'_>);
}

/// What the error policy and the run loop log.
pub enum Log<'a> {
    /// A write of the pass over `key` conflicted: retried after [`CONFLICT_REQUEUE`].
    Conflict { key: &'a str },
    /// `key` vanished during the pass: rechecked after [`VANISHED_REQUEUE`].
    Vanished { key: &'a str, error: &'a Error },
    /// The pass over `key` failed: retried after `delay`.
    Failed {
        key: &'a str,
        error: &'a Error,
        delay: Duration,
    },
    /// The controller's stream yielded an error (a failed reconcile, already handled by the
    /// policy, or a watch error).
    Stream { error: &'a dyn Display },
}

/// Implements [`Reconciler::log`] in a controller's `impl Reconciler`, with the object's key
/// as field `$field` (the controller's name) and the controller's module as target.
macro_rules! policy_log {
    ($field:ident) => {
        fn log(log: $crate::runner::Log<'_>) {
            match log {
                $crate::runner::Log::Conflict { key } => {
                    tracing::debug!($field = %key, "{}", Self::CONFLICT_MESSAGE);
                }
                $crate::runner::Log::Vanished { key, error } => {
                    tracing::debug!($field = %key, %error, "object vanished during reconcile; rechecking");
                }
                $crate::runner::Log::Failed { key, error, delay } => {
                    tracing::warn!($field = %key, %error, retry_in_ms = delay.as_millis() as u64, "{} reconcile failed", Self::CONTROLLER);
                }
                $crate::runner::Log::Stream { error } => {
                    tracing::debug!(controller = Self::CONTROLLER, %error, "reconcile failed");
                }
            }
        }
    };
}
pub(crate) use policy_log;

/// When a failed pass is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// A write conflicted: after [`CONFLICT_REQUEUE`].
    Conflict,
    /// The object vanished: after [`VANISHED_REQUEUE`].
    Vanished,
    /// After the object's next backoff delay.
    Backoff(Duration),
}

impl Retry {
    /// The requeue this retry asks of the controller.
    pub fn action(self) -> Action {
        Action::requeue(match self {
            Retry::Conflict => CONFLICT_REQUEUE,
            Retry::Vanished => VANISHED_REQUEUE,
            Retry::Backoff(delay) => delay,
        })
    }
}

/// The retry of a pass over `key` that failed with `error`; only [`Retry::Backoff`] counts a
/// failure in `backoff`.
pub fn retry(error: &Error, recheck_vanished: bool, backoff: &ErrorBackoff, key: &str) -> Retry {
    if error.is_conflict() {
        Retry::Conflict
    } else if recheck_vanished && error.is_not_found() {
        Retry::Vanished
    } else {
        Retry::Backoff(backoff.next(key))
    }
}

/// What [`run`] hands kube-runtime as the reconcile context.
struct Shared<R> {
    reconciler: Arc<R>,
    metrics: Arc<Metrics>,
    backoff: ErrorBackoff,
}

/// Run `controller` with `reconciler` until `shutdown` is cancelled (in-flight reconciles
/// finish), observing reconciles in `metrics`.
pub async fn run<R: Reconciler>(
    controller: Controller<R::Object>,
    reconciler: Arc<R>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let shared = Arc::new(Shared {
        reconciler,
        metrics,
        backoff: ErrorBackoff::default(),
    });
    controller
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile::<R>, error_policy::<R>, shared)
        .for_each(|result| async move {
            if let Err(error) = result {
                R::log(Log::Stream { error: &error });
            }
        })
        .await;
}

/// One pass, in the controller's span, measured; a success resets the object's backoff.
async fn reconcile<R: Reconciler>(
    object: Arc<R::Object>,
    shared: Arc<Shared<R>>,
) -> Result<Action, Error> {
    let key = R::key(&object);
    let span = R::span(&object);
    let pass = R::reconcile(Arc::clone(&shared.reconciler), object).instrument(span);
    let result = shared.metrics.measure(R::CONTROLLER, pass).await;
    if result.is_ok() {
        shared.backoff.reset(&key);
    }
    result
}

fn error_policy<R: Reconciler>(
    object: Arc<R::Object>,
    error: &Error,
    shared: Arc<Shared<R>>,
) -> Action {
    let key = R::key(&object);
    let retry = retry(error, R::RECHECK_VANISHED, &shared.backoff, &key);
    R::log(match retry {
        Retry::Conflict => Log::Conflict { key: &key },
        Retry::Vanished => Log::Vanished { key: &key, error },
        Retry::Backoff(delay) => Log::Failed {
            key: &key,
            error,
            delay,
        },
    });
    retry.action()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn api_error(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        })))
    }

    fn object(name: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    /// A controller whose passes return the queued outcomes.
    #[derive(Default)]
    struct Scripted {
        outcomes: Mutex<VecDeque<Result<Action, Error>>>,
    }

    impl Reconciler for Scripted {
        type Object = ConfigMap;
        const CONTROLLER: &'static str = "scripted";
        const RECHECK_VANISHED: bool = true;

        fn span(object: &ConfigMap) -> tracing::Span {
            tracing::info_span!("reconcile", controller = Self::CONTROLLER, name = %object.name_any())
        }

        async fn reconcile(self: Arc<Self>, _object: Arc<ConfigMap>) -> Result<Action, Error> {
            let next = self.outcomes.lock().unwrap().pop_front();
            next.unwrap_or_else(|| Ok(Action::await_change()))
        }

        policy_log!(scripted);
    }

    fn shared(outcomes: Vec<Result<Action, Error>>) -> Arc<Shared<Scripted>> {
        Arc::new(Shared {
            reconciler: Arc::new(Scripted {
                outcomes: Mutex::new(outcomes.into()),
            }),
            metrics: Arc::new(Metrics::default()),
            backoff: ErrorBackoff::default(),
        })
    }

    #[test]
    fn each_error_class_gets_its_retry() {
        let backoff = ErrorBackoff::default();
        assert_eq!(
            retry(&api_error(409), false, &backoff, "a"),
            Retry::Conflict
        );
        assert_eq!(retry(&api_error(409), true, &backoff, "a"), Retry::Conflict);
        assert_eq!(retry(&api_error(404), true, &backoff, "a"), Retry::Vanished);
        // Neither counted a failure: the first backoff is the base.
        let base = Duration::from_millis(500);
        assert_eq!(
            retry(&api_error(404), false, &backoff, "a"),
            Retry::Backoff(base)
        );
        assert_eq!(
            retry(&api_error(500), true, &backoff, "a"),
            Retry::Backoff(2 * base)
        );
        assert_eq!(
            retry(&Error::Invalid("x".into()), true, &backoff, "b"),
            Retry::Backoff(base)
        );

        assert_eq!(
            Retry::Conflict.action(),
            Action::requeue(Duration::from_millis(100))
        );
        assert_eq!(
            Retry::Vanished.action(),
            Action::requeue(Duration::from_millis(500))
        );
        assert_eq!(
            Retry::Backoff(Duration::from_secs(3)).action(),
            Action::requeue(Duration::from_secs(3))
        );
    }

    #[test]
    fn the_error_policy_backs_off_per_object_up_to_five_minutes() {
        let shared = shared(Vec::new());
        let failed = Error::Invalid("broken".into());
        let mut delays = Vec::new();
        for _ in 0..12 {
            delays.push(error_policy(object("a"), &failed, shared.clone()));
        }
        let ms = |ms| Action::requeue(Duration::from_millis(ms));
        assert_eq!(delays[..4], [ms(500), ms(1000), ms(2000), ms(4000)]);
        assert_eq!(delays[11], ms(300_000));
        // Another object has its own count; a conflict neither counts nor resets one.
        assert_eq!(error_policy(object("b"), &failed, shared.clone()), ms(500));
        assert_eq!(
            error_policy(object("b"), &api_error(409), shared.clone()),
            ms(100)
        );
        assert_eq!(error_policy(object("b"), &failed, shared.clone()), ms(1000));
    }

    #[tokio::test]
    async fn the_wrapper_counts_each_reconcile_under_its_controller_and_a_success_resets_the_backoff()
     {
        let requeue = Action::requeue(Duration::from_secs(7));
        let shared = shared(vec![
            Err(Error::Invalid("first".into())),
            Ok(requeue.clone()),
        ]);
        let failed = reconcile(object("a"), shared.clone()).await;
        let Err(error) = failed else {
            panic!("the first pass fails");
        };
        assert_eq!(
            error_policy(object("a"), &error, shared.clone()),
            Action::requeue(Duration::from_millis(500))
        );
        assert_eq!(
            error_policy(object("a"), &error, shared.clone()),
            Action::requeue(Duration::from_secs(1))
        );
        assert_eq!(
            reconcile(object("a"), shared.clone()).await.unwrap(),
            requeue
        );
        // The success reset the object's failures.
        assert_eq!(
            error_policy(object("a"), &error, shared.clone()),
            Action::requeue(Duration::from_millis(500))
        );
        let metrics = &shared.metrics;
        assert_eq!(metrics.reconciles("scripted", "success"), 1);
        assert_eq!(metrics.reconciles("scripted", "error"), 1);
    }
}
