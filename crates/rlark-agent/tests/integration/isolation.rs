//! Isolated raw replicas (issue 38, finding "a granted user owns the cluster"): real
//! replicas under the real supervisor (`rlark-agent-supervise`) in the sandboxes the agent's
//! policy gives them (`tasks::isolation`), checked from inside with ordinary tools — what a
//! user with a shell in the replica (`rlark exec`, the SSH endpoint) would try.
//!
//! Before isolation each of these read or did what it asserts now fails: the replica ran as
//! root in the host's mount and PID namespaces.
//!
//! Needs root (users, mounts, control groups), as the agent does.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use rlark_agent::IsolationConfig;
use rlark_agent::runtime::sandbox::{SANDBOX_FILE, enter_argv};
use rlark_agent::runtime::uids::recorded_uid;
use rlark_agent::runtime::{ExitStatus, ReplicaHandle, ReplicaSpec, spawn_replica};
use rlark_agent::tasks::isolation::{Decision, Isolation, Request};
use rlark_api::types::RawTaskSpec;

const DEADLINE: Duration = Duration::from_secs(30);

fn supervisor() -> Vec<OsString> {
    vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()]
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "replica isolation tests need root (they switch users, mount and make control groups)"
    );
}

/// A host laid out as an agent's: its data directory with an identity (a private key and
/// the CA certificate) and a server's PKI beside it.
struct Host {
    root: tempfile::TempDir,
    isolation: Isolation,
}

