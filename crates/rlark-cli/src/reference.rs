//! `docs/cli.md`: the reference of every command and flag, generated from the clap
//! definition. The test below fails when the file drifts from the code; regenerate it with
//! `RLARK_UPDATE_DOCS=1 cargo test -p rlark-cli reference`.

use std::fmt::Write as _;

/// The Markdown reference of `rlark` and every (visible) subcommand.
pub(crate) fn render() -> String {
    let mut command = super::examples::command();
    command.build();
    let mut out = String::from(
        "# rlark command reference\n\n\
         Generated from the CLI's definition (`crates/rlark-cli/src/reference.rs`; a test fails \
         when this file drifts). `rlark COMMAND --help` prints the same text.\n\n\
         Flags marked *global* are accepted anywhere on the command line, before or after \
         the subcommand, as kubectl's.\n",
    );
    section(&mut out, &command, "rlark");
    out
}

fn section(out: &mut String, command: &clap::Command, path: &str) {
    let level = path.split(' ').count().min(4) + 1;
    let _ = write!(out, "\n{} `{path}`\n\n", "#".repeat(level));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let mut usage_command = command.clone();
    let usage = usage_command.render_usage().to_string();
    // `build()` gave every subcommand its full name (`rlark token create`).
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");

    let positionals: Vec<&clap::Arg> = command
        .get_positionals()
        .filter(|a| !a.is_hide_set())
        .collect();
    if !positionals.is_empty() {
        out.push_str("Arguments:\n\n");
        for arg in positionals {
            let name = arg
                .get_value_names()
                .and_then(|n| n.first().map(ToString::to_string))
                .unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
            let _ = writeln!(out, "- `{name}`: {}", help_of(arg));
        }
        out.push('\n');
    }
    let options: Vec<&clap::Arg> = command
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
        .filter(|a| a.get_id() != "help" && a.get_id() != "version")
        // Global flags are listed once, on `rlark` itself.
        .filter(|a| path == "rlark" || !a.is_global_set())
        .collect();
    if !options.is_empty() {
        out.push_str("Options:\n\n");
        for arg in options {
            let mut flag = String::new();
            if let Some(short) = arg.get_short() {
                let _ = write!(flag, "-{short}, ");
            }
            if let Some(long) = arg.get_long() {
                let _ = write!(flag, "--{long}");
            }
            if arg.get_action().takes_values()
                && let Some(names) = arg.get_value_names()
            {
                let names: Vec<String> = names.iter().map(ToString::to_string).collect();
                let _ = write!(flag, " {}", names.join(" "));
            }
            let mut notes = Vec::new();
            if arg.is_global_set() {
                notes.push("global".to_string());
            }
            if let Some(env) = arg.get_env() {
                notes.push(format!("env `{}`", env.to_string_lossy()));
            }
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            if !defaults.is_empty() && arg.get_action().takes_values() {
                notes.push(format!("default `{}`", defaults.join(",")));
            }
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            if !possible.is_empty() && arg.get_action().takes_values() {
                notes.push(format!("one of `{}`", possible.join("`, `")));
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" *({})*", notes.join("; "))
            };
            let _ = writeln!(out, "- `{flag}`{notes}: {}", help_of(arg));
        }
        out.push('\n');
    }
    if let Some(after) = command.get_after_long_help().or(command.get_after_help()) {
        let after = after.to_string();
        let (title, body) = after.split_once('\n').unwrap_or((after.as_str(), ""));
        let _ = writeln!(out, "{title}\n\n```sh\n{}\n```", unindent(body));
    }
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        section(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

/// `text` without the two spaces `--help` indents examples by.
fn unindent(text: &str) -> String {
    text.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn help_of(arg: &clap::Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    help.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md");

    #[test]
    fn docs_cli_md_matches_the_cli() {
        let rendered = render();
        if std::env::var_os("RLARK_UPDATE_DOCS").is_some() {
            std::fs::write(PATH, &rendered).expect("write docs/cli.md");
        }
        let on_disk = std::fs::read_to_string(PATH).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "docs/cli.md is out of date: regenerate it with \
             `RLARK_UPDATE_DOCS=1 cargo test -p rlark-cli reference`"
        );
    }

    /// Issue 18, item 8: the `--help` of every command, hidden ones included, as a user
    /// sees it, has no rustdoc link syntax.
    #[test]
    fn every_commands_help_has_no_rustdoc_markup() {
        fn check(command: &mut clap::Command, path: &str, seen: &mut usize) {
            let help = command.render_long_help().to_string();
            *seen += 1;
            for marker in ["[`", "`]", "](crate::", "](super::", "crate::", "super::"] {
                assert!(
                    !help.contains(marker),
                    "{marker:?} in `{path} --help`:\n{help}"
                );
            }
            for sub in command.get_subcommands_mut() {
                let sub_path = format!("{path} {}", sub.get_name());
                check(sub, &sub_path, seen);
            }
        }
        let mut command = crate::examples::command();
        command.build();
        let mut seen = 0;
        check(&mut command, "rlark", &mut seen);
        assert!(seen > 50, "only {seen} commands");
    }

    /// Help is read by users, not rustdoc: no intra-doc links or rustdoc-only markup.
    #[test]
    fn help_has_no_rustdoc_markup() {
        let rendered = render();
        for marker in ["[`", "`]", "](crate::", "](super::"] {
            assert!(
                !rendered.contains(marker),
                "rustdoc markup {marker:?} in --help:\n{}",
                rendered
                    .lines()
                    .filter(|l| l.contains(marker))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        for command in [
            "get", "apply", "exec", "logs", "cordon", "describe", "delete",
        ] {
            assert!(
                rendered.contains(&format!("## `rlark {command}`")),
                "{command}"
            );
        }
        assert!(
            rendered.contains("`--kubeconfig PATH` *(global)*"),
            "{rendered}"
        );
    }
}
