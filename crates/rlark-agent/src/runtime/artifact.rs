//! `raw.artifact`: what is put into the working directory before the process starts.
//!
//! # Sources
//!
//! - `file:///path`: a file on this host.
//! - `http://` and `https://`: downloaded with a blocking client (this runs on a blocking
//!   thread): https verified against the Mozilla roots (webpki-roots), redirects followed
//!   up to [`Limits::max_redirects`], proxies taken from `HTTP_PROXY`/`HTTPS_PROXY`/
//!   `NO_PROXY`, no content decoding (the digest is that of the bytes served). A status
//!   other than 2xx, a connect or read timeout, or a body over
//!   [`Limits::max_download_bytes`] fails the fetch with a message naming it.
//!
//! # Checksum and cache
//!
//! With `artifactSha256` the bytes are checked before anything is placed; a mismatch is
//! [`RuntimeError::ArtifactChecksumMismatch`] (expected and actual digests). A checked
//! download is kept in the cache, `<cache>/sha256/<hex digest>` (the agent's is
//! `DATA_DIR/artifacts`): it is written to a temporary file next to it, checked, then
//! renamed, so the cache only ever holds complete files with the digest of their name.
//! Later fetches of the same digest, from any URL, read the cached file and do not
//! download (replicas starting at the same time wait for one download). Without
//! `artifactSha256` the download is not cached: nothing known before downloading says
//! whether the content changed. The cache is not evicted automatically: delete files
//! under `sha256/` to reclaim space (a missing file is downloaded again).
//!
//! # Placing
//!
//! The name is the last segment of the URL's path. Archives are unpacked into the working
//! directory: `.tar.gz`/`.tgz`, `.tar` and `.zip` by name; a name without any extension
//! is recognised by its first bytes (gzip-compressed tar, tar, zip). Any other file is
//! copied under its name (a `file://` copy keeps the source's permission bits). Unpacking
//! keeps permission bits (an executable stays executable) and refuses, naming the entry:
//! absolute paths, `..` components, symbolic links whose target leaves the directory or
//! is absolute, entries written through a symbolic link, device and FIFO entries, and more
//! than [`Limits::max_unpacked_bytes`] in all.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use ureq::ResponseExt as _;

use super::RuntimeError;

/// Directory of the cache, under the cache root, holding files named by their SHA-256.
pub const CACHE_DIGEST_DIR: &str = "sha256";

/// Bounds of one fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest download accepted (default 4 GiB).
    pub max_download_bytes: u64,
    /// Largest total size of the files an archive unpacks to (default 16 GiB).
    pub max_unpacked_bytes: u64,
    /// Time to resolve the host and to connect (each; default 30 s).
    pub connect_timeout: Duration,
    /// Longest wait for the response head and for each read of the body (default 60 s).
    pub read_timeout: Duration,
    /// Redirects followed before giving up (default 5).
    pub max_redirects: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_download_bytes: 4 << 30,
            max_unpacked_bytes: 16 << 30,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            max_redirects: 5,
        }
    }
}

/// Put the artifact at `url` into `dir` (see the module documentation), checking it
/// against `sha256` (64 hex digits, any case) when given and caching checked downloads
/// under `cache` when given. Returns the copied file, or `dir` for an unpacked archive.
/// Blocking.
pub fn fetch(
    url: &str,
    sha256: Option<&str>,
    cache: Option<&Path>,
    dir: &Path,
) -> Result<PathBuf, RuntimeError> {
    fetch_with(url, sha256, cache, dir, &Limits::default())
}

