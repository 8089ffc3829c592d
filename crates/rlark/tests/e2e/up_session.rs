//! `rlark up` as a local session (the built binary, real processes): its tasks stop when it
//! exits unless `--keep-tasks`; a second `up` on the same data directory is refused at once
//! naming the first one's pid; a taken port names the flag that picks another and leaves no
//! data directory behind.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::up::{BIN, Up, wait_for};

/// Pids of the processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let mut cmdline = Vec::new();
        if std::fs::File::open(entry.path().join("cmdline"))
            .and_then(|mut f| f.read_to_end(&mut cmdline))
            .is_ok()
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            pids.push(pid);
        }
    }
    pids
}

/// Apply a Job with one long-running raw replica on `cloud` whose command line carries
/// `marker`, and wait until that process runs.
fn run_sleeper(up: &Up, dir: &Path, marker: &str) {
    let manifest = dir.join("sleeper.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata:\n  name: sleeper\nspec:\n  \
             tasks:\n    - name: main\n      agentType: Raw\n      role: Actor\n      \
             nodeSelector:\n        rlark.io/cluster-id: cloud\n      raw:\n        \
             replicas: 1\n        entrypoint: [sh, -c, 'sleep 300; : {marker}']\n"
        ),
    )
    .expect("write manifest");
    let out = up.rlark(&["apply", "-f", manifest.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the sleeper to run", || !processes_with(marker).is_empty());
}

#[test]
fn up_stops_its_tasks_on_exit_unless_keep_tasks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");

    let up = Up::start(&data, &[]);
    assert!(
        up.output().contains(
            "Tasks:              stop when rlark up exits (--keep-tasks leaves them running)"
        ),
        "{}",
        up.output()
    );
    let marker = format!("rlark-up-session-{}", std::process::id());
    run_sleeper(&up, dir.path(), &marker);
    assert!(up.interrupt().success());
    assert_eq!(
        processes_with(&marker),
        Vec::<i32>::new(),
        "task left running"
    );

    // --keep-tasks: the process outlives `up`, and the next `up` adopts it (it still runs
    // and the Task is Running again).
    let up = Up::start(&data, &["--keep-tasks"]);
    assert!(
        up.output()
            .contains("(--keep-tasks); the next rlark up adopts them")
    );
    let kept = format!("rlark-up-kept-{}", std::process::id());
    let out = up.rlark(&["delete", "job", "sleeper"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the old Job's Task to go", || {
        !up.rlark(&["get", "task", "sleeper-main", "-n", "rlark-cloud"])
            .status
            .success()
    });
    run_sleeper(&up, dir.path(), &kept);
    let before = processes_with(&kept);
    assert!(up.interrupt().success());
    assert_eq!(
        processes_with(&kept),
        before,
        "--keep-tasks stopped the task"
    );

    let up = Up::start(&data, &[]);
    wait_for("the adopted Task to be Running", || {
        let out = up.rlark(&[
            "get",
            "task",
            "sleeper-main",
            "-n",
            "rlark-cloud",
            "-o",
            "json",
        ]);
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .map(|t| t["status"]["phase"] == "Running")
                .unwrap_or(false)
    });
    assert_eq!(processes_with(&kept), before, "adoption restarted the task");
    assert!(up.interrupt().success());
    assert_eq!(
        processes_with(&kept),
        Vec::<i32>::new(),
        "adopted task left running"
    );
}

#[test]
fn a_second_up_on_the_same_data_directory_names_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let up = Up::start(&data, &[]);
    let second = Command::new(BIN)
        .arg("up")
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "off")
        .output()
        .expect("run a second rlark up");
    assert_eq!(second.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&second.stderr).trim(),
        format!(
            "error: another rlark is using {} (pid {})",
            data.display(),
            up.child.id()
        )
    );
    assert!(up.interrupt().success());
}

