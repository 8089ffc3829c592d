//! The manifests of the repository's `examples/` directory (its top-level `*.yaml`), built
//! into the binary: `rlark up` writes them into `<data-dir>/examples/` at every start and
//! prints that directory, so `rlark apply -f` finds them from any working directory.
//! `examples/` stays their source; a test fails when the two drift apart.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Name of the directory under the data directory.
pub(crate) const DIR: &str = "examples";

/// `(file name, content)` of every example, as `rlark apply -f DIR/` reads them (in name
/// order).
pub(crate) const FILES: &[(&str, &str)] = &[
    ("domain.yaml", include_str!("../../../examples/domain.yaml")),
    ("job.yaml", include_str!("../../../examples/job.yaml")),
    (
        "long-running.yaml",
        include_str!("../../../examples/long-running.yaml"),
    ),
    (
        "workflow.yaml",
        include_str!("../../../examples/workflow.yaml"),
    ),
];

/// Write [`FILES`] into `data_dir/examples/` (rewritten at every start, so they are this
/// binary's) and return that directory as an absolute path.
pub(crate) fn write(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = std::path::absolute(data_dir.join(DIR))
        .with_context(|| format!("resolve {}", data_dir.display()))?;
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, content) in FILES {
        let path = dir.join(name);
        std::fs::write(&path, content).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The built-in files are exactly the repository's `examples/*.yaml`.
    #[test]
    fn built_in_examples_match_the_repository() {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut on_disk: Vec<(String, String)> = std::fs::read_dir(&source)
            .expect("read examples/")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml"))
            .map(|p| {
                let name = p.file_name().expect("name").to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).expect("read example"))
            })
            .collect();
        on_disk.sort();
        let built_in: Vec<(String, String)> = FILES
            .iter()
            .map(|(n, c)| (n.to_string(), c.to_string()))
            .collect();
        assert_eq!(
            built_in, on_disk,
            "cli/example_files.rs FILES must list every examples/*.yaml"
        );
    }

    #[test]
    fn writes_every_example_into_the_data_directory() {
        let data = tempfile::tempdir().expect("tempdir");
        let dir = write(data.path()).expect("write");
        assert!(dir.is_absolute());
        assert_eq!(dir, data.path().join("examples"));
        for (name, content) in FILES {
            assert_eq!(
                std::fs::read_to_string(dir.join(name)).expect("read"),
                *content
            );
        }
    }
}
