//! `rlark backup`, `rlark restore` and `rlark store migrate` as an operator runs them: the
//! real binary against real servers (`rlark server` processes) on SQLite data directories and
//! on a throwaway PostgreSQL cluster (skipped with a message when PostgreSQL is not installed,
//! a failure under CI=true; `tests/support/missing_tool.rs`).

use crate::missing_tool;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use rlark_store::backup::Snapshot;
use rlark_testkit::ServerProcess;

/// Longest any one command may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// Leases in namespace `default`: objects no controller writes, so their resourceVersions
/// stay as the test wrote them (a Domain's status is written by its controller at any time).
fn leases() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
        "leases",
    )
}

fn lease(name: &str, holder: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"holderIdentity": holder},
    }))?)
}

async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// `rlark ARGS...` (no inherited kubeconfig).
async fn rlark(args: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .env_remove("RLARK_STORE")
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .with_context(|| format!("rlark {args:?} did not finish within {DEADLINE:?}"))?
        .with_context(|| format!("run rlark {args:?}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn ok(args: &[&str]) -> Result<String> {
    let output = rlark(args).await?;
    if !output.status.success() {
        bail!(
            "rlark {args:?} failed ({}): {}",
            output.status,
            stderr(&output)
        );
    }
    Ok(stderr(&output))
}

/// `rlark ARGS...` must fail with exit code 1 and say `says`.
async fn fails(args: &[&str], says: &str) -> Result<()> {
    let output = rlark(args).await?;
    let text = stderr(&output);
    anyhow::ensure!(
        output.status.code() == Some(1) && text.contains(says),
        "rlark {args:?} should fail saying {says:?}; got {} and {text:?}",
        output.status
    );
    Ok(())
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Three Leases, one of them deleted and one relabelled: a history with gaps in its
/// revisions. Returns the survivors' (name, resourceVersion).
async fn write_leases(client: &kube::Client) -> Result<Vec<(String, String)>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &leases());
    for name in ["backup-alpha", "backup-beta", "backup-gamma"] {
        api.create(&PostParams::default(), &lease(name, "test")?)
            .await?;
    }
    api.delete("backup-beta", &DeleteParams::default()).await?;
    let patch = serde_json::json!({"metadata": {"labels": {"tier": "edge"}}});
    api.patch(
        "backup-gamma",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    lease_versions(client).await
}

/// The test's Leases (name prefix `backup-`), sorted.
async fn lease_versions(client: &kube::Client) -> Result<Vec<(String, String)>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &leases());
    let mut found: Vec<(String, String)> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.name.unwrap_or_default(),
                d.metadata.resource_version.unwrap_or_default(),
            )
        })
        .filter(|(name, _)| name.starts_with("backup-"))
        .collect();
    found.sort();
    Ok(found)
}

fn read_backup(file: &Path) -> Result<Snapshot> {
    let file = std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?;
    Ok(Snapshot::read_from(std::io::BufReader::new(file))?)
}

