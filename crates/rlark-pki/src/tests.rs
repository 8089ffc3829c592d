use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn der_of(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn client_cert_carries_user_and_every_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    for groups in [
        vec![],
        vec!["system:masters".to_string()],
        vec!["a".to_string(), "b".to_string(), "rlark:agents".to_string()],
    ] {
        let issued = ca.issue_client("alice", &groups, DAY).expect("issue");
        let (user, got) = identity_from_cert_der(&der_of(&issued.cert_pem)).expect("parse");
        assert_eq!(user, "alice");
        assert_eq!(got, groups);
        ca.verify_client_cert(&der_of(&issued.cert_pem))
            .expect("client cert chains to the CA");
        // The key is a usable PKCS#8 key.
        KeyPair::from_pem(&issued.key_pem).expect("key");
    }
}

#[test]
fn client_cert_verifies_with_webpki_and_foreign_ca_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let foreign = Ca::load_or_create(other.path()).expect("foreign ca");
    let issued = foreign
        .issue_client("mallory", &["system:masters".to_string()], DAY)
        .expect("issue");
    let err = ca
        .verify_client_cert(&der_of(&issued.cert_pem))
        .expect_err("foreign cert rejected");
    assert!(matches!(err, PkiError::Verify(_)), "{err}");

    // A serving certificate lacks the clientAuth EKU.
    let serving = ca
        .issue_serving(&["localhost".to_string()], DAY)
        .expect("serving");
    assert!(ca.verify_client_cert(&der_of(&serving.cert_pem)).is_err());
}

#[test]
fn serving_cert_verifies_for_dns_and_ip_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let sans = [
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "rlark.example.com".to_string(),
        "localhost".to_string(),
    ];
    let issued = ca.issue_serving(&sans, DAY).expect("serving");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der_of(ca.cert_pem())).expect("root");
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .expect("verifier");
    let cert = der_of(&issued.cert_pem);
    for name in ["localhost", "127.0.0.1", "::1", "rlark.example.com"] {
        let server_name = ServerName::try_from(name).expect("name").to_owned();
        verifier
            .verify_server_cert(&cert, &[], &server_name, &[], UnixTime::now())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let wrong = ServerName::try_from("evil.example.com").expect("name");
    assert!(
        verifier
            .verify_server_cert(&cert, &[], &wrong, &[], UnixTime::now())
            .is_err()
    );
}

#[test]
fn invalid_sans_are_rejected() {
    for bad in [
        "",
        "has space",
        "a..b",
        "-lead.example",
        "white\tspace",
        "ü.example",
    ] {
        assert!(validate_san(bad).is_err(), "{bad:?} accepted");
    }
    for good in ["localhost", "*.example.com", "10.0.0.1", "fe80::1", "a-b.c"] {
        validate_san(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
}

#[test]
fn ca_reload_keeps_identity_hash_and_issuance_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Ca::load_or_create(dir.path()).expect("create");
    let issued_before = first.issue_client("bob", &[], DAY).expect("issue");
    let hash = first.cert_hash().expect("hash");
    assert!(hash.starts_with("sha256:"));
    assert_eq!(hash.len(), "sha256:".len() + 64);

    let second = Ca::load_or_create(dir.path()).expect("reload");
    assert_eq!(second.cert_pem(), first.cert_pem());
    assert_eq!(second.cert_hash().expect("hash"), hash);
    assert_eq!(ca_cert_hash(second.cert_der()).expect("hash"), hash);
    // Certificates issued before and after the reload chain to the same CA.
    second
        .verify_client_cert(&der_of(&issued_before.cert_pem))
        .expect("old cert still valid");
    let issued_after = second.issue_client("bob", &[], DAY).expect("issue");
    first
        .verify_client_cert(&der_of(&issued_after.cert_pem))
        .expect("new cert valid for the first instance");
}

#[test]
fn ca_hash_is_sha256_of_spki() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let (_, cert) = x509_parser::parse_x509_certificate(ca.cert_der()).expect("parse");
    let expected = format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    );
    assert_eq!(ca.cert_hash().expect("hash"), expected);
    assert_eq!(
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok()),
        Some(CA_COMMON_NAME)
    );
    assert!(cert.is_ca());
    let years = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp())
        / (365 * 24 * 3600);
    assert_eq!(years, 10);
    assert!(ca_cert_hash(b"not a certificate").is_err());
}

