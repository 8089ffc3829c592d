//! Snapshots of a whole store and their file format: what `rlark backup` writes, `rlark
//! restore` reads, and `rlark store migrate` carries from one backend to another.
//!
//! A [`Snapshot`] is every object at one revision, each with the revision that wrote it, so
//! a restored or migrated store keeps its `resourceVersion`s: a client's cached versions and
//! preconditions stay meaningful, and the revision never goes backwards. The change log is
//! not carried: the restored store's log starts at the snapshot's revision (a watch from
//! before it is answered `410 Gone`, and the client relists, as after any compaction).
//!
//! The file is JSON Lines, one self-describing line each, so a backup streams in both
//! directions and a truncated file is detected:
//!
//! ```text
//! {"format":"rlark.io/backup/v1","revision":42,"objects":2}
//! {"resource":"rlinf.io/jobs","namespace":"","name":"a","revision":40,"object":{...}}
//! {"resource":"namespaces","namespace":"","name":"default","revision":1,"object":{...}}
//! {"end":true,"objects":2}
//! ```

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::backend::{Backend, Change};
use crate::{EventType, ObjectKey, Revision, StoreError};

/// The first line's `format`.
pub const FORMAT: &str = "rlark.io/backup/v1";

/// Every object of a store at one revision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The store's revision when the snapshot was taken (at least every object's).
    pub revision: Revision,
    /// In no particular order; each key once.
    pub objects: Vec<SnapshotObject>,
}

/// One object of a [`Snapshot`].
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotObject {
    pub key: ObjectKey,
    /// The revision that wrote it (its `metadata.resourceVersion`).
    pub revision: Revision,
    /// The object's JSON, as the store keeps it.
    pub json: Arc<str>,
}

