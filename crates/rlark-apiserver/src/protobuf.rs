//! Decoding of Kubernetes' protobuf request bodies for the built-in kinds we serve.
//!
//! client-go's typed clients (and so `kubectl create namespace`) send built-in objects as
//! `application/vnd.kubernetes.protobuf` and never fall back to JSON when the server refuses
//! it, so the server must read them. We decode exactly the messages of `Namespace` and
//! `Lease` into the same JSON a client would have sent; responses stay JSON, which those
//! clients accept (`Accept: application/vnd.kubernetes.protobuf,application/json`).
//!
//! Wire format: the 4-byte magic `k8s\0`, then a `runtime.Unknown` message
//! { typeMeta = 1 { apiVersion = 1, kind = 2 }, raw = 2, contentEncoding = 3, contentType = 4 }
//! whose `raw` is the object's own message. Field numbers follow the `generated.proto`
//! files of k8s.io/api and k8s.io/apimachinery. Input is untrusted: every length is checked
//! against the remaining bytes and nesting is bounded by the fixed message shapes.

use serde_json::{Map, Value, json};

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    #[error("missing the k8s protobuf envelope prefix")]
    NoMagic,
    #[error("truncated protobuf message")]
    Truncated,
    #[error("malformed varint")]
    BadVarint,
    #[error("unsupported protobuf wire type {0}")]
    WireType(u64),
    #[error("invalid UTF-8 in field {0}")]
    Utf8(&'static str),
    #[error("protobuf is only accepted for built-in kinds (Namespace, Lease), not {0:?}")]
    UnsupportedKind(String),
}

const MAGIC: &[u8] = b"k8s\x00";

/// One decoded field: number and value.
enum Field<'a> {
    Varint(u64, u64),
    Bytes(u64, &'a [u8]),
}

/// A checked reader over one message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.buf.split_first().ok_or(ProtobufError::Truncated)?;
            self.buf = rest;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProtobufError::BadVarint)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtobufError> {
        if n > self.buf.len() {
            return Err(ProtobufError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<Field<'a>>, ProtobufError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        match key & 7 {
            0 => Ok(Some(Field::Varint(number, self.varint()?))),
            1 => self.take(8).map(|_| Some(Field::Varint(number, 0))),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Truncated)?;
                Ok(Some(Field::Bytes(number, self.take(len)?)))
            }
            5 => self.take(4).map(|_| Some(Field::Varint(number, 0))),
            other => Err(ProtobufError::WireType(other)),
        }
    }
}

fn string(bytes: &[u8], field: &'static str) -> Result<Value, ProtobufError> {
    std::str::from_utf8(bytes)
        .map(|s| Value::String(s.to_string()))
        .map_err(|_| ProtobufError::Utf8(field))
}

/// Decode a `k8s\0`-enveloped body into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    let mut reader = Reader::new(rest);
    while let Some(field) = reader.next()? {
        match field {
            Field::Bytes(1, type_meta) => {
                let mut tm = Reader::new(type_meta);
                while let Some(f) = tm.next()? {
                    match f {
                        Field::Bytes(1, b) => api_version = str_of(b, "typeMeta.apiVersion")?,
                        Field::Bytes(2, b) => kind = str_of(b, "typeMeta.kind")?,
                        _ => {}
                    }
                }
            }
            Field::Bytes(2, bytes) => raw = bytes,
            _ => {}
        }
    }
    let mut object = match kind.as_str() {
        "Namespace" => namespace(raw)?,
        "Lease" => lease(raw)?,
        _ => return Err(ProtobufError::UnsupportedKind(kind)),
    };
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(object))
}

fn str_of(bytes: &[u8], field: &'static str) -> Result<String, ProtobufError> {
    std::str::from_utf8(bytes)
        .map(str::to_string)
        .map_err(|_| ProtobufError::Utf8(field))
}

fn namespace(raw: &[u8]) -> Result<Map<String, Value>, ProtobufError> {
    let mut object = Map::new();
    let mut reader = Reader::new(raw);
    while let Some(field) = reader.next()? {
        match field {
            Field::Bytes(1, b) => {
                object.insert("metadata".into(), object_meta(b)?);
            }
            Field::Bytes(2, b) => {
                let mut finalizers = Vec::new();
                let mut spec = Reader::new(b);
                while let Some(f) = spec.next()? {
                    if let Field::Bytes(1, s) = f {
                        finalizers.push(string(s, "spec.finalizers")?);
                    }
                }
                let spec = if finalizers.is_empty() {
                    json!({})
                } else {
                    json!({"finalizers": finalizers})
                };
                object.insert("spec".into(), spec);
            }
            // Status is ignored on create/update of the main resource anyway.
            _ => {}
        }
    }
    Ok(object)
}

