//! Row encoding shared by the SQL backends: revisions as signed 64-bit integers, event types
//! as their Kubernetes names, objects as JSON text, errors naming what failed.

use serde_json::Value;

use crate::{EventType, ObjectKey, Revision, StoreError};

pub(crate) fn db_err(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Database(format!("{context}: {e}"))
}

pub(crate) fn to_db_int(revision: Revision) -> Result<i64, StoreError> {
    i64::try_from(revision).map_err(|_| {
        StoreError::Database(format!(
            "revision {revision} exceeds a 64-bit signed integer"
        ))
    })
}

pub(crate) fn from_db_int(value: i64, what: &str) -> Result<Revision, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Database(format!("negative {what} {value} in database")))
}

pub(crate) fn event_type_name(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

pub(crate) fn parse_event_type(name: &str) -> Result<EventType, StoreError> {
    match name {
        "ADDED" => Ok(EventType::Added),
        "MODIFIED" => Ok(EventType::Modified),
        "DELETED" => Ok(EventType::Deleted),
        other => Err(StoreError::Database(format!(
            "corrupt change log: unknown event type {other:?}"
        ))),
    }
}

pub(crate) fn parse_object(text: &str, key: &ObjectKey, what: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Database(format!(
            "corrupt {what} {} {}/{}: {e}",
            key.resource, key.namespace, key.name
        ))
    })
}

/// The object key in the three columns of `row` from `first` on (resource, namespace,
/// name), as both backends lay out their tables.
pub(crate) fn key_of<R>(row: &R, first: usize) -> Result<ObjectKey, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(ObjectKey::new(
        row.try_get::<String, _>(first)?,
        row.try_get::<String, _>(first + 1)?,
        row.try_get::<String, _>(first + 2)?,
    ))
}
