//! A minimal HTTP/1.1 JSON client for `rate-ctl serve` (plain HTTP, or
//! HTTPS verified against the system's CA certificates or `--ca FILE`,
//! never accepting an unknown certificate): used by `agent --store
//! http(s)://…` and the `--api` commands.
//! One connection per request keeps it simple; requests are rare (a
//! heartbeat a second, a long-poll at a time).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Why a request got no answer, or a URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("{0:?}: only http://HOST:PORT and https://HOST:PORT URLs are supported")]
    NotHttp(String),
    /// The CA certificates to verify an https:// server cannot be read.
    #[error("{0}")]
    Ca(String),
    #[error("{0:?}: no host")]
    NoHost(String),
    #[error("{method} {path}: no answer within {timeout:?}")]
    Timeout {
        method: String,
        path: String,
        timeout: Duration,
    },
    /// Connecting, sending or reading failed, or the answer is not JSON.
    #[error("{method} {authority}{path}: {reason}")]
    Exchange {
        method: String,
        authority: String,
        path: String,
        reason: String,
    },
}

/// An answer: status and JSON body (`Null` for an empty one).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The API's error message (`{"error": {"message": …}}`), or the status.
    pub fn error_message(&self) -> String {
        match self.body["error"]["message"].as_str() {
            Some(m) => m.to_string(),
            None => format!("HTTP status {}", self.status),
        }
    }
}

/// Percent-encodes a path segment (everything but RFC 3986 unreserved
/// characters), e.g. a host id in `/api/v1/hosts/{id}`.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `--ca FILE` (env RATE_CTL_CA) of this process, set once at start.
static CA_FILE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Sets the CA certificates https:// servers must be signed by (`None`:
/// the system's); once, before the first request.
pub fn set_ca(file: Option<std::path::PathBuf>) {
    let _ = CA_FILE.set(file);
}

/// Where Debian (and most distributions) keep the system's CA bundle.
const SYSTEM_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The client TLS config: the roots of `--ca` or of the system.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, HttpError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;
    let (path, what) = match CA_FILE.get().cloned().flatten() {
        Some(p) => (p, "--ca"),
        None => (std::path::PathBuf::from(SYSTEM_CA), "system CA bundle"),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&path)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| HttpError::Ca(format!("{what} {}: {e}", path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(HttpError::Ca(format!(
            "{what} {}: no usable CA certificate",
            path.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Ca(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[derive(Clone)]
pub struct Client {
    /// host:port
    authority: String,
    /// HTTPS: the verifier and the name the certificate must carry.
    tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// path prefix without a trailing slash (usually empty)
    prefix: String,
    token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("authority", &self.authority)
            .field("https", &self.tls.is_some())
            .finish()
    }
}

impl Client {
    /// `http://HOST:PORT[/prefix]` or `https://…` (port 80 / 443 by
    /// default).
    pub fn new(url: &str, token: Option<String>) -> Result<Client, HttpError> {
        let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (false, r),
            (None, Some(r)) => (true, r),
            (None, None) => return Err(HttpError::NotHttp(url.into())),
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(HttpError::NoHost(url.into()));
        }
        let authority = if authority.contains(':') && !authority.ends_with(']') {
            authority.to_string()
        } else {
            format!("{authority}:{}", if https { 443 } else { 80 })
        };
        let tls = if https {
            let host = authority
                .rsplit_once(':')
                .map_or(authority.as_str(), |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|_| HttpError::NoHost(url.into()))?;
            Some((tls_config()?, name))
        } else {
            None
        };
        Ok(Client {
            authority,
            tls,
            prefix: prefix.to_string(),
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// Sends one request; `Err` only for transport failures (any HTTP
    /// status is an `Ok` answer).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        let body = body.map(|b| ("application/json", Bytes::from(b.to_string())));
        self.send(method, path, body, timeout).await
    }

    /// [`Client::request`] with a body that is not one JSON value (e.g.
    /// JSON lines), sent as is with `content_type`.
    pub async fn request_text(
        &self,
        method: &str,
        path: &str,
        content_type: &'static str,
        body: String,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        self.send(
            method,
            path,
            Some((content_type, Bytes::from(body))),
            timeout,
        )
        .await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&'static str, Bytes)>,
        timeout: Duration,
    ) -> Result<Answer, HttpError> {
        tokio::time::timeout(timeout, self.request_inner(method, path, body))
            .await
            .map_err(|_| HttpError::Timeout {
                method: method.into(),
                path: path.into(),
                timeout,
            })?
    }

    async fn request_inner(
        &self,
        method: &str,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Answer, HttpError> {
        let what = |e: &dyn std::fmt::Display| HttpError::Exchange {
            method: method.into(),
            authority: self.authority.clone(),
            path: path.into(),
            reason: e.to_string(),
        };
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| what(&e))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = match &self.tls {
            None => {
                let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|e| what(&e))?;
                (s, tokio::spawn(async move { c.await.map(|_| ()) }))
            }
            Some((config, name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| what(&format!("TLS: {e}")))?;
                let (s, c) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                    .await
                    .map_err(|e| what(&e))?;
                (s, tokio::spawn(async move { c.await.map(|_| ()) }))
            }
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header("host", &self.authority)
            .header("accept", "application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let bytes = match body {
            Some((content_type, b)) => {
                req = req.header("content-type", content_type);
                b
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(bytes)).map_err(|e| what(&e))?;
        let res = sender.send_request(req).await.map_err(|e| what(&e))?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| what(&e))?
            .to_bytes();
        conn.abort();
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|e| what(&format!("answer is not JSON: {e}")))?
        };
        Ok(Answer { status, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(percent_encode("web-1.a_b~"), "web-1.a_b~");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
        assert_eq!(percent_encode("ü"), "%C3%BC");
    }

    #[test]
    fn urls() {
        let c = Client::new("http://127.0.0.1:9090/", None).unwrap();
        assert_eq!(
            (c.authority.as_str(), c.prefix.as_str()),
            ("127.0.0.1:9090", "")
        );
        let c = Client::new("http://example/rc", Some(String::new())).unwrap();
        assert_eq!(
            (c.authority.as_str(), c.prefix.as_str()),
            ("example:80", "/rc")
        );
        assert!(c.token.is_none());
        assert!(Client::new("ftp://x", None).is_err());
        assert!(Client::new("http://", None).is_err());
    }
}
