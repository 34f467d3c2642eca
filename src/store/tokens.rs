//! Named API tokens of `rate-ctl serve` (issue 34): a name, a role
//! (`admin`, `viewer`, `agent`, an agent token maybe bound to one host),
//! and only the SHA-256 of the secret. Created, listed and revoked by the
//! CLI on the store or by the API; serve looks a presented token up by its
//! hash on every request, so a revoke takes effect at once.

use sqlx::Row;

use super::audit::audit;
use super::{Field, Invalid, Result, Store, StoreError};
use rate_ctl::core::clock::unix_ms;
use sha2::Digest as _;

/// A token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything, as the admin token file.
    Admin,
    /// Reads everything, writes nothing.
    Viewer,
    /// The snapshot long-poll and host reports (as its bound host only).
    Agent,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Viewer => "viewer",
            Role::Agent => "agent",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Role, Invalid> {
        match s {
            "admin" => Ok(Role::Admin),
            "viewer" => Ok(Role::Viewer),
            "agent" => Ok(Role::Agent),
            other => Err(Invalid::new(
                Field::Column("role"),
                "role",
                format!("{other:?} is not admin, viewer or agent"),
            )),
        }
    }
}

/// A stored token (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    pub role: Role,
    /// The one host an agent token may report as.
    pub host_id: Option<String>,
    pub created_ms: u64,
    pub last_used_ms: Option<u64>,
}

/// The stored form of a secret: SHA-256, hex (secrets are 256 random bits,
/// so a fast hash is enough).
pub fn token_hash(secret: &str) -> String {
    sha2::Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn new_secret() -> Result<String> {
    let mut buf = [0u8; 32];
    let mut f = std::fs::File::open("/dev/urandom")
        .map_err(|e| StoreError::Http(format!("/dev/urandom: {e}")))?;
    std::io::Read::read_exact(&mut f, &mut buf)
        .map_err(|e| StoreError::Http(format!("/dev/urandom: {e}")))?;
    Ok(format!(
        "rct_{}",
        buf.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// A token name: 1 to 32 of `A-Z a-z 0-9 . _ -`.
pub fn validate_token_name(name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            Field::Name,
            "name",
            "must be 1 to 32 characters of A-Z, a-z, 0-9, '.', '_', '-'",
        ))
    }
}

const COLUMNS: &str = "name, role, host_id, created_ms, last_used_ms";

fn decode(r: &sqlx::any::AnyRow) -> Result<TokenRecord> {
    let role: String = r.try_get(1)?;
    Ok(TokenRecord {
        name: r.try_get(0)?,
        role: role.parse().map_err(StoreError::Invalid)?,
        host_id: r.try_get(2)?,
        created_ms: r.try_get::<i64, _>(3)?.max(0) as u64,
        last_used_ms: r.try_get::<Option<i64>, _>(4)?.map(|v| v.max(0) as u64),
    })
}

impl Store {
    /// Stores a new token; returns its record and its secret (shown once,
    /// only its hash is kept). Audited (`token.create`); the config version
    /// does not move (agents have nothing to republish).
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        host_id: Option<&str>,
        who: &str,
    ) -> Result<(TokenRecord, String)> {
        validate_token_name(name)?;
        if let Some(h) = host_id {
            if role != Role::Agent {
                return Err(Invalid::new(
                    Field::HostId,
                    "host",
                    "only an agent token is bound to a host",
                )
                .into());
            }
            super::validate_host(h, 1)?;
        }
        let secret = new_secret()?;
        let rec = TokenRecord {
            name: name.to_string(),
            role,
            host_id: host_id.map(str::to_string),
            created_ms: unix_ms(),
            last_used_ms: None,
        };
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(&self.sql("SELECT name FROM api_tokens WHERE name = ?"))
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_some() {
            return Err(Invalid::new(
                Field::Name,
                "name",
                format!("a token named {name:?} exists (revoke it first)"),
            )
            .into());
        }
        sqlx::query(&self.sql(
            "INSERT INTO api_tokens (name, role, host_id, hash, created_ms) VALUES (?, ?, ?, ?, ?)",
        ))
        .bind(name)
        .bind(role.as_str())
        .bind(host_id.map(str::to_string))
        .bind(token_hash(&secret))
        .bind(rec.created_ms as i64)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            who,
            "token.create",
            &format!("token/{name}"),
            None,
            Some(token_json(&rec)),
        )
        .await?;
        tx.commit().await?;
        Ok((rec, secret))
    }

    /// Every token by name.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        sqlx::query(&self.sql(&format!("SELECT {COLUMNS} FROM api_tokens ORDER BY name")))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(decode)
            .collect()
    }

    /// Deletes the token `name` (`NotFound` if there is none). Audited.
    pub async fn revoke_token(&self, name: &str, who: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let before =
            sqlx::query(&self.sql(&format!("SELECT {COLUMNS} FROM api_tokens WHERE name = ?")))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| decode(&r))
                .transpose()?
                .ok_or_else(|| StoreError::NotFound(format!("no token named {name:?}")))?;
        sqlx::query(&self.sql("DELETE FROM api_tokens WHERE name = ?"))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            who,
            "token.revoke",
            &format!("token/{name}"),
            Some(token_json(&before)),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The token whose secret is `secret`, if any.
    pub async fn token_by_secret(&self, secret: &str) -> Result<Option<TokenRecord>> {
        sqlx::query(&self.sql(&format!("SELECT {COLUMNS} FROM api_tokens WHERE hash = ?")))
            .bind(token_hash(secret))
            .fetch_optional(&self.pool)
            .await?
            .map(|r| decode(&r))
            .transpose()
    }

    /// Records that the token `name` was used at `now_ms`.
    pub async fn touch_token(&self, name: &str, now_ms: u64) -> Result<()> {
        sqlx::query(&self.sql("UPDATE api_tokens SET last_used_ms = ? WHERE name = ?"))
            .bind(now_ms as i64)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// A token as the API and `token list --json` show it.
pub fn token_json(t: &TokenRecord) -> serde_json::Value {
    serde_json::json!({
        "name": t.name,
        "role": t.role.as_str(),
        "host": t.host_id,
        "created_at": t.created_ms,
        "last_used_at": t.last_used_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roles_and_hashes() {
        assert!(validate_token_name("web-1.agent_2").is_ok());
        assert!(validate_token_name("").is_err());
        assert!(validate_token_name("a b").is_err());
        assert!(validate_token_name(&"x".repeat(33)).is_err());
        assert_eq!("viewer".parse::<Role>().unwrap(), Role::Viewer);
        assert!("read".parse::<Role>().is_err());
        // SHA-256("abc")
        assert_eq!(
            token_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
