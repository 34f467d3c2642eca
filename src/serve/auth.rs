//! Bearer tokens: admin (everything), read (GET endpoints), agent
//! (snapshot and report). Compared in constant time. A handler states the
//! tokens it accepts by taking an extractor ([`AdminToken`], [`ReadToken`],
//! [`AgentToken`], [`SnapshotToken`]), which answers 401/403 before the
//! handler runs.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;

use super::error::ApiError;
use super::Shared;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Admin,
    Read,
    Agent,
}

impl Kind {
    /// This kind's bit in an extractor's set of allowed kinds.
    const fn bit(self) -> u8 {
        match self {
            Kind::Admin => ADMIN,
            Kind::Read => READ,
            Kind::Agent => AGENT,
        }
    }

    /// The name recorded in the audit log.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Admin => "admin",
            Kind::Read => "read",
            Kind::Agent => "agent",
        }
    }
}

const ADMIN: u8 = 1;
const READ: u8 = 2;
const AGENT: u8 = 4;

/// A request's valid bearer token whose kind is in the set `ALLOWED` (bits
/// of [`Kind`]); 401 without a valid token, 403 for another kind.
pub struct Token<const ALLOWED: u8>(pub Who);

/// Who sent a request: the token and the client's address.
pub struct Who {
    /// The `who` of the store's functions: token name, role and client
    /// address, which the audit log records.
    actor: String,
    /// The one host a named agent token may report as.
    pub host: Option<String>,
    /// A named token from the store (not one of the token files).
    pub named: bool,
    pub kind: Kind,
}

impl Who {
    /// What the audit log records of this caller (see
    /// [`crate::store::actor`]).
    pub fn name(&self) -> &str {
        &self.actor
    }

    /// 403 unless this caller may act for host `host_id`: a named agent
    /// token is bound to one host (`doing`: what it may not do as another,
    /// e.g. "report").
    pub fn may_act_as(&self, host_id: &str, doing: &str) -> Result<(), ApiError> {
        match &self.host {
            Some(bound) if bound != host_id => Err(ApiError::forbidden(format!(
                "this agent token is bound to host {bound:?}; it may not {doing} as {host_id:?}"
            ))),
            _ => Ok(()),
        }
    }
}

/// The peer address of a connection, put on each of its requests by the
/// accept loop (`conn.rs`).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// A valid token: its kind (what it may do), name, role and host binding.
pub struct Identity {
    pub kind: Kind,
    pub name: String,
    pub role: &'static str,
    pub host: Option<String>,
    pub named: bool,
}

/// How often a named token's `last_used` is written at most.
const TOUCH_EVERY_MS: u64 = 60_000;

/// The request's token: one of the token files (compared in constant
/// time), else a named token of the store (looked up by its hash, so a
/// revoke takes effect at the next request). 401 without a valid token.
pub async fn identify(st: &Shared, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let token = bearer(headers)?;
    if let Some(kind) = st.tokens.kind(token.as_bytes()) {
        return Ok(Identity {
            kind,
            name: kind.name().to_string(),
            role: kind.name(),
            host: None,
            named: false,
        });
    }
    let Some(t) = st.store.token_by_secret(token).await? else {
        return Err(ApiError::unauthorized("unknown token"));
    };
    let now = rate_ctl::core::clock::unix_ms();
    let due = {
        // Each insert is whole: a panic elsewhere leaves the map usable.
        let mut touched = st
            .token_touched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = touched.get(&t.name).copied().unwrap_or(0);
        let due = now.saturating_sub(last) >= TOUCH_EVERY_MS;
        if due {
            touched.insert(t.name.clone(), now);
        }
        due
    };
    if due {
        // Best effort: a failed write only leaves `last_used` older.
        let _ = st.store.touch_token(&t.name, now).await;
    }
    use crate::store::tokens::Role;
    Ok(Identity {
        kind: match t.role {
            Role::Admin => Kind::Admin,
            Role::Viewer => Kind::Read,
            Role::Agent => Kind::Agent,
        },
        name: t.name,
        role: t.role.as_str(),
        host: t.host_id,
        named: true,
    })
}

/// The bearer token of the request; 401 when there is none.
fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let token = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::unauthorized(
            "missing bearer token (Authorization: Bearer <token>)",
        ));
    }
    Ok(token)
}

