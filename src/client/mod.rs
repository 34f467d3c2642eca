//! The one store-or-API abstraction: where the config commands
//! (`strategy`, `blacklist`, `host`) and the agent read and write — the
//! store itself (`--store URL`) or a running `rate-ctl serve` (`--api URL
//! --token T`, or the agent's `--store http://…`). Each command is written
//! once against [`Backend`]; both variants answer with the store's types
//! and errors, so output, messages and exit codes are the same either way.
//! [`http`] is the HTTP client; the API's JSON of the records is the
//! store's ([`crate::store::json`]), shared with `serve`.

pub mod http;
mod keys;
pub mod protocol;

use std::time::Duration;

use serde_json::{json, Value};

use crate::store::json::{
    blacklist_api_json, blacklist_from_api_json, field_of_api_name, host_from_api_json,
    strategy_api_json, strategy_from_api_json,
};
use crate::store::record::{BlacklistRecord, HostRecord, StrategyRecord};
use crate::store::valid::{valid_import, Valid};
use crate::store::Invalid;
use crate::store::{BadRow, LeaseRow, Store, StoreError};
use http::{percent_encode, Answer, Client, HttpError};

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Who the store's audit log names for a change made with `--store`.
const CLI: &str = "cli";
/// Longest wait for a store connection.
const STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for an ordinary API call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for an import (10,000 strategies take a few seconds).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(300);

/// Where to manage the config, from `--store` / `--api`.
#[derive(Debug, Clone)]
pub enum Target {
    Store(String),
    Api { url: String, token: Option<String> },
}

/// An open config backend.
pub enum Backend {
    Store(Store),
    Api(Api),
}

/// `rate-ctl serve`'s REST API (docs/API.md) as a config backend.
pub struct Api {
    client: Client,
    url: String,
}

impl Backend {
    /// Opens the store (creating and migrating an SQLite file) or prepares
    /// the API client (nothing is sent until the first call).
    pub async fn open(target: &Target) -> Result<Backend> {
        Backend::open_with_timeout(target, STORE_TIMEOUT).await
    }

    /// [`Backend::open`] with the longest wait for a store connection.
    pub async fn open_with_timeout(target: &Target, timeout: Duration) -> Result<Backend> {
        match target {
            Target::Store(url) => Store::open_with_timeout(url, timeout)
                .await
                .map(Backend::Store),
            Target::Api { url, token } => {
                let client =
                    Client::new(url, token.clone()).map_err(|e| StoreError::Url(e.to_string()))?;
                Ok(Backend::Api(Api {
                    client,
                    url: url.trim_end_matches('/').to_string(),
                }))
            }
        }
    }

    /// Stores a new strategy; its id and the new config version.
    pub async fn add_strategy(&self, rec: &Valid<StrategyRecord>) -> Result<(u32, u64)> {
        match self {
            Backend::Store(s) => s.add_strategy(rec, CLI).await,
            Backend::Api(a) => {
                let mut body = strategy_api_json(rec);
                strip(&mut body, &["id", "version", "created_at", "updated_at"]);
                let v = a.call("POST", "/api/v1/strategies", Some(&body)).await?;
                let stored = a.strategy(&v)?;
                Ok((stored.id, stored.version))
            }
        }
    }

    /// One strategy; `NotFound` if absent, `Invalid` if its row is not a
    /// valid strategy.
    pub async fn get_strategy(&self, id: u32) -> Result<StrategyRecord> {
        match self {
            Backend::Store(s) => s.get_strategy(id).await,
            Backend::Api(a) => {
                let v = a
                    .call("GET", &format!("/api/v1/strategies/{id}"), None)
                    .await?;
                a.strategy(&v)
            }
        }
    }

    /// Replaces strategy `rec.id`; the new config version. Through the API
    /// the edit is based on `rec.version` (as read by `get_strategy`), so a
    /// change made meanwhile by someone else is refused (`Conflict`).
    pub async fn update_strategy(&self, rec: &Valid<StrategyRecord>) -> Result<u64> {
        match self {
            Backend::Store(s) => s.update_strategy(rec, CLI).await,
            Backend::Api(a) => {
                let mut body = strategy_api_json(rec);
                strip(&mut body, &["created_at", "updated_at"]);
                let v = a
                    .call(
                        "PUT",
                        &format!("/api/v1/strategies/{}", rec.id),
                        Some(&body),
                    )
                    .await?;
                Ok(a.strategy(&v)?.version)
            }
        }
    }

    /// Deletes a strategy; the config version after the change.
    pub async fn delete_strategy(&self, id: u32) -> Result<u64> {
        match self {
            Backend::Store(s) => s.delete_strategy(id, CLI).await,
            Backend::Api(a) => {
                // Deletes the version just read: 409 if someone changes it
                // in between, as for an update.
                let path = format!("/api/v1/strategies/{id}");
                let seen = a.strategy(&a.call("GET", &path, None).await?)?.version;
                a.change("DELETE", &format!("{path}?version={seen}"), None)
                    .await
            }
        }
    }

