//! `rlark bench ARGS`: runs `rlark-bench ARGS`, the benchmarks' own binary, so this product
//! binary carries no bench code. `rlark-bench` is looked for beside this executable (where
//! `cargo build` and the packages put it), then on PATH.

use std::ffi::OsString;
use std::path::PathBuf;

/// The benches' binary.
const BENCH_BINARY: &str = "rlark-bench";

/// `rlark bench`'s arguments: everything after `bench`, passed on unchanged.
#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true)]
pub(crate) struct BenchArgs {
    /// The rlark-bench subcommand and its flags (`rlark bench --help` prints rlark-bench's
    /// help: the benches, their flags and targets).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<OsString>,
}

/// Where `rlark-bench` is: beside this executable, else the first on PATH; the error names
/// every place it looked.
fn find() -> anyhow::Result<PathBuf> {
    let exe =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("the path of this executable: {e}"))?;
    let beside = exe.with_file_name(BENCH_BINARY);
    if beside.is_file() {
        return Ok(beside);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(BENCH_BINARY);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!(
        "the benches are the {BENCH_BINARY} binary, found neither beside this executable ({}) \
         nor on PATH ({}); build it with `cargo build -p rlark-bench` (next to rlark) or \
         install it beside rlark",
        beside.display(),
        path.to_string_lossy()
    )
}

/// Replace this process with `rlark-bench ARGS` (its exit code is then this command's);
/// returns only when that cannot start.
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let program = find()?;
    let error = std::process::Command::new(&program).args(&args.args).exec();
    anyhow::bail!("run {}: {error}", program.display())
}
