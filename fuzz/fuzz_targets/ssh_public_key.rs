//! OpenSSH public keys and certificates from untrusted input (SSH signing requests).
#![no_main]

use std::sync::OnceLock;

use rlark_pki::ssh::{SshCa, SshCertRole, verify_ssh_cert};

fn ca() -> &'static SshCa {
    static CA: OnceLock<(tempfile_free::Dir, SshCa)> = OnceLock::new();
    &CA.get_or_init(|| {
        let dir = tempfile_free::Dir::new();
        let ca = SshCa::load_or_create(&dir.0).expect("ssh ca");
        (dir, ca)
    })
    .1
}

/// A scratch directory without pulling tempfile into the fuzz build.
mod tempfile_free {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!("rlark-fuzz-{}", std::process::id()));
            Dir(path)
        }
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let role = SshCertRole::Guest {
        user: "fuzz".to_string(),
    };
    let _ = ca().sign(text, &role, std::time::Duration::from_secs(60));
    let _ = verify_ssh_cert(text, &[ca().fingerprint()], 0);
});