/// What can go wrong reading or writing a backup.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("reading the backup: {0}")]
    Read(#[source] std::io::Error),
    #[error("writing the backup: {0}")]
    Write(#[source] std::io::Error),
    /// The file is not a complete backup of this format; names the line and the problem.
    #[error("backup line {line}: {problem}")]
    Invalid { line: usize, problem: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Snapshot {
    /// The snapshot of everything `backend` holds (read through [`Backend::load`]).
    pub async fn of_backend<B: Backend>(backend: &mut B) -> Result<Self, StoreError> {
        let loaded = backend.load().await?;
        let objects = loaded
            .objects
            .into_iter()
            .map(|object| {
                let json = serde_json::to_string(&object.object)
                    .map_err(|e| StoreError::Database(format!("serializing object: {e}")))?;
                Ok(SnapshotObject {
                    key: object.key,
                    revision: object.revision,
                    json: Arc::from(json),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Self {
            revision: loaded.revision,
            objects,
        })
    }

    /// Write the snapshot in the backup format.
    pub fn write_to(&self, out: &mut impl Write) -> Result<(), BackupError> {
        for line in self.lines() {
            out.write_all(line.as_bytes()).map_err(BackupError::Write)?;
        }
        out.flush().map_err(BackupError::Write)
    }

    /// The backup format's lines (each ending in `\n`), made one at a time.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.objects.len() + 2).map(|index| self.line(index))
    }

    /// Line `index` of the backup (0: the header; then one per object; last: the end line),
    /// ending in `\n`: for a streamed response, which owns the snapshot behind an `Arc`.
    pub fn line(&self, index: usize) -> String {
        let count = self.objects.len();
        if index == 0 {
            let header = serde_json::json!({
                "format": FORMAT,
                "revision": self.revision,
                "objects": count,
            });
            return format!("{header}\n");
        }
        match self.objects.get(index - 1) {
            // The object's JSON goes in as it is stored: it is valid JSON already.
            Some(object) => format!(
                "{{\"resource\":{},\"namespace\":{},\"name\":{},\"revision\":{},\"object\":{}}}\n",
                Value::from(object.key.resource.as_str()),
                Value::from(object.key.namespace.as_str()),
                Value::from(object.key.name.as_str()),
                object.revision,
                object.json,
            ),
            None => format!("{}\n", serde_json::json!({"end": true, "objects": count})),
        }
    }

    /// Lines of the backup in index order, joined into chunks of about `chunk_bytes` (a
    /// streamed response's body frames).
    pub fn chunks(self: Arc<Self>, chunk_bytes: usize) -> impl Iterator<Item = String> {
        let total = self.objects.len() + 2;
        let mut next = 0;
        std::iter::from_fn(move || {
            if next >= total {
                return None;
            }
            let mut chunk = String::new();
            while next < total && (chunk.is_empty() || chunk.len() < chunk_bytes) {
                chunk.push_str(&self.line(next));
                next += 1;
            }
            Some(chunk)
        })
    }

    /// Read a backup, checking it whole: the format, every line, each key once, each
    /// object's `resourceVersion` equal to its line's revision and none above the snapshot's,
    /// the count, and the end line (a truncated file is refused).
    pub fn read_from(input: impl BufRead) -> Result<Self, BackupError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Header {
            format: String,
            revision: Revision,
            objects: usize,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Line {
            resource: String,
            namespace: String,
            name: String,
            revision: Revision,
            object: Value,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct End {
            end: bool,
            objects: usize,
        }
        let invalid = |line: usize, problem: String| BackupError::Invalid { line, problem };
        let mut lines = input.lines().enumerate().map(|(i, l)| (i + 1, l));
        let (number, first) = lines
            .next()
            .ok_or_else(|| invalid(1, "the file is empty".into()))?;
        let first = first.map_err(BackupError::Read)?;
        let header: Header = serde_json::from_str(&first).map_err(|e| {
            invalid(
                number,
                format!("not an rlark backup header ({FORMAT}): {e}"),
            )
        })?;
        if header.format != FORMAT {
            return Err(invalid(
                number,
                format!(
                    "format {:?} is not supported (this build reads {FORMAT})",
                    header.format
                ),
            ));
        }
        let mut snapshot = Snapshot {
            revision: header.revision,
            objects: Vec::with_capacity(header.objects.min(1 << 20)),
        };
        let mut seen = HashSet::new();
        let mut ended = None;
        for (number, line) in lines {
            let line = line.map_err(BackupError::Read)?;
            if ended.is_some() {
                return Err(invalid(number, "content after the end line".into()));
            }
            if line.starts_with("{\"end\"") {
                let end: End = serde_json::from_str(&line)
                    .map_err(|e| invalid(number, format!("malformed end line: {e}")))?;
                if !end.end || end.objects != snapshot.objects.len() {
                    return Err(invalid(
                        number,
                        format!(
                            "the end line counts {} objects, the file holds {}",
                            end.objects,
                            snapshot.objects.len()
                        ),
                    ));
                }
                ended = Some(number);
                continue;
            }
            let entry: Line = serde_json::from_str(&line)
                .map_err(|e| invalid(number, format!("malformed object line: {e}")))?;
            let key = ObjectKey::new(entry.resource, entry.namespace, entry.name);
            let named = format!("{} {}/{}", key.resource, key.namespace, key.name);
            if !entry.object.is_object() {
                return Err(invalid(number, format!("{named}: not a JSON object")));
            }
            let stored = entry.object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<Revision>().ok());
            if stored != Some(entry.revision) {
                return Err(invalid(
                    number,
                    format!(
                        "{named}: metadata.resourceVersion {} does not match the line's revision {}",
                        entry.object["metadata"]["resourceVersion"], entry.revision
                    ),
                ));
            }
            if entry.revision == 0 || entry.revision > snapshot.revision {
                return Err(invalid(
                    number,
                    format!(
                        "{named}: revision {} is outside the snapshot's 1..={}",
                        entry.revision, snapshot.revision
                    ),
                ));
            }
            if !seen.insert(key.clone()) {
                return Err(invalid(number, format!("{named} appears twice")));
            }
            let json = serde_json::to_string(&entry.object)
                .map_err(|e| invalid(number, format!("{named}: {e}")))?;
            snapshot.objects.push(SnapshotObject {
                key,
                revision: entry.revision,
                json: Arc::from(json),
            });
        }
        if ended.is_none() {
            return Err(invalid(
                snapshot.objects.len() + 2,
                "the end line is missing: the backup is truncated".into(),
            ));
        }
        if header.objects != snapshot.objects.len() {
            return Err(invalid(
                1,
                format!(
                    "the header counts {} objects, the file holds {}",
                    header.objects,
                    snapshot.objects.len()
                ),
            ));
        }
        Ok(snapshot)
    }
}

/// Write `snapshot` into `backend`, which must hold nothing (no object, revision 0): in one
/// transaction, every object with the revision that wrote it, then the store's revision and
/// its change log's floor set to the snapshot's. Refused, with nothing written, when the
/// backend is not empty.
pub async fn import<B: Backend>(backend: &mut B, snapshot: &Snapshot) -> Result<(), StoreError> {
    let mut changes = Vec::with_capacity(snapshot.objects.len());
    for object in &snapshot.objects {
        let value: Value = serde_json::from_str(&object.json).map_err(|e| {
            StoreError::Database(format!(
                "object {} {}/{}: {e}",
                object.key.resource, object.key.namespace, object.key.name
            ))
        })?;
        changes.push(Change {
            key: object.key.clone(),
            event_type: EventType::Added,
            revision: object.revision,
            object: Arc::new(value),
            json: Arc::clone(&object.json),
        });
    }
    // In revision order, as a store writes them (the SQLite backend's row order is its
    // revision order).
    changes.sort_by_key(|change| change.revision);
    backend.import(&changes, snapshot.revision).await
}

/// Shared by the backends' restore tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::{CachedStore, ListOptions, Store};

    pub(crate) const R: &str = "widgets.test.rlark.io";

    /// A history with updates and a deletion: revision 6, objects a (written at 5), c (6)
    /// and one in another resource (3).
    pub(crate) async fn write_history(store: &impl Store) {
        let object = |name: &str, v: u64| {
            serde_json::json!({
                "apiVersion": "test.rlark.io/v1", "kind": "Widget",
                "metadata": {"name": name, "namespace": "ns"}, "spec": {"v": v},
            })
        };
        let key = |name: &str| ObjectKey::new(R, "ns", name);
        store.create(&key("a"), object("a", 1)).await.expect("a");
        store.create(&key("b"), object("b", 1)).await.expect("b");
        let other = ObjectKey::new("namespaces", "", "ns");
        let namespace = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": "ns"}});
        store.create(&other, namespace).await.expect("namespace");
        store.delete(&key("b"), None).await.expect("delete b");
        store
            .update(&key("a"), object("a", 2), Some(1))
            .await
            .expect("update a");
        store.create(&key("c"), object("c", 1)).await.expect("c");
    }

    /// The same objects with the same revisions, whatever the order.
    pub(crate) fn assert_same(left: &Snapshot, right: &Snapshot) {
        let sorted = |s: &Snapshot| {
            let mut objects: Vec<(String, String, String, Revision, Value)> = s
                .objects
                .iter()
                .map(|o| {
                    (
                        o.key.resource.clone(),
                        o.key.namespace.clone(),
                        o.key.name.clone(),
                        o.revision,
                        serde_json::from_str(&o.json).expect("json"),
                    )
                })
                .collect();
            objects.sort_by(|a, b| (&a.0, &a.1, &a.2).cmp(&(&b.0, &b.1, &b.2)));
            (s.revision, objects)
        };
        assert_eq!(sorted(left), sorted(right));
    }

    /// `snapshot` went through the file format, was imported into `restored`'s backend and
    /// the store reopened: the same objects and revisions, the log starting at the snapshot,
    /// and the next write numbered after it.
    pub(crate) async fn check_restored<B: Backend>(snapshot: &Snapshot, restored: &CachedStore<B>) {
        assert_same(&restored.snapshot(), snapshot);
        assert_eq!(restored.revision(), snapshot.revision);
        assert_eq!(restored.compacted_revision(), snapshot.revision);
        assert!(matches!(
            restored.watch(R, None, snapshot.revision - 1).await,
            Err(StoreError::Expired { .. })
        ));
        let listed = restored
            .list(R, &ListOptions::default())
            .await
            .expect("list");
        assert_eq!(listed.items.len(), 2);
        let d = ObjectKey::new(R, "ns", "d");
        let created = restored
            .create(
                &d,
                serde_json::json!({"apiVersion": "test.rlark.io/v1", "kind": "Widget",
                                   "metadata": {"name": "d", "namespace": "ns"}}),
            )
            .await
            .expect("a write after the restore");
        let expected = (snapshot.revision + 1).to_string();
        assert_eq!(created["metadata"]["resourceVersion"], expected.as_str());
    }

    /// Through the file format and back.
    pub(crate) fn through_a_file(snapshot: &Snapshot) -> Snapshot {
        let mut file = Vec::new();
        snapshot.write_to(&mut file).expect("write");
        Snapshot::read_from(file.as_slice()).expect("read")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(resource: &str, name: &str, revision: Revision) -> SnapshotObject {
        let value = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Thing",
            "metadata": {"name": name, "resourceVersion": revision.to_string()},
            "spec": {"text": "line\nbreak \"quoted\""},
        });
        SnapshotObject {
            key: ObjectKey::new(resource, "ns", name),
            revision,
            json: Arc::from(value.to_string()),
        }
    }

    fn sample() -> Snapshot {
        Snapshot {
            revision: 9,
            objects: vec![
                object("rlinf.io/jobs", "a", 3),
                object("namespaces", "b", 9),
            ],
        }
    }

    fn written(snapshot: &Snapshot) -> String {
        let mut out = Vec::new();
        snapshot.write_to(&mut out).expect("write");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let text = written(&sample());
        assert_eq!(text.lines().count(), 4);
        let read = Snapshot::read_from(text.as_bytes()).expect("read");
        assert_eq!(read, sample());
    }

    #[test]
    fn chunks_join_to_the_written_file() {
        let text = written(&sample());
        for chunk_bytes in [1, 100, 1 << 20] {
            let chunks: Vec<String> = Arc::new(sample()).chunks(chunk_bytes).collect();
            assert_eq!(chunks.concat(), text, "chunks of {chunk_bytes}");
            if chunk_bytes == 1 {
                assert_eq!(chunks.len(), 4, "one line per chunk at least");
            }
        }
    }

    #[test]
    fn an_empty_store_makes_a_valid_backup() {
        let empty = Snapshot::default();
        let read = Snapshot::read_from(written(&empty).as_bytes()).expect("read");
        assert_eq!(read, empty);
    }

    /// Every way a file can be wrong is refused with the line and the problem.
    #[test]
    fn damaged_backups_are_refused_naming_the_line() {
        let text = written(&sample());
        let lines: Vec<&str> = text.lines().collect();
        let join = |lines: &[&str]| lines.join("\n");
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "line 1: the file is empty"),
            ("{\"hello\":1}".into(), "line 1: not an rlark backup header"),
            (
                text.replace(FORMAT, "rlark.io/backup/v9"),
                "line 1: format \"rlark.io/backup/v9\" is not supported",
            ),
            (
                join(&lines[..3]),
                "the end line is missing: the backup is truncated",
            ),
            (
                join(&[lines[0], lines[1], lines[1], lines[3]]),
                "line 3: rlinf.io/jobs ns/a appears twice",
            ),
            (
                join(&[lines[0], lines[1], lines[3]]),
                "line 3: the end line counts 2 objects, the file holds 1",
            ),
            (
                text.replace("\"revision\":3,", "\"revision\":4,"),
                "line 2: rlinf.io/jobs ns/a: metadata.resourceVersion \"3\" does not match the line's revision 4",
            ),
            (
                text.replace("\"revision\":9,\"objects\"", "\"revision\":5,\"objects\""),
                "line 3: namespaces ns/b: revision 9 is outside the snapshot's 1..=5",
            ),
            (
                format!("{text}{}\n", lines[1]),
                "line 5: content after the end line",
            ),
            (
                text.replace("\"resource\":\"namespaces\"", "\"resource\":7"),
                "line 3: malformed object line",
            ),
        ];
        for (input, expected) in cases {
            let error = Snapshot::read_from(input.as_bytes())
                .expect_err(expected)
                .to_string();
            assert!(
                error.contains(expected),
                "{error:?} should say {expected:?}"
            );
        }
    }
}
