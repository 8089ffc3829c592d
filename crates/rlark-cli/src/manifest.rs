//! Reading manifests: files, directories and stdin holding multi-document YAML or JSON.

use std::io::Read as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::Value;

/// One object read from a manifest source.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Manifest {
    /// Where it came from (`file.yaml`, `-` for stdin), for messages.
    pub source: String,
    pub object: Value,
}

impl Manifest {
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }

    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.object["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
    }
}

/// Read every `-f` argument: `-` is stdin, a directory contributes its `.yaml`, `.yml` and
/// `.json` files (sorted by name, not recursive), anything else is read as a file.
pub(crate) fn read_sources(sources: &[String]) -> anyhow::Result<Vec<Manifest>> {
    let mut manifests = Vec::new();
    for source in sources {
        if source == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("read manifests from stdin")?;
            manifests.extend(parse_documents(&text, "-")?);
            continue;
        }
        let path = Path::new(source);
        if path.is_dir() {
            let mut files = Vec::new();
            for entry in
                std::fs::read_dir(path).with_context(|| format!("read directory {source}"))?
            {
                let entry_path = entry
                    .with_context(|| format!("read directory {source}"))?
                    .path();
                let is_manifest = entry_path
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
                if is_manifest && entry_path.is_file() {
                    files.push(entry_path);
                }
            }
            files.sort();
            if files.is_empty() {
                bail!("no .yaml, .yml or .json files in directory {source}");
            }
            for file in files {
                manifests.extend(read_file(&file)?);
            }
        } else {
            manifests.extend(read_file(path)?);
        }
    }
    Ok(manifests)
}

fn read_file(path: &Path) -> anyhow::Result<Vec<Manifest>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    parse_documents(&text, &path.display().to_string())
}

/// Split `text` into objects: JSON (one or more concatenated objects) when it starts with
/// `{`, else multi-document YAML. Empty documents are skipped, `kind: *List` objects are
/// expanded into their items, and every object must have `apiVersion`, `kind` and
/// `metadata.name`.
pub(crate) fn parse_documents(text: &str, source: &str) -> anyhow::Result<Vec<Manifest>> {
    let documents: Vec<Value> = if text.trim_start().starts_with('{') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .with_context(|| format!("parse JSON in {source}"))?
    } else {
        serde_saphyr::from_multiple(text).with_context(|| format!("parse YAML in {source}"))?
    };
    let mut out = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        collect(document, source, index, &mut out)?;
    }
    Ok(out)
}

fn collect(
    document: Value,
    source: &str,
    index: usize,
    out: &mut Vec<Manifest>,
) -> anyhow::Result<()> {
    let mut map = match document {
        Value::Null => return Ok(()),
        Value::Object(map) => map,
        other => bail!(
            "{source}: document {} is not an object but {}",
            index + 1,
            match other {
                Value::Array(_) => "a list",
                Value::String(_) => "a string",
                _ => "a scalar",
            }
        ),
    };
    if map.is_empty() {
        return Ok(());
    }
    let is_list = map
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k.ends_with("List"))
        && matches!(map.get("items"), Some(Value::Array(_)));
    if is_list && let Some(Value::Array(items)) = map.remove("items") {
        for item in items {
            collect(item, source, index, out)?;
        }
        return Ok(());
    }
    let manifest = Manifest {
        source: source.to_string(),
        object: Value::Object(map),
    };
    let missing = [
        ("apiVersion", manifest.api_version()),
        ("kind", manifest.kind()),
        ("metadata.name", manifest.name()),
    ]
    .into_iter()
    .find(|(_, v)| v.is_empty());
    if let Some((field, _)) = missing {
        bail!("{source}: document {} has no {field}", index + 1);
    }
    out.push(manifest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_multi_document_yaml_and_skips_empty_documents() {
        let text = "---\napiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata:\n  name: a\n---\n\n---\n\
                    # only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n...\n";
        let docs = parse_documents(text, "f.yaml").expect("parse");
        let names: Vec<_> = docs.iter().map(|m| (m.kind(), m.name())).collect();
        assert_eq!(names, [("Job", "a"), ("Namespace", "b")]);
        assert_eq!(docs[0].source, "f.yaml");
        assert_eq!(docs[0].namespace(), None);
    }

    #[test]
    fn reads_json_objects_and_expands_lists() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"rlinf.io/v1alpha1","kind":"Task","metadata":{"name":"t","namespace":"n"}},
            {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"n"}}]}
            {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"m"}}"#;
        let docs = parse_documents(text, "-").expect("parse");
        let names: Vec<_> = docs.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["t", "n", "m"]);
        assert_eq!(docs[0].namespace(), Some("n"));
    }

    #[test]
    fn incomplete_documents_are_errors_that_name_the_field() {
        let err =
            parse_documents("apiVersion: v1\nkind: Namespace\n", "x.yaml").expect_err("no name");
        assert!(err.to_string().contains("metadata.name"), "{err}");
        assert!(err.to_string().contains("x.yaml"), "{err}");
        let err = parse_documents("kind: Job\nmetadata: {name: a}\n", "x.yaml")
            .expect_err("no apiVersion");
        assert!(err.to_string().contains("apiVersion"), "{err}");
        assert!(parse_documents("- a\n- b\n", "x.yaml").is_err());
        assert!(parse_documents("key: [unclosed\n", "x.yaml").is_err());
    }

    #[test]
    fn directories_contribute_manifest_files_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("b.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}"#,
        )
        .expect("write");
        std::fs::write(dir.path().join("README.md"), "not a manifest").expect("write");
        let docs = read_sources(&[dir.path().display().to_string()]).expect("read");
        let names: Vec<_> = docs.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["a", "b"]);
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(read_sources(&[empty.path().display().to_string()]).is_err());
        assert!(read_sources(&["/does/not/exist.yaml".to_string()]).is_err());
    }
}