/// [`fetch`] with explicit limits.
pub fn fetch_with(
    url: &str,
    sha256: Option<&str>,
    cache: Option<&Path>,
    dir: &Path,
    limits: &Limits,
) -> Result<PathBuf, RuntimeError> {
    let failed = |message: String| RuntimeError::Artifact {
        url: url.to_string(),
        message,
    };
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
    let mismatch = |actual: String| RuntimeError::ArtifactChecksumMismatch {
        url: url.to_string(),
        expected: expected.clone().unwrap_or_default(),
        actual,
    };
    let lower = url.to_ascii_lowercase();
    if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(failed(
                "a file:// URL must name an absolute path on this host (file:///path)".to_string(),
            ));
        }
        let source = Path::new(rest);
        let name = source
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| failed("the URL names no file".to_string()))?;
        if let Some(expected) = &expected {
            let actual = hash_file(source).map_err(|e| failed(e.to_string()))?;
            if &actual != expected {
                return Err(mismatch(actual));
            }
        }
        return place(source, name, dir, Placing::Copy, limits).map_err(failed);
    }
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(failed(
            "unsupported URL scheme (this agent fetches http://, https:// and file:// artifacts)"
                .to_string(),
        ));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| failed(format!("not a valid URL: {e}")))?;
    let name = url_file_name(uri.path());
    match (&expected, cache) {
        (Some(expected), Some(cache)) => {
            let cached = cached_download(url, expected, cache, limits)?;
            place(&cached, &name, dir, Placing::Copy, limits).map_err(failed)
        }
        _ => {
            // Not cached: download next to its destination, place it, drop the download.
            let temp = dir.join(temp_name());
            let result = download(url, &temp, limits).and_then(|actual| match &expected {
                Some(expected) if &actual != expected => Err(mismatch(actual)),
                _ => place(&temp, &name, dir, Placing::Move, limits).map_err(failed),
            });
            let _ = fs::remove_file(&temp);
            result
        }
    }
}

/// The cached file of digest `expected`, downloading `url` into the cache first when it
/// is not there yet.
fn cached_download(
    url: &str,
    expected: &str,
    cache: &Path,
    limits: &Limits,
) -> Result<PathBuf, RuntimeError> {
    let failed = |message: String| RuntimeError::Artifact {
        url: url.to_string(),
        message,
    };
    let digest_dir = cache.join(CACHE_DIGEST_DIR);
    let cached = digest_dir.join(expected);
    // One download per digest at a time in this agent; the others wait and then find it.
    let lock = digest_lock(expected);
    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
    if cached.is_file() {
        tracing::debug!(url, digest = expected, "artifact found in the cache");
        return Ok(cached);
    }
    fs::create_dir_all(&digest_dir)
        .map_err(|e| failed(format!("create the cache {}: {e}", digest_dir.display())))?;
    let temp = digest_dir.join(format!(".{expected}.part"));
    let actual = match download(url, &temp, limits) {
        Ok(actual) => actual,
        Err(error) => {
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
    };
    if actual != expected {
        let _ = fs::remove_file(&temp);
        return Err(RuntimeError::ArtifactChecksumMismatch {
            url: url.to_string(),
            expected: expected.to_string(),
            actual,
        });
    }
    fs::rename(&temp, &cached).map_err(|e| {
        let _ = fs::remove_file(&temp);
        failed(format!("store in the cache {}: {e}", cached.display()))
    })?;
    tracing::info!(url, digest = expected, "artifact downloaded into the cache");
    Ok(cached)
}

/// The lock of one digest (shared by the fetches of that digest running now).
fn digest_lock(digest: &str) -> Arc<Mutex<()>> {
    static LOCKS: LazyLock<Mutex<HashMap<String, Weak<Mutex<()>>>>> = LazyLock::new(Mutex::default);
    let mut locks = LOCKS.lock().unwrap_or_else(|e| e.into_inner());
    locks.retain(|_, lock| lock.strong_count() > 0);
    if let Some(lock) = locks.get(digest).and_then(Weak::upgrade) {
        return lock;
    }
    let lock = Arc::new(Mutex::new(()));
    locks.insert(digest.to_string(), Arc::downgrade(&lock));
    lock
}

/// A file name no other fetch of this process uses at the same time.
fn temp_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        ".rlark-download-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The last segment of a URL path, for the copy's name: `artifact` when there is none
/// usable (empty, `.`, `..`, or not valid once percent-decoded).
fn url_file_name(path: &str) -> String {
    let segment = path.rsplit('/').next().unwrap_or_default();
    let decoded = percent_decode(segment).unwrap_or_default();
    if decoded.is_empty() || decoded == "." || decoded == ".." || decoded.contains(['/', '\0']) {
        "artifact".to_string()
    } else {
        decoded
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Download `url` into `to` (replacing it), returning the lowercase hex SHA-256 of the
/// bytes. The errors name the URL and the cause.
fn download(url: &str, to: &Path, limits: &Limits) -> Result<String, RuntimeError> {
    let failed = |message: String| RuntimeError::Artifact {
        url: url.to_string(),
        message,
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_resolve(Some(limits.connect_timeout))
        .timeout_connect(Some(limits.connect_timeout))
        .timeout_recv_response(Some(limits.read_timeout))
        .timeout_per_read(Some(limits.read_timeout))
        .max_redirects(limits.max_redirects)
        .http_status_as_error(false)
        .user_agent(format!("rlark-agent/{}", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::TooManyRedirects => {
            failed(format!("more than {} redirects", limits.max_redirects))
        }
        other => failed(format!("download failed: {other}")),
    })?;
    let status = response.status();
    let final_url = response.get_uri().to_string();
    let from = if final_url == url {
        String::new()
    } else {
        format!(" (redirected to {final_url})")
    };
    if !status.is_success() {
        return Err(failed(format!(
            "the server answered HTTP {}{from}",
            status_text(status)
        )));
    }
    let too_large = |size: String| {
        failed(format!(
            "the artifact is larger than the limit of {} bytes ({size}){from}",
            limits.max_download_bytes
        ))
    };
    let body = response.into_body();
    if let Some(length) = body.content_length()
        && length > limits.max_download_bytes
    {
        return Err(too_large(format!("Content-Length {length}")));
    }
    let mut reader = body.into_reader();
    let mut output =
        File::create(to).map_err(|e| failed(format!("create {}: {e}", to.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total: u64 = 0;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(format!("download failed after {total} bytes: {e}"))),
        };
        total += n as u64;
        if total > limits.max_download_bytes {
            return Err(too_large(format!(
                "more than {} bytes received",
                limits.max_download_bytes
            )));
        }
        hasher.update(&buf[..n]);
        output
            .write_all(&buf[..n])
            .map_err(|e| failed(format!("write {}: {e}", to.display())))?;
    }
    output
        .sync_all()
        .map_err(|e| failed(format!("write {}: {e}", to.display())))?;
    Ok(hex::encode(hasher.finalize()))
}

fn status_text(status: http::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// Lowercase hex SHA-256 of a file.
fn hash_file(path: &Path) -> io::Result<String> {
    let mut input = File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
    let mut hasher = Sha256::new();
    io::copy(&mut input, &mut hasher)
        .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", path.display())))?;
    Ok(hex::encode(hasher.finalize()))
}

/// What an archive is, or that it is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TarGz,
    Tar,
    Zip,
    File,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::TarGz => "a gzip-compressed tar archive",
            Kind::Tar => "a tar archive",
            Kind::Zip => "a zip archive",
            Kind::File => "a file",
        }
    }
}

/// The kind by name; a name without an extension by the first bytes of `source`.
fn kind_of(name: &str, source: &Path) -> io::Result<Kind> {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        return Ok(Kind::TarGz);
    }
    if lower.ends_with(".tar") {
        return Ok(Kind::Tar);
    }
    if lower.ends_with(".zip") {
        return Ok(Kind::Zip);
    }
    if name.contains('.') {
        return Ok(Kind::File);
    }
    let mut head = Vec::with_capacity(512);
    File::open(source)?.take(512).read_to_end(&mut head)?;
    let is_tar = |block: &[u8]| block.get(257..262) == Some(b"ustar".as_slice());
    if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
        return Ok(Kind::Zip);
    }
    if is_tar(&head) {
        return Ok(Kind::Tar);
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        let mut inner = Vec::with_capacity(512);
        let decoder = flate2::read::GzDecoder::new(File::open(source)?);
        // A gzip stream that is not a tar (or not valid) is a plain file.
        if decoder.take(512).read_to_end(&mut inner).is_ok() && is_tar(&inner) {
            return Ok(Kind::TarGz);
        }
    }
    Ok(Kind::File)
}

