//! A throwaway PostgreSQL cluster for tests: `initdb` on a temporary directory, `pg_ctl
//! start` on a free loopback port, `pg_ctl stop` on drop.
//!
//! PostgreSQL refuses to run as root, so as root the server binaries run as the `postgres`
//! user (Debian's package creates it) through `runuser`, or as `nobody` through `setpriv`.
//! The binaries are looked up in `RLARK_PG_BIN`, then Debian's `/usr/lib/postgresql/*/bin`
//! (newest version first), then `PATH`.
//!
//! One source for every suite: rlark-store's unit tests include it with `#[path]` (they
//! cannot depend on rlark-testkit, which depends on rlark-store), rlark-testkit exports it
//! as `rlark_testkit::postgres`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

/// A running cluster; stopped (immediately, it holds nothing worth keeping) on drop.
pub struct PgCluster {
    bin: PathBuf,
    run_as: Option<RunAs>,
    data: PathBuf,
    port: u16,
    _dir: TempDir,
}

#[derive(Clone, Copy)]
enum RunAs {
    /// `runuser -u postgres --`.
    Postgres,
    /// `setpriv` as nobody/nogroup (65534).
    Nobody,
}

/// Where `initdb` and `pg_ctl` are, if anywhere.
pub fn find_bin() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("RLARK_PG_BIN").map(PathBuf::from) {
        return has_tools(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| has_tools(dir)))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|out| out.status.success())
}

impl PgCluster {
    /// `initdb` and start a cluster whose superuser is `rlark` (trust authentication on
    /// loopback only). Panics with the tool's output when a step fails.
    pub fn start(bin: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for PostgreSQL");
        let run_as = if !is_root() {
            None
        } else if user_exists("postgres") {
            Some(RunAs::Postgres)
        } else {
            Some(RunAs::Nobody)
        };
        if let Some(run_as) = run_as {
            let owner = match run_as {
                RunAs::Postgres => "postgres:",
                RunAs::Nobody => "65534:65534",
            };
            let out = Command::new("chown")
                .args(["-R", owner])
                .arg(dir.path())
                .output()
                .expect("run chown");
            check("chown", &out);
        }
        let data = dir.path().join("data");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("free loopback port")
            .port();
        let cluster = Self {
            bin: bin.to_owned(),
            run_as,
            data,
            port,
            _dir: dir,
        };
        let out = cluster
            .tool("initdb")
            .arg("-D")
            .arg(&cluster.data)
            .args(["-U", "rlark", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        check("initdb", &out);
        cluster.resume();
        cluster
    }

    /// Start the (stopped) cluster again on the same port; panics with the server log if it
    /// does not come up.
    pub fn resume(&self) {
        let log = self._dir.path().join("postgres.log");
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&log)
            .arg("-o")
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {}",
                self.port,
                self._dir.path().display()
            ))
            .args(["-w", "-t", "60", "start"])
            .output()
            .expect("run pg_ctl start");
        if !out.status.success() {
            let server_log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "pg_ctl start failed: {}{}\nserver log:\n{server_log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Stop the cluster at once (`-m immediate`: as a crash would; committed transactions
    /// are in the WAL and replayed at the next start).
    pub fn pause(&self) {
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output()
            .expect("run pg_ctl stop");
        check("pg_ctl stop", &out);
    }

    fn tool(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        match self.run_as {
            None => Command::new(program),
            Some(RunAs::Postgres) => {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(program);
                command
            }
            Some(RunAs::Nobody) => {
                let mut command = Command::new("setpriv");
                command
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(program);
                command
            }
        }
    }

    /// URL of database `database` (the cluster has `postgres`; see [`Self::create_database`]).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://rlark@127.0.0.1:{}/{database}", self.port)
    }
}

impl PgCluster {
    /// Create database `name` (with `psql` from the same installation, or on `PATH`).
    pub fn create_database(&self, name: &str) {
        let psql = match self.bin.join("psql") {
            bundled if bundled.is_file() => bundled,
            _ => PathBuf::from("psql"),
        };
        let out = Command::new(psql)
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "rlark",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(format!("CREATE DATABASE \"{name}\""))
            .output()
            .expect("run psql");
        check("CREATE DATABASE", &out);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Stopped already (a test's `pause`) is fine; anything else is reported.
        let stopped = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        if let Ok(out) = stopped
            && !out.status.success()
            && self.data.join("postmaster.pid").exists()
        {
            eprintln!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[track_caller]
fn check(step: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{step} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
