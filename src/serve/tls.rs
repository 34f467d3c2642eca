//! HTTPS for `rate-ctl serve --tls-cert FILE --tls-key FILE` (rustls with
//! the `ring` provider: TLS 1.2 and 1.3, no client certificates).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the certificate or the key cannot be used (names the option).
#[derive(Debug, thiserror::Error)]
#[error("{option} {path}: {problem}")]
pub struct TlsError {
    option: &'static str,
    path: String,
    problem: String,
}

fn err(option: &'static str, path: &Path, problem: impl ToString) -> TlsError {
    TlsError {
        option,
        path: path.display().to_string(),
        problem: problem.to_string(),
    }
}

/// The server config from a PEM certificate chain and a PEM private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| err("--tls-cert", cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| err("--tls-cert", cert, e))?;
    if chain.is_empty() {
        return Err(err("--tls-cert", cert, "no PEM certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| err("--tls-key", key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("--tls-cert", cert, e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            err(
                "--tls-key",
                cert,
                format!("does not fit the certificate: {e}"),
            )
        })?;
    Ok(Arc::new(config))
}
