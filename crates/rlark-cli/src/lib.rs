//! The `rlark` command line as a library: flags ([`parse`], [`command`]), logging setup
//! ([`init_tracing`]), dispatch ([`run`]) and error reporting ([`report`]). The `rlark`
//! binary is a thin `main` over these (plus the replica supervisor and the memory
//! allocator, which are the binary's); tests and other programs call them in-process.
//!
//! It owns the subcommands' flags, their client-side logic (kubeconfig and discovery,
//! table and `-o` output, apply/get/describe/logs/exec, the `up` and demo set-up) and the
//! `rlark bench` forwarder to the rlark-bench binary. It must not depend on the test kit,
//! the simulator or the benches (`scripts/test.sh` checks the `rlark` binary's tree).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod agent;
mod apply;
mod bench;
mod camera;
mod client;
mod completion;
mod controller_manager;
mod cordon;
mod delete;
mod demo;
mod demo_python;
mod describe;
mod devinit;
mod discovery;
mod embodied;
mod events;
mod example_files;
mod examples;
mod exec;
mod get;
mod join;
mod logs;
mod manifest;
mod names;
mod net;
mod output;
mod port_forward;
#[cfg(test)]
mod reference;
mod reports;
mod robot;
mod security;
mod server;
mod ssh;
mod store;
mod table;
pub mod version;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use client::report;
pub use examples::command;

