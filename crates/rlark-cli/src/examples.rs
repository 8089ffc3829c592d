//! The `Examples:` section of every command's `--help` (and of its man page and
//! `docs/cli.md`), kept in one table so a test can check that every command has one and
//! that every example parses with the flags the command has today.

use clap::CommandFactory as _;

use super::Cli;

/// `(command path without "rlark", example lines)`. A line starting with `#` explains the
/// next one; the others are commands a shell runs as written.
pub(crate) const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "# a control plane on this machine, then the examples it writes into its data directory",
            "rlark up",
            "rlark apply -f .rlark/examples/",
            "rlark get jobs",
        ],
    ),
    (
        "bench",
        &[
            "# the benches, their flags and targets (rlark-bench's help)",
            "rlark bench --help",
            "rlark bench api",
            "# a quick run, as JSON",
            "rlark bench api --creates 200 --list-objects 1000 --watchers 10 --json",
            "rlark bench controllers --jobs 50 --json",
            "rlark bench tunnel --mib 256 --json",
            "rlark bench port-forward --skip-ssh --json",
            "rlark bench ssh --sessions 200 --mib 256 --json",
            "rlark bench agent --tasks 200 --json",
            "rlark bench camera --seconds 5 --fps 30",
            "rlark bench net --quick",
        ],
    ),
    (
        "server",
        &[
            "rlark server --data-dir /var/lib/rlark",
            "# every interface, with a name in the certificate",
            "rlark server --data-dir /var/lib/rlark --listen 0.0.0.0:8443 --tls-san rlark.example.org",
        ],
    ),
    (
        "up",
        &[
            "rlark up",
            "# the demo Workflow, then exit with its result",
            "rlark up --demo --once",
            "rlark up --data-dir /tmp/rlark --listen 127.0.0.1:9443",
        ],
    ),
    (
        "kubeconfig",
        &[
            "export KUBECONFIG=$(rlark kubeconfig --path)",
            "rlark kubeconfig --user alice --role viewer -o alice.kubeconfig",
        ],
    ),
    (
        "token",
        &[
            "rlark token create --cluster-id edge-1",
            "rlark token create --user ci --role admin",
        ],
    ),
    (
        "token create",
        &[
            "# a bootstrap token: prints the `rlark join` command for the new agent",
            "rlark token create --cluster-id edge-1 --ttl 30m",
            "# a bearer token of a user",
            "rlark token create --user ci --role viewer",
        ],
    ),
    (
        "token login-link",
        &[
            "# open the printed https://SERVER/#login=CODE in a browser",
            "rlark token login-link",
        ],
    ),
    (
        "cert",
        &["rlark cert list", "rlark cert revoke --user alice"],
    ),
    ("cert list", &["rlark cert list", "rlark cert list -o json"]),
    (
        "cert revoke",
        &[
            "rlark cert revoke 0A:1B --reason 'key leaked'",
            "rlark cert revoke --cluster-id edge-1",
            "rlark cert revoke --user alice",
        ],
    ),
    (
        "cert sign",
        &[
            "rlark cert sign --role viewer --name alice --csr alice.csr -o alice.crt",
            "rlark cert sign --role agent --cluster-id edge-1 --csr - < agent.csr",
        ],
    ),
    (
        "cert sign-ssh",
        &[
            "rlark cert sign-ssh --role ssh-guest --user alice --public-key id_ed25519.pub -o id_ed25519-cert.pub",
            "rlark cert sign-ssh --role domain --domain demo-net --cluster-id edge-1 --public-key gw.pub -o gw-cert.pub",
        ],
    ),
    (
        "cert revocations",
        &["rlark cert revocations", "rlark cert revocations -o json"],
    ),
    (
        "ca",
        &[
            "rlark ca rotate --data-dir .rlark",
            "rlark ca retire --data-dir .rlark",
        ],
    ),
    (
        "ca rotate",
        &[
            "# with the server stopped: a new CA, trusted beside the old one",
            "rlark ca rotate --data-dir /var/lib/rlark",
        ],
    ),
    (
        "ca retire",
        &[
            "# once every agent and user has a certificate of the new CA",
            "rlark ca retire --data-dir /var/lib/rlark",
        ],
    ),
    (
        "crds",
        &["rlark crds | kubectl apply -f -", "rlark crds > crds.yaml"],
    ),
    (
        "apply",
        &[
            "rlark apply -f .rlark/examples/job.yaml",
            "# every example `rlark up` wrote into its data directory",
            "rlark apply -f .rlark/examples/",
            "cat .rlark/examples/job.yaml | rlark apply -f -",
            "# create it even with fields the server does not know, and show its warnings",
            "rlark apply -f .rlark/examples/job.yaml --validate=warn",
        ],
    ),
    (
        "get",
        &[
            "rlark get jobs",
            "rlark get job ppo-train -o yaml",
            "rlark get tasks -A -o wide",
            "rlark get jobs -l app=ppo",
            "rlark get nodes -A --no-headers",
            "# several kinds, a table each",
            "rlark get jobs,tasks",
            "# a row for every change, until Ctrl-C",
            "rlark get tasks -w",
            "# one object, as a JSON document per change",
            "rlark get job counter -w -o json",
            "rlark get tasks -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase}{\"\\n\"}{end}'",
            "rlark get tasks -o custom-columns=NAME:.metadata.name,PHASE:.status.phase",
        ],
    ),
    (
        "delete",
        &[
            "rlark delete job ppo-train",
            "rlark delete job/ppo-train workflow/train-eval",
            "rlark delete -f .rlark/examples/",
            "rlark delete job ppo-train --ignore-not-found",
        ],
    ),
    (
        "describe",
        &[
            "rlark describe job ppo-train",
            "rlark describe task/ppo-train-actor",
            "rlark describe node host-1",
            "# the object only, as `rlark get -o yaml` prints it",
            "rlark describe job ppo-train -o yaml",
        ],
    ),
    (
        "events",
        &[
            "rlark events",
            "rlark events job/ppo-train",
            "rlark events --for task/ppo-train-actor",
        ],
    ),
    (
        "cordon",
        &[
            "rlark cordon node/host-1",
            "rlark cordon node host-1 -n rlark-edge",
        ],
    ),
    ("uncordon", &["rlark uncordon node/host-1"]),
    (
        "controller-manager",
        &[
            "rlark controller-manager --kubeconfig admin.kubeconfig",
            "rlark controller-manager --metrics-listen 127.0.0.1:0 --node-grace-period 1m",
        ],
    ),
    (
        "agent",
        &[
            "# the first start joins with the values `rlark token create` printed",
            "rlark agent --server https://rlark.example.org:8443 --cluster-id edge-1 --data-dir /var/lib/rlark-agent --token TOKEN --ca-hash sha256:HEX",
            "rlark agent --server https://rlark.example.org:8443 --cluster-id edge-1 --data-dir /var/lib/rlark-agent --node-category edge",
        ],
    ),
    (
        "join",
        &[
            "rlark join --server https://rlark.example.org:8443 --token TOKEN --ca-hash sha256:HEX --cluster-id edge-1",
        ],
    ),
    (
        "logs",
        &[
            "rlark logs task/ppo-train-actor",
            "rlark logs job/ppo-train -f",
            "rlark logs task ppo-train-rollout --tail 20",
            "rlark logs pod/ppo-train-actor-0 --previous",
        ],
    ),
    (
        "reports",
        &[
            "rlark reports task/ppo-train-actor",
            "rlark reports ppo-train-actor -f -o json",
        ],
    ),
    (
        "exec",
        &[
            "rlark exec task/ppo-train-actor -- nvidia-smi",
            "rlark exec -it task/ppo-train-actor -- sh",
            "rlark exec task ppo-train-rollout --replica 1 -- cat /etc/hostname",
        ],
    ),
    (
        "backup",
        &[
            "# from the running server (admin kubeconfig)",
            "rlark backup rlark-backup.jsonl",
            "# straight from a stopped server's data directory",
            "rlark backup rlark-backup.jsonl --from sqlite:/var/lib/rlark",
        ],
    ),
    (
        "restore",
        &[
            "rlark restore rlark-backup.jsonl --to sqlite:/var/lib/rlark-new",
            "rlark restore rlark-backup.jsonl --to postgres://rlark@db.example/rlark",
        ],
    ),
    (
        "store",
        &[
            "rlark store migrate --from sqlite:/var/lib/rlark --to postgres://rlark@db.example/rlark",
        ],
    ),
    (
        "store migrate",
        &[
            "rlark store migrate --from sqlite:/var/lib/rlark --to postgres://rlark@db.example/rlark",
            "# and back, into a new data directory",
            "rlark store migrate --from postgres://rlark@db.example/rlark --to sqlite:/var/lib/rlark-new",
        ],
    ),
    (
        "ssh",
        &[
            "rlark ssh task/ppo-train-actor",
            "rlark ssh task/ppo-train-rollout --replica 1 -- nvidia-smi",
            "# TensorBoard of the task on localhost:6006",
            "rlark ssh task/ppo-train-actor -N -L 6006:localhost:6006",
        ],
    ),
    (
        "ssh-config",
        &[
            "rlark ssh-config >> ~/.ssh/config",
            "rlark ssh-config --alias lab -i ~/.ssh/id_ed25519",
        ],
    ),
    (
        "ssh-key",
        &[
            "rlark ssh-key add ~/.ssh/id_ed25519.pub",
            "rlark ssh-key list",
        ],
    ),
    (
        "ssh-key add",
        &[
            "rlark ssh-key add ~/.ssh/id_ed25519.pub",
            "cat key.pub | rlark ssh-key add -",
        ],
    ),
    (
        "ssh-key list",
        &["rlark ssh-key list", "rlark ssh-key list --user alice"],
    ),
    (
        "ssh-key remove",
        &["rlark ssh-key remove SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"],
    ),
    (
        "net",
        &["rlark net check task/ppo-train-actor task/ppo-train-rollout --port 6379"],
    ),
    (
        "net check",
        &[
            "rlark net check task/ppo-train-actor task/ppo-train-rollout",
            "rlark net check ppo-train-actor 10.200.0.3 --port 6379",
        ],
    ),
    (
        "port-forward",
        &[
            "# a replica's port, as kubectl port-forward (replica 0 of a task)",
            "rlark port-forward task/ppo-train-actor 6006",
            "rlark port-forward pod/counter-main-0 18080:8080 -n rlark-cloud",
            "# a port on the edge agent's own host",
            "rlark port-forward edge-1 9100:127.0.0.1:9100",
            "rlark port-forward edge-1 0:10.0.0.5:22 --address 0.0.0.0",
        ],
    ),
    (
        "embodied",
        &["rlark embodied --config examples/embodied/sim.yaml --socket-dir /tmp/rlark-run"],
    ),
    (
        "robot",
        &[
            "rlark robot --socket-dir /tmp/rlark-run list",
            "rlark robot --socket-dir /tmp/rlark-run start arm-0",
        ],
    ),
    (
        "robot list",
        &["rlark robot --socket-dir /tmp/rlark-run list"],
    ),
    (
        "robot status",
        &[
            "rlark robot --socket-dir /tmp/rlark-run status arm-0",
            "rlark robot --socket-dir /tmp/rlark-run status arm-0 -o json",
        ],
    ),
    (
        "robot start",
        &[
            "rlark robot --socket-dir /tmp/rlark-run start arm-0",
            "rlark robot --socket-dir /tmp/rlark-run start arm-0 --mode teleop --arg speed=0.5",
        ],
    ),
    (
        "robot stop",
        &["rlark robot --socket-dir /tmp/rlark-run stop arm-0"],
    ),
    (
        "robot switch",
        &["rlark robot --socket-dir /tmp/rlark-run switch arm-0 teleop --arg target=0.5,0,0,0,0,0"],
    ),
    (
        "robot reset",
        &["rlark robot --socket-dir /tmp/rlark-run reset arm-0"],
    ),
    (
        "robot logs",
        &["rlark robot --socket-dir /tmp/rlark-run logs arm-0 --tail 50"],
    ),
    (
        "devinit",
        &[
            "rlark devinit setup",
            "rlark devinit --socket-dir /var/run/rlark setup",
        ],
    ),
    ("devinit setup", &["rlark devinit setup --timeout 2m"]),
    (
        "camera",
        &[
            "rlark camera --socket-dir /tmp/rlark-run list",
            "rlark camera --socket-dir /tmp/rlark-run open cam-0",
        ],
    ),
    (
        "camera list",
        &["rlark camera --socket-dir /tmp/rlark-run list"],
    ),
    (
        "camera info",
        &[
            "rlark camera --socket-dir /tmp/rlark-run info cam-0",
            "rlark camera --socket-dir /tmp/rlark-run info cam-0 -o yaml",
        ],
    ),
    (
        "camera open",
        &[
            "rlark camera --socket-dir /tmp/rlark-run open cam-0",
            "rlark camera --socket-dir /tmp/rlark-run open cam-0 --width 320 --height 240 --fps 15",
        ],
    ),
    (
        "camera close",
        &["rlark camera --socket-dir /tmp/rlark-run close cam-0"],
    ),
    (
        "camera frame",
        &[
            "rlark camera --socket-dir /tmp/rlark-run frame cam-0 --out frame.jpg",
            "rlark camera --socket-dir /tmp/rlark-run frame cam-0 -o - --encoding png > frame.png",
        ],
    ),
    (
        "camera watch",
        &["rlark camera --socket-dir /tmp/rlark-run watch cam-0 --count 10"],
    ),
    (
        "version",
        &[
            "rlark version",
            "rlark version --client",
            "rlark version -o json",
        ],
    ),
    (
        "completion",
        &[
            "# load completion into the current bash session",
            "source <(rlark completion bash)",
            "# install it for every zsh session (a directory of $fpath)",
            "rlark completion zsh > \"${fpath[1]}/_rlark\"",
            "rlark completion fish > ~/.config/fish/completions/rlark.fish",
        ],
    ),
    (
        "man",
        &["rlark man --dir ./man", "man -l ./man/rlark-get.1"],
    ),
];

