//! Where the agent reads its configuration and records its heartbeat: the
//! same [`Backend`] the config commands use — the store itself (polled) or
//! `rate-ctl serve` over HTTP (`--store http://HOST:PORT --token T`, so that
//! an nginx host needs no database driver or credentials).
//!
//! Over HTTP a background task long-polls `GET /api/v1/snapshot?after=V&delta=1`
//! (answered at commit, with only what changed after V when serve can tell)
//! and queues what arrives; [`ConfigSource::changed`] wakes the agent as
//! soon as something does.
//!
//! Directly on a store, [`ConfigSource::changed`] wakes the agent at a
//! commit instead of waiting for its poll (issue 29): on PostgreSQL a
//! listener on [`NOTIFY_CHANNEL`] (every change notifies it at commit); on
//! SQLite a look at the database and WAL files' size and time every
//! [`SQLITE_WATCH`] (two `stat` calls, no query); MariaDB has neither and
//! is polled (`--poll-ms`). The poll stays as the backstop of both.
//! [`ConfigSource::update`] then reads only what changed since the agent's
//! version ([`crate::store::Store::changes_since`]), or everything. Heartbeats, applied versions and counters go to
//! `POST /api/v1/hosts/{id}/report`, whose answer carries the hosts (for
//! the cluster-rate split).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use std::sync::{Mutex, MutexGuard, PoisonError};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::delta::Update;
use crate::client::http::{percent_encode, Answer, Client};
use crate::client::protocol::{
    acks_json, counters_json, delta_from, granted_leases_from, hosts_from, snapshot_changed,
    snapshot_from, LeaseAck,
};
use crate::client::{Backend, Target};
use crate::store::record::HostRecord;
use crate::store::schema::Dialect;
use crate::store::{CounterSample, LeaseRow, Snapshot, Store, StoreError, NOTIFY_CHANNEL};
use rate_ctl::core::clock::unix_ms;

/// Longest a long-poll may take before the client gives up on it (the
/// server answers within 30 s).
const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(40);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Counters per report through serve: at most about 110 bytes of JSON
/// each, so a chunk stays well under serve's 2 MiB body limit.
pub const REPORT_CHUNK: usize = 8_192;

/// A lock on the long-poll's results; a task that panicked holding it
/// left whole values (each is replaced in one assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often the SQLite database and WAL files are looked at for a commit.
pub const SQLITE_WATCH: Duration = Duration::from_millis(2);

/// How long the version is read again every [`SQLITE_WATCH`] after the
/// SQLite files changed without a new version (a commit being synced).
pub const SQLITE_SETTLE: Duration = Duration::from_millis(100);

/// What a commit changes in an SQLite store's files: (size, modification
/// time in ns, inode) of the database and of its WAL.
type Stamp = [(u64, i128, u64); 2];

fn stamp(db: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| {
                (
                    m.size(),
                    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
                    m.ino(),
                )
            })
            .unwrap_or_default()
    };
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    [one(db), one(std::path::Path::new(&wal))]
}

/// The long-poll's (and the PostgreSQL listener's) results, shared with
/// its task.
#[derive(Default)]
struct Latest {
    /// The newest version received over HTTP.
    version: Mutex<Option<u64>>,
    /// What arrived over HTTP since the agent last took it, in order.
    queue: Mutex<Vec<Update>>,
    /// The long-poll's last failure, until it succeeds again.
    error: Mutex<Option<String>>,
    notify: Notify,
}

/// The agent's connection to its [`Target`]; connects lazily and again
/// after [`ConfigSource::disconnect`].
pub struct ConfigSource {
    target: Target,
    /// How long the store may take to hand out a connection.
    timeout: Duration,
    backend: Option<Backend>,
    latest: Arc<Latest>,
    poller: Option<JoinHandle<()>>,
    /// The SQLite files as they were when the version was last read.
    seen: Mutex<Option<Stamp>>,
    /// The version last read, and until when to read it again every
    /// [`SQLITE_WATCH`] after the files changed without a new version.
    settle: Mutex<(Option<u64>, Option<std::time::Instant>)>,
}

impl ConfigSource {
    /// A source for `target`; an API URL that cannot be used is refused
    /// here (`StoreError::Url`), before anything is sent.
    pub fn new(target: Target, timeout: Duration) -> Result<ConfigSource, StoreError> {
        if let Target::Api { url, token } = &target {
            Client::new(url, token.clone()).map_err(|e| StoreError::Url(e.to_string()))?;
        }
        Ok(ConfigSource {
            target,
            timeout,
            backend: None,
            latest: Arc::default(),
            poller: None,
            seen: Mutex::new(None),
            settle: Mutex::new((None, None)),
        })
    }

