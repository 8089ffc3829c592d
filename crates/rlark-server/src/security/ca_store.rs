//! The installation's CAs in the store, so that server replicas sharing a store share them.
//!
//! One record (`certificateauthorities.security.rlark.io/installation`, a resource the API
//! registry does not serve) holds the files of `pki/` that make the CAs: `ca.crt` and
//! `ssh_ca.pub` as they are, `ca.key` and `ssh_ca` sealed with AES-256-GCM under a key derived
//! from the operator's secret (`--ca-secret-file`, never stored). A database dump or an
//! `rlark backup` therefore carries the CAs without exposing their keys.
//!
//! At start, before the CA is loaded ([`sync`]):
//! - the store has the record and `pki/` has no CA: the files are unsealed into `pki/` (the
//!   secret is required, and a wrong one is refused by the AEAD tag);
//! - both have one: they must be the same CA, or the start is refused (this data directory
//!   belongs to another installation);
//! - the store has none and a secret is given: the local CA (created now if there is none) is
//!   sealed into the store. Two replicas starting at once race on the create; the loser
//!   adopts the winner's CA if its own was created in this start, and is refused otherwise.
//! - no secret and no record: nothing changes (the CA lives in `pki/` only, as before).
//!
//! Not carried: a CA rotation's `pki/trusted/` and `pki/ca-cross.crt` (rotate on one replica
//! and copy those files to the others).

use std::path::Path;

use base64::Engine as _;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use rlark_store::{ObjectKey, Store, StoreError};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use crate::{ServerError, ServerStore};

/// Store resource of the CA record.
pub(crate) const CERTIFICATE_AUTHORITIES: &str = "certificateauthorities.security.rlark.io";
/// Its one record's name.
pub(crate) const RECORD: &str = "installation";
/// Shortest accepted secret, in bytes (after trimming surrounding whitespace).
pub const MIN_SECRET_BYTES: usize = 32;
/// The files of `pki/` the record carries: (file name, sealed).
const FILES: [(&str, bool); 4] = [
    (rlark_pki::CA_CERT_FILE, false),
    (rlark_pki::CA_KEY_FILE, true),
    (rlark_pki::ssh::SSH_CA_PUB_FILE, false),
    (rlark_pki::ssh::SSH_CA_KEY_FILE, true),
];
/// Names the sealing scheme in the record, so a later one can be told apart.
const SCHEME: &str = "aes-256-gcm/sha256-v1";

/// The operator's secret, as the AEAD key derived from it.
pub struct CaSecret {
    key: LessSafeKey,
}

impl std::fmt::Debug for CaSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaSecret(..)")
    }
}

impl CaSecret {
    /// From the secret's bytes (a file's content; surrounding whitespace ignored). Refused
    /// below [`MIN_SECRET_BYTES`].
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the CA secret has {} bytes; at least {MIN_SECRET_BYTES} are required \
                 (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
                secret.len()
            ));
        }
        let mut hasher = Sha256::new();
        hasher.update(b"rlark ca secret v1\0");
        hasher.update(secret);
        let digest = hasher.finalize();
        let key = UnboundKey::new(&AES_256_GCM, &digest)
            .map_err(|_| "cannot derive the CA sealing key".to_string())?;
        Ok(Self {
            key: LessSafeKey::new(key),
        })
    }

    /// Read the secret from `path`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("read the CA secret file {}: {e}", path.display()))?;
        Self::new(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// `base64(nonce || ciphertext || tag)`, bound to the file's name.
    fn seal(&self, file: &str, plain: &[u8]) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| "no randomness for a nonce".to_string())?;
        let mut sealed = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(file.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| format!("cannot seal {file}"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(base64::engine::general_purpose::STANDARD.encode(out))
    }

    fn open(&self, file: &str, sealed: &str) -> Result<Vec<u8>, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|e| format!("{file} in the store is not base64: {e}"))?;
        if bytes.len() < NONCE_LEN {
            return Err(format!("{file} in the store is truncated"));
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| format!("{file} in the store has a bad nonce"))?;
        let mut buffer = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(file.as_bytes()), &mut buffer)
            .map_err(|_| {
                format!(
                    "cannot unseal {file} from the store: the CA secret is not the one it was \
                     sealed with"
                )
            })?;
        Ok(plain.to_vec())
    }
}

