//! The web console's committed build (`web/dist/`, embedded in the binary) is current: its
//! `source-hash.txt` names the SHA-256 of the sources it was built from, computed here the
//! same way as `web/scripts/stamp.mjs` does. After changing anything under `web/` (sources,
//! dependencies, build configuration), run `npm run build` in `web/` and commit `web/dist/`.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Keep in step with INPUTS in web/scripts/stamp.mjs.
const INPUTS: &[&str] = &[
    "index.html",
    "package-lock.json",
    "package.json",
    "public",
    "src",
    "tsconfig.json",
    "vite.config.ts",
];

fn web() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web")
}

fn files(root: &Path, rel: &str, out: &mut Vec<String>) {
    let full = root.join(rel);
    if full.is_dir() {
        for entry in std::fs::read_dir(&full).expect("read web dir") {
            let name = entry.expect("dir entry").file_name();
            files(root, &format!("{rel}/{}", name.to_string_lossy()), out);
        }
    } else {
        out.push(rel.to_string());
    }
}

fn source_hash(root: &Path) -> String {
    let mut all = Vec::new();
    for input in INPUTS {
        files(root, input, &mut all);
    }
    all.sort();
    let mut hash = Sha256::new();
    for path in &all {
        hash.update(path.as_bytes());
        hash.update([0]);
        hash.update(std::fs::read(root.join(path)).expect("read web source"));
        hash.update([0]);
    }
    hex::encode(hash.finalize())
}

#[test]
fn console_build_is_current() {
    let root = web();
    let recorded = std::fs::read_to_string(root.join("dist/source-hash.txt"))
        .expect("web/dist/source-hash.txt: build the console with `npm run build` in web/");
    let current = source_hash(&root);
    assert_eq!(
        recorded.trim(),
        current,
        "web/dist was built from other sources than web/ holds now: run `npm ci && npm run build` in web/ and commit web/dist"
    );
    // The page the server embeds is there and loads its script from /assets/.
    let index = std::fs::read_to_string(root.join("dist/index.html")).expect("web/dist/index.html");
    assert!(index.contains("src=\"/assets/"), "{index}");
}