/// The `Examples:` text of one table entry.
fn section(lines: &[&str]) -> String {
    let mut text = String::from("Examples:");
    for line in lines {
        text.push_str("\n  ");
        text.push_str(line);
    }
    text
}

/// The CLI's definition with the examples of [`EXAMPLES`] as every command's
/// `after_help`. What `rlark` parses with, and what completion, man pages and
/// `docs/cli.md` are generated from.
pub fn command() -> clap::Command {
    attach(Cli::command(), "")
}

fn attach(mut command: clap::Command, path: &str) -> clap::Command {
    if let Some((_, lines)) = EXAMPLES.iter().find(|(p, _)| *p == path) {
        command = command.after_help(section(lines));
    }
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        let sub_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path} {name}")
        };
        command = command.mut_subcommand(&name, |sub| attach(sub, &sub_path));
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible command, by its path without "rlark" ("" is rlark itself).
    fn paths(command: &clap::Command, path: &str, out: &mut Vec<String>) {
        out.push(path.to_string());
        // `help` (added by `build()`) prints the help of the others.
        for sub in command
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let sub_path = if path.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{path} {}", sub.get_name())
            };
            paths(sub, &sub_path, out);
        }
    }

    /// `line` as the words a shell would pass, up to a pipe or a redirection; `None`
    /// for lines that do not start by running `rlark`.
    fn words(line: &str) -> Option<Vec<String>> {
        if !line.starts_with("rlark ") {
            return None;
        }
        let mut out = Vec::new();
        let mut word = String::new();
        let mut quote = None;
        let mut in_word = false;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    in_word = true;
                }
                (None, '|' | '>' | '<') => break,
                (None, c) if c.is_whitespace() => {
                    if in_word {
                        out.push(std::mem::take(&mut word));
                        in_word = false;
                    }
                }
                (None, c) => {
                    word.push(c);
                    in_word = true;
                }
            }
        }
        if in_word {
            out.push(word);
        }
        Some(out)
    }

    /// Issue 18, item 8: every command's `--help` ends with an `Examples:` section, and
    /// the table names no command that does not exist.
    #[test]
    fn every_command_has_examples() {
        let mut command = command();
        command.build();
        let mut all = Vec::new();
        paths(&command, "", &mut all);
        let mut missing = Vec::new();
        for path in &all {
            let mut sub = command.clone();
            for name in path.split_whitespace() {
                sub = sub.find_subcommand(name).expect("listed").clone();
            }
            let help = sub.render_long_help().to_string();
            if !help.contains("\nExamples:\n  ") {
                missing.push(format!("rlark {path}").trim().to_string());
            }
        }
        assert!(
            missing.is_empty(),
            "no Examples: section in --help of {missing:?}"
        );
        for (path, lines) in EXAMPLES {
            assert!(
                all.iter().any(|p| p == path),
                "examples of a command that does not exist: {path:?}"
            );
            assert!(!lines.is_empty(), "{path:?}");
        }
    }

    /// Every example runs a command that exists with flags it has: it parses.
    #[test]
    fn every_example_parses() {
        let mut checked = 0;
        for (path, lines) in EXAMPLES {
            for line in *lines {
                // `export KUBECONFIG=$(rlark ...)`, `source <(rlark ...)`: the inner command.
                let line = line
                    .split_once("$(")
                    .or_else(|| line.split_once("<("))
                    .map_or(*line, |(_, inner)| inner.trim_end_matches(')'));
                let Some(words) = words(line) else { continue };
                // An example of a command runs that command (or, on a group, one under it).
                let expected: Vec<&str> = path.split_whitespace().collect();
                let named: Vec<&str> = words[1..]
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !w.starts_with('-'))
                    .collect();
                assert!(
                    expected.iter().all(|e| named.contains(e)),
                    "example of {path:?} runs another command: {line}"
                );
                if let Err(e) = command().try_get_matches_from(&words) {
                    panic!("example of {path:?} does not parse: {line}\n{e}");
                }
                checked += 1;
            }
        }
        assert!(checked > EXAMPLES.len(), "only {checked} examples checked");
    }

    #[test]
    fn words_split_as_a_shell_does() {
        assert_eq!(
            words("rlark cert revoke 0A --reason 'key leaked' | tee x"),
            Some(
                vec!["rlark", "cert", "revoke", "0A", "--reason", "key leaked"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
        assert_eq!(words("man -l x"), None);
    }
}