fn refused(message: String) -> ServerError {
    ServerError::Security(message)
}

fn store_error(store: &ServerStore) -> impl Fn(StoreError) -> ServerError + '_ {
    |source| ServerError::OpenStore {
        path: store.location(),
        source,
    }
}

/// Bring `pki_dir` and the store's record into agreement (see the module documentation).
pub(crate) async fn sync(
    store: &ServerStore,
    pki_dir: &Path,
    secret: Option<&CaSecret>,
) -> Result<(), ServerError> {
    let key = ObjectKey::new(CERTIFICATE_AUTHORITIES, "", RECORD);
    let local_cert = pki_dir.join(rlark_pki::CA_CERT_FILE);
    let had_local = local_cert.exists();
    let had_local_ssh = pki_dir.join(rlark_pki::ssh::SSH_CA_PUB_FILE).exists();
    if let Some(record) = store.get(&key).await.map_err(store_error(store))? {
        return adopt(&record, pki_dir, secret, had_local);
    }
    let Some(secret) = secret else {
        return Ok(());
    };
    // Create what is missing locally, then publish it.
    rlark_pki::Ca::load_or_create(pki_dir)?;
    rlark_pki::ssh::SshCa::load_or_create(pki_dir).map_err(|e| refused(format!("SSH CA: {e}")))?;
    let mut files = Map::new();
    for (file, sealed) in FILES {
        let path = pki_dir.join(file);
        let bytes =
            std::fs::read(&path).map_err(|e| refused(format!("read {}: {e}", path.display())))?;
        let entry = if sealed {
            json!({"sealed": secret.seal(file, &bytes).map_err(refused)?})
        } else {
            json!({"plain": String::from_utf8_lossy(&bytes)})
        };
        files.insert(file.to_string(), entry);
    }
    let record = json!({
        "metadata": {"name": RECORD},
        "spec": {"scheme": SCHEME, "files": files},
    });
    match store.create(&key, record).await {
        Ok(_) => {
            tracing::info!("the installation's CAs are now in the store, keys sealed");
            Ok(())
        }
        Err(StoreError::AlreadyExists(_)) => {
            // Another replica published first.
            let record = store
                .get(&key)
                .await
                .map_err(store_error(store))?
                .ok_or_else(|| refused("the CA record vanished while starting".into()))?;
            lost_race(&record, pki_dir, secret, had_local, had_local_ssh)
        }
        Err(e) => Err(store_error(store)(e)),
    }
}

/// Another replica published its CAs between this start's read and its create: drop what
/// this start created (`had_local*` false) where it differs from the record, then adopt.
fn lost_race(
    record: &Value,
    pki_dir: &Path,
    secret: &CaSecret,
    had_local: bool,
    had_local_ssh: bool,
) -> Result<(), ServerError> {
    let local_cert = pki_dir.join(rlark_pki::CA_CERT_FILE);
    if !had_local && cert_of(record)? != std::fs::read_to_string(&local_cert).ok() {
        // The CA this start created lost the race: take the winner's.
        for (file, _) in FILES {
            let _ = std::fs::remove_file(pki_dir.join(file));
        }
    }
    // The same for the SSH CA alone: replicas given the same X.509 CA (copied into
    // each data directory) still create their SSH CAs here, each its own.
    let ssh_pub = pki_dir.join(rlark_pki::ssh::SSH_CA_PUB_FILE);
    if !had_local_ssh && ssh_pub_of(record) != std::fs::read_to_string(&ssh_pub).ok() {
        for file in [
            rlark_pki::ssh::SSH_CA_KEY_FILE,
            rlark_pki::ssh::SSH_CA_PUB_FILE,
        ] {
            let _ = std::fs::remove_file(pki_dir.join(file));
        }
    }
    adopt(record, pki_dir, Some(secret), had_local)
}