/// Copy `from`'s `pki/` (the CA) into `to`: a restored store is served with the CA its
/// certificates and tokens were issued by.
fn copy_pki(from: &Path, to: &Path) -> Result<()> {
    let (from, to) = (from.join("pki"), to.join("pki"));
    std::fs::create_dir_all(&to)?;
    for entry in std::fs::read_dir(&from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// Online backup from a running server (admins only, a file is never overwritten), offline
/// backup of a stopped one, restore into a new data directory served with the old CA: the
/// same objects with the same resourceVersions, and new writes numbered after them. A store
/// in use or with data is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_and_restore_a_sqlite_data_directory() -> Result<()> {
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let work = tempfile::tempdir()?;
    let (dir_a, dir_b) = (work.path().join("a"), work.path().join("b"));
    let server = ServerProcess::spawn(binary, &dir_a)?;
    let admin = server.kubeconfig_path().to_path_buf();
    let written = write_leases(&client_for(&admin).await?).await?;
    assert_eq!(written.len(), 2);

    let online = work.path().join("online.jsonl");
    let said = ok(&["backup", path(&online), "--kubeconfig", path(&admin)]).await?;
    assert!(
        said.contains("backed up") && said.contains("from the server"),
        "{said}"
    );
    let snapshot = read_backup(&online)?;
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&online)?.permissions().mode() & 0o777,
        0o600
    );
    let leases_in = |s: &Snapshot| {
        let mut found: Vec<(String, String)> = s
            .objects
            .iter()
            .filter(|o| o.key.resource.contains("leases") && o.key.name.starts_with("backup-"))
            .map(|o| (o.key.name.clone(), o.revision.to_string()))
            .collect();
        found.sort();
        found
    };
    assert_eq!(leases_in(&snapshot), written);
    fails(
        &["backup", path(&online), "--kubeconfig", path(&admin)],
        "an existing file is not overwritten",
    )
    .await?;

    // A viewer may read objects but not take a backup (it holds tokens and Secrets).
    let viewer = work.path().join("viewer.kubeconfig");
    ok(&[
        "kubeconfig",
        "--user",
        "vera",
        "--role",
        "viewer",
        "-o",
        path(&viewer),
        "--kubeconfig",
        path(&admin),
    ])
    .await?;
    fails(
        &[
            "backup",
            path(&work.path().join("v.jsonl")),
            "--kubeconfig",
            path(&viewer),
        ],
        "only admins may take a backup",
    )
    .await?;

    // The store of a running server cannot be read or written directly.
    let sqlite_a = format!("sqlite:{}", path(&dir_a));
    let offline = work.path().join("offline.jsonl");
    fails(
        &["backup", path(&offline), "--from", &sqlite_a],
        "is its server stopped?",
    )
    .await?;

    server.terminate()?;
    let said = ok(&["backup", path(&offline), "--from", &sqlite_a]).await?;
    assert!(said.contains("rlark.db"), "{said}");
    let stopped = read_backup(&offline)?;
    assert_eq!(leases_in(&stopped), written);
    assert!(stopped.revision >= snapshot.revision);
    fails(
        &[
            "backup",
            path(&work.path().join("x.jsonl")),
            "--from",
            &format!("sqlite:{}", path(&dir_b)),
        ],
        "no store at",
    )
    .await?;

    // Restore the online backup into a new data directory, with the old CA.
    let sqlite_b = format!("sqlite:{}", path(&dir_b));
    let said = ok(&["restore", path(&online), "--to", &sqlite_b]).await?;
    assert!(
        said.contains(&format!("at revision {}", snapshot.revision)),
        "{said}"
    );
    fails(
        &["restore", path(&online), "--to", &sqlite_b],
        "is not empty",
    )
    .await?;
    copy_pki(&dir_a, &dir_b)?;
    let restored = ServerProcess::spawn(binary, &dir_b)?;
    let client = client_for(restored.kubeconfig_path()).await?;
    assert_eq!(lease_versions(&client).await?, written);
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &leases());
    let created = api
        .create(&PostParams::default(), &lease("after-restore", "test")?)
        .await?;
    let version: u64 = created
        .metadata
        .resource_version
        .unwrap_or_default()
        .parse()?;
    assert!(
        version > snapshot.revision,
        "{version} after a restore at {}",
        snapshot.revision
    );
    fails(
        &["restore", path(&online), "--to", &sqlite_b],
        "is its server stopped?",
    )
    .await?;
    restored.terminate()?;

    // A damaged file is refused before anything is written.
    let damaged = work.path().join("damaged.jsonl");
    let text = std::fs::read_to_string(&online)?;
    let cut: Vec<&str> = text.lines().collect();
    std::fs::write(&damaged, cut[..cut.len() - 1].join("\n"))?;
    fails(
        &[
            "restore",
            path(&damaged),
            "--to",
            &format!("sqlite:{}", path(&work.path().join("c"))),
        ],
        "the backup is truncated",
    )
    .await?;
    Ok(())
}

/// `rlark store migrate` from SQLite to PostgreSQL and back: a server on each copy serves
/// the same objects with the same resourceVersions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_migrate_between_sqlite_and_postgres() -> Result<()> {
    let Some(bin) = rlark_testkit::postgres::find_bin() else {
        missing_tool::skip_or_fail(
            "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
        );
        return Ok(());
    };
    let cluster = rlark_testkit::postgres::PgCluster::start(&bin);
    cluster.create_database("migrated");
    let url = cluster.url("migrated");
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let work = tempfile::tempdir()?;
    let (dir_a, dir_b) = (work.path().join("a"), work.path().join("b"));
    let server = ServerProcess::spawn(binary, &dir_a)?;
    let written = write_leases(&client_for(server.kubeconfig_path()).await?).await?;
    server.terminate()?;

    let sqlite_a = format!("sqlite:{}", path(&dir_a));
    let said = ok(&["store", "migrate", "--from", &sqlite_a, "--to", &url]).await?;
    assert!(
        said.contains("copied") && !said.contains("password"),
        "{said}"
    );
    fails(
        &["store", "migrate", "--from", &sqlite_a, "--to", &url],
        "is not empty",
    )
    .await?;
    fails(
        &["store", "migrate", "--from", &sqlite_a, "--to", &sqlite_a],
        "the same store",
    )
    .await?;

    // Served from PostgreSQL (with the data directory's CA).
    let on_pg = ServerProcess::spawn_with_args(binary, &dir_a, &["--store", &url])?;
    assert_eq!(
        lease_versions(&client_for(on_pg.kubeconfig_path()).await?).await?,
        written
    );
    on_pg.terminate()?;

    // And back into a new data directory.
    let sqlite_b = format!("sqlite:{}", path(&dir_b));
    ok(&["store", "migrate", "--from", &url, "--to", &sqlite_b]).await?;
    copy_pki(&dir_a, &dir_b)?;
    let back = ServerProcess::spawn(binary, &dir_b)?;
    assert_eq!(
        lease_versions(&client_for(back.kubeconfig_path()).await?).await?,
        written
    );
    back.terminate()?;
    Ok(())
}
