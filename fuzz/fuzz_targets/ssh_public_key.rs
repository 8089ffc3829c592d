//! OpenSSH public keys and certificates from untrusted input (SSH signing requests).
//! The body is `rlark_pki::fuzzing::ssh_public_key`, which `cargo test -p rlark-pki` also runs.
#![no_main]

use std::sync::OnceLock;

use rlark_pki::ssh::SshCa;

fn ca() -> &'static SshCa {
    static CA: OnceLock<SshCa> = OnceLock::new();
    CA.get_or_init(|| {
        // A scratch directory without pulling tempfile into the fuzz build.
        let dir = std::env::temp_dir().join(format!("rlark-fuzz-{}", std::process::id()));
        SshCa::load_or_create(&dir).expect("ssh ca")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_pki::fuzzing::ssh_public_key(ca(), data);
});
