//! `rate-ctl agent`: store → shared-memory file.
//!
//! Every `poll` (default 50 ms) the agent reads the one-row config version;
//! every heartbeat interval (default 1 s) it records its heartbeat and
//! applied version in the hosts table and re-reads the hosts. When the
//! version or this host's share of the fleet changes, it loads the full set
//! in one read transaction, computes local rates ([`crate::fleet::rates`]) and
//! publishes through the core writer ([`Sink`]).
//!
//! The store is reached through a [`ConfigSource`]: the database itself or
//! `rate-ctl serve` over HTTP (`--store http://…`); everything else
//! (rates, faults, logging, publishing) is this one implementation.
//! Each heartbeat also reports the file's slot counters that moved since
//! the last one (for `GET /api/v1/stats`, and the fleet leader's demand).
//!
//! `split: demand` strategies: each heartbeat also brings this host's
//! leases ([`fleet`], [`crate::fleet::lease`]); a valid lease replaces the static share
//! as the local rate, a change is published and acknowledged at once, and
//! while the host holds leases it reports every [`fleet::PERIOD`]. An
//! expired lease falls back to the static split, also while the store is
//! unreachable (the last snapshot is published again). On a direct store
//! the agent is also a candidate fleet leader.
//!
//! Faults: an unreachable store keeps the last table in the file and is
//! retried with exponential backoff (up to `max_backoff`), logging once per
//! change of state; an invalid row is skipped and named; a publish the
//! writer refuses (capacity, or freed slots still in their 2 s quarantine)
//! keeps the previous table, is logged once and retried with backoff (250 ms,
//! then every 500 ms) until it succeeds or the version or share changes; a
//! table that fits but needs slots still held by the strategies it replaces
//! is published in stages (the writer's `publish_staged`), the rest 2 s
//! later; SIGTERM/SIGINT stop the agent
//! between publishes (a publish is synchronous, so it is never cut short)
//! and it exits 0.

pub mod bans;
pub mod delta;
pub mod keys;
pub mod publish;
pub mod source;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use rate_ctl::core::model::ValidStrategy;
use rate_ctl::core::shm::ShmError;
use tracing::{debug, error, info, warn};

use crate::fleet::leader as fleet;
use crate::fleet::rates::{local_strategy, share, Share};
use crate::store::record::{BlacklistRecord, HostRecord, StrategyRecord};
use crate::store::{redact_url, BadRow, CounterSample, Snapshot, StoreError};
use rate_ctl::core::clock::unix_ms;
pub use source::ConfigSource;

/// Where published tables go: the core writer in production, a recorder in
/// unit tests.
pub trait Sink {
    /// Publishes the full table; `Ok` carries a one-line summary, `Err` a
    /// message naming what was refused (the previous table stays).
    /// `changed`: the ids (sorted) that may differ from the last
    /// successful publish; `None`: any (see `Writer::publish_staged`).
    fn publish(
        &mut self,
        strategies: &[&ValidStrategy],
        blacklist: &[BlacklistRecord],
        config_version: u64,
        changed: Option<&[u32]>,
    ) -> Result<String, ShmError>;
    /// Writes the agent heartbeat (unix ms) into the file header.
    fn heartbeat(&self, unix_ms: u64);
    /// The slot counters of the published strategies.
    fn counters(&self) -> Vec<CounterSample> {
        Vec::new()
    }
    /// Replaces a file truncated or rewritten under the agent; `Ok(Some)`
    /// (the reason) when it did, and the table must be published again.
    fn check_file(&mut self) -> Result<Option<String>, ShmError> {
        Ok(None)
    }
    /// Strategies the last publish left for a later stage (slots still in
    /// their quarantine); 0 when it was complete.
    fn deferred(&self) -> usize {
        0
    }
    /// The mapped files (the penalty box's ban table, `bans.rs`).
    fn mapping(&self) -> Option<std::sync::Arc<rate_ctl::core::shm::Mapping>> {
        None
    }
}

/// Why the agent stopped (it otherwise runs until its shutdown signal).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The store refused the agent's credentials at first contact: a
    /// configuration error, not retried.
    #[error("--store {store}: {message}")]
    Refused { store: String, message: String },
}

/// How long after a staged publish the rest is published: the writer's
/// slot quarantine and a margin.
const STAGE_WAIT_MS: u64 = 2_100;

