//! The agent's per-key operations (issue 33), in a task of their own
//! beside the agent's loop: every [`POLL`] it
//!
//! * through `rate-ctl serve` (`--store http://…`): posts `POST
//!   /api/v1/hosts/{host}/keys` with the readings it owes, and gets the
//!   key resets recorded since its last poll and the fleet view's
//!   questions for this host (`src/serve/keys.rs`); the readings of new
//!   questions go out at once in a second post;
//! * on the store itself (`--store URL`): reads the resets recorded since
//!   its last one (`key_resets`) and the fleet view's questions of the last
//!   2 s it has not answered (`key_questions`), and answers them there
//!   (`key_answers`).
//!
//! A reset sets the key's word in this host's file to a new key's
//! ([`rate_ctl::core::key_ops::reset_published`]); a reading is
//! [`rate_ctl::core::key_ops::read_published`], the same as `rate-ctl
//! shm key`. The id of the last reset applied is kept in the file's state
//! header: a restarted agent goes on from it (a reset recorded while no
//! agent ran is applied then); on a new file it starts after the newest
//! (the file holds no state yet). Faults (serve or store unreachable, a file
//! being replaced) are logged at debug and retried at the next poll: the
//! agent's loop reports them already.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tracing::{debug, info, warn};

use crate::client::http::{percent_encode, Client};
use crate::client::Target;
use crate::store::Store;
use rate_ctl::core::clock::unix_ms;
use rate_ctl::core::escape::escape_bytes;
use rate_ctl::core::key_ops::{read_published, reset_published, top_of};
use rate_ctl::core::keys::read::now;
use rate_ctl::core::shm::Mapping;

