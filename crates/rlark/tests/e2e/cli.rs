//! The `rlark` binary itself: help, usage errors, config errors, `crds`, `kubeconfig`, and
//! `rlark server` as a real process that shuts down cleanly on SIGTERM.

use std::path::Path;
use std::process::{Command, Output};

use anyhow::Context as _;
use rlark_testkit::ServerProcess;

fn rlark() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlark"));
    // Keep client commands from picking up the developer's kubeconfig.
    cmd.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    cmd
}

fn run(args: &[&str]) -> anyhow::Result<Output> {
    rlark()
        .args(args)
        .output()
        .with_context(|| format!("run rlark {args:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_lists_the_subcommands() -> anyhow::Result<()> {
    let out = run(&["--help"])?;
    assert!(out.status.success());
    let help = text(&out.stdout);
    for cmd in [
        "server",
        "up",
        "kubeconfig",
        "crds",
        "apply",
        "get",
        "delete",
    ] {
        assert!(help.contains(cmd), "--help misses {cmd}:\n{help}");
    }
    let out = run(&["server", "--help"])?;
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--data-dir",
        "--listen",
        "--tls-san",
        "--config",
        "--log-format",
        "--reinitialize-store",
        "--max-connections",
        "--max-connections-per-ip",
        "--reserved-connections",
        "--header-read-timeout",
        "--idle-timeout",
    ] {
        assert!(help.contains(flag), "server --help misses {flag}:\n{help}");
    }
    Ok(())
}

#[test]
fn usage_errors_exit_2_and_name_the_flag() -> anyhow::Result<()> {
    let out = run(&["server", "--data-dri", "/tmp/x"])?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--data-dri"), "{stderr}");

    let out = run(&["server", "--data-dir", "/tmp/x", "--listen", "nowhere"])?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--listen"), "{stderr}");

    let out = run(&["frobnicate"])?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

#[test]
fn bad_config_files_fail_with_exit_1_naming_the_field() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("rlark.yaml");

    std::fs::write(&config, "dataDir: /tmp/never\nlistn: 127.0.0.1:0\n")?;
    let out = run(&["server", "--config", &config.display().to_string()])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("listn"), "{stderr}");
    assert!(stderr.contains("rlark.yaml"), "{stderr}");

    let data_dir = dir.path().join("data");
    std::fs::write(
        &config,
        format!("dataDir: {}\ntlsSans: [\"bad name\"]\n", data_dir.display()),
    )?;
    let out = run(&["server", "--config", &config.display().to_string()])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("tlsSans[0]"), "{stderr}");
    // Validated before anything was created.
    assert!(!data_dir.exists());

    // Connection limits: flags are validated like the file, naming the field.
    let out = run(&[
        "server",
        "--data-dir",
        &data_dir.display().to_string(),
        "--max-connections-per-ip",
        "0",
    ])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("connections.maxConnectionsPerIP"),
        "{stderr}"
    );
    assert!(!data_dir.exists());

    let out = run(&["server"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--data-dir"));
    Ok(())
}

#[test]
fn crds_prints_custom_resource_definitions() -> anyhow::Result<()> {
    let out = run(&["crds"])?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let yaml = text(&out.stdout);
    assert!(yaml.contains("kind: CustomResourceDefinition"), "{yaml}");
    assert!(yaml.contains("jobs.rlinf.io"), "{yaml}");
    Ok(())
}

#[test]
fn server_process_serves_and_exits_0_on_sigterm() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let server = ServerProcess::spawn(binary, dir.path())?;
    assert_eq!(server.probe("/healthz")?, (200, "ok".to_string()));
    assert_eq!(server.probe("/metrics")?.0, 401);

    // `rlark kubeconfig` prints the file the server wrote.
    let data_dir = dir.path().display().to_string();
    let out = run(&["kubeconfig", "--data-dir", &data_dir])?;
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout),
        std::fs::read_to_string(server.kubeconfig_path())?
    );
    let out = run(&["kubeconfig", "--data-dir", &data_dir, "--path"])?;
    assert_eq!(
        Path::new(text(&out.stdout).trim()),
        std::path::absolute(server.kubeconfig_path())?
    );

    let log_path = server.log_path().to_path_buf();
    let status = server.terminate()?;
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log_path)?
    );
    let log = std::fs::read_to_string(&log_path)?;
    assert!(log.contains("listening"), "{log}");
    assert!(log.contains("server stopped"), "{log}");

    // A restart on the same data directory works (the store lock was released).
    let server = ServerProcess::spawn(binary, dir.path())?;
    assert_eq!(server.probe("/readyz")?.0, 200);
    assert_eq!(server.terminate()?.code(), Some(0));
    Ok(())
}

/// `rlark server` on a data directory whose `rlark.db` was lost (the CA is still there)
/// exits 1 saying why and how to go on; with `--reinitialize-store` it starts.
#[test]
fn server_refuses_a_lost_store_unless_told_to_reinitialize() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let server = ServerProcess::spawn(binary, dir.path())?;
    assert_eq!(server.terminate()?.code(), Some(0));
    for file in ["rlark.db", "rlark.db-wal", "rlark.db-shm"] {
        match std::fs::remove_file(dir.path().join(file)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("remove the store"),
        }
    }

    let data_dir = dir.path().display().to_string();
    let mut child = rlark()
        .args(["server", "--data-dir", &data_dir, "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("spawn rlark server")?;
    // A server that wrongly starts would serve until killed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            anyhow::bail!("rlark server started on a lost store (killed after 30 s)");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output()?;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert!(stderr.contains("--reinitialize-store"), "{stderr}");

    let server = ServerProcess::spawn_with_args(binary, dir.path(), &["--reinitialize-store"])?;
    assert_eq!(server.probe("/readyz")?.0, 200);
    assert_eq!(server.terminate()?.code(), Some(0));
    Ok(())
}

#[test]
fn json_logs_are_one_object_per_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let server = ServerProcess::spawn_with_args(binary, dir.path(), &["--log-format", "json"])?;
    let log_path = server.log_path().to_path_buf();
    assert_eq!(server.terminate()?.code(), Some(0));
    let log = std::fs::read_to_string(&log_path)?;
    let mut saw_listening = false;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let entry: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        if entry["fields"]["message"] == "listening" {
            saw_listening = true;
            assert!(entry["fields"]["addr"].as_str().is_some(), "{line}");
        }
    }
    assert!(saw_listening, "{log}");
    Ok(())
}

#[test]
fn client_commands_explain_a_missing_kubeconfig() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = rlark()
        .current_dir(dir.path())
        .args(["get", "jobs"])
        .output()?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no kubeconfig"), "{stderr}");
    assert!(stderr.contains("rlark up"), "{stderr}");
    Ok(())
}
