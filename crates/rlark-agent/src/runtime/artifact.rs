//! `raw.artifact`: a file put into the working directory before the process starts.
//!
//! Only `file://` URLs are fetched for now (a copy, checked against `artifactSha256` when
//! given); `http(s)://` is refused with an explicit message rather than ignored. Archives
//! are copied as they are, not unpacked.

use std::fs::{self, File};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::RuntimeError;

/// Message of the error for `http://` and `https://` artifacts.
pub const HTTP_UNSUPPORTED: &str = "http artifacts are not supported by this agent yet";

/// Copy the artifact at `url` into `dir` (same file name), verifying `sha256` (64 hex
/// digits, any case) when given. Returns the copy's path. Blocking.
pub fn fetch(url: &str, sha256: Option<&str>, dir: &Path) -> Result<PathBuf, RuntimeError> {
    let failed = |message: String| RuntimeError::Artifact {
        url: url.to_string(),
        message,
    };
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(failed(HTTP_UNSUPPORTED.to_string()));
    }
    let Some(rest) = url.strip_prefix("file://") else {
        return Err(failed(
            "unsupported URL scheme (this agent fetches file:// artifacts only)".to_string(),
        ));
    };
    if !rest.starts_with('/') {
        return Err(failed(
            "a file:// URL must name an absolute path on this host (file:///path)".to_string(),
        ));
    }
    let expected = match sha256 {
        Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(hex.to_ascii_lowercase())
        }
        Some(hex) => {
            return Err(failed(format!(
                "artifactSha256 {hex:?} is not 64 hexadecimal digits"
            )));
        }
        None => None,
    };
    let source = Path::new(rest);
    let name = source
        .file_name()
        .ok_or_else(|| failed("the URL names no file".to_string()))?;
    let target = dir.join(name);
    let actual = copy_hashing(source, &target).map_err(|e| failed(e.to_string()))?;
    if let Some(expected) = expected
        && expected != actual
    {
        let _ = fs::remove_file(&target);
        return Err(RuntimeError::ArtifactChecksumMismatch {
            url: url.to_string(),
            expected,
            actual,
        });
    }
    Ok(target)
}

/// Copy `from` to `to` (replacing it), returning the lowercase hex SHA-256 of the bytes.
fn copy_hashing(from: &Path, to: &Path) -> io::Result<String> {
    let mut input = File::open(from)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", from.display())))?;
    let mut output = File::create(to)
        .map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", to.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = input
            .read(&mut buf)
            .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", from.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        output
            .write_all(&buf[..n])
            .map_err(|e| io::Error::new(e.kind(), format!("write {}: {e}", to.display())))?;
    }
    output.sync_all()?;
    // Keep the source's permission bits (an executable stays executable).
    if let Ok(meta) = fs::metadata(from) {
        let _ = fs::set_permissions(to, meta.permissions());
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn file_urls_are_copied_and_checked() {
        let src = tempfile::tempdir().expect("tempdir");
        let dst = tempfile::tempdir().expect("tempdir");
        let file = src.path().join("model.bin");
        fs::write(&file, "hello").expect("write");
        let url = format!("file://{}", file.display());

        let copy = fetch(&url, Some(&HELLO_SHA256.to_uppercase()), dst.path()).expect("fetch");
        assert_eq!(copy, dst.path().join("model.bin"));
        assert_eq!(fs::read_to_string(&copy).expect("read"), "hello");
        fetch(&url, None, dst.path()).expect("no checksum given");

        let wrong = "0".repeat(64);
        match fetch(&url, Some(&wrong), dst.path()) {
            Err(e @ RuntimeError::ArtifactChecksumMismatch { .. }) => {
                let message = e.to_string();
                assert!(message.contains(&wrong) && message.contains(HELLO_SHA256));
                assert_eq!(e.reason(), "ArtifactChecksumMismatch");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        assert!(!copy.exists(), "a mismatching copy is removed");
    }

    #[test]
    fn other_urls_fail_with_a_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = fetch("https://example.invalid/a.tgz", None, dir.path()).expect_err("http");
        assert!(err.to_string().contains(HTTP_UNSUPPORTED), "{err}");
        let err = fetch("s3://bucket/a", None, dir.path()).expect_err("s3");
        assert!(err.to_string().contains("scheme"), "{err}");
        let err = fetch("file:///nonexistent/a", None, dir.path()).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/a"), "{err}");
        let err = fetch("file:///x", Some("abc"), dir.path()).expect_err("bad digest");
        assert!(err.to_string().contains("64 hexadecimal"), "{err}");
    }
}