/// rlark: cross-cluster control plane for embodied-AI reinforcement learning.
#[derive(Debug, Parser)]
#[command(
    name = "rlark",
    version,
    about = "rlark: cross-cluster control plane for embodied-AI reinforcement learning",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks on this machine: runs the rlark-bench binary with the same arguments.
    ///
    /// The benches live in the rlark-bench binary, looked for beside this executable, else
    /// on PATH; `rlark bench ARGS` runs `rlark-bench ARGS` in place of this process (its
    /// exit code is this command's). Network on 127.0.0.1 only, or network namespaces.
    /// `rlark bench --help` prints rlark-bench's help: the benches, their flags and targets.
    Bench(crate::bench::BenchArgs),
    /// Run the control-plane server until SIGTERM or SIGINT.
    Server(server::ServerArgs),
    /// Start a local control plane on loopback with embedded defaults and print how to use it.
    Up(server::UpArgs),
    /// Print the admin kubeconfig of a data directory, or (with --user) make a kubeconfig
    /// for a user with a new certificate signed by the server.
    Kubeconfig(server::KubeconfigArgs),
    /// Create bootstrap tokens (agent join) and user bearer tokens.
    #[command(subcommand)]
    Token(security::TokenCommand),
    /// List, revoke and sign client certificates.
    #[command(subcommand)]
    Cert(security::CertCommand),
    /// Rotate the installation CA of a data directory (offline).
    #[command(subcommand)]
    Ca(security::CaCommand),
    /// Print the CustomResourceDefinitions of the rlinf.io API (for a real Kubernetes cluster).
    Crds,
    /// Create or update resources from files, directories or stdin.
    Apply(apply::ApplyArgs),
    /// Display resources.
    Get(get::GetArgs),
    /// Delete resources by kind and name, or from files.
    Delete(delete::DeleteArgs),
    /// Show an object with its conditions and the Events recorded about it.
    Describe(describe::DescribeArgs),
    /// Print Events (LAST SEEN, TYPE, REASON, OBJECT, MESSAGE) as `kubectl events`: all of
    /// them, or those about one object (KIND/NAME, KIND NAME or --for KIND/NAME).
    Events(events::EventsArgs),
    /// Mark a Node unschedulable: no new Task is placed on it.
    Cordon(cordon::CordonArgs),
    /// Mark a Node schedulable again.
    Uncordon(cordon::CordonArgs),
    /// Run the Job, Workflow, Task and Node controllers against an API server, with leader
    /// election, until SIGTERM or SIGINT.
    ControllerManager(controller_manager::ControllerManagerArgs),
    /// Run the agent of a cluster on this host until SIGTERM or SIGINT: report the host as
    /// a Node, run the Tasks placed on it, keep a tunnel to every server. The first start
    /// joins with --token and --ca-hash.
    Agent(agent::AgentArgs),
    /// Join this host to an installation as the agent of a cluster: verify the server's CA
    /// against --ca-hash, make a key here, and get a certificate with a bootstrap token.
    Join(join::JoinArgs),
    /// Print the output of replicas (pod/NAME, task/NAME or job/NAME), read by their
    /// agents through the server; -f follows it until they exit.
    Logs(logs::LogsArgs),
    /// Print the reports a task posted (rewards, metrics) as a table (TIME, TYPE, STEP,
    /// VALUE, DETAILS) or JSON; -f keeps printing new ones.
    Reports(reports::ReportsArgs),
    /// Run a command in a running replica (task/NAME picks replica 0), through the server
    /// and its agent: -i sends stdin, -t gives it a terminal; exits with the command's code.
    Exec(exec::ExecArgs),
    /// OpenSSH's `ssh` into a replica of a task (task/NAME) through the server's SSH
    /// endpoint, with your kubeconfig identity and no key setup; -L forwards into it.
    Ssh(ssh::SshArgs),
    /// Print an ssh_config stanza for the server's SSH endpoint and pin its host key.
    SshConfig(ssh::SshConfigArgs),
    /// Register, list and remove your SSH public keys (for `ssh TASK@server`).
    #[command(subcommand)]
    SshKey(ssh::SshKeyCommand),
    /// Pod network: `net check SOURCE DESTINATION` opens a test connection between Domain
    /// members and prints the path taken (local, direct or relay) and its setup latency.
    #[command(subcommand)]
    Net(net::NetCommand),
    /// Forward a local port to HOST:PORT as the agent of a cluster reaches it, through the
    /// server (HTTP CONNECT over the tunnel), until interrupted.
    PortForward(port_forward::PortForwardArgs),
    /// Run the embodied runtime of an edge host until SIGTERM or SIGINT: robots (ROS 1,
    /// ROS 2, simulated arm) as RobotController services on unix sockets.
    Embodied(embodied::EmbodiedArgs),
    /// Talk to the robots of `rlark embodied` on this host: list, status, start, stop,
    /// switch, reset, logs.
    Robot(robot::RobotArgs),
    /// Create the embodied runtime's macvlan interfaces in this process's network namespace
    /// (DeviceService.Setup on devinit.sock), e.g. from a pod's init container.
    Devinit(devinit::DevinitArgs),
    /// Talk to the cameras of `rlark embodied` on this host: list, info, open, close, save
    /// a frame, watch frames.
    Camera(camera::CameraArgs),
    /// Print the client's and the server's version, git commit and build date.
    Version(version::VersionArgs),
    /// Save every object of the store, with its revision, to a file (JSON Lines): from the
    /// running server (admin credentials), or with --from straight from a stopped store.
    Backup(store::BackupArgs),
    /// Write a backup file into an empty store (its server stopped), revisions kept.
    Restore(store::RestoreArgs),
    /// Store maintenance: `store migrate` copies a store between SQLite and PostgreSQL.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Print a shell completion script (bash, zsh or fish) on stdout.
    Completion(completion::CompletionArgs),
    /// Write man pages for rlark and every subcommand into a directory.
    Man(completion::ManArgs),
}