    pub fn connected(&self) -> bool {
        self.backend.is_some()
    }

    fn backend(&self) -> Result<&Backend, StoreError> {
        self.backend
            .as_ref()
            .ok_or_else(|| StoreError::Url("not connected".into()))
    }

    /// Connects and registers this host: with `weight` given, sets it if the
    /// stored one differs; returns the weight in force (`default_weight` for
    /// a new host without `weight`).
    pub async fn connect(
        &mut self,
        host_id: &str,
        weight: Option<u32>,
        default_weight: u32,
    ) -> Result<u32, StoreError> {
        let backend = Backend::open_with_timeout(&self.target, self.timeout).await?;
        let w = match &backend {
            Backend::Store(store) => {
                let w = register(store, host_id, weight, default_weight).await?;
                store.relax_durability().await?;
                if let (Dialect::Postgres, Target::Store(url)) = (store.dialect(), &self.target) {
                    self.poller = Some(tokio::spawn(listen(url.clone(), self.latest.clone())));
                }
                w
            }
            Backend::Api(api) => {
                let client = api.client();
                let mut body = json!({"counters": []});
                if let Some(w) = weight {
                    body["weight"] = json!(w);
                }
                let answer = report(client, host_id, body).await?;
                let w = hosts_from(&answer["hosts"])
                    .iter()
                    .find(|h| h.host_id == host_id)
                    .map(|h| h.weight.max(1))
                    .unwrap_or(weight.unwrap_or(default_weight));
                let first = client
                    .request("GET", "/api/v1/snapshot?after=0", None, REQUEST_TIMEOUT)
                    .await
                    .map_err(|e| StoreError::Http(e.to_string()))?;
                let snap = snapshot_from(&ok_body(first, "snapshot")?)?;
                let after = snap.version;
                *lock(&self.latest.version) = Some(after);
                *lock(&self.latest.queue) = vec![Update::Full(snap)];
                *lock(&self.latest.error) = None;
                self.poller = Some(tokio::spawn(long_poll(
                    client.clone(),
                    self.latest.clone(),
                    after,
                )));
                w
            }
        };
        self.backend = Some(backend);
        Ok(w)
    }

    /// Writes one penalty-box ban (issue 32) as the store's `source: ban`
    /// blacklist entry: directly, or through serve's
    /// `POST /api/v1/hosts/{host}/bans`. Returns the entry's id and whether
    /// it is new.
    pub async fn write_ban(
        &self,
        host_id: &str,
        rec: &crate::store::valid::Valid<crate::store::record::BlacklistRecord>,
        strategy_id: u32,
        who: &str,
    ) -> Result<(u64, bool), StoreError> {
        match self.backend()? {
            Backend::Store(store) => store
                .blacklist_ban(rec, strategy_id, who)
                .await
                .map(|w| (w.id, w.created)),
            Backend::Api(api) => {
                let path = format!("/api/v1/hosts/{}/bans", percent_encode(host_id));
                let body = json!({
                    "dimension": rec.dimension,
                    "value": rec.value,
                    "expires_ms": rec.expires_ms,
                    "reason": rec.reason,
                    "strategy": strategy_id,
                });
                let a = api
                    .client()
                    .request("POST", &path, Some(&body), REQUEST_TIMEOUT)
                    .await
                    .map_err(|e| StoreError::Http(e.to_string()))?;
                let v = ok_body(a, "ban")?;
                Ok((v["id"].as_u64().unwrap_or(0), v["created"] == json!(true)))
            }
        }
    }

    /// The store, when the agent reaches it directly.
    pub fn store(&self) -> Option<&Store> {
        match &self.backend {
            Some(Backend::Store(s)) => Some(s),
            _ => None,
        }
    }