#[test]
fn a_taken_port_names_the_flag_and_leaves_no_data_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .arg("up")
        .arg("--data-dir")
        .arg(&data)
        .arg("--listen")
        .arg(addr.to_string())
        .env("RUST_LOG", "off")
        .output()
        .expect("run rlark up");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: {addr} is already in use (another rlark up, or another program): pick \
             another address with --listen, e.g. --listen 127.0.0.1:"
        )),
        "{stderr}"
    );
    assert!(
        !data.exists(),
        "a half-created data directory was left behind"
    );
}

#[test]
fn version_reports_the_build_of_client_and_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let up = Up::start(&dir.path().join("data"), &[]);
    let out = up.rlark(&["version", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let (client, server) = (&doc["clientVersion"], &doc["serverVersion"]);
    assert_eq!(
        client["gitVersion"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        server["gitVersion"],
        format!("v1.33.0+rlark-{}", env!("CARGO_PKG_VERSION"))
    );
    // The tests run from a git checkout: the build knows its commit and the commit's date,
    // and the server in the same binary reports the same.
    let commit = client["gitCommit"].as_str().expect("commit");
    assert_eq!(commit.len(), 40, "{doc}");
    assert_eq!(server["gitCommit"], commit);
    assert_ne!(client["buildDate"], "1970-01-01T00:00:00Z");
    assert_eq!(server["buildDate"], client["buildDate"]);

    let out = up.rlark(&["version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let short = &commit[..12];
    assert!(
        text.starts_with(&format!(
            "Client Version: v{} (commit {short}, built ",
            env!("CARGO_PKG_VERSION")
        )) && text.contains(&format!(
            "Server Version: v1.33.0+rlark-{} (commit {short}, built ",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    assert!(up.interrupt().success());
}

/// Issue 38 ("the agent's and the server's key files are 0600 and owned by a user no task
/// runs as"): after a real `rlark up` in a data directory made beforehand with the usual
/// mode 0755, every private file — the CA, admin and SSH keys, the SSH host key, the
/// agents' keys and kubeconfigs, the store (Secrets, Jobs' env, token records) with its
/// WAL, the audit log — is 0600 and every directory holding one 0700, all owned by this
/// process's user (root for a real installation). Before the fix the existing directory
/// stayed 0755 and the store was 0644.
#[test]
fn key_files_and_their_directories_are_private() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let up = Up::start(&data, &[]);
    let me = std::fs::metadata("/proc/self").expect("me").uid();
    let mode = |path: &Path| {
        let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(meta.uid(), me, "owner of {}", path.display());
        meta.permissions().mode() & 0o777
    };
    let mut private_dirs = vec![data.clone(), data.join("pki"), data.join("agents")];
    let mut private_files: Vec<PathBuf> = [
        "pki/ca.key",
        "pki/ca.crt",
        "pki/admin.key",
        "pki/ssh_ca",
        "pki/ssh_host_ed25519_key",
        "admin.kubeconfig",
        "audit.log",
        "rlark.db",
    ]
    .iter()
    .map(|f| data.join(f))
    .collect();
    for agent in ["cloud", "edge"] {
        let agent_dir = data.join("agents").join(agent);
        private_dirs.push(agent_dir.clone());
        private_dirs.push(agent_dir.join("identity"));
        for file in ["agent.pem", "agent.kubeconfig", "agent.json"] {
            private_files.push(agent_dir.join("identity").join(file));
        }
    }
    let wal = data.join("rlark.db-wal");
    if wal.exists() {
        private_files.push(wal);
    }
    for path in &private_dirs {
        assert_eq!(mode(path), 0o700, "{}", path.display());
    }
    for path in &private_files {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    // Whatever else sits in pki/ or an identity directory is private too, but for CA
    // certificates (an agent's `ca.crt` is 0644: isolated replicas verify the server with it).
    for dir in private_dirs
        .iter()
        .filter(|d| d.ends_with("pki") || d.ends_with("identity"))
    {
        for entry in std::fs::read_dir(dir).expect("list").flatten() {
            let path = entry.path();
            let mode = mode(&path);
            if path.extension().is_some_and(|e| e == "crt") {
                assert_eq!(mode & 0o022, 0, "{}", path.display());
            } else {
                assert_eq!(mode & 0o077, 0, "{}", path.display());
            }
        }
    }
    assert!(up.interrupt().success());
}
