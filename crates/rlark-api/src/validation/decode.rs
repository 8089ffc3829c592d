//! Decoding a JSON object into its typed struct, a failure reported as one [`FieldError`] at
//! the Kubernetes-style path where it failed.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::FieldError;
use crate::types::TaskSpec;

pub(super) fn decode_then<T: DeserializeOwned>(
    object: &Value,
    check: fn(&T) -> Vec<FieldError>,
) -> Vec<FieldError> {
    match decode::<T>(object) {
        Ok(typed) => check(&typed),
        Err(error) => vec![error],
    }
}

/// Decodes `object`, turning a serde failure into one [`FieldError`] at its path.
pub fn decode<T: DeserializeOwned>(object: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(object).map_err(|err| {
        let mut segments = path_segments(err.path());
        let mut message = err.into_inner().to_string();
        // A Job task template flattens a TaskSpec, and serde loses the path inside a
        // flattened struct: decode that element as a TaskSpec again to find it.
        if let Some(element) = flattened_task_template(object, &segments)
            && let Err(inner) = serde_path_to_error::deserialize::<_, TaskSpec>(element)
        {
            segments.extend(path_segments(inner.path()));
            message = inner.into_inner().to_string();
        }
        serde_error(&segments, &message)
    })
}

enum Segment {
    Key(String),
    Index(usize),
}

fn path_segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    path.iter()
        .map(|s| match s {
            serde_path_to_error::Segment::Seq { index } => Segment::Index(*index),
            serde_path_to_error::Segment::Map { key } => Segment::Key(key.clone()),
            serde_path_to_error::Segment::Enum { variant } => Segment::Key(variant.clone()),
            serde_path_to_error::Segment::Unknown => Segment::Key("?".to_string()),
        })
        .collect()
}

fn render_path(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The element at `spec...tasks[i]` when the path ends there (a Job task template).
fn flattened_task_template<'a>(object: &'a Value, segments: &[Segment]) -> Option<&'a Value> {
    match segments {
        [
            Segment::Key(first),
            ..,
            Segment::Key(tasks),
            Segment::Index(_),
        ] if first == "spec" && tasks == "tasks" => {}
        _ => return None,
    }
    let mut value = object;
    for segment in segments {
        value = match segment {
            Segment::Key(key) => value.get(key.as_str())?,
            Segment::Index(i) => value.get(*i)?,
        };
    }
    Some(value)
}

/// Backtick-quoted words of a serde message, in order.
fn backticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn serde_error(segments: &[Segment], message: &str) -> FieldError {
    let path = render_path(segments);
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some(name) = rest.strip_suffix('`')
    {
        let field = if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        };
        return FieldError::required(field, "");
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some((value, expected)) = rest.rsplit_once("`, expected ")
    {
        return FieldError::not_supported(path, value, &backticked(expected));
    }
    FieldError::invalid(path, message)
}
