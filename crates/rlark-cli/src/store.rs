//! `rlark backup`, `rlark restore` and `rlark store migrate`: a store's objects saved to a
//! file, written into an empty store, or carried from one backend to another, with their
//! revisions (`rlark_store::backup`; docs/operations.md, "Backup and restore").
//!
//! A store is named `sqlite:DIR` (a data directory; its `rlark.db`) or by a `postgres://`
//! URL. Reading or writing a store directly needs its server stopped: the SQLite backend
//! takes the file's exclusive lock and the PostgreSQL one the writer lock, so either fails,
//! naming the problem, while a server runs on it. `rlark backup` without `--from` asks the
//! running server instead (`GET /rlark/v1/backup`, admin credentials).

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use futures::AsyncReadExt as _;
use rlark_store::backup::{self, Snapshot};
use rlark_store::{
    Backend, PostgresBackend, PostgresStoreConfig, SqliteBackend, SqliteStoreConfig,
};

use super::ClientArgs;
use super::client::Session;

#[derive(Debug, Args)]
pub(crate) struct BackupArgs {
    /// The backup file to write (JSON Lines; `-` for standard output). An existing file is
    /// not overwritten.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Read this store directly instead of asking the running server: `sqlite:DIR` (a data
    /// directory) or a postgres:// URL. Its server must be stopped.
    #[arg(long, value_name = "STORE")]
    from: Option<String>,
    #[arg(skip)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// The backup file to read (`-` for standard input).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The store to restore into: `sqlite:DIR` (a data directory; created if absent) or a
    /// postgres:// URL. It must be empty, and no server may run on it.
    #[arg(long, value_name = "STORE")]
    to: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum StoreCommand {
    /// Copy every object, with its revision, from one store into another, empty one (both
    /// servers stopped): `--from sqlite:DIR --to postgres://...` or back.
    Migrate(MigrateArgs),
}

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// The store to copy: `sqlite:DIR` or a postgres:// URL.
    #[arg(long, value_name = "STORE")]
    from: String,
    /// The empty store to copy into: `sqlite:DIR` (created if absent) or a postgres:// URL.
    #[arg(long, value_name = "STORE")]
    to: String,
}

/// A store named on the command line.
#[derive(Debug, PartialEq)]
enum StoreRef {
    /// The database file of a data directory.
    Sqlite(PathBuf),
    Postgres(String),
}

impl StoreRef {
    fn parse(text: &str) -> anyhow::Result<Self> {
        if let Some(dir) = text.strip_prefix("sqlite:") {
            if dir.is_empty() {
                bail!("store {text:?}: sqlite: needs a data directory (sqlite:DIR)");
            }
            return Ok(StoreRef::Sqlite(Path::new(dir).join("rlark.db")));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(StoreRef::Postgres(text.to_string()));
        }
        bail!(
            "store {:?} is neither sqlite:DIR (a data directory) nor a postgres:// URL",
            rlark_server::redact_url(text)
        )
    }

    /// For messages: no password.
    fn describe(&self) -> String {
        match self {
            StoreRef::Sqlite(path) => path.display().to_string(),
            StoreRef::Postgres(url) => rlark_server::redact_url(url),
        }
    }
}

/// What to do with a store opened directly.
enum Step<'a> {
    /// Read everything it holds.
    Read,
    /// Write this snapshot into it (it must be empty).
    Write(&'a Snapshot),
}

/// Open `store`'s backend (its server must be stopped), take `step`, close it: the snapshot
/// read, or `None` after a write.
async fn on_store(store: &StoreRef, step: Step<'_>) -> anyhow::Result<Option<Snapshot>> {
    let described = store.describe();
    let opening = || format!("open {described} (is its server stopped?)");
    match store {
        StoreRef::Sqlite(path) => {
            // Opening creates a missing file: a mistyped directory would read as empty.
            if matches!(step, Step::Read) && !path.is_file() {
                bail!("no store at {described} (is the directory a server's data directory?)");
            }
            let backend = SqliteBackend::open(&SqliteStoreConfig::new(path))
                .await
                .with_context(opening)?;
            on_backend(backend, step, &described).await
        }
        StoreRef::Postgres(url) => {
            let backend = PostgresBackend::open_backend(&PostgresStoreConfig::from_url(url)?)
                .await
                .with_context(opening)?;
            on_backend(backend, step, &described).await
        }
    }
}

/// [`on_store`] once the backend is open; closes it whatever the outcome.
async fn on_backend<B: Backend>(
    mut backend: B,
    step: Step<'_>,
    described: &str,
) -> anyhow::Result<Option<Snapshot>> {
    let result = match step {
        Step::Read => Snapshot::of_backend(&mut backend)
            .await
            .map(Some)
            .with_context(|| format!("read {described}")),
        Step::Write(snapshot) => backup::import(&mut backend, snapshot)
            .await
            .map(|()| None)
            .with_context(|| format!("restore into {described}")),
    };
    backend.close().await;
    result
}