    /// All strategies by id, and the rows that are not valid strategies
    /// (the API leaves those out: it serves only what agents publish).
    pub async fn list_strategies(&self) -> Result<(Vec<StrategyRecord>, Vec<BadRow>)> {
        match self {
            Backend::Store(s) => s.list_strategies().await,
            Backend::Api(a) => {
                let v = a.call("GET", "/api/v1/strategies", None).await?;
                let list = v["strategies"]
                    .as_array()
                    .ok_or_else(|| a.odd("strategies is not a list"))?;
                let recs = list.iter().map(|s| a.strategy(s)).collect::<Result<_>>()?;
                Ok((recs, Vec::new()))
            }
        }
    }

    /// Loads strategies all or nothing: `records` are the parsed lines of
    /// `text` with their line numbers, validated here for the store (one
    /// check, [`valid_import`]). The API is sent `text` itself (it validates
    /// what it receives), so its errors name the same lines.
    pub async fn import(
        &self,
        text: &str,
        records: Vec<(usize, StrategyRecord)>,
        replace: bool,
        allow_empty: bool,
    ) -> Result<(usize, u64)> {
        match self {
            Backend::Store(s) => {
                s.import(valid_import(records)?, replace, allow_empty, CLI)
                    .await
            }
            Backend::Api(a) => {
                let path = format!(
                    "/api/v1/strategies/import?replace={replace}&allow_empty={allow_empty}"
                );
                let answer = a
                    .client
                    .request_text(
                        "POST",
                        &path,
                        "application/x-ndjson",
                        text.to_string(),
                        IMPORT_TIMEOUT,
                    )
                    .await
                    .map_err(|e| a.unreachable(e))?;
                let v = a.check(answer)?;
                match (v["imported"].as_u64(), v["version"].as_u64()) {
                    (Some(n), Some(version)) => Ok((n as usize, version)),
                    _ => Err(a.odd("import answer without imported/version")),
                }
            }
        }
    }

    /// Adds a blacklist entry; its id and the new config version.
    pub async fn blacklist_add(&self, rec: &Valid<BlacklistRecord>) -> Result<(u64, u64)> {
        match self {
            Backend::Store(s) => s.blacklist_add(rec, CLI).await,
            Backend::Api(a) => {
                let mut body = blacklist_api_json(rec);
                strip(&mut body, &["id", "created_at", "source"]);
                if rec.expires_ms.is_none() {
                    strip(&mut body, &["expires_at"]);
                }
                let v = a.call("POST", "/api/v1/blacklist", Some(&body)).await?;
                let entry = blacklist_from_api_json(&v).map_err(|e| a.odd(&e))?;
                Ok((entry.id, a.version().await?))
            }
        }
    }

    /// Removes a blacklist entry; the config version after the change.
    pub async fn blacklist_rm(&self, id: u64) -> Result<u64> {
        match self {
            Backend::Store(s) => s.blacklist_rm(id, CLI).await,
            Backend::Api(a) => {
                a.change("DELETE", &format!("/api/v1/blacklist/{id}"), None)
                    .await
            }
        }
    }

    pub async fn blacklist_list(&self) -> Result<Vec<BlacklistRecord>> {
        match self {
            Backend::Store(s) => s.blacklist_list().await,
            Backend::Api(a) => {
                let v = a.call("GET", "/api/v1/blacklist", None).await?;
                v["entries"]
                    .as_array()
                    .ok_or_else(|| a.odd("entries is not a list"))?
                    .iter()
                    .map(|e| blacklist_from_api_json(e).map_err(|m| a.odd(&m)))
                    .collect()
            }
        }
    }

    /// The config version and the hosts by id.
    pub async fn hosts(&self) -> Result<(u64, Vec<HostRecord>)> {
        match self {
            Backend::Store(s) => Ok((s.version().await?, s.hosts().await?)),
            Backend::Api(a) => {
                let v = a.call("GET", "/api/v1/hosts", None).await?;
                let version = v["version"]
                    .as_u64()
                    .ok_or_else(|| a.odd("hosts answer without version"))?;
                let hosts = v["hosts"]
                    .as_array()
                    .ok_or_else(|| a.odd("hosts is not a list"))?
                    .iter()
                    .map(|h| host_from_api_json(h).map_err(|e| a.odd(&e)))
                    .collect::<Result<_>>()?;
                Ok((version, hosts))
            }
        }
    }

    /// The fleet leases (`split: demand` strategies), by strategy then host.
    pub async fn leases(&self) -> Result<Vec<LeaseRow>> {
        match self {
            Backend::Store(s) => s.leases(None).await,
            Backend::Api(a) => {
                let v = a.call("GET", "/api/v1/hosts", None).await?;
                let mut out = Vec::new();
                for h in v["hosts"].as_array().into_iter().flatten() {
                    let host = h["host_id"].as_str().unwrap_or_default();
                    for l in h["leases"].as_array().into_iter().flatten() {
                        let n = |k: &str| l[k].as_u64();
                        let age = n("age_ms").unwrap_or(0);
                        out.push(LeaseRow {
                            strategy_id: n("strategy").unwrap_or(0) as u32,
                            host_id: host.to_string(),
                            value: n("rate").unwrap_or(0),
                            epoch: n("epoch").unwrap_or(0),
                            expires_ms: n("expires").unwrap_or(0),
                            granted_ms: rate_ctl::core::clock::unix_ms().saturating_sub(age),
                            demand_milli: (l["demand"].as_f64().unwrap_or(0.0) * 1000.0) as u64,
                            window_start_ms: 0,
                            window_admitted: 0,
                            applied_epoch: n("applied_epoch"),
                            applied_value: n("applied_rate"),
                            applied_ms: None,
                        });
                    }
                }
                Ok(out)
            }
        }
    }

