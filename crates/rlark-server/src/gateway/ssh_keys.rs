//! `/api/v1/ssh-user-keys`: RLark's SSH user keys onto rlark's (`/rlark/v1/sshkeys`,
//! docs/ssh.md), as the caller.
//!
//! | RLark | rlark |
//! |---|---|
//! | `GET [?user=U]` → `[{index, user, public_key, added_at, notes}]` | `GET /rlark/v1/sshkeys[?user=U]` (a user sees its own keys, an admin everyone's); `index` counts each user's keys in registration order; `id` and `fingerprint` are added |
//! | `POST {user, public_key, notes}` | `POST /rlark/v1/sshkeys {publicKey}` for the caller: `user` must be the caller (rlark registers a key for who registers it); `notes` becomes the key's comment when the line has none |
//! | `DELETE /{index}?user=U` | the `index`-th key of `U` (as listed), `DELETE /rlark/v1/sshkeys/{id}` (the owner or an admin) |

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use rlark_api::agent::local::{percent_decode, percent_encode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Gateway;
use super::error::GatewayError;
use super::forward::Caller;

const KEYS: &str = "/rlark/v1/sshkeys";
/// Largest request body.
const MAX_BODY: usize = 64 * 1024;

fn user_param(request: &Request) -> Option<String> {
    request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("user="))
        .and_then(|u| percent_decode(u).ok())
        .filter(|u| !u.is_empty())
}

/// rlark's key records as RLark's items: per user in registration order, indexed.
fn rlark_items(mut records: Vec<Value>) -> Vec<Value> {
    let field = |r: &Value, name: &str| r[name].as_str().unwrap_or_default().to_string();
    records.sort_by_key(|r| (field(r, "user"), field(r, "createdAt"), field(r, "id")));
    let mut items = Vec::with_capacity(records.len());
    let mut index = 0;
    let mut previous: Option<String> = None;
    for record in &records {
        let user = field(record, "user");
        if previous.as_deref() != Some(user.as_str()) {
            index = 0;
            previous = Some(user.clone());
        }
        let mut line = field(record, "publicKey");
        let comment = field(record, "comment");
        if !comment.is_empty() {
            line = format!("{line} {comment}");
        }
        items.push(json!({
            "index": index,
            "user": user,
            "public_key": line,
            "added_at": field(record, "createdAt"),
            "notes": comment,
            "id": field(record, "id"),
            "fingerprint": field(record, "fingerprint"),
        }));
        index += 1;
    }
    items
}

impl Gateway {
    async fn key_items(
        &self,
        caller: &Caller,
        user: Option<&str>,
    ) -> Result<Vec<Value>, GatewayError> {
        let uri = match user {
            Some(user) => format!("{KEYS}?user={}", percent_encode(user)),
            None => KEYS.to_string(),
        };
        let list = self.backend.get(caller, &uri).await?;
        let records = list["items"].as_array().cloned().unwrap_or_default();
        Ok(rlark_items(records))
    }
}

/// `GET /api/v1/ssh-user-keys[?user=U]`.
pub(crate) async fn list(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let items = gateway
        .key_items(&caller, user_param(&request).as_deref())
        .await?;
    Ok(axum::Json(items).into_response())
}

#[derive(Deserialize)]
struct AddBody {
    #[serde(default)]
    user: String,
    #[serde(default)]
    public_key: String,
    #[serde(default)]
    notes: String,
}

/// `POST /api/v1/ssh-user-keys`.
pub(crate) async fn add(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY)
        .await
        .map_err(|_| GatewayError::BadRequest(format!("body is larger than {MAX_BODY} bytes")))?;
    let body: AddBody = serde_json::from_slice(&bytes).map_err(|e| {
        GatewayError::BadRequest(format!(
            "the body is not {{\"user\", \"public_key\", \"notes\"}}: {e}"
        ))
    })?;
    let user = body.user.trim();
    if user.is_empty() || body.public_key.trim().is_empty() {
        return Err(GatewayError::BadRequest(
            "user and public_key are required".to_string(),
        ));
    }
    if user != caller.identity.user {
        return Err(GatewayError::Forbidden(format!(
            "rlark registers an SSH key for the user who registers it: you are {:?}, not \
             {user:?} (log in as {user:?} to register its keys)",
            caller.identity.user
        )));
    }
    let mut line = body.public_key.trim().to_string();
    let notes = body.notes.trim();
    if !notes.is_empty() && line.split_whitespace().count() == 2 {
        line = format!("{line} {notes}");
    }
    let answer = gateway
        .backend
        .json(
            &caller,
            Method::POST,
            KEYS,
            Some("application/json"),
            Body::from(json!({"publicKey": line}).to_string()),
        )
        .await?;
    let created = rlark_items(vec![answer.body.clone()]);
    let id = answer.body["id"].as_str().unwrap_or_default();
    // Its index among the user's keys.
    let items = gateway.key_items(&caller, Some(user)).await?;
    let item = items
        .into_iter()
        .find(|i| i["id"] == id)
        .or_else(|| created.into_iter().next())
        .unwrap_or(Value::Null);
    Ok((StatusCode::CREATED, axum::Json(item)).into_response())
}

/// `DELETE /api/v1/ssh-user-keys/{index}?user=U`.
pub(crate) async fn remove(
    State(gateway): State<Gateway>,
    Path(index): Path<String>,
    request: Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let index: usize = index.parse().map_err(|_| {
        GatewayError::BadRequest(format!(
            "{index:?} is not a key index (a number, as GET /api/v1/ssh-user-keys lists)"
        ))
    })?;
    let user = user_param(&request).unwrap_or_else(|| caller.identity.user.clone());
    let items = gateway.key_items(&caller, Some(&user)).await?;
    let Some(item) = items.iter().find(|i| i["index"] == index) else {
        return Err(GatewayError::NotFound(format!(
            "user {user:?} has no SSH key #{index} ({} registered)",
            items.len()
        )));
    };
    let id = item["id"].as_str().unwrap_or_default();
    gateway
        .backend
        .pass(
            &caller,
            Method::DELETE,
            &format!("{KEYS}/{}", percent_encode(id)),
            None,
            Body::empty(),
        )
        .await?;
    Ok(axum::Json(json!({"message": "deleted"})).into_response())
}
