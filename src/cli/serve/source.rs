//! `rate-ctl agent --store http://HOST:PORT --token T`: the agent's
//! [`Source`] over the REST API, so that an nginx host needs no database
//! driver or credentials.
//!
//! A background task long-polls `GET /api/v1/snapshot?after=V` and keeps
//! the newest snapshot; [`Source::changed`] wakes the agent as soon as one
//! arrives. Heartbeats, applied versions and counters go to
//! `POST /api/v1/hosts/{id}/report`, whose answer carries the hosts (for
//! the cluster-rate split).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::client::{percent_encode, Answer, Client};
use crate::cli::agent::Source;
use crate::cli::record::{
    blacklist_from_api_json, host_from_api_json, strategy_from_api_json, HostRecord,
};
use crate::cli::store::{BadRow, CounterSample, Snapshot, StoreError};

/// Longest a long-poll may take before the client gives up on it (the
/// server answers within 30 s).
const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(40);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Shared {
    latest: Mutex<Option<Snapshot>>,
    /// The long-poll's last failure, until it succeeds again.
    error: Mutex<Option<String>>,
    notify: Notify,
}

pub struct HttpSource {
    client: Client,
    shared: Arc<Shared>,
    poller: Option<JoinHandle<()>>,
}

impl HttpSource {
    pub fn new(url: &str, token: Option<String>) -> Result<HttpSource, String> {
        Ok(HttpSource {
            client: Client::new(url, token)?,
            shared: Arc::default(),
            poller: None,
        })
    }

    async fn report(&self, host_id: &str, body: Value) -> Result<Value, StoreError> {
        let path = format!("/api/v1/hosts/{}/report", percent_encode(host_id));
        let a = self
            .client
            .request("POST", &path, Some(&body), REQUEST_TIMEOUT)
            .await
            .map_err(StoreError::Http)?;
        ok_body(a, "report")
    }
}

fn ok_body(a: Answer, what: &str) -> Result<Value, StoreError> {
    if (200..300).contains(&a.status) {
        Ok(a.body)
    } else {
        Err(StoreError::Http(format!(
            "{what}: HTTP {}: {}",
            a.status,
            a.error_message()
        )))
    }
}

/// The hosts of a report answer; an entry that is not a host is skipped.
fn hosts_from(v: &Value) -> Vec<HostRecord> {
    v["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| host_from_api_json(h).ok())
        .collect()
}

/// A snapshot answer → the store's [`Snapshot`]; strategies are validated
/// again (one implementation: [`crate::cli::record::StrategyRecord::validate`]).
fn snapshot_from(v: &Value) -> Result<Snapshot, StoreError> {
    let version = v["version"]
        .as_u64()
        .ok_or_else(|| StoreError::Http("snapshot: no version".into()))?;
    let mut strategies = Vec::new();
    let mut bad_rows = Vec::new();
    for s in v["strategies"].as_array().into_iter().flatten() {
        let id = s["id"].as_i64().unwrap_or(-1);
        match strategy_from_api_json(s).and_then(|mut r| r.validate().map(|()| r)) {
            Ok(r) => strategies.push(r),
            Err(reason) => bad_rows.push(BadRow { id, reason }),
        }
    }
    let mut blacklist = Vec::new();
    for b in v["blacklist"].as_array().into_iter().flatten() {
        if let Ok(mut r) = blacklist_from_api_json(b) {
            if r.validate().is_ok() {
                blacklist.push(r);
            }
        }
    }
    Ok(Snapshot {
        version,
        strategies,
        bad_rows,
        blacklist,
    })
}

impl Source for HttpSource {
    fn connected(&self) -> bool {
        self.poller.is_some()
    }

    async fn connect(
        &mut self,
        host_id: &str,
        weight: Option<u32>,
        default_weight: u32,
    ) -> Result<u32, StoreError> {
        let mut body = json!({"counters": []});
        if let Some(w) = weight {
            body["weight"] = json!(w);
        }
        let answer = self.report(host_id, body).await?;
        let w = hosts_from(&answer)
            .iter()
            .find(|h| h.host_id == host_id)
            .map(|h| h.weight.max(1))
            .unwrap_or(weight.unwrap_or(default_weight));
        let first = self
            .client
            .request("GET", "/api/v1/snapshot?after=0", None, REQUEST_TIMEOUT)
            .await
            .map_err(StoreError::Http)?;
        let snap = snapshot_from(&ok_body(first, "snapshot")?)?;
        let mut after = snap.version;
        *self.shared.latest.lock().expect("not poisoned") = Some(snap);
        *self.shared.error.lock().expect("not poisoned") = None;
        let client = self.client.clone();
        let shared = self.shared.clone();
        self.poller = Some(tokio::spawn(async move {
            loop {
                let path = format!("/api/v1/snapshot?after={after}");
                let r = client
                    .request("GET", &path, None, LONG_POLL_TIMEOUT)
                    .await
                    .map_err(StoreError::Http)
                    .and_then(|a| ok_body(a, "snapshot"))
                    .and_then(|v| {
                        let changed = v["changed"].as_bool().unwrap_or(true);
                        Ok(if changed {
                            Some(snapshot_from(&v)?)
                        } else {
                            None
                        })
                    });
                match r {
                    Ok(s) => {
                        *shared.error.lock().expect("not poisoned") = None;
                        if let Some(s) = s {
                            after = s.version;
                            *shared.latest.lock().expect("not poisoned") = Some(s);
                            shared.notify.notify_one();
                        }
                    }
                    Err(e) => {
                        *shared.error.lock().expect("not poisoned") = Some(e.to_string());
                        shared.notify.notify_one();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }));
        Ok(w)
    }

    async fn heartbeat(
        &mut self,
        host_id: &str,
        _weight: u32,
        _now: u64,
        applied: Option<(u64, u64)>,
        counters: &[CounterSample],
    ) -> Result<Vec<HostRecord>, StoreError> {
        let counters: Vec<Value> = counters
            .iter()
            .map(|c| json!({"id": c.id, "passed": c.passed, "limited": c.limited, "delayed": c.delayed}))
            .collect();
        let body = json!({"applied_version": applied.map(|a| a.0), "counters": counters});
        Ok(hosts_from(&self.report(host_id, body).await?))
    }

    async fn applied(
        &mut self,
        host_id: &str,
        _weight: u32,
        _at: u64,
        version: u64,
    ) -> Result<(), StoreError> {
        self.report(host_id, json!({"applied_version": version, "counters": []}))
            .await
            .map(|_| ())
    }

    async fn version(&mut self) -> Result<u64, StoreError> {
        if let Some(e) = self.shared.error.lock().expect("not poisoned").clone() {
            return Err(StoreError::Http(e));
        }
        self.shared
            .latest
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|s| s.version)
            .ok_or_else(|| StoreError::Http("no snapshot yet".into()))
    }

    async fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        self.shared
            .latest
            .lock()
            .expect("not poisoned")
            .clone()
            .ok_or_else(|| StoreError::Http("no snapshot yet".into()))
    }

    fn disconnect(&mut self) {
        if let Some(p) = self.poller.take() {
            p.abort();
        }
    }

    async fn changed(&self) {
        self.shared.notify.notified().await
    }
}

impl Drop for HttpSource {
    fn drop(&mut self) {
        self.disconnect();
    }
}