    /// Sets a host's weight (registering it); the config version after.
    pub async fn set_weight(&self, host_id: &str, weight: u32) -> Result<u64> {
        match self {
            Backend::Store(s) => s.set_weight(host_id, weight, CLI).await,
            Backend::Api(a) => {
                let path = format!("/api/v1/hosts/{}", percent_encode(host_id));
                a.change("PUT", &path, Some(&json!({ "weight": weight })))
                    .await
            }
        }
    }
}

impl Api {
    /// The HTTP client (the agent's reports and long-poll).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// One JSON call; a refusal becomes the store error of the same kind.
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let answer = self
            .client
            .request(method, path, body, CALL_TIMEOUT)
            .await
            .map_err(|e| self.unreachable(e))?;
        self.check(answer)
    }

    /// The body of a 2xx answer, else the store error the status stands
    /// for: 400/422 → `Invalid` (the message starts with the field), 404 →
    /// `NotFound`, 409 → `Conflict`, anything else → `Http`.
    fn check(&self, a: Answer) -> Result<Value> {
        if (200..300).contains(&a.status) {
            return Ok(a.body);
        }
        let m = a.error_message();
        Err(match a.status {
            400 | 422 => {
                let field = a.body["error"]["field"].as_str().and_then(field_of_api_name);
                StoreError::Invalid(Invalid::whole(field, m))
            }
            // An absent strategy or entry, as the store says it; any other
            // 404 (e.g. a URL that is not `rate-ctl serve`) is not about an id.
            404 if m.starts_with("no strategy") || m.starts_with("no blacklist") => {
                StoreError::NotFound(m)
            }
            409 => StoreError::Conflict(format!("{m} (someone changed it meanwhile; try again)")),
            401 => StoreError::Http(format!(
                "--api {}: the token was refused ({m}); give the admin token with --token or RATE_CTL_TOKEN",
                self.url
            )),
            403 => StoreError::Http(format!(
                "--api {}: this token may not do that ({m}); changes need the admin token",
                self.url
            )),
            s => StoreError::Http(format!("--api {}: HTTP {s}: {m}", self.url)),
        })
    }

    fn unreachable(&self, e: HttpError) -> StoreError {
        StoreError::Http(format!(
            "cannot reach rate-ctl serve (--api {}): {e}",
            self.url
        ))
    }

    /// An answer that is not what docs/API.md describes.
    fn odd(&self, what: impl std::fmt::Display) -> StoreError {
        StoreError::Http(format!("--api {}: unexpected answer: {what}", self.url))
    }

    fn strategy(&self, v: &Value) -> Result<StrategyRecord> {
        strategy_from_api_json(v).map_err(|e| self.odd(&e))
    }

    /// A change whose answer does not carry the version: the call, then
    /// the config version after it.
    async fn change(&self, method: &str, path: &str, body: Option<&Value>) -> Result<u64> {
        self.call(method, path, body).await?;
        self.version().await
    }

    /// The current config version.
    async fn version(&self) -> Result<u64> {
        let v = self.call("GET", "/api/v1/version", None).await?;
        v["version"]
            .as_u64()
            .ok_or_else(|| self.odd("version answer without version"))
    }
}

fn strip(v: &mut Value, keys: &[&str]) {
    if let Some(o) = v.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Field;

    fn api() -> Api {
        Api {
            client: Client::new("http://127.0.0.1:1", None).unwrap(),
            url: "http://127.0.0.1:1".into(),
        }
    }

    fn answer(status: u16, field: &str, message: &str) -> Answer {
        Answer {
            status,
            body: json!({"error": {"field": field, "message": message}}),
        }
    }

    #[test]
    fn refusals_map_to_store_errors() {
        let a = api();
        let e = a
            .check(answer(422, "rate", "rate: must be greater than 0"))
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Invalid(i)
                if i.to_string() == "rate: must be greater than 0" && i.field == Some(Field::Rate)),
            "{e:?}"
        );
        let e = a
            .check(answer(404, "", "no strategy with id 9"))
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::NotFound(m) if m == "no strategy with id 9"),
            "{e:?}"
        );
        let e = a.check(answer(401, "", "unknown token")).unwrap_err();
        assert!(e.to_string().contains("--token"), "{e}");
        let e = a.check(answer(409, "version", "stale")).unwrap_err();
        assert!(matches!(e, StoreError::Conflict(_)), "{e:?}");
        assert_eq!(
            a.check(Answer {
                status: 204,
                body: Value::Null
            })
            .unwrap(),
            Value::Null
        );
    }
}
