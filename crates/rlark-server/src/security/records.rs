//! The security state the server persists in the store: issued certificates, revocations,
//! bootstrap tokens and bearer tokens. These live under resource names the API registry does
//! not serve (`*.security.rlark.io`), so no API client — not even an admin through the
//! Kubernetes API — can read them; the admin-only `/rlark/v1/...` routes expose what is safe
//! (never a token secret or its hash). Keeping them in the store (rather than files) makes
//! them survive restarts and, with a shared store, reach every replica.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Store resource of issued-certificate records (name = serial hex).
pub(crate) const CERTIFICATES: &str = "certificates.security.rlark.io";
/// Store resource of revocations (name = `serial-<hex>`).
pub(crate) const REVOCATIONS: &str = "revocations.security.rlark.io";
/// Store resource of bootstrap tokens (name = token id).
pub(crate) const BOOTSTRAP_TOKENS: &str = "bootstraptokens.security.rlark.io";
/// Store resource of bearer tokens (name = token id).
pub(crate) const BEARER_TOKENS: &str = "bearertokens.security.rlark.io";
/// Store resource of the clusters that joined (name = cluster ID): made by the first join,
/// atomically, so two joins cannot both create one cluster's identity.
pub(crate) const CLUSTERS: &str = "clusters.security.rlark.io";

/// One certificate this installation issued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRecord {
    pub serial: String,
    /// Subject CN.
    pub user: String,
    /// Subject O values.
    pub groups: Vec<String>,
    /// `admin`, `agent`, `peer`, `viewer`.
    pub role: String,
    /// For agent certificates: the cluster ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Issuer CN.
    pub issuer: String,
    /// RFC 3339.
    pub not_before: String,
    /// RFC 3339.
    pub not_after: String,
    /// `sha256:` of the certificate's public key.
    pub key_hash: String,
    /// Who asked: `join`, `renew`, `startup`, or the admin user's name.
    pub issued_by: String,
    /// For renewals: the serial of the certificate the renewal was authenticated with.
    /// Revoking that serial revokes this certificate too. Absent for certificates renewed
    /// before rlark recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_from: Option<String>,
    /// Set once revoked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// A revoked certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevocationRecord {
    pub serial: String,
    /// Subject CN of the revoked certificate, when known.
    #[serde(default)]
    pub user: String,
    pub reason: String,
    pub revoked_by: String,
    /// RFC 3339.
    pub revoked_at: String,
}

/// A bootstrap token (agent join). Only the hash of the secret is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapTokenRecord {
    pub id: String,
    pub secret_hash: String,
    /// RFC 3339.
    pub expires_at: String,
    /// The one cluster that may join with the token. Always set on tokens made now; `None`
    /// only on tokens an earlier version made, which are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Cluster IDs that joined with it (each at most once).
    #[serde(default)]
    pub used_by: Vec<String>,
    pub created_by: String,
    /// Made by the admin to give a cluster that joined before (or was revoked) a new
    /// identity (`rlark token create --rejoin`); without it such a join is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rejoin: bool,
}

/// A cluster that joined: the first join (or rejoin) of its ID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// RFC 3339.
    pub joined_at: String,
    /// The bootstrap token it last joined with.
    pub token_id: String,
}

/// A bearer token of a user or of a running task. Only the hash of the secret is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BearerTokenRecord {
    pub id: String,
    pub secret_hash: String,
    pub user: String,
    pub groups: Vec<String>,
    /// RFC 3339; `None` = valid until revoked (task tokens: while the task runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// For task tokens: the task it is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskBinding>,
    pub created_by: String,
    /// Set once revoked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// The one run of one Task a task token is valid for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskBinding {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Wrap a record as a store object named `name`.
pub(crate) fn to_object<T: Serialize>(name: &str, record: &T) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": serde_json::to_value(record).unwrap_or(Value::Null),
    })
}

/// Read a record back from a store object; `None` when it does not have the expected shape
/// (logged by the caller).
pub(crate) fn from_object<T: for<'de> Deserialize<'de>>(object: &Value) -> Option<T> {
    serde_json::from_value(object.get("spec")?.clone()).ok()
}

/// `resourceVersion` of a stored object (for optimistic updates).
pub(crate) fn revision_of(object: &Value) -> Option<u64> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok())
}
