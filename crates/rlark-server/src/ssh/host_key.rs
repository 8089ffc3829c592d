//! The SSH server's host key: one Ed25519 key in `DATA_DIR/pki/ssh_host_ed25519_key`
//! (OpenSSH private key format, mode 0600), made at the first start with SSH on and kept
//! after that, so clients pinning it (`rlark ssh-config`) keep trusting the server.

use std::path::{Path, PathBuf};

use russh::keys::ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey};

/// File name of the host key inside the PKI directory.
pub const HOST_KEY_FILE: &str = "ssh_host_ed25519_key";

/// Loading or making the host key failed.
#[derive(Debug, thiserror::Error)]
pub enum HostKeyError {
    #[error("read SSH host key {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("make SSH host key {path}: {reason}")]
    Create { path: PathBuf, reason: String },
}

/// Load `dir/ssh_host_ed25519_key`, or make and store a new one when it does not exist.
pub fn load_or_create(dir: &Path) -> Result<PrivateKey, HostKeyError> {
    let path = dir.join(HOST_KEY_FILE);
    if path.exists() {
        let load = |reason: String| HostKeyError::Load {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| load(e.to_string()))?;
        let key = PrivateKey::from_openssh(text.as_bytes())
            .map_err(|e| load(format!("not an OpenSSH private key: {e}")))?;
        if key.is_encrypted() {
            return Err(load("the key is encrypted (not supported)".into()));
        }
        return Ok(key);
    }
    let create = |reason: String| HostKeyError::Create {
        path: path.clone(),
        reason,
    };
    rlark_pki::create_private_dir(dir).map_err(|e| create(e.to_string()))?;
    let mut key = PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)
        .map_err(|e| create(e.to_string()))?;
    key.set_comment("rlark-ssh-host");
    let text = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| create(e.to_string()))?;
    rlark_pki::write_private_file(&path, text.as_bytes()).map_err(|e| create(e.to_string()))?;
    tracing::info!(path = %path.display(), fingerprint = %fingerprint(&key), "created SSH host key");
    Ok(key)
}

/// `SHA256:...` of the key, as `ssh-keygen -l` prints it.
pub fn fingerprint(key: &PrivateKey) -> String {
    key.public_key().fingerprint(HashAlg::Sha256).to_string()
}

/// The public key as one OpenSSH line without comment (`ssh-ed25519 AAAA...`), the form a
/// `known_hosts` line carries.
pub fn public_line(key: &PrivateKey) -> String {
    russh::keys::ssh_key::PublicKey::new(key.public_key().key_data().clone(), "")
        .to_openssh()
        .map(|line| line.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let again = load_or_create(dir.path()).unwrap();
        assert_eq!(fingerprint(&first), fingerprint(&again));
        assert!(public_line(&first).starts_with("ssh-ed25519 AAAA"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join(HOST_KEY_FILE))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join(HOST_KEY_FILE), "garbage").unwrap();
        let error = load_or_create(dir.path()).unwrap_err().to_string();
        assert!(error.contains("not an OpenSSH private key"), "{error}");
    }
}
