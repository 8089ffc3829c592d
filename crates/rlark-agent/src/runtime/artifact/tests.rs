use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use super::*;

const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What the test server answers on one path.
#[derive(Clone)]
enum Route {
    /// 200 with this body and a Content-Length.
    Body(Vec<u8>),
    /// 200 with this body, no Content-Length: the end is the connection's close.
    Unsized(Vec<u8>),
    /// 302 to this location.
    Redirect(String),
    /// The response head, then nothing for this long.
    Stall(Duration),
}

/// A minimal HTTP/1.1 server on 127.0.0.1 that counts the requests of every path; a path
/// without a route gets a 404.
struct TestServer {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(routes: Vec<(&str, Route)>) -> TestServer {
        let routes: Arc<HashMap<String, Route>> = Arc::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_string(), r))
                .collect(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hits, stop) = (Arc::clone(&hits), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (routes, hits) = (Arc::clone(&routes), Arc::clone(&hits));
                    std::thread::spawn(move || serve(stream, &routes, &hits));
                }
            })
        };
        TestServer {
            addr,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(stream: TcpStream, routes: &HashMap<String, Route>, hits: &Mutex<HashMap<String, usize>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // Headers, up to the blank line (bounded).
    for _ in 0..100 {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    *hits.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
    let mut out = stream;
    let _ = match routes.get(&path) {
        Some(Route::Body(body)) => out
            .write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .and_then(|()| out.write_all(body)),
        Some(Route::Unsized(body)) => out
            .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            .and_then(|()| out.write_all(body)),
        Some(Route::Redirect(to)) => out.write_all(
            format!(
                "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        ),
        Some(Route::Stall(pause)) => {
            let head = out.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n",
            );
            std::thread::sleep(*pause);
            head
        }
        None => out.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
        ),
    };
}

/// A tar.gz with a directory, an executable script, a data file and a symlink inside.
fn good_tar_gz() -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    builder
        .append_data(&mut dir, "bin/", io::empty())
        .expect("dir");
    for (path, mode, body) in [
        ("bin/run.sh", 0o755, &b"#!/bin/sh\necho ran\n"[..]),
        ("data/config.txt", 0o644, &b"answer=42\n"[..]),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_size(body.len() as u64);
        builder.append_data(&mut header, path, body).expect("file");
    }
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    builder
        .append_link(&mut link, "bin/config", "../data/config.txt")
        .expect("link");
    let mut hard = tar::Header::new_gnu();
    hard.set_entry_type(tar::EntryType::Link);
    hard.set_size(0);
    builder
        .append_link(&mut hard, "bin/again.sh", "bin/run.sh")
        .expect("hard link");
    builder.into_inner().expect("tar").finish().expect("gzip")
}

/// A plain tar with one entry whose raw header says `name` (no validation by the builder),
/// of type `kind`, with `link` as its link target.
fn raw_tar(name: &str, kind: tar::EntryType, link: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    {
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
    }
    if let Some(link) = link {
        header.set_link_name_literal(link).expect("link name");
    }
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(body.len() as u64);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, body).expect("append");
    builder.into_inner().expect("tar")
}