#[test]
fn files_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let ca = Ca::load_or_create(&pki).expect("ca");
    assert_eq!(mode(&pki), 0o700);
    assert_eq!(mode(&pki.join(CA_CERT_FILE)), 0o600);
    assert_eq!(mode(&pki.join(CA_KEY_FILE)), 0o600);
    let (crt, key) = (pki.join("admin.crt"), pki.join("admin.key"));
    ca.load_or_issue_client(&crt, &key, "admin", &["system:masters".to_string()], DAY)
        .expect("admin");
    assert_eq!(mode(&crt), 0o600);
    assert_eq!(mode(&key), 0o600);
    let kubeconfig = dir.path().join("admin.kubeconfig");
    write_private_file(&kubeconfig, b"x").expect("write");
    write_private_file(&kubeconfig, b"y").expect("overwrite");
    assert_eq!(mode(&kubeconfig), 0o600);
    assert_eq!(std::fs::read(&kubeconfig).expect("read"), b"y");
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn incomplete_or_mismatched_ca_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    Ca::load_or_create(dir.path()).expect("ca");
    std::fs::remove_file(dir.path().join(CA_KEY_FILE)).expect("rm");
    let err = Ca::load_or_create(dir.path()).expect_err("incomplete");
    assert!(
        matches!(
            err,
            PkiError::IncompleteCa {
                missing: CA_KEY_FILE,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ca.key"), "{err}");

    let other = tempfile::tempdir().expect("tempdir");
    Ca::load_or_create(other.path()).expect("other ca");
    std::fs::copy(other.path().join(CA_KEY_FILE), dir.path().join(CA_KEY_FILE)).expect("cp");
    let err = Ca::load_or_create(dir.path()).expect_err("mismatch");
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err}");
}

#[test]
fn client_cert_is_reused_only_when_still_right() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(&dir.path().join("pki")).expect("ca");
    let (crt, key) = (dir.path().join("admin.crt"), dir.path().join("admin.key"));
    let masters = ["system:masters".to_string()];
    let first = ca
        .load_or_issue_client(&crt, &key, "admin", &masters, DAY * 365)
        .expect("issue");
    let again = ca
        .load_or_issue_client(&crt, &key, "admin", &masters, DAY * 365)
        .expect("reuse");
    assert_eq!(first.cert_pem, again.cert_pem);
    // Different groups: re-issued.
    let other = ca
        .load_or_issue_client(&crt, &key, "admin", &[], DAY * 365)
        .expect("reissue");
    assert_ne!(other.cert_pem, first.cert_pem);
    // Expiring within a day: re-issued.
    let short = ca
        .issue_client("admin", &[], Duration::from_secs(60))
        .expect("short");
    write_private_file(&crt, short.cert_pem.as_bytes()).expect("write");
    write_private_file(&key, short.key_pem.as_bytes()).expect("write");
    let renewed = ca
        .load_or_issue_client(&crt, &key, "admin", &[], DAY * 365)
        .expect("renew");
    assert_ne!(renewed.cert_pem, short.cert_pem);
}

