//! `rlark completion SHELL` and `rlark man --dir DIR`: shell completion scripts and man
//! pages generated from the clap definition, so they never drift from the flags.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, ValueEnum};

/// Shells `rlark completion` writes a script for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionArgs {
    /// The shell to write the completion script for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Directory to write the pages to (created when missing): rlark.1 and one page per
    /// subcommand (rlark-get.1, rlark-token-create.1, ...).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
}

/// Print the completion script of `args.shell` on stdout.
pub(crate) fn completion(args: CompletionArgs) -> anyhow::Result<()> {
    let mut command = super::examples::command();
    let mut out = Vec::new();
    match args.shell {
        Shell::Bash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut command, "rlark", &mut out)
        }
        Shell::Zsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut command, "rlark", &mut out)
        }
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut command, "rlark", &mut out)
        }
    }
    match std::io::stdout().lock().write_all(&out) {
        // `rlark completion bash | head`: the reader has what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("write the completion script to stdout"),
    }
}

/// Write the man pages into `args.dir` and print each path written.
pub(crate) fn man(args: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("create man page directory {}", args.dir.display()))?;
    let mut command = super::examples::command().disable_help_subcommand(true);
    // `build()` names every subcommand by its full path (`rlark-token-create`), which is
    // the page's name and title.
    command.build();
    let mut written = Vec::new();
    write_pages(command, &args.dir, &mut written)?;
    let mut stdout = std::io::stdout().lock();
    for path in written {
        writeln!(stdout, "{}", path.display()).context("write to stdout")?;
    }
    Ok(())
}

fn write_pages(
    command: clap::Command,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    let build = super::version::build_info();
    // The footer: `rlark 0.1.0` and the build's day (not the subcommand's name and no date).
    let man = clap_mangen::Man::new(command)
        .source(format!("rlark {}", env!("CARGO_PKG_VERSION")))
        .manual("rlark manual")
        .date(build.build_date.get(..10).unwrap_or_default().to_string());
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("render man page {}", path.display()))?;
    std::fs::write(&path, page).with_context(|| format!("write man page {}", path.display()))?;
    written.push(path);
    Ok(())
}