fn ssh_pub_of(record: &Value) -> Option<String> {
    record["spec"]["files"][rlark_pki::ssh::SSH_CA_PUB_FILE]["plain"]
        .as_str()
        .map(str::to_owned)
}

fn cert_of(record: &Value) -> Result<Option<String>, ServerError> {
    Ok(record["spec"]["files"][rlark_pki::CA_CERT_FILE]["plain"]
        .as_str()
        .map(str::to_owned))
}

/// Use the record's CA: check it against `pki/`, or unseal it there.
fn adopt(
    record: &Value,
    pki_dir: &Path,
    secret: Option<&CaSecret>,
    had_local: bool,
) -> Result<(), ServerError> {
    let scheme = record["spec"]["scheme"].as_str().unwrap_or_default();
    if scheme != SCHEME {
        return Err(refused(format!(
            "the store's CA record uses scheme {scheme:?}; this build knows {SCHEME:?}"
        )));
    }
    let stored_cert =
        cert_of(record)?.ok_or_else(|| refused("the store's CA record has no ca.crt".into()))?;
    let local_cert = pki_dir.join(rlark_pki::CA_CERT_FILE);
    if let Ok(local) = std::fs::read_to_string(&local_cert)
        && local.trim() != stored_cert.trim()
    {
        return Err(refused(format!(
            "{} is not the CA this store's installation uses (the store holds another \
             one): this data directory belongs to a different installation. Start with an \
             empty data directory and --ca-secret-file to take the store's CA",
            local_cert.display()
        )));
    }
    let local_ssh = pki_dir.join(rlark_pki::ssh::SSH_CA_PUB_FILE);
    if let (Ok(local), Some(stored)) = (std::fs::read_to_string(&local_ssh), ssh_pub_of(record))
        && local.trim() != stored.trim()
    {
        return Err(refused(format!(
            "{} is not the SSH CA this store's installation uses (the store holds another \
             one): replicas must share it. Remove {} and {} from this data directory to take \
             the store's, or start with an empty data directory",
            local_ssh.display(),
            rlark_pki::ssh::SSH_CA_PUB_FILE,
            rlark_pki::ssh::SSH_CA_KEY_FILE,
        )));
    }
    let mut missing: Vec<&str> = FILES
        .iter()
        .map(|(file, _)| *file)
        .filter(|file| !pki_dir.join(file).exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let Some(secret) = secret else {
        return Err(refused(format!(
            "the store holds this installation's CA with its key sealed, and {} has no copy \
             ({} missing): give the secret it was sealed with (--ca-secret-file FILE, \
             RLARK_CA_SECRET_FILE, or store.caSecretFile in the config file)",
            pki_dir.display(),
            missing.join(", ")
        )));
    };
    rlark_pki::create_private_dir(pki_dir)?;
    // Keys first, the certificate last: `pki/ca.crt` is what marks a data directory as
    // having run, so it must not exist without its key.
    missing.sort_by_key(|file| *file == rlark_pki::CA_CERT_FILE);
    for file in missing {
        let entry = &record["spec"]["files"][file];
        let bytes = match (entry["plain"].as_str(), entry["sealed"].as_str()) {
            (Some(plain), _) => plain.as_bytes().to_vec(),
            (None, Some(sealed)) => secret.open(file, sealed).map_err(refused)?,
            _ => {
                return Err(refused(format!("the store's CA record has no {file}")));
            }
        };
        rlark_pki::write_private_file(&pki_dir.join(file), &bytes)?;
    }
    if !had_local {
        tracing::info!(pki = %pki_dir.display(), "took the installation's CAs from the store");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealing_round_trips_and_binds_the_file_and_the_secret() {
        let secret = CaSecret::new(&[7u8; 40]).expect("secret");
        let sealed = secret.seal("ca.key", b"key material").expect("seal");
        assert_eq!(
            secret.open("ca.key", &sealed).expect("open"),
            b"key material"
        );
        // Another file name (AAD) or another secret is refused.
        assert!(secret.open("ssh_ca", &sealed).is_err());
        let other = CaSecret::new(&[8u8; 40]).expect("secret");
        let error = other.open("ca.key", &sealed).expect_err("wrong secret");
        assert!(error.contains("not the one it was sealed with"), "{error}");
        // Two seals of the same bytes differ (random nonce).
        assert_ne!(
            sealed,
            secret.seal("ca.key", b"key material").expect("seal")
        );
        assert!(secret.open("ca.key", "AAAA").is_err());
    }

    async fn store(dir: &Path) -> ServerStore {
        ServerStore::Sqlite(
            rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
                dir.join("rlark.db"),
            ))
            .await
            .expect("store"),
        )
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).expect(file)
    }

    /// Replicas whose data directories were given the same X.509 CA (the Helm chart's
    /// `ca.existingSecret`, copied into each) end with one SSH CA too: the store's.
    #[tokio::test]
    async fn replicas_given_the_same_ca_share_the_stores_ssh_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path()).await;
        let secret = CaSecret::new(&[3u8; 32]).expect("secret");
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        rlark_pki::Ca::load_or_create(&one).expect("ca");
        rlark_pki::create_private_dir(&two).expect("dir");
        for file in [rlark_pki::CA_CERT_FILE, rlark_pki::CA_KEY_FILE] {
            std::fs::copy(one.join(file), two.join(file)).expect("copy");
        }
        sync(&store, &one, Some(&secret)).await.expect("first");
        sync(&store, &two, Some(&secret)).await.expect("second");
        for file in [
            rlark_pki::CA_CERT_FILE,
            rlark_pki::ssh::SSH_CA_PUB_FILE,
            rlark_pki::ssh::SSH_CA_KEY_FILE,
        ] {
            assert_eq!(read(&one, file), read(&two, file), "{file}");
        }
        // A data directory with an SSH CA of its own is refused, naming the files.
        let three = dir.path().join("three");
        rlark_pki::create_private_dir(&three).expect("dir");
        for file in [rlark_pki::CA_CERT_FILE, rlark_pki::CA_KEY_FILE] {
            std::fs::copy(one.join(file), three.join(file)).expect("copy");
        }
        rlark_pki::ssh::SshCa::load_or_create(&three).expect("own ssh ca");
        let error = sync(&store, &three, Some(&secret))
            .await
            .expect_err("another SSH CA")
            .to_string();
        assert!(error.contains("not the SSH CA"), "{error}");
        assert!(error.contains(rlark_pki::ssh::SSH_CA_PUB_FILE), "{error}");
    }

    /// The race of two first starts: the one whose create loses adopts the winner's SSH CA
    /// even though it was given the same X.509 CA (and so keeps its `ca.crt`).
    #[tokio::test]
    async fn the_loser_of_the_first_publish_drops_the_ssh_ca_it_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path()).await;
        let secret = CaSecret::new(&[4u8; 32]).expect("secret");
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        rlark_pki::Ca::load_or_create(&one).expect("ca");
        rlark_pki::create_private_dir(&two).expect("dir");
        for file in [rlark_pki::CA_CERT_FILE, rlark_pki::CA_KEY_FILE] {
            std::fs::copy(one.join(file), two.join(file)).expect("copy");
        }
        sync(&store, &one, Some(&secret))
            .await
            .expect("one publishes");
        // `two` read no record, made its SSH CA, and then lost the create.
        rlark_pki::ssh::SshCa::load_or_create(&two).expect("two's own ssh ca");
        let record = store
            .get(&ObjectKey::new(CERTIFICATE_AUTHORITIES, "", RECORD))
            .await
            .expect("get")
            .expect("record");
        lost_race(&record, &two, &secret, true, false).expect("two adopts");
        for file in [
            rlark_pki::ssh::SSH_CA_PUB_FILE,
            rlark_pki::ssh::SSH_CA_KEY_FILE,
        ] {
            assert_eq!(read(&one, file), read(&two, file), "{file}");
        }
    }

    #[test]
    fn a_short_secret_is_refused() {
        let error = CaSecret::new(b"  short secret \n").expect_err("short");
        assert!(error.contains("at least 32"), "{error}");
    }
}