fn lease(raw: &[u8]) -> Result<Map<String, Value>, ProtobufError> {
    let mut object = Map::new();
    let mut reader = Reader::new(raw);
    while let Some(field) = reader.next()? {
        match field {
            Field::Bytes(1, b) => {
                object.insert("metadata".into(), object_meta(b)?);
            }
            Field::Bytes(2, b) => {
                let mut spec = Map::new();
                let mut r = Reader::new(b);
                while let Some(f) = r.next()? {
                    match f {
                        Field::Bytes(1, s) => {
                            spec.insert("holderIdentity".into(), string(s, "spec.holderIdentity")?);
                        }
                        Field::Varint(2, v) => {
                            spec.insert("leaseDurationSeconds".into(), json!(v as i32));
                        }
                        Field::Bytes(3, t) => {
                            spec.insert("acquireTime".into(), time(t, true)?);
                        }
                        Field::Bytes(4, t) => {
                            spec.insert("renewTime".into(), time(t, true)?);
                        }
                        Field::Varint(5, v) => {
                            spec.insert("leaseTransitions".into(), json!(v as i32));
                        }
                        Field::Bytes(6, s) => {
                            spec.insert("strategy".into(), string(s, "spec.strategy")?);
                        }
                        Field::Bytes(7, s) => {
                            spec.insert(
                                "preferredHolder".into(),
                                string(s, "spec.preferredHolder")?,
                            );
                        }
                        _ => {}
                    }
                }
                object.insert("spec".into(), Value::Object(spec));
            }
            _ => {}
        }
    }
    Ok(object)
}

/// `meta.v1.Time` / `MicroTime` { seconds = 1, nanos = 2 } as RFC 3339.
fn time(bytes: &[u8], micro: bool) -> Result<Value, ProtobufError> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next()? {
        match f {
            Field::Varint(1, v) => seconds = v as i64,
            Field::Varint(2, v) => nanos = i64::from(v as i32),
            _ => {}
        }
    }
    let at = chrono::DateTime::from_timestamp(seconds, u32::try_from(nanos).unwrap_or(0))
        .unwrap_or_default();
    let format = if micro {
        "%Y-%m-%dT%H:%M:%S%.6fZ"
    } else {
        "%Y-%m-%dT%H:%M:%SZ"
    };
    Ok(Value::String(at.format(format).to_string()))
}