/// Read everything `store` holds.
async fn load(store: &StoreRef) -> anyhow::Result<Snapshot> {
    on_store(store, Step::Read)
        .await?
        .context("reading a store gave no snapshot")
}

/// Write `snapshot` into the empty store `store`.
async fn import(store: &StoreRef, snapshot: &Snapshot) -> anyhow::Result<()> {
    on_store(store, Step::Write(snapshot)).await.map(drop)
}

/// `rlark backup FILE [--from STORE]`.
pub(crate) async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let to_stdout = args.file.as_os_str() == "-";
    let (text, source) = match &args.from {
        Some(store) => {
            let store = StoreRef::parse(store)?;
            let snapshot = load(&store).await?;
            let mut text = Vec::new();
            snapshot.write_to(&mut text)?;
            (text, store.describe())
        }
        None => (fetch(&args.client).await?, "the server".to_string()),
    };
    // Checked whole before it is written: a backup that would not restore is an error now.
    let snapshot = Snapshot::read_from(text.as_slice())
        .with_context(|| format!("the backup read from {source} is not valid"))?;
    if to_stdout {
        std::io::stdout()
            .lock()
            .write_all(&text)
            .context("write the backup to standard output")?;
    } else {
        write_new(&args.file, &text)?;
    }
    eprintln!(
        "backed up {} objects at revision {} from {source}{}",
        snapshot.objects.len(),
        snapshot.revision,
        if to_stdout {
            String::new()
        } else {
            format!(" to {}", args.file.display())
        }
    );
    Ok(())
}

/// `GET /rlark/v1/backup` from the server of the kubeconfig.
async fn fetch(client: &ClientArgs) -> anyhow::Result<Vec<u8>> {
    let session = Session::connect(client).await?;
    let request = http::Request::get("/rlark/v1/backup")
        .header(http::header::ACCEPT, "application/x-ndjson")
        .body(Vec::new())
        .context("build the request")?;
    let mut body = session
        .client
        .request_stream(request)
        .await
        .context("GET /rlark/v1/backup (admin credentials needed)")?;
    let mut text = Vec::new();
    body.read_to_end(&mut text)
        .await
        .context("read the backup from the server")?;
    Ok(text)
}

/// Write `bytes` to a file that must not exist yet, readable by its owner only (a backup
/// holds token hashes, certificate records and Secrets), durably (fsync before returning).
fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "create {} (an existing file is not overwritten)",
                path.display()
            )
        })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", path.display()))
}

/// `rlark restore FILE --to STORE`.
pub(crate) async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let store = StoreRef::parse(&args.to)?;
    let snapshot = if args.file.as_os_str() == "-" {
        Snapshot::read_from(std::io::stdin().lock())
            .context("read the backup from standard input")?
    } else {
        let file = std::fs::File::open(&args.file)
            .with_context(|| format!("open {}", args.file.display()))?;
        Snapshot::read_from(BufReader::new(file))
            .with_context(|| format!("read {}", args.file.display()))?
    };
    import(&store, &snapshot).await?;
    eprintln!(
        "restored {} objects at revision {} into {}",
        snapshot.objects.len(),
        snapshot.revision,
        store.describe()
    );
    Ok(())
}

/// `rlark store migrate --from STORE --to STORE`.
pub(crate) async fn store(command: StoreCommand) -> anyhow::Result<()> {
    match command {
        StoreCommand::Migrate(args) => {
            let (from, to) = (StoreRef::parse(&args.from)?, StoreRef::parse(&args.to)?);
            if from == to {
                bail!("--from and --to name the same store ({})", from.describe());
            }
            let snapshot = load(&from).await?;
            import(&to, &snapshot).await?;
            eprintln!(
                "copied {} objects at revision {} from {} to {}",
                snapshot.objects.len(),
                snapshot.revision,
                from.describe(),
                to.describe()
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_are_named_sqlite_dir_or_postgres_urls() {
        assert_eq!(
            StoreRef::parse("sqlite:/var/lib/rlark").expect("sqlite"),
            StoreRef::Sqlite(PathBuf::from("/var/lib/rlark/rlark.db"))
        );
        assert_eq!(
            StoreRef::parse("postgres://u:pw@db/rlark").expect("pg"),
            StoreRef::Postgres("postgres://u:pw@db/rlark".into())
        );
        for (bad, says) in [
            ("sqlite:", "sqlite: needs a data directory"),
            ("/var/lib/rlark", "neither sqlite:DIR"),
            ("mysql://u:secret@db/x", "\"mysql://u@db/x\" is neither"),
        ] {
            let error = StoreRef::parse(bad).expect_err(bad).to_string();
            assert!(error.contains(says), "{error:?} should say {says:?}");
            assert!(!error.contains("secret"), "{error:?} shows the password");
        }
        assert_eq!(
            StoreRef::Postgres("postgres://u:pw@db/rlark".into()).describe(),
            "postgres://u@db/rlark"
        );
    }
}
