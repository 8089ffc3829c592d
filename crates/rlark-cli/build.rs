//! Build information for `rlark version` and the API server's `/version`: the git commit
//! of the source tree and a build date. Whether the tree had uncommitted changes is not
//! recorded: knowing it would mean watching the index, which `git status` itself rewrites,
//! so the build script would run on every build.
//!
//! The date is `SOURCE_DATE_EPOCH` when set (reproducible builds), else the commit's own
//! date, never the wall clock: two builds of one commit report the same. Outside a git
//! checkout (a source tarball) the commit is empty and `RLARK_GIT_COMMIT` may give it.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo:rerun-if-env-changed=RLARK_GIT_COMMIT");
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it points to (a commit)
    // and packed-refs (a gc).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
            let common = PathBuf::from(common);
            println!(
                "cargo:rerun-if-changed={}",
                common.join("packed-refs").display()
            );
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={}", common.join(branch).display());
            }
        }
    }
    let commit = std::env::var("RLARK_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_default();
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .or_else(|| git(&["log", "-1", "--format=%ct"]).and_then(|s| s.parse().ok()))
        .unwrap_or(0);
    println!("cargo:rustc-env=RLARK_BUILD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=RLARK_BUILD_EPOCH={epoch}");
}