#[test]
fn kubeconfig_has_the_expected_shape() {
    let yaml = kubeconfig_yaml(
        "https://127.0.0.1:8443",
        "CA PEM",
        "CERT PEM",
        "KEY PEM",
        "admin",
    );
    let doc: serde_json::Value = serde_saphyr::from_str(&yaml).expect("yaml");
    use base64::Engine as _;
    let decode = |v: &serde_json::Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("str"))
                .expect("b64"),
        )
        .expect("utf8")
    };
    assert_eq!(doc["kind"], "Config");
    assert_eq!(doc["current-context"], "rlark");
    assert_eq!(doc["clusters"][0]["name"], "rlark");
    assert_eq!(
        doc["clusters"][0]["cluster"]["server"],
        "https://127.0.0.1:8443"
    );
    assert_eq!(
        decode(&doc["clusters"][0]["cluster"]["certificate-authority-data"]),
        "CA PEM"
    );
    assert_eq!(doc["contexts"][0]["context"]["cluster"], "rlark");
    assert_eq!(doc["contexts"][0]["context"]["user"], "rlark");
    assert_eq!(doc["users"][0]["name"], "rlark");
    assert_eq!(
        decode(&doc["users"][0]["user"]["client-certificate-data"]),
        "CERT PEM"
    );
    assert_eq!(
        decode(&doc["users"][0]["user"]["client-key-data"]),
        "KEY PEM"
    );
}

#[test]
fn csr_is_signed_with_the_callers_subject_not_the_requested_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let made = generate_key_and_csr("system:masters-wannabe").expect("csr");
    let csr = parse_csr(made.csr_pem.as_bytes()).expect("parse");
    let groups = vec!["rlark:agents".to_string()];
    let (pem, info) = ca
        .sign_client_csr(&csr, "system:rlark:agent:a", &groups, DAY)
        .expect("sign");
    assert_eq!(info.common_name, "system:rlark:agent:a");
    assert_eq!(info.groups, groups);
    assert_eq!(info.issuer, CA_COMMON_NAME);
    ca.verify_client_cert(&der_of(&pem)).expect("chains to CA");
    // The certificate is for the requester's key.
    let key = KeyPair::from_pem(&made.key_pem).expect("key");
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    assert_eq!(
        info.key_hash,
        format!("sha256:{}", hex::encode(Sha256::digest(&spki)))
    );
    // Renewal timing: 2/3 of the lifetime, after now and before expiry.
    let renew_at = info.renew_at();
    assert!(renew_at > SystemTime::now() && renew_at < info.not_after);
    assert!(ca.sign_client_csr(&csr, "", &[], DAY).is_err());
}

#[test]
fn short_certificates_are_backdated_proportionally() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let issued = ca
        .issue_client("a", &[], Duration::from_secs(60))
        .expect("issue");
    let info = CertInfo::from_pem(&issued.cert_pem).expect("info");
    let lifetime = info
        .not_after
        .duration_since(info.not_before)
        .expect("order");
    // 60 s validity + 6 s back-dating (a tenth), not 5 minutes.
    assert!(lifetime <= Duration::from_secs(67), "{lifetime:?}");
    assert!(info.renew_at() > SystemTime::now());
}