#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub store_url: String,
    pub host_id: String,
    /// Set this host's weight at start; `None` keeps the stored one (1 for
    /// a new host).
    pub weight: Option<u32>,
    pub poll: Duration,
    pub heartbeat_every: Duration,
    pub freshness_ms: u64,
    pub max_backoff: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    version: u64,
    share: Key,
    at_ms: u64,
}

/// A refused publish and when to try it again.
#[derive(Debug, Clone)]
struct Refused {
    version: u64,
    share: Key,
    retry_at_ms: u64,
    delay_ms: u64,
}

/// What the local rates depend on besides the config version: this host's
/// static share and its valid leases (`split: demand` strategies).
type Key = (Share, Leases);

/// Valid leases: strategy id → (epoch, value).
type Leases = BTreeMap<u32, (u64, u64)>;

/// First wait before retrying a refused publish; doubles up to
/// [`REFUSED_MAX_DELAY_MS`] (and `max_backoff`).
const REFUSED_FIRST_DELAY_MS: u64 = 250;
const REFUSED_MAX_DELAY_MS: u64 = 500;

impl Refused {
    /// Whether `(version, share)` was refused and its retry is not due.
    fn waiting(this: &Option<Refused>, version: u64, share: &Key, now_ms: u64) -> bool {
        this.as_ref()
            .is_some_and(|r| r.version == version && r.share == *share && now_ms < r.retry_at_ms)
    }
}

pub struct Agent<S: Sink> {
    opts: AgentOptions,
    sink: S,
    source: ConfigSource,
    healthy: Option<bool>,
    applied: Option<Applied>,
    /// The last refused publish: retried with backoff (a refusal may be
    /// transient, e.g. freed slots still in their 2 s quarantine).
    refused: Option<Refused>,
    /// The last publish refusal and its time (unix ms), reported with every
    /// heartbeat until a publish succeeds.
    publish_error: Option<(String, u64)>,
    /// The last fault found in the shared-memory files (something changed,
    /// removed or replaced them; see `Writer::check_live`) and its time:
    /// reported through the publish-error field while no publish error is,
    /// for [`FILE_FAULT_SHOWN_MS`] after it was repaired (a repair takes
    /// one poll: a report only while broken would go unseen), or for as
    /// long as it cannot be repaired.
    file_fault: Option<(String, u64)>,
    /// A staged publish left strategies out: publish again from this time.
    staged_until_ms: u64,
    /// When the file's upkeep ([`Agent::upkeep`]) is next due.
    next_upkeep_ms: u64,
    hosts: Vec<HostRecord>,
    my_weight: u32,
    next_heartbeat_ms: u64,
    logged_bad: HashSet<(i64, String)>,
    /// Counters as last reported, and the strategies whose counters moved
    /// in the last report (reported once more when they stop, so that the
    /// series has a point where they went flat).
    sent: HashMap<u32, CounterSample>,
    moving: HashSet<u32>,
    /// This host's leases as last read (src/fleet/leader.rs writes them).
    leases: Vec<crate::store::LeaseRow>,
    /// What this host enforces for each `split: demand` strategy:
    /// (strategy, lease epoch or 0 for the static share, local rate),
    /// reported with every heartbeat.
    acks: Vec<(u32, u64, u64)>,
    /// The strategies of the last snapshot (the leader's input when this
    /// agent reaches the store directly).
    strategies: Vec<StrategyRecord>,
    /// Takes part in the fleet leadership (direct store only).
    coordinator: Option<fleet::Coordinator>,
    /// The configuration as last read: kept up to date with what each
    /// version changed (a full read at start, after a reconnect, or when
    /// the store cannot tell what changed); also what is published again
    /// with the static split when leases expire while the store is
    /// unreachable.
    table: Option<delta::Table>,
    /// The penalty box's bans written to the store (`bans.rs`).
    bans: bans::BanState,
    /// Each strategy's local form as last derived, and the share it was
    /// derived with: a change re-derives only the strategies it touched
    /// (all of them when the share changes).
    derived: Derived,
}

