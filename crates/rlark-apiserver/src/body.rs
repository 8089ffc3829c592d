//! Request bodies: size limit, media type, and decoding JSON or YAML into a JSON value.
//!
//! JSON is decoded by a small visitor instead of `serde_json::from_slice::<Value>` so that
//! duplicate keys are noticed (`fieldValidation=Strict` reports them, as kube-apiserver
//! does) instead of silently keeping the last one.

use std::fmt;

use axum::body::Body;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Kubernetes' protobuf media type.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// A decoded body plus the paths of keys that appeared twice in one JSON object
/// (`spec.foo`, `spec.tasks[0].name`).
#[derive(Debug)]
pub(crate) struct Decoded {
    pub value: Value,
    pub duplicates: Vec<String>,
}

/// Read the whole body, refusing more than `limit` bytes with 413 (checked against
/// `Content-Length` first, so an honest oversized request is refused before it is read).
pub(crate) async fn read(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::request_entity_too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::request_entity_too_large(limit))
        }
        Err(error) => Err(ApiError::bad_request(format!(
            "reading the request body failed: {error}"
        ))),
    }
}

/// The media type of `Content-Type` without parameters, lowercased; `application/json` when
/// absent (what kube-apiserver assumes for clients like curl).
pub(crate) fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "application/json".to_string())
}

/// Decode an object body sent as `application/json`, `application/yaml` or (for the
/// built-in kinds, as client-go's typed clients send them) `application/vnd.kubernetes.protobuf`;
/// 415 otherwise. Syntax errors are 400 and carry the parser's line and column; a body that
/// is not a JSON object is 400 too.
pub(crate) fn decode_object(bytes: &[u8], media_type: &str) -> Result<Decoded, ApiError> {
    let decoded = match media_type {
        "application/json" => decode_json(bytes)?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => decode_yaml(bytes)?,
        PROTOBUF => match crate::protobuf::decode(bytes) {
            Ok(value) => Decoded {
                value,
                duplicates: Vec::new(),
            },
            Err(error @ crate::protobuf::ProtobufError::UnsupportedKind(_)) => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    error.to_string(),
                ));
            }
            Err(error) => {
                return Err(ApiError::bad_request(format!(
                    "couldn't decode the request body: {error}"
                )));
            }
        },
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !decoded.value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(decoded)
}

/// Decode JSON, recording duplicate keys.
pub(crate) fn decode_json(bytes: &[u8]) -> Result<Decoded, ApiError> {
    let mut duplicates = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = PathSeed {
        path: String::new(),
        duplicates: &mut duplicates,
    }
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value))
    .map_err(|e| {
        ApiError::bad_request(format!(
            "couldn't decode the request body: json parse error: {e}"
        ))
    })?;
    Ok(Decoded { value, duplicates })
}

fn decode_yaml(bytes: &[u8]) -> Result<Decoded, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!("error converting YAML to JSON: invalid UTF-8: {e}"))
    })?;
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?;
    Ok(Decoded {
        value,
        duplicates: Vec::new(),
    })
}

/// Deserializes a [`Value`] while tracking the JSON path, so duplicate keys can be named.
struct PathSeed<'a> {
    path: String,
    duplicates: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for PathSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PathSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so `from_f64` only fails on input serde_json rejects.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, items.len());
            match seq.next_element_seed(PathSeed {
                path,
                duplicates: &mut *self.duplicates,
            })? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{}", self.path, key)
            };
            let value = map.next_value_seed(PathSeed {
                path: path.clone(),
                duplicates: &mut *self.duplicates,
            })?;
            if object.insert(key, value).is_some() {
                self.duplicates.push(path);
            }
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_with_duplicates_is_decoded_and_reported() {
        let decoded = decode_json(
            br#"{"a": 1, "spec": {"x": [{"n": 1, "n": 2}], "y": true, "y": false}, "a": 3}"#,
        )
        .unwrap();
        assert_eq!(
            decoded.value,
            json!({"a": 3, "spec": {"x": [{"n": 2}], "y": false}})
        );
        assert_eq!(decoded.duplicates, vec!["spec.x[0].n", "spec.y", "a"]);
    }

    #[test]
    fn numbers_keep_their_kind() {
        let decoded =
            decode_json(br#"{"i": -3, "u": 18446744073709551615, "f": 1.5, "n": null}"#).unwrap();
        assert!(decoded.value["i"].is_i64());
        assert!(decoded.value["u"].is_u64());
        assert!(decoded.value["f"].is_f64());
        assert!(decoded.value["n"].is_null());
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let error = decode_object(b"{\n  \"a\": }", "application/json").unwrap_err();
        assert_eq!(error.code, 400);
        assert!(error.message.contains("line 2 column"), "{}", error.message);
        let error = decode_object(b"{} trailing", "application/json").unwrap_err();
        assert_eq!(error.code, 400);
    }

    #[test]
    fn yaml_bodies() {
        let decoded =
            decode_object(b"kind: Job\nspec:\n  tasks: []\n", "application/yaml").unwrap();
        assert_eq!(decoded.value, json!({"kind": "Job", "spec": {"tasks": []}}));
        let error = decode_object(b"kind: Job\n  spec: [\n", "application/yaml").unwrap_err();
        assert_eq!(error.code, 400);
        assert!(
            error.message.starts_with("error converting YAML to JSON"),
            "{}",
            error.message
        );
        assert!(error.message.contains("line"), "{}", error.message);
    }

    #[test]
    fn non_objects_and_unknown_media_types_are_refused() {
        assert_eq!(
            decode_object(b"[1]", "application/json").unwrap_err().code,
            400
        );
        assert_eq!(
            decode_object(b"{}", "application/cbor").unwrap_err().code,
            415
        );
        assert_eq!(
            decode_object(b"{}", PROTOBUF).unwrap_err().code,
            400,
            "no k8s envelope"
        );
    }

    #[test]
    fn media_type_strips_parameters() {
        let mut headers = HeaderMap::new();
        assert_eq!(media_type(&headers), "application/json");
        headers.insert(
            http::header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(media_type(&headers), "application/json");
    }

    #[tokio::test]
    async fn size_limit_is_413() {
        let headers = HeaderMap::new();
        let error = read(Body::from(vec![b' '; 11]), &headers, 10)
            .await
            .unwrap_err();
        assert_eq!(error.code, 413);
        let mut declared = HeaderMap::new();
        declared.insert(http::header::CONTENT_LENGTH, "11".parse().unwrap());
        assert_eq!(
            read(Body::empty(), &declared, 10).await.unwrap_err().code,
            413
        );
        assert_eq!(
            read(Body::from("0123456789"), &headers, 10)
                .await
                .unwrap()
                .len(),
            10
        );
    }
}