    /// Records the heartbeat (and the applied version and time, if any),
    /// counter samples, the last publish error (`None` clears it) and what
    /// this host enforces for leased strategies (`acks`: strategy, epoch,
    /// value); returns every host and this host's leases.
    #[allow(clippy::too_many_arguments)]
    pub async fn heartbeat(
        &mut self,
        host_id: &str,
        weight: u32,
        now: u64,
        applied: Option<(u64, u64)>,
        counters: &[CounterSample],
        publish_error: Option<&(String, u64)>,
        acks: &[LeaseAck],
    ) -> Result<(Vec<HostRecord>, Vec<LeaseRow>), StoreError> {
        match self.backend()? {
            Backend::Store(store) => {
                store.heartbeat(host_id, weight, now, applied).await?;
                store
                    .set_publish_error(host_id, publish_error.map(|(m, at)| (m.as_str(), *at)))
                    .await?;
                if !counters.is_empty() {
                    store.add_samples(host_id, now, counters).await?;
                }
                store.ack_leases(host_id, now, acks).await?;
                Ok((store.hosts().await?, store.leases(Some(host_id)).await?))
            }
            Backend::Api(api) => {
                // serve takes at most 2 MiB a request, and the counters of a
                // full table (65,536 strategies) are about 4 MiB of JSON:
                // they go in chunks, all but the last with counters only.
                let mut counters = counters;
                while counters.len() > REPORT_CHUNK {
                    let (chunk, rest) = counters.split_at(REPORT_CHUNK);
                    report(
                        api.client(),
                        host_id,
                        json!({"counters": counters_json(chunk)}),
                    )
                    .await?;
                    counters = rest;
                }
                let body = json!({
                    "applied_version": applied.map(|a| a.0),
                    "counters": counters_json(counters),
                    "publish_error": publish_error.map(|e| &e.0),
                    "publish_error_at": publish_error.map(|e| e.1),
                    "leases": acks_json(acks),
                });
                let answer = report(api.client(), host_id, body).await?;
                Ok((
                    hosts_from(&answer["hosts"]),
                    granted_leases_from(&answer["leases"], host_id),
                ))
            }
        }
    }

    /// Records that `version` was applied at `at`.
    pub async fn applied(
        &mut self,
        host_id: &str,
        weight: u32,
        at: u64,
        version: u64,
    ) -> Result<(), StoreError> {
        match self.backend()? {
            Backend::Store(store) => {
                store
                    .heartbeat(host_id, weight, at, Some((version, at)))
                    .await
            }
            Backend::Api(api) => report(
                api.client(),
                host_id,
                json!({"applied_version": version, "counters": []}),
            )
            .await
            .map(|_| ()),
        }
    }

    /// The current config version (cheap).
    pub async fn version(&mut self) -> Result<u64, StoreError> {
        match self.backend()? {
            Backend::Store(store) => {
                let Some(db) = store.sqlite_file() else {
                    return store.version().await;
                };
                // Before the read: a commit after it changes the files.
                let now = stamp(db);
                let before = lock(&self.seen).replace(now);
                let v = store.version().await?;
                // The files change when a commit writes its WAL frames, but
                // the commit shows only once they are synced (an fsync of
                // 10-20 ms): the files moved without a new version, so
                // look again every few ms for a while.
                let mut settle = lock(&self.settle);
                if before.is_some_and(|b| b != now) && settle.0 == Some(v) {
                    settle.1 = Some(std::time::Instant::now() + SQLITE_SETTLE);
                } else if settle.0 != Some(v) {
                    settle.1 = None;
                }
                settle.0 = Some(v);
                Ok(v)
            }
            Backend::Api(_) => {
                if let Some(e) = lock(&self.latest.error).clone() {
                    return Err(StoreError::Http(e));
                }
                lock(&self.latest.version).ok_or_else(|| StoreError::Http("no snapshot yet".into()))
            }
        }
    }

    /// What changed since version `after` (the agent's table), or
    /// everything (`after` `None`, or when the store cannot tell); over
    /// HTTP, what the long-poll brought since the last call, in order.
    pub async fn update(&mut self, after: Option<u64>) -> Result<Vec<Update>, StoreError> {
        match self.backend()? {
            Backend::Store(store) => {
                if let Some(after) = after {
                    if let Some(changes) = store.changes_since(after).await? {
                        return Ok(vec![Update::Delta { after, changes }]);
                    }
                }
                Ok(vec![Update::Full(store.snapshot().await?)])
            }
            Backend::Api(_) => Ok(std::mem::take(&mut *lock(&self.latest.queue))),
        }
    }

    /// The full configuration with its version (read again whole).
    pub async fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        match self.backend()? {
            Backend::Store(store) => store.snapshot().await,
            Backend::Api(api) => {
                let a = api
                    .client()
                    .request("GET", "/api/v1/snapshot?after=0", None, REQUEST_TIMEOUT)
                    .await
                    .map_err(|e| StoreError::Http(e.to_string()))?;
                snapshot_from(&ok_body(a, "snapshot")?)
            }
        }
    }

    /// Forgets the connection; the next tick connects again.
    pub fn disconnect(&mut self) {
        if let Some(p) = self.poller.take() {
            p.abort();
        }
        if let Some(Backend::Store(s)) = self.backend.take() {
            tokio::spawn(s.close());
        }
    }

    /// Resolves when the configuration may have changed: at a commit on
    /// PostgreSQL (NOTIFY) and through serve (long-poll), when the SQLite
    /// files changed since the version was last read; never on MariaDB
    /// (the agent polls `version` every `poll`).
    pub async fn changed(&self) {
        let seen = *lock(&self.seen);
        let settling = lock(&self.settle)
            .1
            .is_some_and(|t| std::time::Instant::now() < t);
        match (self.store().and_then(Store::sqlite_file), seen) {
            (Some(_), Some(_)) if settling => tokio::time::sleep(SQLITE_WATCH).await,
            (Some(db), Some(seen)) => loop {
                tokio::time::sleep(SQLITE_WATCH).await;
                let now = stamp(db);
                if now != seen {
                    tracing::trace!(?seen, ?now, "the SQLite files changed");
                    return;
                }
            },
            _ if self.poller.is_some() => self.latest.notify.notified().await,
            _ => std::future::pending::<()>().await,
        }
    }
}

