//! The Python interpreter of `rlark up --demo`'s tasks, so that the README's first command
//! is one step on a machine with nothing but Python 3:
//!
//! - `--demo-python PATH` given: that interpreter, which must have the packages (the error
//!   names what it lacks and how to install it);
//! - otherwise `python3` on `PATH` when it has them (nothing is installed);
//! - otherwise a virtual environment of the demo's own under the data directory
//!   (`DATA_DIR/demo/venv`): created with `python3 -m venv` and given [`REQUIREMENTS`] with
//!   pip, whose progress is shown as it goes; kept, so the next `up --demo` on that data
//!   directory starts at once (it is only checked again). Where the package index cannot be
//!   reached, the error says so and gives the commands to run by hand (or a mirror through
//!   pip's own `PIP_INDEX_URL`).
//!
//! The environment is readable by every user (`venv` writes with the process umask, 022 by
//! default): raw replicas run as users of their own (docs/security.md, "Replica
//! isolation").

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// What the demo's tasks need beyond the standard library, as pip requirements: numpy for
/// the learner, and the embodied SDK's runtime (`sdk/python/rlark-embodied`).
pub(crate) const REQUIREMENTS: &[&str] =
    &["numpy>=1.22,<3", "grpcio>=1.85.1,<2", "protobuf>=7.35.1,<8"];

/// Where the demo's own environment lives, under the data directory.
pub(crate) const VENV_DIR: &str = "demo/venv";

/// Python run with `-c` to list what the demo's tasks lack: one line per missing package.
const PYTHON_CHECK: &str = r#"
import sys
missing = []
if sys.version_info < (3, 10):
    missing.append("Python >= 3.10 (this is %s)" % sys.version.split()[0])
try:
    import numpy
except ImportError:
    missing.append("numpy")
try:
    import grpc
    if tuple(int(x) for x in grpc.__version__.split(".")[:2]) < (1, 85):
        missing.append("grpcio>=1.85.1 (found %s)" % grpc.__version__)
except ImportError:
    missing.append("grpcio>=1.85.1")
try:
    from google.protobuf import __version__ as protobuf
    if int(protobuf.split(".")[0]) != 7:
        missing.append("protobuf>=7.35.1,<8 (found %s)" % protobuf)
except ImportError:
    missing.append("protobuf>=7.35.1,<8")
print("\n".join(missing))
"#;

/// `python` as the tasks should name it: a path made absolute (the tasks run elsewhere), a
/// bare name left for `PATH`.
fn absolute(python: &Path) -> anyhow::Result<PathBuf> {
    if python.components().count() > 1 {
        std::path::absolute(python).context("resolve the demo's Python")
    } else {
        Ok(python.to_path_buf())
    }
}

