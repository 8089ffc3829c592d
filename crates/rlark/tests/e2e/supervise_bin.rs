//! `rlark-supervise`, the supervisor binary the agent prefers when it is installed beside
//! `rlark` (`rlark_agent::runtime::default_supervisor`): it answers `--version` with
//! exactly the line the agent checks, and supervises a task like `rlark supervise`.

use std::process::Command;

use anyhow::Context as _;

const SUPERVISE: &str = env!("CARGO_BIN_EXE_rlark-supervise");

#[test]
fn version_line_is_the_one_the_agent_expects() -> anyhow::Result<()> {
    let out = Command::new(SUPERVISE).arg("--version").output()?;
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8(out.stdout)?;
    assert_eq!(line.trim_end(), rlark_agent::supervisor::version_line());
    // And it sits beside `rlark`, where the agent looks for it.
    let rlark = std::path::Path::new(env!("CARGO_BIN_EXE_rlark"));
    assert_eq!(
        rlark.with_file_name("rlark-supervise"),
        std::path::Path::new(SUPERVISE)
    );
    Ok(())
}

#[test]
fn it_records_the_exit_of_the_task_it_runs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let status = Command::new(SUPERVISE)
        .args(["--dir".as_ref(), dir.path().as_os_str()])
        .args(["--", "/bin/sh", "-c", "exit 3"])
        .status()?;
    assert!(status.success(), "{status:?}");
    let exit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("exit.json")).context("exit.json")?)?;
    assert_eq!(exit["code"], 3, "{exit}");
    assert!(dir.path().join("pid.json").is_file());
    // Bad arguments: exit 2 with the usage.
    let out = Command::new(SUPERVISE).arg("--bogus").output()?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}
