//! Embeds the web console's built assets (`web/dist/`, committed to the repository) into the
//! binary: writes `$OUT_DIR/console_assets.rs`, a table of `(path, content type, bytes)`
//! that `src/console/assets.rs` includes. No Node is needed to build rlark.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dist = manifest.join("../../web/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.is_dir() {
        collect(&dist, &dist, &mut files);
    }
    files.sort();
    let mut out = String::from("&[\n");
    for (rel, abs) in &files {
        println!("cargo:rerun-if-changed={}", abs.display());
        writeln!(
            out,
            "    ({:?}, {:?}, include_bytes!({:?}) as &[u8]),",
            format!("/{rel}"),
            content_type(rel),
            abs.display().to_string()
        )
        .expect("write to a String");
    }
    out.push(']');
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("console_assets.rs"), out).expect("write console_assets.rs");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let entries = std::fs::read_dir(dir).expect("read web/dist");
    for entry in entries {
        let path = entry.expect("read web/dist entry").path();
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(root, &path, files);
        } else {
            let rel = path
                .strip_prefix(root)
                .expect("under web/dist")
                .to_string_lossy()
                .replace('\\', "/");
            files.push((rel, path));
        }
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}
