//! The `Examples:` section of `rlark-bench --help` and of each bench's `--help` (moved here
//! from `rlark`'s example table with the benches). They are written as users run them,
//! `rlark bench ...`, which runs `rlark-bench ...` with the same arguments; a test checks
//! that every visible bench has examples and that each parses with today's flags.

use clap::{CommandFactory as _, FromArgMatches as _};

use crate::BenchArgs;

/// `(bench, example lines)`; `""` is `rlark-bench` itself. A line starting with `#`
/// explains the next one.
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "rlark bench api --json",
            "rlark bench tunnel --mib 64",
            "# the same, without the forwarder",
            "rlark-bench tunnel --mib 64",
        ],
    ),
    (
        "api",
        &[
            "rlark bench api",
            "# a quick run, as JSON",
            "rlark bench api --creates 200 --list-objects 1000 --watchers 10 --json",
        ],
    ),
    (
        "controllers",
        &[
            "rlark bench controllers",
            "rlark bench controllers --jobs 50 --json",
        ],
    ),
    (
        "tunnel",
        &["rlark bench tunnel", "rlark bench tunnel --mib 256 --json"],
    ),
    (
        "port-forward",
        &[
            "rlark bench port-forward",
            "rlark bench port-forward --skip-ssh --json",
        ],
    ),
    (
        "ssh",
        &[
            "rlark bench ssh",
            "rlark bench ssh --sessions 200 --mib 256 --json",
        ],
    ),
    (
        "agent",
        &["rlark bench agent", "rlark bench agent --tasks 200 --json"],
    ),
    ("camera", &["rlark bench camera --seconds 5 --fps 30"]),
    (
        "net",
        &[
            "rlark bench net --quick",
            "rlark bench net --skip-ssh --json",
        ],
    ),
];

/// The `Examples:` text of one table entry (as `rlark`'s help has it).
fn section(lines: &[&str]) -> String {
    let mut text = String::from("Examples:");
    for line in lines {
        text.push_str("\n  ");
        text.push_str(line);
    }
    text
}

/// `rlark-bench`'s definition with the examples as each command's `after_help`.
pub fn command() -> clap::Command {
    let mut command = BenchArgs::command();
    for (name, lines) in EXAMPLES {
        command = if name.is_empty() {
            command.after_help(section(lines))
        } else {
            command.mut_subcommand(*name, |sub| sub.after_help(section(lines)))
        };
    }
    command
}

/// Parse this process's arguments (clap prints usage errors and exits with 2, 0 for
/// `--help`/`--version`).
pub fn parse() -> BenchArgs {
    let matches = command().get_matches();
    BenchArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_bench_has_examples_and_every_example_parses() {
        let command = command();
        for sub in command
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            assert!(
                EXAMPLES.iter().any(|(name, _)| *name == sub.get_name()),
                "no examples of rlark-bench {}",
                sub.get_name()
            );
        }
        let mut checked = 0;
        for (name, lines) in EXAMPLES {
            for line in lines.iter().filter(|l| !l.starts_with('#')) {
                let args = line
                    .strip_prefix("rlark bench ")
                    .or_else(|| line.strip_prefix("rlark-bench "))
                    .unwrap_or_else(|| panic!("example of {name:?} runs no bench: {line}"));
                let words: Vec<&str> = std::iter::once("rlark-bench")
                    .chain(args.split_whitespace())
                    .collect();
                assert!(
                    name.is_empty() || words[1] == *name,
                    "example of {name:?} runs another bench: {line}"
                );
                if let Err(e) = command.clone().try_get_matches_from(&words) {
                    panic!("example of {name:?} does not parse: {line}\n{e}");
                }
                checked += 1;
            }
        }
        assert!(checked > EXAMPLES.len(), "only {checked} examples checked");
    }
}