/// The local strategies of the last publish (issue 29): a change
/// re-derives only the strategies it touched, all of them when the share
/// or the leases changed or the table was read whole.
#[derive(Default)]
struct Derived {
    /// What `items` were derived with (`None`: nothing derived yet).
    key: Option<Key>,
    /// By strategy id: whether the fleet leases it (`split: demand`) and
    /// its local form (`None`: the derivation failed, logged when it did).
    items: Vec<(u32, bool, Option<Box<ValidStrategy>>)>,
    /// The ids re-derived since the last successful publish, sorted
    /// (`None`: all of them): the writer encodes only these (issue 29).
    dirty: Option<Vec<u32>>,
}

impl Derived {
    /// Brings `items` up to `snap` (strategies sorted by id) and `share`:
    /// only `changed` (sorted ids) unless that is `None` or `share`
    /// differs from what the items were derived with.
    fn update(&mut self, snap: &Snapshot, share: &Key, changed: Option<Vec<u32>>) {
        let derive = |rec: &crate::store::valid::Valid<StrategyRecord>| {
            let leased = fleet::leased(rec);
            let lease = share.1.get(&rec.id).filter(|_| leased);
            let s = match local_strategy(rec, share.0, lease.map(|l| l.1)) {
                Ok(s) => Some(Box::new(s)),
                Err(reason) => {
                    warn!(id = rec.id, %reason, "skipping strategy");
                    None
                }
            };
            (rec.id, leased, s)
        };
        let changed = changed.filter(|_| self.key.as_ref() == Some(share));
        let Some(changed) = changed else {
            self.items = snap.strategies.iter().map(derive).collect();
            self.key = Some(share.clone());
            self.dirty = None;
            return;
        };
        if let Some(dirty) = &mut self.dirty {
            dirty.extend_from_slice(&changed);
            dirty.sort_unstable();
            dirty.dedup();
        }
        for id in changed {
            let rec = snap
                .strategies
                .binary_search_by_key(&id, |r| r.id)
                .ok()
                .map(|i| &snap.strategies[i]);
            match (self.items.binary_search_by_key(&id, |p| p.0), rec) {
                (Ok(i), Some(rec)) => self.items[i] = derive(rec),
                (Ok(i), None) => {
                    self.items.remove(i);
                }
                (Err(i), Some(rec)) => self.items.insert(i, derive(rec)),
                (Err(_), None) => {}
            }
        }
    }
}