fn object_meta(bytes: &[u8]) -> Result<Value, ProtobufError> {
    let mut meta = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    let mut owners = Vec::new();
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next()? {
        match f {
            Field::Bytes(1, s) => {
                meta.insert("name".into(), string(s, "metadata.name")?);
            }
            Field::Bytes(2, s) => {
                meta.insert("generateName".into(), string(s, "metadata.generateName")?);
            }
            Field::Bytes(3, s) => {
                meta.insert("namespace".into(), string(s, "metadata.namespace")?);
            }
            Field::Bytes(5, s) => {
                meta.insert("uid".into(), string(s, "metadata.uid")?);
            }
            Field::Bytes(6, s) => {
                meta.insert(
                    "resourceVersion".into(),
                    string(s, "metadata.resourceVersion")?,
                );
            }
            Field::Bytes(11, entry) => {
                let (k, v) = map_entry(entry, "metadata.labels")?;
                labels.insert(k, v);
            }
            Field::Bytes(12, entry) => {
                let (k, v) = map_entry(entry, "metadata.annotations")?;
                annotations.insert(k, v);
            }
            Field::Bytes(13, owner) => owners.push(owner_reference(owner)?),
            Field::Bytes(14, s) => finalizers.push(string(s, "metadata.finalizers")?),
            // Server-owned (generation, timestamps, managedFields) or unused fields.
            _ => {}
        }
    }
    // Empty strings are proto3 defaults, not values the client meant.
    meta.retain(|_, v| v.as_str() != Some(""));
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    if !owners.is_empty() {
        meta.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !finalizers.is_empty() {
        meta.insert("finalizers".into(), Value::Array(finalizers));
    }
    Ok(Value::Object(meta))
}

fn map_entry(bytes: &[u8], field: &'static str) -> Result<(String, Value), ProtobufError> {
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next()? {
        match f {
            Field::Bytes(1, b) => key = str_of(b, field)?,
            Field::Bytes(2, b) => value = string(b, field)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn owner_reference(bytes: &[u8]) -> Result<Value, ProtobufError> {
    let mut owner = Map::new();
    let mut r = Reader::new(bytes);
    while let Some(f) = r.next()? {
        match f {
            Field::Bytes(1, s) => {
                owner.insert("kind".into(), string(s, "ownerReferences.kind")?);
            }
            Field::Bytes(3, s) => {
                owner.insert("name".into(), string(s, "ownerReferences.name")?);
            }
            Field::Bytes(4, s) => {
                owner.insert("uid".into(), string(s, "ownerReferences.uid")?);
            }
            Field::Bytes(5, s) => {
                owner.insert(
                    "apiVersion".into(),
                    string(s, "ownerReferences.apiVersion")?,
                );
            }
            Field::Varint(6, v) => {
                owner.insert("controller".into(), Value::Bool(v != 0));
            }
            Field::Varint(7, v) => {
                owner.insert("blockOwnerDeletion".into(), Value::Bool(v != 0));
            }
            _ => {}
        }
    }
    Ok(Value::Object(owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn bytes_field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    fn varint_field(number: u64, value: u64, out: &mut Vec<u8>) {
        varint(number << 3, out);
        varint(value, out);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut type_meta = Vec::new();
        bytes_field(1, api_version.as_bytes(), &mut type_meta);
        bytes_field(2, kind.as_bytes(), &mut type_meta);
        let mut unknown = Vec::new();
        bytes_field(1, &type_meta, &mut unknown);
        bytes_field(2, raw, &mut unknown);
        bytes_field(4, b"application/vnd.kubernetes.protobuf", &mut unknown);
        let mut body = MAGIC.to_vec();
        body.extend(unknown);
        body
    }

    #[test]
    fn decodes_a_namespace_like_kubectl_create_namespace() {
        let mut label = Vec::new();
        bytes_field(1, b"team", &mut label);
        bytes_field(2, b"rl", &mut label);
        let mut meta = Vec::new();
        bytes_field(1, b"rlark-edge", &mut meta);
        bytes_field(11, &label, &mut meta);
        let mut spec = Vec::new();
        bytes_field(1, b"kubernetes", &mut spec);
        let mut ns = Vec::new();
        bytes_field(1, &meta, &mut ns);
        bytes_field(2, &spec, &mut ns);
        bytes_field(3, &[], &mut ns);
        let value = decode(&envelope("v1", "Namespace", &ns)).expect("decodes");
        assert_eq!(
            value,
            json!({
                "metadata": {"name": "rlark-edge", "labels": {"team": "rl"}},
                "spec": {"finalizers": ["kubernetes"]},
                "apiVersion": "v1",
                "kind": "Namespace"
            })
        );
    }

    #[test]
    fn decodes_a_lease() {
        let mut meta = Vec::new();
        bytes_field(1, b"node-a", &mut meta);
        bytes_field(3, b"rlark-edge", &mut meta);
        let mut renew = Vec::new();
        varint_field(1, 1_700_000_000, &mut renew);
        varint_field(2, 123_000, &mut renew);
        let mut spec = Vec::new();
        bytes_field(1, b"agent-1", &mut spec);
        varint_field(2, 40, &mut spec);
        bytes_field(4, &renew, &mut spec);
        let mut lease = Vec::new();
        bytes_field(1, &meta, &mut lease);
        bytes_field(2, &spec, &mut lease);
        let value = decode(&envelope("coordination.k8s.io/v1", "Lease", &lease)).expect("decodes");
        assert_eq!(value["spec"]["holderIdentity"], "agent-1");
        assert_eq!(value["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(value["spec"]["renewTime"], "2023-11-14T22:13:20.000123Z");
        assert_eq!(value["metadata"]["namespace"], "rlark-edge");
    }

    #[test]
    fn refuses_bad_input_without_panicking() {
        assert_eq!(decode(b"{}"), Err(ProtobufError::NoMagic));
        let mut truncated = MAGIC.to_vec();
        truncated.extend([0x0a, 0x50, 0x01]);
        assert_eq!(decode(&truncated), Err(ProtobufError::Truncated));
        let mut bad_varint = MAGIC.to_vec();
        bad_varint.extend([0x08; 1]);
        bad_varint.extend([0xff; 11]);
        assert_eq!(decode(&bad_varint), Err(ProtobufError::BadVarint));
        let job = envelope("rlinf.io/v1alpha1", "Job", &[]);
        assert!(matches!(decode(&job), Err(ProtobufError::UnsupportedKind(k)) if k == "Job"));
        // Every prefix of a valid body is refused or decoded, never a panic.
        let body = envelope("v1", "Namespace", &[0x0a, 0x03, 0x0a, 0x01, b'x']);
        for n in 0..body.len() {
            let _ = decode(&body[..n]);
        }
    }
}