/// What `python` lacks of the demo's needs (empty: nothing); `Err` when it does not run.
pub(crate) fn missing(python: &Path) -> anyhow::Result<Vec<String>> {
    let output = match Command::new(python).arg("-c").arg(PYTHON_CHECK).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "the demo's tasks run {}, which {}: install Python 3 (Debian: apt-get install \
             python3 python3-venv) or pass --demo-python PATH",
            python.display(),
            if python.components().count() > 1 {
                "does not exist"
            } else {
                "is not on PATH"
            }
        ),
        Err(e) => return Err(e).with_context(|| format!("run {}", python.display())),
    };
    if !output.status.success() {
        bail!(
            "{} does not run: {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect())
}

/// The pip command that installs [`REQUIREMENTS`] for `python`, as a user would type it.
fn pip_command(python: &Path) -> String {
    let quoted: Vec<String> = REQUIREMENTS.iter().map(|r| format!("'{r}'")).collect();
    format!("{} -m pip install {}", python.display(), quoted.join(" "))
}

/// `--demo-python`: `python` must have everything; the error names what it lacks.
pub(crate) fn check(python: &Path) -> anyhow::Result<PathBuf> {
    let python = absolute(python)?;
    let lacking = missing(&python)?;
    if !lacking.is_empty() {
        bail!(
            "the demo's tasks run {python}, which lacks {missing}. Install them with\n  \
             {pip}\n\
             or leave out --demo-python: `rlark up --demo` then makes an environment of its \
             own under the data directory",
            python = python.display(),
            missing = lacking.join(", "),
            pip = pip_command(&python),
        );
    }
    Ok(python)
}

/// The interpreter of the demo's tasks (module docs): `given` (checked), else `python3`
/// when it has the packages, else the environment under `data_dir`, made when missing.
pub(crate) fn resolve(given: Option<&Path>, data_dir: &Path) -> anyhow::Result<PathBuf> {
    if let Some(python) = given {
        return check(python);
    }
    let system = Path::new("python3");
    let lacking = missing(system)?;
    if lacking.is_empty() {
        return Ok(system.to_path_buf());
    }
    let venv =
        std::path::absolute(data_dir.join(VENV_DIR)).context("resolve the data directory")?;
    let python = venv.join("bin/python");
    if python.exists() && missing(&python)?.is_empty() {
        println!("Demo Python: {} (made by an earlier run)", python.display());
        return Ok(python);
    }
    println!(
        "Demo Python: python3 lacks {}; making an environment of the demo's own in {} \
         (once per data directory)...",
        lacking.join(", "),
        venv.display()
    );
    let made = Command::new(system)
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .output()
        .context("run python3 -m venv")?;
    if !made.status.success() {
        let stderr = String::from_utf8_lossy(&made.stderr);
        let hint = if stderr.contains("ensurepip") {
            " (Debian and Ubuntu split venv out: apt-get install python3-venv)"
        } else {
            ""
        };
        bail!(
            "python3 -m venv {} failed{hint}: {}\nInstall the packages yourself with\n  {}\n\
             or pass --demo-python with an interpreter that has them",
            venv.display(),
            stderr.trim(),
            pip_command(system),
        );
    }
    // pip's own output is the progress: downloads and installs as they happen.
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "on",
        ])
        .args(REQUIREMENTS)
        .status()
        .context("run pip")?;
    if !status.success() {
        bail!(
            "pip could not install the demo's packages into {} ({status}); is the package \
             index reachable? pip reads PIP_INDEX_URL for a mirror. By hand:\n  {}\n\
             then run `rlark up --demo` again, or pass --demo-python with an interpreter that \
             has them",
            venv.display(),
            pip_command(&python),
        );
    }
    let lacking = missing(&python)?;
    if !lacking.is_empty() {
        bail!(
            "after pip, {} still lacks {}",
            python.display(),
            lacking.join(", ")
        );
    }
    println!("Demo Python: {} ready", python.display());
    Ok(python)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "python" that prints `missing` for the check and records its arguments.
    fn fake_python(dir: &Path, missing: &str) -> PathBuf {
        let fake = dir.join(format!("python-{}", missing.len()));
        std::fs::write(&fake, format!("#!/bin/sh\nprintf '{missing}'\n")).expect("write");
        let mut perms = std::fs::metadata(&fake).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&fake, perms).expect("chmod");
        fake
    }

    #[test]
    fn a_given_python_without_the_packages_is_refused_naming_them_and_the_way_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = fake_python(dir.path(), "numpy\\ngrpcio>=1.85.1\\n");
        let error = check(&fake).expect_err("lacks packages");
        let text = error.to_string();
        assert!(text.contains("lacks numpy, grpcio>=1.85.1"), "{text}");
        assert!(
            text.contains("-m pip install 'numpy>=1.22,<3' 'grpcio>=1.85.1,<2'"),
            "{text}"
        );
        assert!(text.contains("leave out --demo-python"), "{text}");
        // One that has everything is taken, as an absolute path.
        let ok = fake_python(dir.path(), "");
        assert_eq!(check(&ok).expect("complete"), ok);
    }

    #[test]
    fn a_python_that_is_not_there_says_how_to_get_one() {
        let error = missing(Path::new("/nonexistent/python3")).expect_err("absent");
        assert!(
            error
                .to_string()
                .contains("/nonexistent/python3, which does not exist"),
            "{error}"
        );
        let error = missing(Path::new("rlark-no-such-python")).expect_err("absent");
        assert!(error.to_string().contains("not on PATH"), "{error}");
    }
}
