//! Kubeconfig files for the admin (and later other) client certificates.

use base64::Engine as _;

/// Name of the cluster, context and user entries in generated kubeconfigs.
pub const KUBECONFIG_NAME: &str = "rlark";

/// A kubeconfig (YAML) with one cluster, context and user, all named `rlark`, the context
/// current. `server_url` is written as given (e.g. `https://127.0.0.1:8443`); the PEMs are
/// embedded base64-encoded as `certificate-authority-data`, `client-certificate-data` and
/// `client-key-data`. `user` is written as a trailing comment (`# user: ...`) that tells a
/// reader whom the certificate is for; the server trusts the certificate, not this comment.
pub fn kubeconfig_yaml(
    server_url: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    user: &str,
) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let name = KUBECONFIG_NAME;
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {name}\n\
         \x20 cluster:\n\
         \x20   server: {server}\n\
         \x20   certificate-authority-data: {ca}\n\
         contexts:\n\
         - name: {name}\n\
         \x20 context:\n\
         \x20   cluster: {name}\n\
         \x20   user: {name}\n\
         current-context: {name}\n\
         preferences: {{}}\n\
         users:\n\
         - name: {name}\n\
         \x20 user:\n\
         \x20   client-certificate-data: {cert}\n\
         \x20   client-key-data: {key}\n\
         # user: {subject}\n",
        server = yaml_quote(server_url),
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
        subject = user.replace(['\n', '\r'], " "),
    )
}

/// A YAML double-quoted scalar. JSON string syntax is a subset of it.
fn yaml_quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}