impl Host {
    fn new(config: IsolationConfig) -> anyhow::Result<Host> {
        let root = tempfile::tempdir()?;
        // As /var/lib is: others may traverse it.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
        let identity = root.path().join("agent/identity");
        std::fs::create_dir_all(&identity)?;
        std::fs::write(identity.join("agent.pem"), "AGENT-PRIVATE-KEY")?;
        std::fs::set_permissions(
            identity.join("agent.pem"),
            std::fs::Permissions::from_mode(0o600),
        )?;
        std::fs::write(identity.join("ca.crt"), "CA-CERTIFICATE")?;
        let pki = root.path().join("server/pki");
        std::fs::create_dir_all(&pki)?;
        std::fs::write(pki.join("ca.key"), "CA-PRIVATE-KEY")?;
        let mut config = config;
        config.hide.push(root.path().join("server"));
        let isolation = Isolation::prepare(&config, &root.path().join("agent"), None)
            .ok_or_else(|| anyhow::anyhow!("isolation is off"))?;
        Ok(Host { root, isolation })
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    /// Start replica `task`-0 running `script` (sh -c) with `env`, as the agent would.
    async fn start(
        &self,
        task: &str,
        raw: &RawTaskSpec,
        script: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<ReplicaHandle> {
        let dir = self.path(&format!("agent/tasks/rlark-a/{task}/uid/0"));
        std::fs::create_dir_all(&dir)?;
        let pod = format!("{task}-0");
        let ca_file = self.path("agent/identity/ca.crt");
        let request = Request {
            namespace: "rlark-a",
            pod: &pod,
            job: "job",
            raw,
            replica_dir: &dir,
            ca_file: &ca_file,
            sockets: Vec::new(),
        };
        let Decision::Isolated(sandbox) = self
            .isolation
            .decide(&request)
            .map_err(anyhow::Error::msg)?
        else {
            anyhow::bail!("the policy ran {task} as root");
        };
        let mut spec = ReplicaSpec::new(vec!["/bin/sh".into(), "-c".into(), script.into()], &dir);
        spec.supervisor = supervisor();
        spec.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        spec.env
            .push(("RLARK_CA_FILE".into(), ca_file.display().to_string()));
        spec.sandbox = Some(sandbox);
        Ok(spawn_replica(spec).await?)
    }
}

fn log_of(handle: &ReplicaHandle) -> String {
    std::fs::read_to_string(handle.log_path()).unwrap_or_default()
}

async fn finish(mut handle: ReplicaHandle) -> anyhow::Result<(ExitStatus, String)> {
    let exit = tokio::time::timeout(DEADLINE, handle.wait()).await?;
    Ok((exit.status, log_of(&handle)))
}

fn policy() -> IsolationConfig {
    IsolationConfig {
        // A parent of its own, so these tests' groups are easy to find and never mix with
        // an agent's.
        cgroup_parent: "/rlark-test.slice".into(),
        ..IsolationConfig::default()
    }
}

#[tokio::test]
async fn a_replica_cannot_read_keys_other_replicas_env_or_processes_nor_enter_their_namespaces()
-> anyhow::Result<()> {
    require_root();
    let host = Host::new(policy())?;
    let root = host.root.path().display().to_string();
    let raw = RawTaskSpec::default();
    let other = host
        .start(
            "b",
            &raw,
            "echo started; exec sleep 60",
            &[("SECRET_B", "hunter2".to_string())],
        )
        .await?;
    let other_pid = other.pid();
    let script = format!(
        r#"
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
echo "name=$(id -un)"
cat {root}/agent/identity/agent.pem && echo "LEAK agent key"
cat {root}/server/pki/ca.key && echo "LEAK CA key"
ls {root}/server/pki 2>/dev/null | grep -q . && echo "LEAK server listing"
echo "ca=$(cat "$RLARK_CA_FILE")"
echo "tasks=$(ls {root}/agent/tasks/rlark-a | tr '\n' ' ')"
cat /proc/{other_pid}/environ && echo "LEAK other environ"
cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -q SECRET_B && echo "LEAK environ by glob"
nsenter --net=/proc/{other_pid}/ns/net true 2>/dev/null && echo "LEAK entered netns"
nsenter --target 1 --mount true 2>/dev/null && echo "LEAK entered host mounts"
kill -0 {other_pid} 2>/dev/null && echo "LEAK can signal"
echo "visible=$(ls /proc | grep -c '^[0-9]')"
touch own-file && echo "wrote work"
touch ../pid.json 2>/dev/null && echo "LEAK wrote replica records"
grep -q NoNewPrivs:.*1 /proc/self/status && echo "no_new_privs"
echo "cgroup=$(grep -E 'memory|^0::' /proc/self/cgroup | head -1)"
"#
    );
    let (status, log) = finish(host.start("a", &raw, &script, &[]).await?).await?;
    assert_eq!(status, ExitStatus::Code(0), "{log}");
    eprintln!("{log}");
    assert!(
        !log.contains("LEAK"),
        "the replica reached what is not its own:\n{log}"
    );
    let uid_line = log
        .lines()
        .find(|l| l.starts_with("uid="))
        .unwrap_or_default();
    let uid: u32 = uid_line
        .trim_start_matches("uid=")
        .split(' ')
        .next()
        .unwrap_or_default()
        .parse()?;
    assert!(
        rlark_agent::runtime::uids::DEFAULT_RANGE.contains(&uid),
        "runs as a replica user: {uid_line}"
    );
    assert!(
        uid_line.ends_with(&format!("groups={uid}")),
        "no extra groups: {uid_line}"
    );
    assert!(log.contains("ca=CA-CERTIFICATE"), "{log}");
    assert!(
        log.contains("name=rlark-replica"),
        "its user has a name: {log}"
    );
    assert!(
        log.contains("tasks=a \n") || log.contains("tasks=a\n"),
        "only its own task dir: {log}"
    );
    assert!(log.contains("wrote work"), "{log}");
    assert!(log.contains("no_new_privs"), "{log}");
    assert!(
        log.contains("rlark-test.slice/rlark-a_a-0"),
        "in its control group: {log}"
    );
    let visible: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("visible="))
        .unwrap_or_default()
        .parse()?;
    assert!(
        visible < 10,
        "sees only its own processes, saw {visible}:\n{log}"
    );

    // The other replica has a user of its own.
    let other_uid = recorded_uid(&host.path("agent/tasks/rlark-a/b/uid/0")).context("b's user")?;
    assert_ne!(other_uid.to_string(), uid.to_string());
    drop(other);
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(i32::try_from(other_pid)?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    Ok(())
}

/// `rlark exec` (and the SSH shell of a task) enter the replica's sandbox: its user, its
/// mounts, its network — not the agent's.
#[tokio::test]
async fn exec_enters_the_replicas_sandbox_as_its_user() -> anyhow::Result<()> {
    require_root();
    let host = Host::new(policy())?;
    let root = host.root.path().display().to_string();
    let mut replica = host
        .start("c", &RawTaskSpec::default(), "exec sleep 60", &[])
        .await?;
    let dir = host.path("agent/tasks/rlark-a/c/uid/0");
    let uid = recorded_uid(&dir).context("c's user")?.to_string();
    let argv = enter_argv(
        &supervisor(),
        replica.pid(),
        Some(&dir.join(SANDBOX_FILE)),
        &dir.join("work"),
        &[
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!(
                "id -u; pwd; cat {root}/agent/identity/agent.pem || echo refused; \
                 ls /proc | grep -c '^[0-9]'"
            ),
        ],
    );
    let output = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .await?;
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(lines.first().copied(), Some(uid.trim()), "{text}");
    assert_eq!(
        lines.get(1).copied(),
        Some(dir.join("work").to_str().unwrap_or_default())
    );
    assert_eq!(lines.get(2).copied(), Some("refused"), "{text}");
    let visible: usize = lines.get(3).copied().unwrap_or_default().parse()?;
    assert!(visible < 10, "{text}");
    replica.terminate(Duration::from_secs(1)).await;
    Ok(())
}

/// The Task's memory limit is the replica's: past it the kernel kills it.
#[tokio::test]
async fn a_replica_is_held_to_its_memory_limit() -> anyhow::Result<()> {
    require_root();
    let host = Host::new(policy())?;
    let raw: RawTaskSpec = serde_json::from_value(serde_json::json!({
        "entrypoint": ["x"],
        "resources": {"limits": {"memory": "32Mi", "cpu": "500m"}}
    }))?;
    // `tail -n 1` keeps a line that never ends in memory: up to 256 MiB of zeros, bounded
    // even if no limit held. Killed by the kernel (SIGKILL, 128 + 9) within the 32 MiB.
    let (status, log) = finish(
        host.start(
            "m",
            &raw,
            "head -c 268435456 /dev/zero | tail -n 1 >/dev/null; echo \"tail=$?\"",
            &[],
        )
        .await?,
    )
    .await?;
    eprintln!("{log}");
    match status {
        // The kernel killed `tail`, the largest process of the group.
        ExitStatus::Code(0) => assert!(log.contains("tail=137"), "the memory limit held: {log}"),
        // Under memory pressure elsewhere the OOM killer may pick the shell first (seen once
        // in a full test run): the limit held all the same. Without one the shell ends
        // normally with `tail=0`.
        ExitStatus::Signal(9) => assert!(!log.contains("tail=0"), "{log}"),
        other => panic!("the replica ended with {other:?}: {log}"),
    }
    Ok(())
}

/// A Task asking for root, or for a user the agent does not allow, does not start.
#[tokio::test]
async fn root_and_foreign_users_are_refused_unless_allowed() -> anyhow::Result<()> {
    require_root();
    let host = Host::new(policy())?;
    let as_root: RawTaskSpec = serde_json::from_value(serde_json::json!({
        "entrypoint": ["x"], "runAsUser": 0
    }))?;
    let error = host
        .start("r", &as_root, "id -u", &[])
        .await
        .map(|_| ())
        .expect_err("root refused");
    assert!(error.to_string().contains("--replica-root-jobs"), "{error}");
    Ok(())
}
