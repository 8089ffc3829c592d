//! RLark gateway routes for features rlark does not have: each answers 501 with a JSON
//! error naming the feature (`{"error", "feature", "reason": "NotProvided"}`), never a
//! made-up success. Authentication still applies (401 first), so the answer tells a
//! logged-in console what is missing, not anyone what exists.

use axum::Router;
use axum::extract::Request;
use axum::routing::any;

use super::error::GatewayError;
use super::forward::Caller;

/// A RLark feature rlark does not provide: its routes and why.
struct Feature {
    name: &'static str,
    routes: &'static [&'static str],
    why: &'static str,
}

const FEATURES: &[Feature] = &[
    Feature {
        name: "storage classes",
        routes: &["/api/v1/storage/{*rest}"],
        why: "rlark has no object-storage integration; tasks reach storage themselves",
    },
    Feature {
        name: "image registries",
        routes: &[
            "/api/v1/image-registries",
            "/api/v1/image-registries/{*rest}",
        ],
        why: "rlark keeps no registry credentials; agents pull with their host's own",
    },
    Feature {
        name: "system config",
        routes: &["/api/v1/system-config"],
        why: "rlark is configured by its command line and config file (docs/operations.md)",
    },
    Feature {
        name: "addons",
        routes: &[
            "/api/v1/addons",
            "/api/v1/addons/{*rest}",
            "/api/v1/installed-addons",
            "/api/v1/clusters/{cluster_id}/addons",
            "/api/v1/clusters/{cluster_id}/addons/{*rest}",
        ],
        why: "rlark installs nothing into member clusters",
    },
    CERTIFICATES,
    Feature {
        name: "job metrics",
        routes: &["/api/v1/rlinf.io/v1alpha1/jobs/{name}/metrics"],
        why: "RLark's own gateway does not implement it either; rlark's task reports are at \
              /rlark/v1/reports (docs/api.md)",
    },
    Feature {
        name: "the TensorBoard proxy of the gateway",
        routes: &["/api/v1/rlinf.io/v1alpha1/tasks/{name}/tensorboard/{*path}"],
        why: "a task's TensorBoard is reached through rlark's task proxy (docs/ssh.md)",
    },
];

/// Agent certificates signed (with their key) by the gateway. `GET
/// /api/v1/certificates/agent` is served ([`super::certificates`]); every other method of it
/// answers 501 through [`certificates`].
const CERTIFICATES: Feature = Feature {
    name: "agent certificates issued by the gateway",
    routes: &["/api/v1/certificates/{*rest}"],
    why: "rlark never hands out an agent's private key: an agent joins with a join token \
          (`rlark token create --cluster-id ID`, then `rlark join`) and keeps its own key \
          (docs/security.md); GET /api/v1/certificates/agent lists the clusters' agent \
          certificates, and admins revoke them with `rlark cert revoke`",
};

/// Any method but GET on `/api/v1/certificates/agent`: 501 ([`CERTIFICATES`]).
pub(crate) async fn certificates(request: Request) -> Result<(), GatewayError> {
    Caller::of(request.extensions())?;
    Err(GatewayError::NotProvided {
        feature: CERTIFICATES.name,
        why: CERTIFICATES.why,
    })
}

/// Every route of [`FEATURES`], answering 501 to any method.
pub(crate) fn router() -> Router {
    let mut router = Router::new();
    for feature in FEATURES {
        let (name, why) = (feature.name, feature.why);
        for route in feature.routes {
            router = router.route(
                route,
                any(move |request: Request| async move {
                    Caller::of(request.extensions())?;
                    Err::<(), _>(GatewayError::NotProvided { feature: name, why })
                }),
            );
        }
    }
    router
}

/// The path prefixes of [`FEATURES`] (for the gateway's session layer).
pub(crate) fn prefixes() -> impl Iterator<Item = &'static str> {
    FEATURES
        .iter()
        .flat_map(|f| f.routes.iter())
        .filter_map(|r| {
            let prefix = r.split("/{").next()?;
            (!prefix.contains("rlinf.io") && !prefix.starts_with("/api/v1/clusters"))
                .then_some(prefix)
        })
}
