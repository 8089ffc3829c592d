//! `GET /api/v1/certificates/agent`: RLark's list of agent certificates, from rlark's
//! certificate records (`/rlark/v1/certificates`, admins only, as the caller).
//!
//! RLark's gateway lists the per-cluster Secrets it keeps (an agent's certificate and key,
//! signed for an admin to install by hand). rlark keeps no agent key: an agent joins with a
//! token and holds its own key, so this lists each cluster's live agent certificates
//! instead, one item per cluster: `cluster_id`, `created_at` (the newest certificate's
//! `notBefore`), `server_addr` (empty: rlark does not know the address agents dial when a
//! proxy is in front; `rlark token create --cluster-id ID` prints the join command), and
//! rlark's own `serials`, `expires_at`. Signing (`POST`) and fetching one cluster's
//! certificate and key (`GET .../{cluster_id}`) stay 501 ([`super::unsupported`]).

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use http::Method;
use serde_json::{Value, json};

use super::Gateway;
use super::error::GatewayError;
use super::forward::Caller;

/// The route.
pub(crate) async fn list(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Json<Value>, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let answer = gateway
        .backend
        .json(
            &caller,
            Method::GET,
            "/rlark/v1/certificates",
            None,
            Body::empty(),
        )
        .await?;
    Ok(Json(agent_items(&answer.body)))
}

/// One item per cluster with a live (unrevoked) agent certificate, by cluster ID.
pub(crate) fn agent_items(records: &Value) -> Value {
    let mut clusters: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for record in records["items"].as_array().into_iter().flatten() {
        let live = record["role"] == "agent" && record["revokedAt"].is_null();
        if let (true, Some(cluster)) = (live, record["clusterId"].as_str()) {
            clusters
                .entry(cluster.to_string())
                .or_default()
                .push(record);
        }
    }
    let items: Vec<Value> = clusters
        .into_iter()
        .map(|(cluster, mut records)| {
            records.sort_by_key(|r| r["notBefore"].as_str().unwrap_or_default().to_string());
            let newest = records.last().copied().unwrap_or(&Value::Null);
            json!({
                "cluster_id": cluster,
                "created_at": newest["notBefore"],
                "expires_at": newest["notAfter"],
                "server_addr": "",
                "serials": records.iter().map(|r| r["serial"].clone()).collect::<Vec<_>>(),
            })
        })
        .collect();
    Value::Array(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_agent_certificates_become_one_item_per_cluster() {
        let records = json!({"items": [
            {"serial": "a1", "role": "agent", "clusterId": "edge", "notBefore": "2026-01-01T00:00:00Z", "notAfter": "2026-04-01T00:00:00Z"},
            {"serial": "a2", "role": "agent", "clusterId": "edge", "notBefore": "2026-03-01T00:00:00Z", "notAfter": "2026-06-01T00:00:00Z"},
            {"serial": "a3", "role": "agent", "clusterId": "cloud", "notBefore": "2026-02-01T00:00:00Z", "notAfter": "2026-05-01T00:00:00Z", "revokedAt": "2026-02-02T00:00:00Z"},
            {"serial": "u1", "role": "admin", "notBefore": "2026-01-01T00:00:00Z", "notAfter": "2027-01-01T00:00:00Z"},
        ]});
        assert_eq!(
            agent_items(&records),
            json!([{"cluster_id": "edge", "created_at": "2026-03-01T00:00:00Z",
                    "expires_at": "2026-06-01T00:00:00Z", "server_addr": "",
                    "serials": ["a1", "a2"]}])
        );
        assert_eq!(agent_items(&json!({})), json!([]));
    }
}