/// How often the agent asks for resets and questions.
pub const POLL: Duration = Duration::from_millis(200);
const TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the task for the agent of `host_id` on the file `shm`.
pub fn spawn(target: Target, host_id: String, shm: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut k = KeyOps {
            target,
            host_id,
            shm,
            after: None,
            store: None,
            client: None,
            owed: Vec::new(),
        };
        loop {
            if let Err(e) = k.round().await {
                debug!(error = %e, "key operations: this round failed; retrying");
                k.store = None;
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

struct KeyOps {
    target: Target,
    host_id: String,
    shm: PathBuf,
    /// The last reset applied (`None`: not started; the newest then).
    after: Option<u64>,
    store: Option<Store>,
    client: Option<Client>,
    /// Readings not yet delivered.
    owed: Vec<Value>,
}

impl KeyOps {
    async fn round(&mut self) -> Result<(), String> {
        match self.target.clone() {
            Target::Store(url) => {
                if self.store.is_none() {
                    self.store = Some(
                        Store::open_with_timeout(&url, TIMEOUT)
                            .await
                            .map_err(|e| e.to_string())?,
                    );
                }
                let store = self.store.as_ref().expect("just opened");
                let after = match self.after {
                    Some(a) => a,
                    // Where this host's file says the last agent stopped
                    // (a reset recorded meanwhile is applied), else after
                    // the newest.
                    None => {
                        let newest = store.key_resets_last().await.map_err(|e| e.to_string())?;
                        match self.applied_in_file() {
                            0 => newest,
                            f => f.min(newest),
                        }
                    }
                };
                let resets = store
                    .key_resets_after(after)
                    .await
                    .map_err(|e| e.to_string())?;
                let rows: Vec<(u64, u32, String)> = resets
                    .into_iter()
                    .map(|r| (r.id, r.strategy_id, r.key))
                    .collect();
                self.after = Some(rows.last().map_or(after, |r| r.0));
                self.apply(&rows);
                // The fleet view's questions of the last 2 s, answered in
                // the store.
                let since = unix_ms().saturating_sub(2_000);
                let qs = store
                    .key_questions_for(&self.host_id, since)
                    .await
                    .map_err(|e| e.to_string())?;
                if qs.is_empty() {
                    return Ok(());
                }
                let qs = qs
                    .into_iter()
                    .map(|q| (q.id, q.strategy_id, q.key))
                    .collect();
                for a in answers(&self.shm, qs)? {
                    let id = a["query"].as_u64().unwrap_or(0);
                    store
                        .key_answer(id, &self.host_id, &a)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Target::Api { url, token } => {
                if self.client.is_none() {
                    self.client = Some(Client::new(&url, token).map_err(|e| e.to_string())?);
                }
                // A second post delivers the readings of the first's
                // questions at once.
                for _ in 0..2 {
                    if !self.poll_api().await? {
                        break;
                    }
                }
                Ok(())
            }
        }
    }

    /// One poll of serve; `true` when it brought questions (readings owed).
    async fn poll_api(&mut self) -> Result<bool, String> {
        if self.after.is_none() {
            // Where this host's file says the last agent stopped.
            self.after = Some(self.applied_in_file()).filter(|&f| f > 0);
        }
        let client = self.client.as_ref().expect("made by round");
        let mut body = json!({"answers": self.owed});
        if let Some(a) = self.after {
            body["after"] = json!(a);
        }
        let path = format!("/api/v1/hosts/{}/keys", percent_encode(&self.host_id));
        let a = client
            .request("POST", &path, Some(&body), TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if a.status != 200 {
            return Err(a.error_message());
        }
        self.owed.clear();
        let rows: Vec<(u64, u32, String)> = a.body["resets"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|r| {
                        Some((
                            r["id"].as_u64()?,
                            u32::try_from(r["strategy"].as_u64()?).ok()?,
                            r["key"].as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.apply(&rows);
        if let Some(after) = a.body["after"].as_u64() {
            self.after = Some(after);
        }
        // A question names a key, or asks for the strategy's top keys.
        let questions: Vec<(u64, u32, Option<String>)> = a.body["queries"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|q| {
                        Some((
                            q["query"].as_u64()?,
                            u32::try_from(q["strategy"].as_u64()?).ok()?,
                            q["key"].as_str().map(str::to_string),
                        ))
                    })
                    .take(256)
                    .collect()
            })
            .unwrap_or_default();
        if questions.is_empty() {
            return Ok(false);
        }
        self.owed = answers(&self.shm, questions)?;
        Ok(true)
    }

    /// The last reset applied to this host's file (0: none, or no file).
    fn applied_in_file(&self) -> u64 {
        Mapping::open(&self.shm).map_or(0, |m| m.key_reset_applied())
    }

    /// Resets each `(id, strategy, key)` in this host's file, then records
    /// the last id in it (see `Mapping::key_reset_applied`).
    fn apply(&self, rows: &[(u64, u32, String)]) {
        if rows.is_empty() {
            return;
        }
        let map = match Mapping::open(&self.shm) {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "key resets: cannot open the file; not applied");
                return;
            }
        };
        let decoded = match crate::agent::publish::read_active(&map) {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "key resets: cannot read the table; not applied");
                return;
            }
        };
        for (id, strategy, key) in rows {
            let p = decoded
                .as_ref()
                .and_then(|d| d.strategies.iter().find(|p| p.strategy.id == *strategy));
            let key_log = escape_bytes(key.as_bytes(), 200);
            match p.map(|p| reset_published(&map, p, key)) {
                Some(Ok(changed)) => {
                    info!(reset = id, strategy, key = %key_log, changed, "key reset applied")
                }
                Some(Err(e)) => {
                    warn!(reset = id, strategy, key = %key_log, error = %e, "key reset refused")
                }
                None => debug!(
                    reset = id,
                    strategy, "key reset: strategy not in this host's table"
                ),
            }
        }
        if let Some(&(last, _, _)) = rows.last() {
            map.set_key_reset_applied(last);
        }
    }
}

/// The readings for `questions` (`(query, strategy, key or top)`) from the
/// file `shm`.
fn answers(
    shm: &std::path::Path,
    questions: Vec<(u64, u32, Option<String>)>,
) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let map = Mapping::open(shm).map_err(|e| e.to_string())?;
    let decoded = crate::agent::publish::read_active(&map).map_err(|e| e.to_string())?;
    for (query, id, key) in questions {
        let p = decoded
            .as_ref()
            .and_then(|d| d.strategies.iter().find(|p| p.strategy.id == id));
        let Some(key) = key else {
            let entries: Vec<Value> = p
                .map(|p| top_of(&map, p))
                .unwrap_or_default()
                .into_iter()
                .map(|e| json!({"key": e.key, "rejections": e.rejections, "requests": e.requests}))
                .collect();
            out.push(json!({"query": query, "read_at": unix_ms(), "entries": entries}));
            continue;
        };
        let mut v = json!({"query": query, "read_at": unix_ms(), "found": false,
                "limit": 0, "used": 0, "remaining": 0, "reset_ms": 0});
        match p.map(|p| read_published(&map, p, &key, now())) {
            Some(Ok((_, r))) => {
                v["found"] = json!(r.found);
                v["limit"] = json!(r.limit);
                v["used"] = json!(r.used);
                v["remaining"] = json!(r.remaining);
                v["reset_ms"] = json!(r.reset_ms);
                if let Some(n) = r.in_flight {
                    v["in_flight"] = json!(n);
                }
            }
            Some(Err(e)) => v["error"] = json!(e.0),
            None => v["error"] = json!("the strategy is not in this host's table"),
        }
        out.push(v);
    }
    Ok(out)
}