/// Keeps freed memory in the agent's heap instead of giving it back
/// (issue 29): every publish allocates and frees the same few hundred kB
/// to MB (the segment's payload, the slot list) and, with glibc's default
/// trimming, the heap shrank after each and grew again at the next, a page
/// fault and a cleared page per 4 kB — a fifth of the agent's CPU during
/// changes with 10,000 strategies. The heap stays at its high-water mark
/// (the agent already holds the table); blocks above 32 MiB are still
/// mappings of their own.
fn keep_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc allocator parameters (no memory is
    // touched); its failure (0) leaves the defaults, which are correct too.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// How long a repaired fault of the shared-memory files stays in the
/// host's report (`rate-ctl host list`, the page's hosts view).
pub const FILE_FAULT_SHOWN_MS: u64 = 60_000;

impl<S: Sink> Agent<S> {
    pub fn new(opts: AgentOptions, sink: S, source: ConfigSource) -> Agent<S> {
        Agent {
            my_weight: opts.weight.unwrap_or(1),
            opts,
            sink,
            source,
            healthy: None,
            applied: None,
            refused: None,
            publish_error: None,
            file_fault: None,
            staged_until_ms: 0,
            next_upkeep_ms: 0,
            hosts: Vec::new(),
            next_heartbeat_ms: 0,
            logged_bad: HashSet::new(),
            sent: HashMap::new(),
            moving: HashSet::new(),
            leases: Vec::new(),
            acks: Vec::new(),
            strategies: Vec::new(),
            coordinator: None,
            table: None,
            bans: Default::default(),
            derived: Derived::default(),
        }
    }

    /// Valid leases at `now` (unexpired).
    fn valid_leases(&self, now: u64) -> Leases {
        self.leases
            .iter()
            .filter(|l| l.expires_ms > now)
            .map(|l| (l.strategy_id, (l.epoch, l.value)))
            .collect()
    }

    #[cfg(test)]
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Runs until `shutdown` resolves; a publish in progress completes first.
    /// A store that refuses the agent's token at first contact is a
    /// configuration error: `Err` (the agent exits non-zero) instead of
    /// retrying forever with no table. Refused later (a token revoked),
    /// the agent keeps its table and retries, logging at error level.
    pub async fn run(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        keep_heap();
        tokio::pin!(shutdown);
        let mut delay = Duration::ZERO;
        loop {
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(delay) => {}
                _ = self.source.changed() => {}
            }
            // The tick may be dropped at an await (a store query); publishing
            // has no await, so it is never interrupted.
            let r = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                r = self.tick() => r,
            };
            match r {
                Ok(()) => {
                    if self.healthy != Some(true) {
                        if self.healthy.is_some() {
                            info!(store = %redact_url(&self.opts.store_url), "store reachable again");
                        }
                        self.healthy = Some(true);
                    }
                    delay = self.opts.poll;
                }
                Err(StoreError::Auth(m)) if self.healthy.is_none() => {
                    error!(store = %redact_url(&self.opts.store_url), error = %m,
                           "the store refused the agent's credentials: a configuration error; exiting");
                    self.source.disconnect();
                    return Err(AgentError::Refused {
                        store: redact_url(&self.opts.store_url),
                        message: m,
                    });
                }
                Err(e) => {
                    if let StoreError::Auth(m) = &e {
                        if self.healthy != Some(false) {
                            error!(store = %redact_url(&self.opts.store_url), error = %m,
                                   "the store refused the agent's credentials; the file keeps the last table, retrying");
                            self.healthy = Some(false);
                        }
                    }
                    if self.healthy != Some(false) {
                        warn!(store = %redact_url(&self.opts.store_url), error = %e,
                              "store unreachable; the file keeps the last table, retrying with backoff");
                        self.healthy = Some(false);
                    }
                    self.offline_tick().await;
                    if matches!(e, StoreError::Db(_) | StoreError::Http(_)) {
                        // Reconnect from scratch next time: a pool may be stuck
                        // on dead connections.
                        self.source.disconnect();
                    }
                    delay = (delay * 2).max(self.opts.poll).min(self.opts.max_backoff);
                }
            }
        }
        self.source.disconnect();
        Ok(())
    }

    /// One poll: heartbeat, version check, publish if needed. A tick may
    /// come every few ms (woken by the store's files or a NOTIFY): the
    /// file's upkeep (its check, heartbeat and repair of foreign state,
    /// which visits every slot) runs once per `poll`.
    pub async fn tick(&mut self) -> Result<(), StoreError> {
        let now = unix_ms();
        if now >= self.next_upkeep_ms {
            self.next_upkeep_ms = now + self.opts.poll.as_millis() as u64;
            self.upkeep(now);
        }
        self.tick_store(now).await
    }

    /// The shared-memory file's upkeep: replaced if someone changed it,
    /// heartbeat, foreign state repaired.
    fn upkeep(&mut self, now: u64) {
        match self.sink.check_file() {
            Ok(None) => {
                if self
                    .file_fault
                    .as_ref()
                    .is_some_and(|f| now.saturating_sub(f.1) >= FILE_FAULT_SHOWN_MS)
                {
                    self.file_fault = None;
                    self.next_heartbeat_ms = 0;
                }
            }
            Ok(Some(reason)) => {
                error!(%reason, "the shared-memory file was changed by someone else; repaired, publishing the table again");
                self.applied = None;
                self.refused = None;
                self.file_fault = Some((
                    format!("shared-memory file changed by someone else: {reason} (repaired)"),
                    now,
                ));
                self.next_heartbeat_ms = 0;
            }
            Err(e) => {
                error!(error = %e, "the shared-memory file is damaged and cannot be replaced");
                let message = format!("shared-memory file damaged and not repaired: {e}");
                if self.file_fault.as_ref().map(|f| &f.0) != Some(&message) {
                    self.next_heartbeat_ms = 0;
                }
                self.file_fault = Some((message, now));
            }
        }
        self.sink.heartbeat(now);
    }

    /// The store's part of a tick: heartbeat when due, version check,
    /// publish if needed.
    async fn tick_store(&mut self, now: u64) -> Result<(), StoreError> {
        if !self.source.connected() {
            self.my_weight = self
                .source
                .connect(&self.opts.host_id, self.opts.weight, self.my_weight)
                .await?;
            info!(host = %self.opts.host_id, weight = self.my_weight, "registered with the store");
            self.next_heartbeat_ms = 0;
        }
        if now >= self.next_heartbeat_ms {
            let applied = self.applied.as_ref().map(|a| (a.version, a.at_ms));
            let (report, all) = self.counters_to_report();
            (self.hosts, self.leases) = self
                .source
                .heartbeat(
                    &self.opts.host_id,
                    self.my_weight,
                    now,
                    applied,
                    &report,
                    self.publish_error.as_ref().or(self.file_fault.as_ref()),
                    &self.acks,
                )
                .await?;
            if let Some(store) = self.source.store() {
                // A direct store: this agent is a candidate fleet leader.
                let c = self.coordinator.get_or_insert_with(|| {
                    fleet::Coordinator::new(format!("agent:{}", self.opts.host_id))
                });
                if let Err(e) = c
                    .tick(store, &self.strategies, self.opts.freshness_ms)
                    .await
                {
                    warn!(error = %e, "fleet leases: this round failed");
                }
            }
            self.moving = report
                .iter()
                .filter(|c| self.sent.get(&c.id) != Some(c))
                .map(|c| c.id)
                .collect();
            self.sent = all;
            if let Some(me) = self.hosts.iter().find(|h| h.host_id == self.opts.host_id) {
                if me.weight != self.my_weight && me.weight > 0 {
                    info!(weight = me.weight, "weight changed in the store");
                    self.my_weight = me.weight;
                }
            }
            // Hosts with leases report twice as often: demand and
            // acknowledgements reach the leader sooner.
            let every = self.opts.heartbeat_every.as_millis() as u64;
            let every = if self.acks.is_empty() {
                every
            } else {
                every.min(fleet::PERIOD.as_millis() as u64)
            };
            self.next_heartbeat_ms = now + every;
        }
        bans::tick(self, now).await;
        let version = self.source.version().await?;
        let share = (
            share(
                &self.hosts,
                &self.opts.host_id,
                self.my_weight,
                now,
                self.opts.freshness_ms,
            ),
            self.valid_leases(now),
        );
        let current = self.applied.as_ref().map(|a| (a.version, &a.share));
        if current == Some((version, &share))
            || Refused::waiting(&self.refused, version, &share, now)
        {
            return Ok(());
        }
        if now < self.staged_until_ms {
            return Ok(());
        }
        self.read_table().await?;
        // Lent to `publish` (which needs `&mut self`); a tick dropped at an
        // await in there (shutdown) loses it, and the next start reads all.
        let mut table = self.table.take().expect("read above");
        let r = self.publish(&mut table, share, now).await;
        self.table = Some(table);
        r
    }

    /// Brings the table up to date: only what changed since its version,
    /// or everything when the source cannot tell (or has no table yet).
    async fn read_table(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let after = self.table.as_ref().map(|t| t.version);
        let mut whole = self.table.is_none();
        let mut gap = false;
        for u in self.source.update(after).await? {
            let full = matches!(u, delta::Update::Full(_));
            whole |= full;
            if full {
                gap = false;
            }
            if !delta::Table::apply(&mut self.table, u) {
                gap = true;
            }
        }
        if gap || self.table.is_none() {
            let snap = self.source.snapshot().await?;
            self.table = Some(delta::Table::full(snap));
            whole = true;
        }
        let table = self.table.as_ref().expect("read above");
        debug!(
            version = table.version,
            strategies = table.len(),
            whole,
            took_us = started.elapsed().as_micros() as u64,
            "configuration read"
        );
        Ok(())
    }

    /// Forgets the table: the next change is read whole (a test's way to
    /// see an edit made in the database behind the store's back).
    #[cfg(test)]
    fn forget_table(&mut self) {
        self.table = None;
    }

    /// The store is unreachable: leases still expire. When one did, the
    /// last snapshot is published again with the static split in its place
    /// (shares as of the last heartbeat that got through).
    async fn offline_tick(&mut self) {
        let now = unix_ms();
        let Some(applied) = &self.applied else { return };
        if self.table.is_none() {
            return;
        }
        let leases = self.valid_leases(now);
        if applied.share.1 == leases {
            return;
        }
        let share = (applied.share.0, leases);
        warn!("fleet leases expired while the store is unreachable: the static split applies");
        // Publishing needs no store; recording it does (retried later).
        let mut table = self.table.take().expect("checked above");
        let _ = self.publish(&mut table, share, now).await;
        self.table = Some(table);
    }

    /// Publishes `snap` with the local rates of `share`.
    async fn publish(
        &mut self,
        table: &mut delta::Table,
        share: Key,
        now: u64,
    ) -> Result<(), StoreError> {
        if Refused::waiting(&self.refused, table.version, &share, now) {
            return Ok(());
        }
        let prepared = std::time::Instant::now();
        let changed = table.take_changed();
        let snap = table.snapshot();
        log_bad_rows(&mut self.logged_bad, &snap.bad_rows);
        self.derived.update(snap, &share, changed);
        let mut strategies: Vec<&ValidStrategy> = Vec::with_capacity(self.derived.items.len());
        let mut acks = Vec::new();
        // The fleet leader's input: only `split: demand` strategies matter.
        self.strategies.clear();
        for (id, leased, s) in &self.derived.items {
            if *leased {
                if let Ok(i) = snap.strategies.binary_search_by_key(id, |r| r.id) {
                    self.strategies.push((*snap.strategies[i]).clone());
                }
            }
            let Some(s) = s else { continue };
            if *leased {
                let lease = share.1.get(id);
                acks.push((*id, lease.map_or(0, |l| l.0), s.rate));
            }
            strategies.push(s);
        }
        let blacklist: Vec<BlacklistRecord> = snap
            .blacklist
            .iter()
            .filter(|b| b.expires_ms.is_none_or(|e| e > now))
            .map(|b| (**b).clone())
            .collect();
        let prepare_us = prepared.elapsed().as_micros() as u64;
        let started = std::time::Instant::now();
        let result = self.sink.publish(
            &strategies,
            &blacklist,
            snap.version,
            self.derived.dirty.as_deref(),
        );
        if result.is_ok() {
            self.derived.dirty = Some(Vec::new());
        }
        match result {
            Ok(summary) if self.sink.deferred() > 0 => {
                warn!(
                    version = snap.version,
                    deferred = self.sink.deferred(),
                    "published in stages: {summary}; the other strategies follow in 2 s, \
                     once the slots this publish freed may be reused"
                );
                self.staged_until_ms = unix_ms() + STAGE_WAIT_MS;
                self.refused = None;
                self.clear_publish_error();
            }
            Ok(summary) => {
                let at = unix_ms();
                info!(
                    version = snap.version,
                    prepare_us,
                    took_us = started.elapsed().as_micros() as u64,
                    strategies = strategies.len(),
                    skipped = snap.bad_rows.len(),
                    blacklist = blacklist.len(),
                    weight = share.0.weight,
                    total_weight = share.0.total,
                    leases = share.1.len(),
                    "published: {summary}"
                );
                if acks != self.acks {
                    // The leader frees capacity only once told: say it now.
                    self.acks = acks;
                    self.next_heartbeat_ms = 0;
                }
                self.applied = Some(Applied {
                    version: snap.version,
                    share,
                    at_ms: at,
                });
                self.refused = None;
                self.clear_publish_error();
                self.source
                    .applied(&self.opts.host_id, self.my_weight, at, snap.version)
                    .await?;
            }
            Err(e) => {
                let again = self
                    .refused
                    .as_ref()
                    .filter(|r| r.version == snap.version && r.share == share);
                let cap = REFUSED_MAX_DELAY_MS.min(self.opts.max_backoff.as_millis() as u64);
                let delay_ms = match again {
                    // Logged once per version; retries are quiet.
                    Some(r) => {
                        let r = r.delay_ms;
                        debug!(version = snap.version, error = %e, "publish refused again");
                        (r * 2).min(cap)
                    }
                    None => {
                        error!(version = snap.version, error = %e,
                               "publish refused; the previous table stays active, retrying with backoff");
                        REFUSED_FIRST_DELAY_MS.min(cap)
                    }
                };
                let message = e.to_string();
                if self.publish_error.as_ref().map(|p| &p.0) != Some(&message) {
                    // Reported at the next tick, not a heartbeat later.
                    self.publish_error = Some((message, unix_ms()));
                    self.next_heartbeat_ms = 0;
                }
                self.refused = Some(Refused {
                    version: snap.version,
                    share,
                    retry_at_ms: unix_ms() + delay_ms,
                    delay_ms,
                });
            }
        }
        Ok(())
    }

    /// A publish succeeded: the error reported so far is cleared at the
    /// next tick.
    fn clear_publish_error(&mut self) {
        if self.publish_error.take().is_some() {
            self.next_heartbeat_ms = 0;
        }
    }

    /// The counters to report (moved since the last report, or moved in
    /// it) and all current counters.
    fn counters_to_report(&self) -> (Vec<CounterSample>, HashMap<u32, CounterSample>) {
        let all: HashMap<u32, CounterSample> = self
            .sink
            .counters()
            .into_iter()
            .map(|c| (c.id, c))
            .collect();
        // A counter that never left zero is not sent: a table of 65,536
        // new strategies would otherwise be reported whole at start.
        let zero = |c: &CounterSample| c.passed == 0 && c.limited == 0 && c.delayed == 0;
        let mut report: Vec<CounterSample> = all
            .values()
            .filter(|c| !(zero(c) && self.sent.get(&c.id).is_none_or(zero)))
            .filter(|c| self.sent.get(&c.id) != Some(*c) || self.moving.contains(&c.id))
            .copied()
            .collect();
        report.sort_by_key(|c| c.id);
        (report, all)
    }
}