fn zip_of(entries: &[(&str, u32, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
    for (name, mode, body) in entries {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(*mode);
        writer.start_file(*name, options).expect("start");
        writer.write_all(body).expect("write");
    }
    for (name, target) in links {
        writer
            .add_symlink(*name, *target, zip::write::SimpleFileOptions::default())
            .expect("symlink");
    }
    writer.finish().expect("zip").into_inner()
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

fn message(error: &RuntimeError) -> String {
    error.to_string()
}

#[test]
fn file_urls_are_copied_and_checked() {
    let src = tempfile::tempdir().expect("tempdir");
    let dst = tempfile::tempdir().expect("tempdir");
    let file = src.path().join("model.bin");
    fs::write(&file, "hello").expect("write");
    let url = format!("file://{}", file.display());

    let copy = fetch(&url, Some(&HELLO_SHA256.to_uppercase()), None, dst.path()).expect("fetch");
    assert_eq!(copy, dst.path().join("model.bin"));
    assert_eq!(fs::read_to_string(&copy).expect("read"), "hello");
    fs::remove_file(&copy).expect("remove");
    fetch(&url, None, None, dst.path()).expect("no checksum given");

    let wrong = "0".repeat(64);
    fs::remove_file(&copy).expect("remove");
    match fetch(&url, Some(&wrong), None, dst.path()) {
        Err(e @ RuntimeError::ArtifactChecksumMismatch { .. }) => {
            let message = e.to_string();
            assert!(message.contains(&wrong) && message.contains(HELLO_SHA256));
            assert_eq!(e.reason(), "ArtifactChecksumMismatch");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert!(!copy.exists(), "nothing is placed when the digest differs");
}

#[test]
fn file_url_archives_are_unpacked() {
    let src = tempfile::tempdir().expect("tempdir");
    let dst = tempfile::tempdir().expect("tempdir");
    let archive = src.path().join("app.tgz");
    fs::write(&archive, good_tar_gz()).expect("write");
    let url = format!("file://{}", archive.display());
    let placed = fetch(&url, None, None, dst.path()).expect("fetch");
    assert_eq!(placed, dst.path());
    assert_eq!(mode_of(&dst.path().join("bin/run.sh")), 0o755);
    assert!(
        !dst.path().join("app.tgz").exists(),
        "the archive itself is not copied"
    );
}

#[test]
fn other_urls_fail_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = fetch("s3://bucket/a", None, None, dir.path()).expect_err("s3");
    assert!(message(&err).contains("unsupported URL scheme"), "{err}");
    assert_eq!(err.reason(), "ArtifactError");
    let err = fetch("file:///nonexistent/a", None, None, dir.path()).expect_err("missing");
    assert!(message(&err).contains("/nonexistent/a"), "{err}");
    let err = fetch("file:///x", Some("abc"), None, dir.path()).expect_err("bad digest");
    assert!(message(&err).contains("64 hexadecimal"), "{err}");
    let err = fetch("http://[::1", None, None, dir.path()).expect_err("bad URL");
    assert!(message(&err).contains("not a valid URL"), "{err}");
}

#[test]
fn checked_downloads_are_cached_by_digest() {
    let body = b"#!/bin/sh\necho cached\n".to_vec();
    let digest = sha256_hex(&body);
    let server = TestServer::start(vec![
        ("/v1/run.sh", Route::Body(body.clone())),
        ("/mirror/run.sh", Route::Body(body.clone())),
    ]);
    let cache = tempfile::tempdir().expect("cache");
    let url = server.url("/v1/run.sh");
    for _ in 0..2 {
        let work = tempfile::tempdir().expect("work");
        let placed = fetch(&url, Some(&digest), Some(cache.path()), work.path()).expect("fetch");
        assert_eq!(placed, work.path().join("run.sh"));
        assert_eq!(fs::read(&placed).expect("read"), body);
    }
    assert_eq!(
        server.hits("/v1/run.sh"),
        1,
        "the second fetch uses the cache"
    );
    let cached = cache.path().join(CACHE_DIGEST_DIR).join(&digest);
    assert_eq!(fs::read(&cached).expect("cached file"), body);
    let leftovers: Vec<_> = fs::read_dir(cache.path().join(CACHE_DIGEST_DIR))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        leftovers,
        [std::ffi::OsString::from(&digest)],
        "no temporary files"
    );

    // The cache is keyed by digest: another URL with the same digest is not downloaded.
    let work = tempfile::tempdir().expect("work");
    fetch(
        &server.url("/mirror/run.sh"),
        Some(&digest.to_uppercase()),
        Some(cache.path()),
        work.path(),
    )
    .expect("mirror");
    assert_eq!(server.hits("/mirror/run.sh"), 0);

    // Without a digest nothing is cached: every fetch downloads.
    for _ in 0..2 {
        let work = tempfile::tempdir().expect("work");
        fetch(&url, None, Some(cache.path()), work.path()).expect("unchecked");
        let names: Vec<_> = fs::read_dir(work.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            [std::ffi::OsString::from("run.sh")],
            "no temporary files"
        );
    }
    assert_eq!(server.hits("/v1/run.sh"), 3);
}

#[test]
fn replicas_fetching_one_digest_at_once_download_it_once() {
    let body = vec![7u8; 256 * 1024];
    let digest = sha256_hex(&body);
    let server = TestServer::start(vec![("/big.bin", Route::Body(body.clone()))]);
    let cache = tempfile::tempdir().expect("cache");
    let url = server.url("/big.bin");
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (url, digest, cache) = (url.clone(), digest.clone(), cache.path().to_path_buf());
            std::thread::spawn(move || {
                let work = tempfile::tempdir().expect("work");
                let placed = fetch(&url, Some(&digest), Some(&cache), work.path())?;
                Ok::<_, RuntimeError>(fs::read(placed).expect("read").len())
            })
        })
        .collect();
    for worker in workers {
        assert_eq!(worker.join().expect("thread").expect("fetch"), body.len());
    }
    assert_eq!(server.hits("/big.bin"), 1);
}

#[test]
fn a_download_with_the_wrong_digest_is_refused_and_not_cached() {
    let server = TestServer::start(vec![("/a.tar.gz", Route::Body(b"hello".to_vec()))]);
    let cache = tempfile::tempdir().expect("cache");
    let work = tempfile::tempdir().expect("work");
    let wrong = "f".repeat(64);
    let url = server.url("/a.tar.gz");
    for cache in [Some(cache.path()), None] {
        let err = fetch(&url, Some(&wrong), cache, work.path()).expect_err("mismatch");
        match &err {
            RuntimeError::ArtifactChecksumMismatch {
                url: u,
                expected,
                actual,
            } => {
                assert_eq!(u, &url);
                assert_eq!(expected, &wrong);
                assert_eq!(actual, HELLO_SHA256);
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        assert!(message(&err).contains(&url), "{err}");
    }
    let digest_dir = cache.path().join(CACHE_DIGEST_DIR);
    assert_eq!(fs::read_dir(&digest_dir).expect("list").count(), 0);
    assert_eq!(fs::read_dir(work.path()).expect("list").count(), 0);
}

#[test]
fn redirects_are_followed_up_to_the_limit() {
    let archive = good_tar_gz();
    let mut routes = vec![("/app.tar.gz", Route::Body(archive.clone()))];
    let names: Vec<String> = (0..7).map(|i| format!("/r{i}")).collect();
    routes.push((names[0].as_str(), Route::Redirect("/app.tar.gz".into())));
    for i in 1..7 {
        routes.push((names[i].as_str(), Route::Redirect(names[i - 1].clone())));
    }
    let server = TestServer::start(routes);
    let work = tempfile::tempdir().expect("work");
    // Five redirects are followed. The name comes from the URL asked for (`r4`, without an
    // extension), so the archive is recognised by its bytes.
    let placed = fetch(&server.url("/r4"), None, None, work.path()).expect("5 redirects");
    assert_eq!(placed, work.path(), "unpacked: recognised by its bytes");
    assert_eq!(mode_of(&work.path().join("bin/run.sh")), 0o755);
    assert_eq!(server.hits("/app.tar.gz"), 1);

    let err = fetch(&server.url("/r5"), None, None, work.path()).expect_err("6 redirects");
    assert!(message(&err).contains("more than 5 redirects"), "{err}");
    assert_eq!(err.reason(), "ArtifactError");
}

#[test]
fn http_failures_name_the_cause() {
    let server = TestServer::start(vec![("/stall.bin", Route::Stall(Duration::from_secs(3)))]);
    let work = tempfile::tempdir().expect("work");
    let url = server.url("/missing.tar.gz");
    let err = fetch(&url, None, None, work.path()).expect_err("404");
    let text = message(&err);
    assert!(
        text.contains(&url) && text.contains("HTTP 404 Not Found"),
        "{text}"
    );

    let limits = Limits {
        read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let err = fetch_with(&server.url("/stall.bin"), None, None, work.path(), &limits)
        .expect_err("stalled body");
    assert!(message(&err).contains("download failed"), "{err}");

    // Nothing listens on a port just released.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let url = format!("http://127.0.0.1:{port}/a.zip");
    let err = fetch(&url, None, None, work.path()).expect_err("refused");
    let text = message(&err);
    assert!(
        text.contains(&url) && text.contains("download failed"),
        "{text}"
    );
    assert_eq!(
        fs::read_dir(work.path()).expect("list").count(),
        0,
        "no leftovers"
    );
}

#[test]
fn downloads_over_the_size_limit_are_refused() {
    let body = vec![1u8; 4096];
    let server = TestServer::start(vec![
        ("/sized.bin", Route::Body(body.clone())),
        ("/unsized.bin", Route::Unsized(body.clone())),
    ]);
    let limits = Limits {
        max_download_bytes: 1000,
        ..Limits::default()
    };
    let cache = tempfile::tempdir().expect("cache");
    let work = tempfile::tempdir().expect("work");
    let digest = sha256_hex(&body);
    let err = fetch_with(
        &server.url("/sized.bin"),
        Some(&digest),
        Some(cache.path()),
        work.path(),
        &limits,
    )
    .expect_err("sized");
    let text = message(&err);
    assert!(
        text.contains("larger than the limit of 1000 bytes")
            && text.contains("Content-Length 4096"),
        "{text}"
    );
    let err = fetch_with(
        &server.url("/unsized.bin"),
        None,
        None,
        work.path(),
        &limits,
    )
    .expect_err("unsized");
    assert!(
        message(&err).contains("larger than the limit of 1000 bytes"),
        "{err}"
    );
    assert_eq!(
        fs::read_dir(work.path()).expect("list").count(),
        0,
        "no leftovers"
    );
    // Within the limit it works.
    fetch(
        &server.url("/unsized.bin"),
        Some(&digest),
        None,
        work.path(),
    )
    .expect("default limit");
}

#[test]
fn tar_gz_and_zip_archives_are_unpacked_with_their_modes() {
    let zip = zip_of(
        &[
            ("tool/run.sh", 0o755, b"#!/bin/sh\necho zipped\n"),
            ("tool/readme.txt", 0o644, b"read me"),
        ],
        &[("tool/start", "run.sh")],
    );
    let server = TestServer::start(vec![
        ("/app.tar.gz", Route::Body(good_tar_gz())),
        ("/tool.zip", Route::Body(zip)),
    ]);
    let work = tempfile::tempdir().expect("work");
    fetch(&server.url("/app.tar.gz"), None, None, work.path()).expect("tar.gz");
    let w = work.path();
    assert_eq!(mode_of(&w.join("bin/run.sh")), 0o755);
    assert_eq!(mode_of(&w.join("data/config.txt")), 0o644);
    assert_eq!(
        fs::read_to_string(w.join("bin/config")).expect("via link"),
        "answer=42\n"
    );
    assert_eq!(
        fs::read(w.join("bin/again.sh")).expect("hard link"),
        fs::read(w.join("bin/run.sh")).expect("script")
    );

    fetch(&server.url("/tool.zip"), None, None, w).expect("zip");
    assert_eq!(mode_of(&w.join("tool/run.sh")), 0o755);
    assert_eq!(mode_of(&w.join("tool/readme.txt")), 0o644);
    assert_eq!(
        fs::read_link(w.join("tool/start")).expect("link"),
        Path::new("run.sh")
    );
    // The unpacked script runs.
    let out = std::process::Command::new(w.join("tool/run.sh"))
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "zipped\n");
}

#[test]
fn names_decide_and_bytes_decide_only_without_an_extension() {
    let zip = zip_of(&[("inside.txt", 0o644, b"x")], &[]);
    let server = TestServer::start(vec![
        ("/download", Route::Body(zip.clone())),
        ("/model.whl", Route::Body(zip)),
        ("/blob", Route::Body(b"just bytes".to_vec())),
        ("/fake.zip", Route::Body(b"not a zip".to_vec())),
        ("/dir/", Route::Body(b"no name".to_vec())),
        ("/a%20b.txt", Route::Body(b"spaced".to_vec())),
    ]);
    let work = tempfile::tempdir().expect("work");
    let w = work.path();
    assert_eq!(
        fetch(&server.url("/download"), None, None, w).expect("sniffed"),
        w
    );
    assert!(w.join("inside.txt").is_file());
    assert_eq!(
        fetch(&server.url("/model.whl"), None, None, w).expect("wheel"),
        w.join("model.whl"),
        "a zip under another extension is a file"
    );
    assert_eq!(
        fetch(&server.url("/blob"), None, None, w).expect("blob"),
        w.join("blob")
    );
    assert_eq!(
        fetch(&server.url("/dir/"), None, None, w).expect("no name"),
        w.join("artifact")
    );
    assert_eq!(
        fetch(&server.url("/a%20b.txt"), None, None, w).expect("decoded"),
        w.join("a b.txt")
    );
    let err = fetch(&server.url("/fake.zip"), None, None, w).expect_err("fake zip");
    assert!(
        message(&err).contains("unpack fake.zip (a zip archive)"),
        "{err}"
    );
}

#[test]
fn archives_cannot_write_outside_the_directory() {
    use tar::EntryType::{Regular, Symlink};
    let mut tricky_links = tar::Builder::new(Vec::new());
    // `deep/l` points two levels up (to the root: allowed); writing through it is not.
    for (name, kind, link) in [
        ("deep/", tar::EntryType::Directory, None),
        ("deep/l", Symlink, Some("..")),
        ("deep/l/x", Regular, None),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(0o755);
        header.set_size(0);
        match link {
            Some(link) => tricky_links
                .append_link(&mut header, name, link)
                .expect("link"),
            None => tricky_links
                .append_data(&mut header, name, io::empty())
                .expect("entry"),
        }
    }
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot.tar",
            raw_tar("../evil.txt", Regular, None, b"x"),
            "\"../evil.txt\": a path with '..'",
        ),
        (
            "nested.tar",
            raw_tar("a/../../evil.txt", Regular, None, b"x"),
            "\"a/../../evil.txt\": a path with '..'",
        ),
        (
            "abs.tar",
            raw_tar("/tmp/evil.txt", Regular, None, b"x"),
            "\"/tmp/evil.txt\": absolute paths",
        ),
        (
            "up.tar",
            raw_tar("link", Symlink, Some("../outside"), b""),
            "\"link\": the symbolic link to ../outside would leave",
        ),
        (
            "root.tar",
            raw_tar("etc", Symlink, Some("/etc"), b""),
            "\"etc\": the symbolic link to the absolute path /etc",
        ),
        (
            "hard.tar",
            raw_tar("h", tar::EntryType::Link, Some("../../etc/passwd"), b""),
            "\"h\": the hard link to ../../etc/passwd would leave",
        ),
        (
            "fifo.tar",
            raw_tar("pipe", tar::EntryType::Fifo, None, b""),
            "\"pipe\": entries of type Fifo",
        ),
        (
            "through.tar",
            tricky_links.into_inner().expect("tar"),
            "\"deep/l/x\": it would be written through the symbolic link deep/l",
        ),
        (
            "zipdot.zip",
            zip_of(&[("../evil.txt", 0o644, b"x")], &[]),
            "\"../evil.txt\": a path with '..'",
        ),
        (
            "ziplink.zip",
            zip_of(&[], &[("l", "../../outside")]),
            "\"l\": the symbolic link to ../../outside would leave",
        ),
    ];
    let routes: Vec<(String, Route)> = cases
        .iter()
        .map(|(name, body, _)| (format!("/{name}"), Route::Body(body.clone())))
        .collect();
    let server = TestServer::start(
        routes
            .iter()
            .map(|(p, r)| (p.as_str(), r.clone()))
            .collect(),
    );
    let outer = tempfile::tempdir().expect("outer");
    for (name, _, expected) in &cases {
        let work = outer.path().join(name.replace('.', "-")).join("work");
        fs::create_dir_all(&work).expect("mkdir");
        let err = fetch(&server.url(&format!("/{name}")), None, None, &work).expect_err(name);
        assert_eq!(err.reason(), "ArtifactError", "{name}");
        assert!(message(&err).contains(expected), "{name}: {err}");
        // Nothing escaped: the work dir's parent holds only the work dir.
        let parent = work.parent().expect("parent");
        assert_eq!(fs::read_dir(parent).expect("list").count(), 1, "{name}");
    }
}

#[test]
fn unpacking_stops_at_the_size_limit() {
    let mut builder = tar::Builder::new(Vec::new());
    for i in 0..4 {
        let body = vec![0u8; 600];
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(body.len() as u64);
        builder
            .append_data(&mut header, format!("f{i}"), body.as_slice())
            .expect("append");
    }
    let server = TestServer::start(vec![(
        "/big.tar",
        Route::Body(builder.into_inner().expect("tar")),
    )]);
    let limits = Limits {
        max_unpacked_bytes: 1500,
        ..Limits::default()
    };
    let work = tempfile::tempdir().expect("work");
    let err = fetch_with(&server.url("/big.tar"), None, None, work.path(), &limits)
        .expect_err("too large");
    assert!(
        message(&err).contains("more than the limit of 1500 bytes"),
        "{err}"
    );
}
