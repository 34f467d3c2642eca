//! A minimal HTTP/1.1 JSON client for `rate-ctl serve` (loopback or LAN,
//! plain HTTP): used by `agent --store http://…` and the `--api` commands.
//! One connection per request keeps it simple; requests are rare (a
//! heartbeat a second, a long-poll at a time).

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

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

#[derive(Debug, Clone)]
pub struct Client {
    /// host:port
    authority: String,
    /// path prefix without a trailing slash (usually empty)
    prefix: String,
    token: Option<String>,
}

impl Client {
    /// `http://HOST:PORT[/prefix]`.
    pub fn new(url: &str, token: Option<String>) -> Result<Client, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only http://HOST:PORT URLs are supported (no TLS)"))?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let authority = if authority.contains(':') && !authority.ends_with(']') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Client {
            authority,
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
    ) -> Result<Answer, String> {
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
    ) -> Result<Answer, String> {
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
    ) -> Result<Answer, String> {
        tokio::time::timeout(timeout, self.request_inner(method, path, body))
            .await
            .map_err(|_| format!("{method} {path}: no answer within {timeout:?}"))?
    }

    async fn request_inner(
        &self,
        method: &str,
        path: &str,
        body: Option<(&'static str, Bytes)>,
    ) -> Result<Answer, String> {
        let what =
            |e: &dyn std::fmt::Display| format!("{method} http://{}{path}: {e}", self.authority);
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| what(&e))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| what(&e))?;
        let conn = tokio::spawn(conn);
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
        assert!(Client::new("https://x", None).is_err());
        assert!(Client::new("http://", None).is_err());
    }
}