impl Drop for ConfigSource {
    fn drop(&mut self) {
        if let Some(p) = self.poller.take() {
            p.abort();
        }
    }
}

/// Registers `host_id` in the store (see [`ConfigSource::connect`]).
async fn register(
    store: &Store,
    host_id: &str,
    weight: Option<u32>,
    default_weight: u32,
) -> Result<u32, StoreError> {
    let hosts = store.hosts().await?;
    let w = match (hosts.iter().find(|h| h.host_id == host_id), weight) {
        (Some(me), Some(w)) if me.weight != w => {
            store.set_weight(host_id, w, "agent").await?;
            w
        }
        (Some(me), None) => me.weight.max(1),
        (Some(_), Some(w)) => w,
        (None, w) => {
            let w = w.unwrap_or(default_weight);
            store.heartbeat(host_id, w, unix_ms(), None).await?;
            w
        }
    };
    Ok(w)
}

/// `POST /api/v1/hosts/{id}/report`.
async fn report(client: &Client, host_id: &str, body: Value) -> Result<Value, StoreError> {
    let path = format!("/api/v1/hosts/{}/report", percent_encode(host_id));
    let a = client
        .request("POST", &path, Some(&body), REQUEST_TIMEOUT)
        .await
        .map_err(|e| StoreError::Http(e.to_string()))?;
    ok_body(a, "report")
}

/// Listens on the PostgreSQL channel every change notifies at commit and
/// wakes the agent; reconnects by itself (sqlx's listener), and the agent's
/// poll covers the time it takes.
async fn listen(url: String, latest: Arc<Latest>) {
    let mut failing = false;
    loop {
        let r = async {
            let mut l = sqlx::postgres::PgListener::connect(&url).await?;
            l.listen(NOTIFY_CHANNEL).await?;
            tracing::debug!(channel = NOTIFY_CHANNEL, "listening for changes");
            failing = false;
            loop {
                l.recv().await?;
                latest.notify.notify_one();
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        }
        .await;
        if let Err(e) = r {
            if !failing {
                tracing::warn!(error = %e, "cannot listen for changes on PostgreSQL; polling meanwhile");
                failing = true;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Long-polls the snapshot after `after` until aborted, queueing what
/// arrives (a delta when serve sends one) in `latest` and waking the agent.
async fn long_poll(client: Client, latest: Arc<Latest>, mut after: u64) {
    loop {
        let path = format!("/api/v1/snapshot?after={after}&delta=1");
        let r = client
            .request("GET", &path, None, LONG_POLL_TIMEOUT)
            .await
            .map_err(|e| StoreError::Http(e.to_string()))
            .and_then(|a| ok_body(a, "snapshot"))
            .and_then(|v| {
                Ok(if !snapshot_changed(&v) {
                    None
                } else if let Some(changes) = delta_from(&v, after)? {
                    Some(Update::Delta { after, changes })
                } else {
                    Some(Update::Full(snapshot_from(&v)?))
                })
            });
        match r {
            Ok(s) => {
                *lock(&latest.error) = None;
                if let Some(u) = s {
                    after = match &u {
                        Update::Full(s) => s.version,
                        Update::Delta { changes, .. } => changes.version,
                    };
                    *lock(&latest.version) = Some(after);
                    lock(&latest.queue).push(u);
                    latest.notify.notify_one();
                }
            }
            Err(e) => {
                *lock(&latest.error) = Some(e.to_string());
                latest.notify.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn ok_body(a: Answer, what: &str) -> Result<Value, StoreError> {
    if (200..300).contains(&a.status) {
        Ok(a.body)
    } else if a.status == 401 || a.status == 403 {
        Err(StoreError::Auth(format!(
            "{what}: HTTP {}: {} (check --token / RATE_CTL_TOKEN: the agent token of rate-ctl serve)",
            a.status,
            a.error_message()
        )))
    } else {
        Err(StoreError::Http(format!(
            "{what}: HTTP {}: {}",
            a.status,
            a.error_message()
        )))
    }
}