/// How a plain file gets to its place.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placing {
    /// Copy (the source stays; its permission bits are kept).
    Copy,
    /// Rename (a download of our own).
    Move,
}

/// Put `source` (named `name`) into `dir`: unpacked when it is an archive, else under its
/// name. The error says what went wrong (the caller adds the URL).
fn place(
    source: &Path,
    name: &str,
    dir: &Path,
    how: Placing,
    limits: &Limits,
) -> Result<PathBuf, String> {
    let kind = kind_of(name, source).map_err(|e| format!("read {}: {e}", source.display()))?;
    let unpacked = match kind {
        Kind::File => {
            let target = dir.join(name);
            remove_if_symlink(&target).map_err(|e| e.to_string())?;
            match how {
                Placing::Move => fs::rename(source, &target)
                    .map_err(|e| format!("move into {}: {e}", target.display()))?,
                Placing::Copy => copy_file(source, &target).map_err(|e| e.to_string())?,
            }
            return Ok(target);
        }
        Kind::TarGz => {
            let file = open(source)?;
            unpack_tar(
                flate2::read::GzDecoder::new(BufReader::new(file)),
                dir,
                limits,
            )
        }
        Kind::Tar => unpack_tar(BufReader::new(open(source)?), dir, limits),
        Kind::Zip => unpack_zip(open(source)?, dir, limits),
    };
    unpacked.map_err(|e| format!("unpack {name} ({}): {e}", kind.describe()))?;
    Ok(dir.to_path_buf())
}