impl<const ALLOWED: u8> FromRequestParts<Shared> for Token<ALLOWED> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &Shared) -> Result<Self, ApiError> {
        let id = identify(st, &parts.headers).await?;
        if ALLOWED & id.kind.bit() == 0 {
            return Err(ApiError::forbidden(if id.named {
                format!(
                    "the {} token {:?} may not use this endpoint",
                    id.role, id.name
                )
            } else {
                format!("the {} token may not use this endpoint", id.kind.name())
            }));
        }
        let client = parts
            .extensions
            .get::<ClientAddr>()
            .map(|c| c.0.to_string());
        Ok(Token(Who {
            actor: crate::store::actor(&id.name, id.role, client.as_deref()),
            host: id.host,
            named: id.named,
            kind: id.kind,
        }))
    }
}

/// Changes: the admin token only.
pub type AdminToken = Token<ADMIN>;
/// Reads: the admin or the read token.
pub type ReadToken = Token<{ ADMIN | READ }>;
/// Host reports: the admin or the agent token.
pub type AgentToken = Token<{ ADMIN | AGENT }>;
/// The snapshot long-poll: any token.
pub type SnapshotToken = Token<{ ADMIN | READ | AGENT }>;

#[derive(Debug)]
pub enum AdminSource {
    Env,
    File { path: PathBuf, created: bool },
}

pub struct Tokens {
    admin: Vec<u8>,
    read: Option<Vec<u8>>,
    agent: Option<Vec<u8>>,
    pub admin_source: AdminSource,
}

/// Equal in time that depends only on the lengths.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0 && a.len() == b.len()
}

/// A token that could not be read or created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// `what` names the file (and the option that gave it).
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: the file is empty")]
    Empty { what: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TokenError {
    let what = what.into();
    move |source| TokenError::Io { what, source }
}

fn random_token() -> Result<String, TokenError> {
    let mut buf = [0u8; 32];
    let mut f = std::fs::File::open("/dev/urandom").map_err(io("/dev/urandom"))?;
    std::io::Read::read_exact(&mut f, &mut buf).map_err(io("/dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_token(path: &Path, what: &str) -> Result<Vec<u8>, TokenError> {
    let what = format!("{what} {}", path.display());
    let t = std::fs::read_to_string(path).map_err(io(what.clone()))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(TokenError::Empty { what });
    }
    Ok(t.as_bytes().to_vec())
}

fn env_token(name: &str) -> Option<Vec<u8>> {
    std::env::var(name)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .map(String::into_bytes)
}

impl Tokens {
    /// Admin token from env RATE_CTL_ADMIN_TOKEN, else from `admin_file`,
    /// created (mode 0600, random) if missing; read and agent tokens from
    /// env or their files when given.
    pub fn load(
        admin_file: &Path,
        read_file: Option<&Path>,
        agent_file: Option<&Path>,
    ) -> Result<Tokens, TokenError> {
        let (admin, admin_source) = match env_token("RATE_CTL_ADMIN_TOKEN") {
            Some(t) => (t, AdminSource::Env),
            None if admin_file.exists() => (
                read_token(admin_file, "--admin-token-file")?,
                AdminSource::File {
                    path: admin_file.to_path_buf(),
                    created: false,
                },
            ),
            None => {
                let t = random_token()?;
                if let Some(dir) = admin_file.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(io(format!("--admin-token-file: {}", dir.display())))?;
                }
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(admin_file)
                    .map_err(io(format!("--admin-token-file {}", admin_file.display())))?;
                writeln!(f, "{t}")
                    .map_err(io(format!("--admin-token-file {}", admin_file.display())))?;
                (
                    t.into_bytes(),
                    AdminSource::File {
                        path: admin_file.to_path_buf(),
                        created: true,
                    },
                )
            }
        };
        let other =
            |env: &str, file: Option<&Path>, what: &str| -> Result<Option<Vec<u8>>, TokenError> {
                match (env_token(env), file) {
                    (Some(t), _) => Ok(Some(t)),
                    (None, Some(f)) => read_token(f, what).map(Some),
                    (None, None) => Ok(None),
                }
            };
        Ok(Tokens {
            admin,
            read: other("RATE_CTL_READ_TOKEN", read_file, "--read-token-file")?,
            agent: other("RATE_CTL_AGENT_TOKEN", agent_file, "--agent-token-file")?,
            admin_source,
        })
    }

    /// The kind of a token file's token, if `given` is one.
    pub fn kind(&self, given: &[u8]) -> Option<Kind> {
        // Compare against every configured token, without stopping early.
        let admin = ct_eq(given, &self.admin);
        let read = self.read.as_deref().is_some_and(|t| ct_eq(given, t));
        let agent = self.agent.as_deref().is_some_and(|t| ct_eq(given, t));
        if admin {
            Some(Kind::Admin)
        } else if read {
            Some(Kind::Read)
        } else if agent {
            Some(Kind::Agent)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"", b"a"));
        assert!(!ct_eq(&[0u8; 256], &[0u8; 0]));
    }
}