fn verify_serving(
    verifier: &dyn ServerCertVerifier,
    chain: &[CertificateDer<'static>],
) -> Result<(), rustls::Error> {
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from("localhost").expect("name"),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

#[test]
fn pinned_verifier_accepts_only_the_pinned_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let ca = Ca::load_or_create(dir.path()).expect("ca");
    let mitm = Ca::load_or_create(other.path()).expect("mitm");
    let chain_of = |ca: &Ca| {
        let serving = ca
            .issue_serving(&["localhost".to_string()], DAY)
            .expect("serving");
        let mut chain = vec![der_of(&serving.cert_pem)];
        chain.extend(ca.serving_chain_tail());
        chain
    };
    let verifier = ServerVerifier::pinned_ca(&ca.cert_hash().expect("hash")).expect("pin");
    verify_serving(&verifier, &chain_of(&ca)).expect("pinned CA accepted");
    let error = verify_serving(&verifier, &chain_of(&mitm)).expect_err("other CA refused");
    assert!(error.to_string().contains("does not match"), "{error}");
    // A MITM that forwards the real CA certificate but signs with its own key still fails.
    let mut forged = chain_of(&mitm);
    forged.push(CertificateDer::from(ca.cert_der().to_vec()));
    assert!(verify_serving(&verifier, &forged).is_err());
    // Pins are validated.
    for bad in ["", "sha256:", "sha256:xyz", "md5:00", &"sha256:".repeat(2)] {
        assert!(ServerVerifier::pinned_ca(bad).is_err(), "{bad:?}");
    }
    let upper = ca
        .cert_hash()
        .expect("hash")
        .to_uppercase()
        .replace("SHA256", "sha256");
    assert!(ServerVerifier::pinned_ca(&upper).is_ok());
}

#[test]
fn ca_rotation_keeps_old_clients_working_until_retired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = Ca::load_or_create(dir.path()).expect("ca");
    let old_anchor = CertificateDer::from(old.cert_der().to_vec());
    let old_client = old.issue_client("alice", &[], DAY).expect("client");
    drop(old);

    let rotation = rotate_ca(dir.path()).expect("rotate");
    assert_ne!(rotation.previous_hash, rotation.active_hash);
    assert!(rotate_ca(dir.path()).is_err(), "second rotation refused");
    let ca = Ca::load_or_create(dir.path()).expect("reload");
    assert!(ca.rotation_in_progress());
    assert_eq!(ca.cert_hash().expect("hash"), rotation.active_hash);
    assert_eq!(ca.trust_anchors().len(), 2);
    assert_eq!(ca.bundle_pem().matches("BEGIN CERTIFICATE").count(), 2);
    // Client certificates of the old CA still verify; new ones come from the new CA.
    ca.verify_client_cert(&der_of(&old_client.cert_pem))
        .expect("old client accepted during rotation");
    let new_client = ca.issue_client("bob", &[], DAY).expect("client");
    ca.verify_client_cert(&der_of(&new_client.cert_pem))
        .expect("new client accepted");
    assert_ne!(
        CertInfo::from_pem(&new_client.cert_pem)
            .expect("info")
            .issuer,
        CA_COMMON_NAME
    );
    // A client that only trusts the old CA verifies the new serving chain through the
    // cross-signed certificate; one that trusts the new CA verifies it directly.
    let serving = ca
        .issue_serving(&["localhost".to_string()], DAY)
        .expect("serving");
    let mut chain = vec![der_of(&serving.cert_pem)];
    chain.extend(ca.serving_chain_tail());
    assert_eq!(chain.len(), 3);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    for anchors in [vec![old_anchor.clone()], ca.trust_anchors()[..1].to_vec()] {
        let mut roots = rustls::RootCertStore::empty();
        for anchor in &anchors {
            roots.add(anchor.clone()).expect("root");
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("verifier");
        verify_serving(verifier.as_ref(), &chain).expect("serving chain verifies");
    }
    // Joining agents pin the new CA.
    let pinned = ServerVerifier::pinned_ca(&rotation.active_hash).expect("pin");
    verify_serving(&pinned, &chain).expect("pin of the new CA");

    let retired = retire_previous_cas(dir.path()).expect("retire");
    assert_eq!(retired, vec![rotation.previous_hash.clone()]);
    let ca = Ca::load_or_create(dir.path()).expect("reload");
    assert!(!ca.rotation_in_progress());
    assert!(
        ca.verify_client_cert(&der_of(&old_client.cert_pem))
            .is_err()
    );
    ca.verify_client_cert(&der_of(&new_client.cert_pem))
        .expect("new client still accepted");
    assert_eq!(ca.serving_chain_tail().len(), 1);
    assert!(
        retire_previous_cas(dir.path())
            .expect("idempotent")
            .is_empty()
    );
}

/// A small deterministic mutation fuzzer for the parsers of untrusted input, run on stable
/// in every test run (the cargo-fuzz targets in `fuzz/` go further on nightly). Each parser
/// must either accept or return an error with a reason — never panic — for thousands of
/// mutations of valid inputs.
#[test]
fn parsers_survive_mutated_input() {
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }
    fn mutate(rng: &mut XorShift, seed: &[u8]) -> Vec<u8> {
        let mut data = seed.to_vec();
        for _ in 0..=rng.below(4) {
            match rng.below(5) {
                0 if !data.is_empty() => {
                    let i = rng.below(data.len());
                    data[i] ^= 1 << rng.below(8);
                }
                1 if !data.is_empty() => data.truncate(rng.below(data.len())),
                2 => {
                    let i = rng.below(data.len() + 1);
                    data.insert(i, rng.next() as u8);
                }
                3 if data.len() > 1 => {
                    let i = rng.below(data.len());
                    data.remove(i);
                }
                _ => {
                    let i = rng.below(data.len() + 1);
                    let j = rng.below(data.len() + 1);
                    let (a, b) = (i.min(j), i.max(j));
                    let chunk = data[a..b].to_vec();
                    data.splice(a..a, chunk);
                }
            }
        }
        data
    }

    let made = generate_key_and_csr("fuzz").expect("csr");
    let der =
        rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(made.csr_pem.as_bytes())
            .expect("der")
            .as_ref()
            .to_vec();
    let csr_seeds: Vec<Vec<u8>> = vec![
        made.csr_pem.clone().into_bytes(),
        der,
        include_bytes!("testdata/rsa.csr").to_vec(),
    ];
    let token_seeds = [
        Token::generate(TokenKind::Bootstrap).expose(),
        Token::generate(TokenKind::Bearer).expose(),
    ];
    // The SSH target: OpenSSH public keys of each algorithm the CA signs for, and a
    // certificate it signed.
    let ssh_dir = tempfile::tempdir().expect("tempdir");
    let ssh_ca = crate::ssh::SshCa::load_or_create(ssh_dir.path()).expect("ssh ca");
    let public_key = |alg| {
        russh::keys::ssh_key::PrivateKey::random(&mut russh::keys::key::safe_rng(), alg)
            .expect("key")
            .public_key()
            .to_openssh()
            .expect("openssh")
    };
    let ed25519 = public_key(russh::keys::ssh_key::Algorithm::Ed25519);
    let ed25519 = ed25519.as_str();
    let signed = ssh_ca
        .sign(
            ed25519,
            &crate::ssh::SshCertRole::Guest {
                user: "fuzz".into(),
            },
            std::time::Duration::from_secs(60),
        )
        .expect("sign");
    let ssh_seeds = [
        ed25519.to_string(),
        public_key(russh::keys::ssh_key::Algorithm::Ecdsa {
            curve: russh::keys::ssh_key::EcdsaCurve::NistP256,
        }),
        signed.certificate_openssh,
    ];

    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut csrs, mut tokens, mut keys) = (0, 0, 0);
    for round in 0..4000 {
        let seed = &csr_seeds[round % csr_seeds.len()];
        csrs += usize::from(crate::fuzzing::csr(&mutate(&mut rng, seed)));
        let token_input = mutate(&mut rng, token_seeds[round % 2].as_bytes());
        tokens += usize::from(crate::fuzzing::token(&token_input));
        if round % 4 == 0 {
            let key_input = mutate(&mut rng, ssh_seeds[round % ssh_seeds.len()].as_bytes());
            keys += usize::from(crate::fuzzing::ssh_public_key(&ssh_ca, &key_input));
        }
    }
    // Mutations that keep the DER intact (e.g. PEM whitespace) may still parse; most not.
    assert!(csrs < 4000, "the mutator never produced an invalid CSR");
    assert!(tokens < 4000 && keys < 1000, "every mutation was accepted");
    // The seeds themselves pass each target.
    assert!(crate::fuzzing::ssh_public_key(&ssh_ca, ed25519.as_bytes()));
    assert!(crate::fuzzing::token(token_seeds[0].as_bytes()));
    // (The RSA CSR seed is one the parser refuses with a reason.)
    assert!(csr_seeds[..2].iter().all(|seed| crate::fuzzing::csr(seed)));
}