fn open(path: &Path) -> Result<File, String> {
    File::open(path).map_err(|e| format!("open {}: {e}", path.display()))
}

/// Copy `from` to `to` (replacing it), keeping the permission bits.
fn copy_file(from: &Path, to: &Path) -> io::Result<()> {
    let mut input = File::open(from)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", from.display())))?;
    let mut output = File::create(to)
        .map_err(|e| io::Error::new(e.kind(), format!("create {}: {e}", to.display())))?;
    io::copy(&mut input, &mut output)
        .map_err(|e| io::Error::new(e.kind(), format!("copy to {}: {e}", to.display())))?;
    output.sync_all()?;
    // Keep the source's permission bits (an executable stays executable).
    if let Ok(meta) = fs::metadata(from) {
        let _ = fs::set_permissions(to, meta.permissions());
    }
    Ok(())
}

/// Removes `path` when it is a symbolic link, so that writing there never follows one.
fn remove_if_symlink(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => fs::remove_file(path),
        _ => Ok(()),
    }
}

/// Why an archive entry cannot be unpacked.
#[derive(Debug, thiserror::Error)]
enum UnpackError {
    #[error("entry {entry:?}: {reason}")]
    Entry { entry: String, reason: String },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the files unpack to more than the limit of {0} bytes")]
    TooLarge(u64),
}

fn refuse(entry: &Path, reason: impl Into<String>) -> UnpackError {
    UnpackError::Entry {
        entry: entry.display().to_string(),
        reason: reason.into(),
    }
}

/// `entry` as a relative path without `.`, `..` or root components; an error naming the
/// entry for an absolute path or a `..` component. Empty for the archive's root (`./`).
fn checked_relative(entry: &Path) -> Result<PathBuf, UnpackError> {
    let mut clean = PathBuf::new();
    for component in entry.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(refuse(entry, "a path with '..' would leave the directory"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(entry, "absolute paths are not allowed"));
            }
        }
    }
    Ok(clean)
}

