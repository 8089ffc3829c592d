//! Docker engine helpers for tests of the docker runtime: is an engine there, the test
//! image, the containers a test's agent made.
//!
//! No image registry is reachable from the test machines, so the test image is built
//! locally: `docker import` of a tar holding a static busybox (Debian's `busybox-static`,
//! `/bin/busybox`) and symlinks for the few commands the tests use.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// The tag of the test image.
pub const TEST_IMAGE: &str = "rlark-test/busybox:1";
/// Where the static busybox comes from.
pub const BUSYBOX: &str = "/bin/busybox";
/// Commands linked to busybox in the image.
const APPLETS: &[&str] = &[
    "sh", "echo", "sleep", "cat", "env", "true", "false", "tty", "ls",
];

/// Why docker tests cannot run here (no `docker` client, no engine answering, no static
/// busybox), if anything.
pub fn engine_missing() -> Option<String> {
    match Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdin(Stdio::null())
        .output()
    {
        Err(error) => {
            return Some(format!(
                "the docker client cannot run ({error}; apt-get install docker.io)"
            ));
        }
        Ok(out) if !out.status.success() => {
            return Some(format!(
                "no Docker engine answers ({}; scripts/test.sh starts dockerd)",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(_) => {}
    }
    if !Path::new(BUSYBOX).is_file() {
        return Some(format!(
            "{BUSYBOX} is missing (apt-get install busybox-static)"
        ));
    }
    None
}

/// Build [`TEST_IMAGE`] unless the engine has it already (idempotent; concurrent calls
/// import the same content under the same tag).
pub fn ensure_test_image() -> anyhow::Result<()> {
    let present = Command::new("docker")
        .args(["image", "inspect", TEST_IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    let busybox = std::fs::read(BUSYBOX).with_context(|| format!("read {BUSYBOX}"))?;
    let mut archive = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    archive.append_data(&mut dir, "bin/", std::io::empty())?;
    let mut tmp = tar::Header::new_gnu();
    tmp.set_entry_type(tar::EntryType::Directory);
    tmp.set_mode(0o1777);
    tmp.set_size(0);
    archive.append_data(&mut tmp, "tmp/", std::io::empty())?;
    let mut file = tar::Header::new_gnu();
    file.set_mode(0o755);
    file.set_size(u64::try_from(busybox.len())?);
    archive.append_data(&mut file, "bin/busybox", busybox.as_slice())?;
    for applet in APPLETS {
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_mode(0o777);
        link.set_size(0);
        archive.append_link(&mut link, format!("bin/{applet}"), "busybox")?;
    }
    let bytes = archive.into_inner()?;
    let mut child = Command::new("docker")
        .args(["import", "-", TEST_IMAGE])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("run docker import")?;
    child
        .stdin
        .take()
        .context("docker import stdin")?
        .write_all(&bytes)?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "docker import of {TEST_IMAGE} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Ids of the containers (any state) carrying every label of `labels` (`key=value`).
pub fn containers_with(labels: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut command = Command::new("docker");
    command.args(["ps", "-aq", "--no-trunc"]);
    for label in labels {
        command.arg("--filter").arg(format!("label={label}"));
    }
    let out = command.output().context("run docker ps")?;
    if !out.status.success() {
        bail!(
            "docker ps failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect())
}

/// Remove the containers carrying every label of `labels` (a test's leftovers).
pub fn remove_containers_with(labels: &[&str]) {
    if let Ok(ids) = containers_with(labels)
        && !ids.is_empty()
    {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