/// The command line parsed against the CLI's definition with its examples
/// ([`examples::command`]); usage errors exit as clap's do (2, or 0 for `--help`).
pub fn parse() -> Cli {
    use clap::FromArgMatches as _;
    let matches = examples::command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Data directory of `rlark up`, `rlark kubeconfig` and `rlark ca` when none is given.
pub(crate) const DEFAULT_DATA_DIR: &str = ".rlark";

/// Flags accepted anywhere on the command line, before or after the subcommand (clap
/// `global`), as kubectl's.
#[derive(Clone, Debug, Args)]
pub(crate) struct GlobalArgs {
    /// Kubeconfig file of the commands that talk to a server. Default: $KUBECONFIG (a
    /// `:`-separated list; missing files are skipped, the first file to set a value wins),
    /// else ./.rlark/admin.kubeconfig, else ~/.kube/config.
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: its current-context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Namespace (default: the kubeconfig context's, else `default`; commands that find
    /// objects across namespaces say so in their help).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Log format on stderr. The level comes from RUST_LOG (default: info for `server`,
    /// `up`, `agent` and `controller-manager`, warn otherwise and for `up` on a terminal).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// What the commands that talk to a server take from the global flags.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClientArgs {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub context: Option<String>,
    /// `-n/--namespace`.
    pub namespace: Option<String>,
}

impl GlobalArgs {
    fn client(&self) -> ClientArgs {
        ClientArgs {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// Set up `tracing` on stderr: `RUST_LOG` filter, text or JSON lines.
pub fn init_tracing(cli: &Cli) {
    let default_level = match cli.command {
        Command::Server(_) | Command::Up(_) | Command::ControllerManager(_) | Command::Agent(_) => {
            "info"
        }
        Command::Embodied(_) => "info",
        // kube logs a failed connection at ERROR before returning the error, which the
        // command prints itself: the cause would show twice.
        _ => "warn,kube_client::client::builder=off",
    };
    use std::io::IsTerminal as _;
    // On a terminal `rlark up` prints a banner and the demo's progress: INFO lines would
    // bury them, so only warnings show there unless RUST_LOG asks for more.
    let default_level = if matches!(cli.command, Command::Up(_)) && std::io::stderr().is_terminal()
    {
        "warn"
    } else {
        default_level
    };
    let format = match cli.global.log_format {
        LogFormat::Text => rlark_observe::LogFormat::Text,
        LogFormat::Json => rlark_observe::LogFormat::Json,
    };
    rlark_observe::init_tracing(default_level, format);
}

/// Run the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = cli.global.client();
    match cli.command {
        Command::Server(args) => server::server(args).await,
        Command::Up(args) => server::up(args).await,
        Command::Kubeconfig(args) => server::kubeconfig(args, client).await,
        Command::Token(command) => security::token(command, client).await,
        Command::Cert(command) => security::cert(command, client).await,
        Command::Ca(command) => security::ca(command),
        Command::Bench(command) => crate::bench::run(command),
        Command::Crds => {
            print!("{}", rlark_api::crd::crds_yaml());
            Ok(())
        }
        Command::Apply(mut args) => {
            args.client = client;
            apply::apply(args).await
        }
        Command::Get(mut args) => {
            args.client = client;
            get::get(args).await
        }
        Command::Delete(mut args) => {
            args.client = client;
            delete::delete(args).await
        }
        Command::Describe(mut args) => {
            args.client = client;
            describe::describe(args).await
        }
        Command::Events(mut args) => {
            args.client = client;
            events::events(args).await
        }
        Command::Cordon(mut args) => {
            args.client = client;
            cordon::cordon(args, true).await
        }
        Command::Uncordon(mut args) => {
            args.client = client;
            cordon::cordon(args, false).await
        }
        Command::ControllerManager(mut args) => {
            args.client = client;
            controller_manager::controller_manager(args).await
        }
        Command::Agent(args) => agent::agent(args).await,
        Command::Join(args) => join::join(args).await,
        Command::Logs(mut args) => {
            args.client = client;
            logs::logs(args).await
        }
        Command::Reports(mut args) => {
            args.client = client;
            reports::reports(args).await
        }
        Command::Exec(mut args) => {
            args.client = client;
            exec::exec(args).await
        }
        Command::Ssh(mut args) => {
            args.client = client;
            ssh::ssh(args).await
        }
        Command::SshConfig(mut args) => {
            args.client = client;
            ssh::ssh_config(args).await
        }
        Command::SshKey(command) => ssh::ssh_key(command, client).await,
        Command::Net(command) => net::net(command, client).await,
        Command::PortForward(mut args) => {
            args.client = client;
            port_forward::port_forward(args).await
        }
        Command::Embodied(args) => embodied::embodied(args).await,
        Command::Robot(args) => robot::robot(args).await,
        Command::Devinit(args) => devinit::devinit(args).await,
        Command::Camera(args) => camera::camera(args).await,
        Command::Backup(mut args) => {
            args.client = client;
            store::backup(args).await
        }
        Command::Restore(args) => store::restore(args).await,
        Command::Store(command) => store::store(command).await,
        Command::Version(mut args) => {
            args.client_args = client;
            version::version(args).await
        }
        Command::Completion(args) => completion::completion(args),
        Command::Man(args) => completion::man(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        examples::command().debug_assert();
    }

    #[test]
    fn parses_client_commands() {
        let cli = Cli::try_parse_from(["rlark", "get", "jobs", "-A", "-o", "wide", "-l", "a=b"])
            .expect("parse");
        let Command::Get(args) = cli.command else {
            panic!("not get")
        };
        assert!(args.all_namespaces);
        assert_eq!(args.selector.as_deref(), Some("a=b"));

        let cli = Cli::try_parse_from(["rlark", "apply", "-f", "-", "-f", "dir", "-n", "x"])
            .expect("parse");
        let Command::Apply(args) = cli.command else {
            panic!("not apply")
        };
        assert_eq!(args.filenames, ["-", "dir"]);

        assert!(Cli::try_parse_from(["rlark", "get"]).is_err());
        // `delete jobs` parses (`delete job/x` has no NAME either) but names nothing.
        let cli = Cli::try_parse_from(["rlark", "delete", "jobs"]).expect("parse");
        let Command::Delete(args) = cli.command else {
            panic!("not delete")
        };
        assert!(delete::named(args.kind.as_deref().unwrap_or_default(), &args.names).is_err());
        assert!(Cli::try_parse_from(["rlark", "delete", "-f", "x", "jobs"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "delete", "jobs", "a"]).is_ok());

        let cli = Cli::try_parse_from([
            "rlark", "net", "check", "task/a", "task/b", "-n", "rlark-x", "--port", "80",
        ])
        .expect("parse");
        let Command::Net(net::NetCommand::Check(args)) = cli.command else {
            panic!("not net check")
        };
        assert_eq!(
            (args.source.as_str(), args.destination.as_str()),
            ("task/a", "task/b")
        );
        assert_eq!(args.port, Some(80));
        assert!(Cli::try_parse_from(["rlark", "net", "check", "a", "b", "--port", "0"]).is_err());
        assert!(Cli::try_parse_from(["rlark", "net", "check", "a"]).is_err());
    }

    #[test]
    fn parses_controller_commands() {
        let cli = Cli::try_parse_from(["rlark", "cordon", "rlark-c1/n1"]).expect("parse");
        assert!(matches!(cli.command, Command::Cordon(ref a) if a.node == "rlark-c1/n1"));
        let cli =
            Cli::try_parse_from(["rlark", "uncordon", "n1", "-n", "rlark-c1"]).expect("parse");
        assert!(
            matches!(cli.command, Command::Uncordon(_))
                && cli.global.namespace.as_deref() == Some("rlark-c1")
        );
        let cli = Cli::try_parse_from(["rlark", "describe", "job", "ppo"]).expect("parse");
        assert!(
            matches!(cli.command, Command::Describe(ref a) if a.kind == "job" && a.name.as_deref() == Some("ppo"))
        );
        let cli = Cli::try_parse_from(["rlark", "describe", "job/ppo"]).expect("parse");
        assert!(matches!(cli.command, Command::Describe(ref a) if a.name.is_none()));

        let cli = Cli::try_parse_from([
            "rlark",
            "controller-manager",
            "--leader-elect=false",
            "--metrics-listen",
            "127.0.0.1:0",
            "--node-grace-period",
            "2s",
        ])
        .expect("parse");
        let Command::ControllerManager(args) = cli.command else {
            panic!("not controller-manager")
        };
        assert!(!args.leader_elect);
        assert_eq!(args.node_grace_period, std::time::Duration::from_secs(2));
        assert_eq!(args.metrics_listen.port(), 0);
        let cli = Cli::try_parse_from(["rlark", "controller-manager"]).expect("parse");
        let Command::ControllerManager(args) = cli.command else {
            panic!("not controller-manager")
        };
        assert!(args.leader_elect);
        assert!(
            Cli::try_parse_from(["rlark", "controller-manager", "--node-grace-period", "soon"])
                .is_err()
        );

        let cli =
            Cli::try_parse_from(["rlark", "server", "--data-dir", "d", "--controllers=false"])
                .expect("parse");
        assert!(matches!(cli.command, Command::Server(ref a) if a.controllers == Some(false)));
        let cli = Cli::try_parse_from(["rlark", "server", "--data-dir", "d"]).expect("parse");
        assert!(matches!(cli.command, Command::Server(ref a) if a.controllers.is_none()));
    }
}