/// Refuses a symbolic link at `link` (relative to the directory) whose `target` is absolute
/// or leaves the directory (resolved from the link's own directory, without following other
/// links: no entry may pass through a link, see [`prepare_target`]).
fn check_link_target(entry: &Path, link: &Path, target: &Path) -> Result<(), UnpackError> {
    let mut depth: Vec<&std::ffi::OsStr> = link
        .parent()
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    for component in target.components() {
        match component {
            Component::Normal(part) => depth.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return Err(refuse(
                        entry,
                        format!(
                            "the symbolic link to {} would leave the directory",
                            target.display()
                        ),
                    ));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(
                    entry,
                    format!(
                        "the symbolic link to the absolute path {} is not allowed",
                        target.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Where `rel` goes in `dir`: its parent directories are created, none of them may be a
/// symbolic link (an entry written through a link could land outside), and a link already
/// at the place itself is removed (so it is replaced, not followed).
fn prepare_target(dir: &Path, rel: &Path, entry: &Path) -> Result<PathBuf, UnpackError> {
    check_parents(dir, rel, entry, true)?;
    let target = dir.join(rel);
    remove_if_symlink(&target)?;
    Ok(target)
}

/// Refuses `rel` when one of its parent directories in `dir` is a symbolic link or not a
/// directory; with `create`, missing ones are created, else they are an error.
fn check_parents(dir: &Path, rel: &Path, entry: &Path, create: bool) -> Result<(), UnpackError> {
    let mut current = dir.to_path_buf();
    let mut parents = rel.components().peekable();
    while let Some(component) = parents.next() {
        if parents.peek().is_none() {
            break;
        }
        current.push(component);
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(refuse(
                    entry,
                    format!(
                        "it would be written through the symbolic link {}",
                        current.strip_prefix(dir).unwrap_or(&current).display()
                    ),
                ));
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(refuse(
                    entry,
                    format!(
                        "{} is not a directory",
                        current.strip_prefix(dir).unwrap_or(&current).display()
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => fs::create_dir(&current)?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Permission bits to give an unpacked file: the archive's, or 0644 when it has none.
fn file_mode(mode: Option<u32>) -> u32 {
    match mode.map(|m| m & 0o7777) {
        Some(0) | None => 0o644,
        Some(m) => m & 0o777,
    }
}

/// Write `reader` into a new file at `target` with `mode`, counting into `total`.
fn write_file(
    reader: &mut dyn Read,
    target: &Path,
    mode: u32,
    total: &mut u64,
    limits: &Limits,
) -> Result<(), UnpackError> {
    let mut output = File::create(target)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        *total += n as u64;
        if *total > limits.max_unpacked_bytes {
            return Err(UnpackError::TooLarge(limits.max_unpacked_bytes));
        }
        output.write_all(&buf[..n])?;
    }
    output.set_permissions(fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn make_dir(target: &Path, mode: Option<u32>) -> Result<(), UnpackError> {
    match fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => fs::remove_file(target).and_then(|()| fs::create_dir(target))?,
        Err(_) => fs::create_dir(target)?,
    }
    // The owner keeps full access so the rest of the archive can be written into it.
    let mode = mode.map_or(0o755, |m| (m & 0o777) | 0o700);
    fs::set_permissions(target, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn unpack_tar(reader: impl Read, dir: &Path, limits: &Limits) -> Result<(), UnpackError> {
    use tar::EntryType;
    let mut archive = tar::Archive::new(reader);
    let mut total = 0u64;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            continue;
        }
        let rel = checked_relative(&name)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        let mode = entry.header().mode().ok();
        match kind {
            EntryType::Directory => {
                let target = prepare_target(dir, &rel, &name)?;
                make_dir(&target, mode)?;
            }
            EntryType::Regular | EntryType::Continuous => {
                let target = prepare_target(dir, &rel, &name)?;
                write_file(&mut entry, &target, file_mode(mode), &mut total, limits)?;
            }
            EntryType::Symlink => {
                let link = entry
                    .link_name()?
                    .ok_or_else(|| refuse(&name, "a symbolic link without a target"))?
                    .into_owned();
                check_link_target(&name, &rel, &link)?;
                let target = prepare_target(dir, &rel, &name)?;
                if target.exists() {
                    fs::remove_file(&target)?;
                }
                std::os::unix::fs::symlink(&link, &target)?;
            }
            EntryType::Link => {
                let source = entry
                    .link_name()?
                    .ok_or_else(|| refuse(&name, "a hard link without a target"))?
                    .into_owned();
                let source_rel = checked_relative(&source).map_err(|_| {
                    refuse(
                        &name,
                        format!(
                            "the hard link to {} would leave the directory",
                            source.display()
                        ),
                    )
                })?;
                check_parents(dir, &source_rel, &name, false)?;
                let source_path = dir.join(&source_rel);
                let target = prepare_target(dir, &rel, &name)?;
                if target.exists() {
                    fs::remove_file(&target)?;
                }
                fs::hard_link(&source_path, &target).map_err(|e| {
                    refuse(&name, format!("hard link to {}: {e}", source.display()))
                })?;
            }
            other => {
                return Err(refuse(
                    &name,
                    format!("entries of type {other:?} (devices, FIFOs) are not allowed"),
                ));
            }
        }
    }
    Ok(())
}

fn unpack_zip(file: File, dir: &Path, limits: &Limits) -> Result<(), UnpackError> {
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(zip_error)?;
    let mut total = 0u64;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(zip_error)?;
        let name = PathBuf::from(entry.name().map_err(zip_error)?.into_owned());
        if name.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(refuse(&name, "a NUL byte in the name"));
        }
        let rel = checked_relative(&name)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        let mode = entry.unix_mode();
        if entry.is_dir() {
            let target = prepare_target(dir, &rel, &name)?;
            make_dir(&target, mode)?;
        } else if entry.is_symlink() {
            let mut link = String::new();
            entry.by_ref().take(4096).read_to_string(&mut link)?;
            let link = PathBuf::from(link);
            check_link_target(&name, &rel, &link)?;
            let target = prepare_target(dir, &rel, &name)?;
            if target.exists() {
                fs::remove_file(&target)?;
            }
            std::os::unix::fs::symlink(&link, &target)?;
        } else {
            let target = prepare_target(dir, &rel, &name)?;
            write_file(&mut entry, &target, file_mode(mode), &mut total, limits)?;
        }
    }
    Ok(())
}

fn zip_error(error: zip::result::ZipError) -> UnpackError {
    UnpackError::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        error.to_string(),
    ))
}

#[cfg(test)]
mod tests;
