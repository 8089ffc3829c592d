//! Private files (mode 0600) and public ones (0644, certificates only), written atomically.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::{PkiError, Result};

/// Create `dir` (and missing parents) with mode 0700. An existing directory is left as is.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| PkiError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })
}

/// Write `contents` to `path` with mode 0600, atomically: the bytes go to a temporary file
/// in the same directory, are synced, and the file is renamed over `path`. A concurrent
/// reader sees either the old or the new content, never a part.
pub fn write_private_file(path: &Path, contents: &[u8]) -> Result<()> {
    write_file(path, contents, 0o600)
}

/// [`write_private_file`] with mode 0644: for certificates everyone on the host may read
/// (the CA bundle that isolated replicas verify the server with), never for keys.
pub fn write_public_file(path: &Path, contents: &[u8]) -> Result<()> {
    write_file(path, contents, 0o644)
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let write_err = |source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{file_name}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        // Make the rename itself durable; failing to sync a directory is not fatal.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(write_err)
}

pub(crate) fn read_to_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| PkiError::Read {
        path: path.to_path_buf(),
        source,
    })
}
