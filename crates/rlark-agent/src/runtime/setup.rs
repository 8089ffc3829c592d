//! What a raw replica needs before it starts: its directories (given to its user), its
//! program resolved, its artifacts.

use super::*;

/// What [`prepare`] made ready.
pub(super) struct Prepared {
    pub(super) program: PathBuf,
    pub(super) work_dir: PathBuf,
    pub(super) logs: LogFiles,
    pub(super) stdout: std::fs::File,
    pub(super) stderr: std::fs::File,
}

/// Directories, artifact, program lookup, log file. Blocking.
pub(super) fn prepare(spec: &ReplicaSpec) -> Result<Prepared, RuntimeError> {
    let Some(program) = spec.entrypoint.first().filter(|p| !p.is_empty()) else {
        return Err(RuntimeError::EmptyEntrypoint);
    };
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RuntimeError::Io { path, source }
    };
    let default_work = spec.default_work_dir();
    std::fs::create_dir_all(&default_work).map_err(io_err(&default_work))?;
    let logs = spec.log_files();
    if let Some(dir) = logs.path().parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    // The records of an earlier start of this replica (a restart) must not be mistaken
    // for this one's.
    for name in [PID_FILE, EXIT_FILE] {
        let path = spec.replica_dir.join(name);
        record::remove(&path).map_err(io_err(&path))?;
    }
    let work_dir = match &spec.working_dir {
        Some(dir) => {
            let dir = default_work.join(dir);
            check_dir(&dir)?;
            dir
        }
        None => default_work,
    };
    if let Some(url) = &spec.artifact {
        let cache = spec.artifact_cache.as_deref();
        artifact::fetch(url, spec.artifact_sha256.as_deref(), cache, &work_dir)?;
    }
    if let Some(sandbox) = &spec.sandbox {
        give_work_dir(
            &spec.default_work_dir(),
            sandbox.uid,
            sandbox.gid,
            spec.artifact.is_some(),
        )?;
    }
    let path_var = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    let program = resolve_program(program, &work_dir, path_var.as_deref())?;
    if let Err(error) = logs.rotate_if_needed() {
        tracing::warn!(log = %logs.path().display(), %error, "rotate replica log");
    }
    let stdout = logs
        .open_for_start(chrono::Utc::now())
        .map_err(io_err(logs.path()))?;
    let stderr = stdout.try_clone().map_err(io_err(logs.path()))?;
    Ok(Prepared {
        program,
        work_dir,
        logs,
        stdout,
        stderr,
    })
}

/// Make `work` (and, after an artifact was unpacked into it, everything in it that root
/// owns) the replica user's. Symbolic links are changed themselves, never followed, and
/// directories reached through them are not entered.
pub(super) fn give_work_dir(
    work: &Path,
    uid: u32,
    gid: u32,
    recursive: bool,
) -> Result<(), RuntimeError> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{Gid, Uid, fchownat};
    use std::os::unix::fs::MetadataExt as _;
    let chown = |path: &Path| {
        fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            source: io::Error::from(e),
        })
    };
    chown(work)?;
    if !recursive {
        return Ok(());
    }
    let mut pending = vec![work.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| RuntimeError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.uid() == 0 {
                chown(&path)?;
            }
            if meta.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(())
}

/// `raw.workingDir` must be an existing, readable directory.
pub(super) fn check_dir(dir: &Path) -> Result<(), RuntimeError> {
    let failed = |reason: String| RuntimeError::WorkingDir {
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(failed("does not exist".into())),
        Err(e) => Err(failed(format!("cannot be read: {e}"))),
        Ok(meta) if !meta.is_dir() => Err(failed("is not a directory".into())),
        Ok(_) => std::fs::read_dir(dir)
            .map(drop)
            .map_err(|e| failed(format!("cannot be read: {e}"))),
    }
}

/// The file to execute for `program`: a path (relative to `work_dir`) when it contains a
/// `/`, else the first executable file of that name in `path_var`.
pub(crate) fn resolve_program(
    program: &str,
    work_dir: &Path,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, RuntimeError> {
    let not_found = |detail: String| RuntimeError::EntrypointNotFound {
        program: program.to_string(),
        detail,
    };
    if program.contains('/') {
        let path = work_dir.join(program);
        return match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() && is_executable(&meta) => Ok(path),
            Ok(meta) if meta.is_file() => {
                Err(not_found(format!("{} is not executable", path.display())))
            }
            Ok(_) => Err(not_found(format!("{} is not a file", path.display()))),
            Err(e) => Err(not_found(format!("{}: {e}", path.display()))),
        };
    }
    let Some(path_var) = path_var.filter(|p| !p.is_empty()) else {
        return Err(not_found("PATH is empty".to_string()));
    };
    for dir in std::env::split_paths(path_var) {
        let candidate = work_dir.join(dir).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && is_executable(&meta)
        {
            return Ok(candidate);
        }
    }
    Err(not_found(format!(
        "no executable {program:?} in PATH ({})",
        path_var.to_string_lossy()
    )))
}

pub(super) fn is_executable(meta: &std::fs::Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}
