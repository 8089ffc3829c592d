//! Private files (mode 0600) and public ones (0644, certificates only), written atomically.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::{PkiError, Result};

/// Create `dir` (and missing parents) with mode 0700. An existing `dir` of this process's
/// user that is open to group or others is made 0700 (keys go in it). One owned by another
/// user is left as it is: it is not ours to change (a Kubernetes volume's root belongs to
/// root, its group to the pod's `fsGroup`), and what rlark writes in it is 0600 anyway.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let failed = |source| PkiError::CreateDir {
        path: dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(failed)?;
    let meta = fs::metadata(dir).map_err(failed)?;
    // /proc/self belongs to the process's effective user.
    let mine = fs::metadata("/proc/self").is_ok_and(|me| me.uid() == meta.uid());
    if mine && meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(failed)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    /// Issue 38 ("key files are 0600 and owned by a user no task runs as"): a data
    /// directory made beforehand with the usual 0755 used to stay open to everyone.
    #[test]
    fn an_existing_open_directory_is_made_private_and_a_foreign_one_left_alone() {
        let root = tempfile::tempdir().expect("dir");
        let open = root.path().join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).expect("chmod");
        create_private_dir(&open).expect("private");
        assert_eq!(fs::metadata(&open).expect("meta").mode() & 0o777, 0o700);
        let fresh = root.path().join("a/b");
        create_private_dir(&fresh).expect("created");
        assert_eq!(fs::metadata(&fresh).expect("meta").mode() & 0o777, 0o700);
        write_private_file(&fresh.join("key"), b"k").expect("write");
        assert_eq!(
            fs::metadata(fresh.join("key")).expect("meta").mode() & 0o777,
            0o600
        );
        if fs::metadata("/proc/self").map(|m| m.uid()).ok() == Some(0) {
            let foreign = root.path().join("foreign");
            fs::create_dir(&foreign).expect("mkdir");
            fs::set_permissions(&foreign, fs::Permissions::from_mode(0o775)).expect("chmod");
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).expect("chown");
            create_private_dir(&foreign).expect("a volume's root, say");
            assert_eq!(fs::metadata(&foreign).expect("meta").mode() & 0o777, 0o775);
        }
    }
}
