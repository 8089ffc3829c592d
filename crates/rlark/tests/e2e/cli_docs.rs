//! Issue 18, item 8: what `rlark` generates about itself from its clap definition: shell
//! completion scripts (`rlark completion`) and man pages (`rlark man`). No server needed.

use std::process::{Command, Output, Stdio};

use anyhow::Context as _;

const BINARY: &str = env!("CARGO_BIN_EXE_rlark");

fn rlark(args: &[&str]) -> anyhow::Result<Output> {
    Command::new(BINARY)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run rlark {args:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `source <(rlark completion bash)` works: bash parses the script, and it completes
/// rlark's subcommands and flags.
#[test]
fn completion_bash_is_a_script_bash_accepts() -> anyhow::Result<()> {
    let out = rlark(&["completion", "bash"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    assert!(script.contains("complete -F _rlark"), "no `complete` line");
    for word in ["port-forward", "--kubeconfig", "completion"] {
        assert!(script.contains(word), "{word} is not completed");
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("rlark.bash");
    std::fs::write(&path, &script)?;
    let check = Command::new("bash").arg("-n").arg(&path).output()?;
    assert!(check.status.success(), "bash -n: {}", text(&check.stderr));
    // Sourcing it defines the completion function and registers it for `rlark`.
    let sourced = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p rlark",
            path.to_str().context("path")?
        ))
        .output()?;
    assert!(sourced.status.success(), "{}", text(&sourced.stderr));
    assert!(
        text(&sourced.stdout).contains("_rlark"),
        "{}",
        text(&sourced.stdout)
    );
    Ok(())
}

#[test]
fn completion_zsh_and_fish_are_written() -> anyhow::Result<()> {
    let out = rlark(&["completion", "zsh"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("#compdef rlark\n"));
    let out = rlark(&["completion", "fish"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("complete -c rlark"));
    Ok(())
}

/// An unknown shell is a usage error (exit 2) naming the shells there are.
#[test]
fn completion_of_an_unknown_shell_names_the_choices() -> anyhow::Result<()> {
    let out = rlark(&["completion", "tcsh"])?;
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: invalid value 'tcsh' for '<SHELL>'\n  [possible values: bash, zsh, fish]\n"
        ),
        "{stderr}"
    );
    Ok(())
}

/// `rlark man --dir DIR` writes rlark.1 and one roff page per subcommand, nested ones
/// included, and prints what it wrote.
#[test]
fn man_writes_a_page_per_command() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pages = dir.path().join("man");
    let out = rlark(&["man", "--dir", pages.to_str().context("path")?])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    for (name, title) in [
        ("rlark.1", ".TH rlark 1 "),
        ("rlark-get.1", ".TH rlark-get 1 "),
        ("rlark-apply.1", ".TH rlark-apply 1 "),
        ("rlark-token-create.1", ".TH rlark-token-create 1 "),
        ("rlark-completion.1", ".TH rlark-completion 1 "),
    ] {
        let path = pages.join(name);
        let page = std::fs::read_to_string(&path).with_context(|| format!("read {name}"))?;
        // clap_mangen puts two string definitions (`.ie`/`.el`) before the title.
        let first_request = page
            .lines()
            .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
            .unwrap_or_default();
        assert!(first_request.starts_with(title), "{name}: {first_request}");
        assert!(page.contains(".SH NAME"), "{name}");
        assert!(
            listed.contains(&path.display().to_string()),
            "{name} not listed in {listed:?}"
        );
    }
    let get = std::fs::read_to_string(pages.join("rlark-get.1"))?;
    assert!(
        get.contains("rlark 0.1.0"),
        "footer names rlark and its version"
    );
    let count = std::fs::read_dir(&pages)?.count();
    assert_eq!(count, listed.len(), "every page written is listed");
    Ok(())
}

#[test]
fn man_into_an_unwritable_place_says_where() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("file");
    std::fs::write(&file, "")?;
    let target = file.join("man");
    let out = rlark(&["man", "--dir", target.to_str().context("path")?])?;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: create man page directory {}: ",
            target.display()
        )),
        "{stderr}"
    );
    Ok(())
}