/// Logs each invalid row once while it stays invalid.
fn log_bad_rows(logged: &mut HashSet<(i64, String)>, bad: &[BadRow]) {
    let now: HashSet<(i64, String)> = bad.iter().map(|b| (b.id, b.reason.to_string())).collect();
    for b in bad {
        if !logged.contains(&(b.id, b.reason.to_string())) {
            warn!(id = b.id, reason = %b.reason, "skipping invalid strategy row");
        }
    }
    *logged = now;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Target;
    use crate::store::record::StrategyRecord;
    use crate::store::valid::Valid;
    use crate::store::Store;
    use rate_ctl::core::model::Strategy;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Default)]
    struct Recorder {
        published: Vec<(u64, Vec<Strategy>)>,
        heartbeat: AtomicU64,
        limit: Option<usize>,
    }

    impl Sink for Recorder {
        fn publish(
            &mut self,
            strategies: &[&ValidStrategy],
            _blacklist: &[BlacklistRecord],
            v: u64,
            _changed: Option<&[u32]>,
        ) -> Result<String, ShmError> {
            if let Some(l) = self.limit {
                if strategies.len() > l {
                    return Err(ShmError::Capacity {
                        what: "max strategies",
                        limit: l as u64,
                        needed: strategies.len() as u64,
                    });
                }
            }
            self.published
                .push((v, strategies.iter().map(|s| Strategy::clone(s)).collect()));
            Ok(format!("{} strategies", strategies.len()))
        }
        fn heartbeat(&self, ms: u64) {
            self.heartbeat.store(ms, Ordering::Relaxed);
        }
    }

    fn opts(url: &str, host: &str) -> AgentOptions {
        AgentOptions {
            store_url: url.into(),
            host_id: host.into(),
            weight: Some(1),
            poll: Duration::from_millis(10),
            heartbeat_every: Duration::from_millis(0),
            freshness_ms: 10_000,
            max_backoff: Duration::from_millis(100),
        }
    }

    /// A cluster strategy split by weight: these tests are about the
    /// static split (a demand strategy's share comes from its lease).
    fn rec(name: &str, rate: u64) -> Valid<StrategyRecord> {
        serde_json::from_str::<StrategyRecord>(&format!(
            r#"{{"name":"{name}","algorithm":"token_bucket","rate":{rate},"burst":4,"split":"static"}}"#
        ))
        .unwrap()
        .into_valid()
        .unwrap()
    }

    /// Issue 29: a change re-derives only the strategies it names, and a
    /// new share all of them; the result is what a derivation from scratch
    /// gives.
    #[test]
    fn derived_rates_follow_changes_and_shares_as_a_full_derivation_does() {
        let mk = |id: u32, rate: u64| {
            let mut r = serde_json::from_str::<StrategyRecord>(&format!(
                r#"{{"name":"s{id}","algorithm":"token_bucket","rate":{rate},"burst":4,"split":"static"}}"#
            ))
            .unwrap();
            r.id = id;
            r.into_valid().unwrap()
        };
        let snap = |strategies| Snapshot {
            version: 1,
            strategies,
            bad_rows: vec![],
            blacklist: vec![],
        };
        let half: Key = (
            Share {
                weight: 1,
                total: 2,
            },
            Leases::new(),
        );
        let whole: Key = (
            Share {
                weight: 1,
                total: 1,
            },
            Leases::new(),
        );
        let rates = |d: &Derived| -> Vec<(u32, Option<u64>)> {
            d.items
                .iter()
                .map(|(id, _, s)| (*id, s.as_ref().map(|s| s.rate)))
                .collect()
        };
        let mut d = Derived::default();
        d.update(&snap(vec![mk(1, 100), mk(2, 200), mk(3, 300)]), &half, None);
        assert_eq!(rates(&d), [(1, Some(50)), (2, Some(100)), (3, Some(150))]);
        // Nothing published yet: the writer encodes every record.
        assert_eq!(d.dirty, None);
        // Published (the agent empties the list on success).
        d.dirty = Some(Vec::new());
        // 2 replaced, 3 removed, 4 added.
        let s2 = snap(vec![mk(1, 100), mk(2, 400), mk(4, 40)]);
        d.update(&s2, &half, Some(vec![4, 2, 3]));
        assert_eq!(rates(&d), [(1, Some(50)), (2, Some(200)), (4, Some(20))]);
        assert_eq!(d.dirty.as_deref(), Some(&[2, 3, 4][..]));
        // Not published (refused): the next change adds to the list.
        d.update(&s2, &half, Some(vec![1, 2]));
        assert_eq!(d.dirty.as_deref(), Some(&[1, 2, 3, 4][..]));
        // Another share: everything again, though no strategy changed.
        d.update(&s2, &whole, Some(vec![]));
        assert_eq!(rates(&d), [(1, Some(100)), (2, Some(400)), (4, Some(40))]);
        assert_eq!(d.dirty, None);
        let mut scratch = Derived::default();
        scratch.update(&s2, &whole, None);
        assert_eq!(rates(&scratch), rates(&d));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn publishes_on_change_and_skips_bad_rows_and_keeps_table_on_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("s.db").display());
        let store = Store::open(&url).await.unwrap();
        store.add_strategy(&rec("a", 400), "test").await.unwrap();
        let mut agent = Agent::new(
            opts(&url, "h1"),
            Recorder::default(),
            ConfigSource::new(Target::Store(url.clone()), Duration::from_secs(1)).unwrap(),
        );
        agent.tick().await.unwrap();
        assert_eq!(agent.sink().published.len(), 1);
        assert!(agent.sink().heartbeat.load(Ordering::Relaxed) > 0);
        // No change, no publish.
        agent.tick().await.unwrap();
        assert_eq!(agent.sink().published.len(), 1);

        // A second fresh host with weight 3 takes 3/4 of the rate.
        store.heartbeat("h2", 3, unix_ms(), None).await.unwrap();
        agent.tick().await.unwrap();
        let (_, last) = agent.sink().published.last().unwrap();
        assert_eq!(last[0].rate, 100);

        // A row broken behind the CLI's back is skipped; the rest applies.
        store.add_strategy(&rec("b", 10), "test").await.unwrap();
        sqlx::query("UPDATE strategies SET algorithm = 'bogus' WHERE name = 'a'")
            .execute(store.pool())
            .await
            .unwrap();
        // Such an edit is no change of the store's: it is seen at the next
        // full read (here forced; a restart or a gap in the change log).
        agent.forget_table();
        store.add_strategy(&rec("c", 10), "test").await.unwrap();
        agent.tick().await.unwrap();
        let (v, last) = agent.sink().published.last().unwrap();
        assert_eq!(*v, store.version().await.unwrap());
        assert_eq!(last.len(), 2, "b and c, not the broken a");

        // Refused publish: nothing recorded, not retried until a change.
        agent.sink.limit = Some(2);
        store.add_strategy(&rec("d", 10), "test").await.unwrap();
        let n = agent.sink().published.len();
        agent.tick().await.unwrap();
        agent.tick().await.unwrap();
        assert_eq!(agent.sink().published.len(), n);
        let hosts = store.hosts().await.unwrap();
        let me = hosts.iter().find(|h| h.host_id == "h1").unwrap();
        assert!(me.applied_version.unwrap() < store.version().await.unwrap());
    }
}
