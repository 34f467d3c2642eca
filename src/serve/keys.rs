//! Per-key operations across the fleet (issue 33):
//!
//! * `GET /api/v1/strategies/{id}/keys/{key}`: every fresh host's reading
//!   of the key and the fleet's sum. The question is queued here, in this
//!   instance's memory; the agents that poll `POST
//!   /api/v1/hosts/{host}/keys` (every `crate::agent::keys::POLL`, 200 ms) read it from
//!   their own file and answer on their next poll. The answer waits at
//!   most [`ANSWER_WAIT`] and lists a host that did not answer by then as
//!   such (`"answered": false`). The question is also a row of the
//!   store's `key_questions`: agents on the store itself answer it in
//!   `key_answers`, read here every [`STORE_POLL`]. Agents polling another
//!   `serve` instance are not asked (they are listed as not answering).
//! * `DELETE /api/v1/strategies/{id}/keys/{key}`: records a reset in the
//!   store (audited, `key_resets`); the agents apply it from their poll
//!   (through serve) or from the store itself (`--store`).
//! * `POST /api/v1/hosts/{host}/keys` (agent token): the agent's poll —
//!   resets after its last one, the questions waiting for it; its answers.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::{json, Value};

use super::auth::{AdminToken, AgentToken, ReadToken, Token};
use super::body::{json_response, object, ok, Fields};
use super::error::{ApiError, ApiResult};
use super::{Routes, Shared};
use crate::store::StoreError;
use rate_ctl::core::clock::unix_ms;

/// How long the fleet view waits for the hosts' answers.
pub const ANSWER_WAIT: Duration = Duration::from_millis(1000);
/// How often the fleet view reads the store's answers while it waits.
const STORE_POLL: Duration = Duration::from_millis(100);
/// Questions kept at most (older ones are dropped first).
const MAX_QUESTIONS: usize = 256;
/// Most answers one agent poll carries.
const MAX_ANSWERS: usize = 256;

pub fn router() -> Routes {
    Routes::default()
        .add(
            "/api/v1/strategies/{id}/keys/{key}",
            &["GET", "DELETE"],
            get(show_key).delete(reset_key),
        )
        .add("/api/v1/strategies/{id}/top", &["GET"], get(show_top))
        .add("/api/v1/hosts/{host_id}/keys", &["POST"], post(agent_poll))
}

/// A question of the fleet view, and the answers so far by host.
struct Question {
    id: u64,
    strategy: u32,
    /// The key; `None`: the strategy's top keys.
    key: Option<String>,
    asked_ms: u64,
    answers: HashMap<String, Value>,
}

#[derive(Default)]
struct Questions {
    next: u64,
    open: Vec<Question>,
}

static QUESTIONS: LazyLock<Mutex<Questions>> = LazyLock::new(Mutex::default);
static ANSWERED: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

fn questions() -> std::sync::MutexGuard<'static, Questions> {
    QUESTIONS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The strategy id of the path: 404 naming `strategy` when it is not one.
fn strategy_id(s: &str) -> Result<u32, ApiError> {
    s.parse::<u32>().ok().filter(|&i| i > 0).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            Some("strategy"),
            format!("no strategy with id {s:?}"),
        )
    })
}

/// The key of the path as `$rate_ctl_key` prints it, checked against the
/// strategy: 404 (`strategy`) for no such strategy, 422 (`strategy`) for
/// one without `each`, 422 (`key`) for a key it cannot have.
async fn checked_key(st: &Shared, id: &str, key: &str) -> Result<(u32, String), ApiError> {
    let id = per_key_strategy(st, id).await?;
    let key = st.store.canonical_key(id, key).await?;
    Ok((id, key))
}

/// The id of the path, a per-key strategy's: 404 (`strategy`) for no such
/// strategy, 422 (`strategy`) for one without `each`.
async fn per_key_strategy(st: &Shared, id: &str) -> Result<u32, ApiError> {
    let id = strategy_id(id)?;
    let rec = st.store.get_strategy(id).await.map_err(|e| match e {
        StoreError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, Some("strategy"), m),
        e => e.into(),
    })?;
    if rec.each.is_empty() {
        return Err(ApiError::invalid(
            "strategy",
            format!("strategy {id} is not per-key (no `each`): it has no keys"),
        ));
    }
    Ok(id)
}

pub async fn reset_key(
    State(st): State<Shared>,
    Token(who): AdminToken,
    Path((id, key)): Path<(String, String)>,
) -> ApiResult {
    let (id, key) = checked_key(&st, &id, &key).await?;
    let r = st.store.key_reset(id, &key, who.name()).await?;
    Ok(json_response(
        StatusCode::ACCEPTED,
        json!({"id": r.id, "strategy": id, "key": r.key, "at": r.at_ms}),
    ))
}

pub async fn show_key(
    State(st): State<Shared>,
    _: ReadToken,
    Path((id, key)): Path<(String, String)>,
) -> ApiResult {
    let (id, key) = checked_key(&st, &id, &key).await?;
    let now = unix_ms();
    let (fresh, answers) = ask(&st, id, Some(key.clone()), now).await?;
    let mut hosts = Vec::new();
    let (mut used, mut remaining, mut in_flight, mut reset) = (0u64, 0u64, None::<u64>, 0u64);
    let mut names: Vec<&String> = fresh.iter().chain(answers.keys()).collect();
    names.sort();
    names.dedup();
    for h in names {
        match answers.get(h) {
            Some(a) => {
                used += a["used"].as_u64().unwrap_or(0);
                remaining += a["remaining"].as_u64().unwrap_or(0);
                reset = reset.max(a["reset_ms"].as_u64().unwrap_or(0));
                if let Some(n) = a["in_flight"].as_u64() {
                    *in_flight.get_or_insert(0) += n;
                }
                let mut v = a.clone();
                v["host"] = json!(h);
                v["answered"] = json!(true);
                hosts.push(v);
            }
            None => hosts.push(json!({"host": h, "answered": false})),
        }
    }
    let answered = hosts
        .iter()
        .filter(|h| h["answered"] == json!(true))
        .count();
    let mut fleet = json!({
        "used": used,
        "remaining": remaining,
        "reset_ms": reset,
        "hosts_answered": answered,
        "hosts_asked": hosts.len(),
    });
    if let Some(n) = in_flight {
        fleet["in_flight"] = json!(n);
    }
    ok(json!({"strategy": id, "key": key, "asked_at": now, "fleet": fleet, "hosts": hosts}))
}

/// Queues a question for the agents and waits (at most [`ANSWER_WAIT`])
/// for every fresh host's answer: the fresh hosts and the answers by host.
async fn ask(
    st: &Shared,
    id: u32,
    key: Option<String>,
    now: u64,
) -> Result<(Vec<String>, HashMap<String, Value>), ApiError> {
    let fresh: Vec<String> = st
        .store
        .hosts()
        .await?
        .into_iter()
        .filter(|h| {
            h.last_heartbeat_ms
                .is_some_and(|hb| hb.saturating_add(st.freshness_ms) >= now)
        })
        .map(|h| h.host_id)
        .collect();
    // Agents on the store itself read the question there (their answers
    // too); a store that refuses it leaves the agents polling serve.
    let stored = match st.store.key_ask(id, key.as_deref(), now).await {
        Ok(q) => Some(q),
        Err(e) => {
            tracing::warn!(error = %e, "fleet view: cannot record the question in the store");
            None
        }
    };
    let qid = {
        let mut q = questions();
        q.next += 1;
        let qid = q.next;
        if q.open.len() >= MAX_QUESTIONS {
            q.open.remove(0);
        }
        q.open.push(Question {
            id: qid,
            strategy: id,
            key,
            asked_ms: now,
            answers: HashMap::new(),
        });
        qid
    };
    let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
    let mut from_store: Vec<(String, Value)> = Vec::new();
    loop {
        let notified = ANSWERED.notified();
        if let Some(sq) = stored {
            from_store = st.store.key_answers(sq).await.unwrap_or_default();
        }
        let all = {
            let q = questions();
            q.open.iter().find(|q| q.id == qid).is_none_or(|q| {
                fresh
                    .iter()
                    .all(|h| q.answers.contains_key(h) || from_store.iter().any(|(s, _)| s == h))
            })
        };
        if all || tokio::time::Instant::now() >= deadline {
            break;
        }
        // Woken by an answer through serve, or every STORE_POLL for the
        // store's.
        let until = deadline.min(tokio::time::Instant::now() + STORE_POLL);
        let _ = tokio::time::timeout_at(until, notified).await;
    }
    let mut answers = {
        let mut q = questions();
        let i = q.open.iter().position(|q| q.id == qid);
        i.map(|i| q.open.remove(i).answers).unwrap_or_default()
    };
    for (h, a) in from_store {
        // Checked as an answer through serve is.
        if let Ok((_, a)) = answer_from(&a) {
            answers.entry(h).or_insert(a);
        }
    }
    Ok((fresh, answers))
}

/// One reading an agent sends: the fields of `rate-ctl shm key --json`.
fn answer_from(v: &Value) -> Result<(u64, Value), ApiError> {
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::invalid("answers", "each answer must be an object"))?;
    let f = Fields(o);
    let n = |k: &str| -> Result<u64, ApiError> {
        f.uint(k, u64::MAX)?
            .ok_or_else(|| ApiError::invalid(&format!("answers.{k}"), "missing"))
    };
    let query = n("query")?;
    if let Some(list) = f.present("entries") {
        return Ok((
            query,
            json!({"read_at": n("read_at")?, "entries": top_entries(list)?}),
        ));
    }
    let mut a = json!({
        "found": o.get("found").and_then(Value::as_bool).unwrap_or(false),
        "limit": n("limit")?,
        "used": n("used")?,
        "remaining": n("remaining")?,
        "reset_ms": n("reset_ms")?,
        "read_at": n("read_at")?,
    });
    if let Some(x) = f.uint("in_flight", u64::MAX)? {
        a["in_flight"] = json!(x);
    }
    if let Some(e) = f.str("error")? {
        a["error"] = json!(rate_ctl::core::escape::escape_bytes(e.as_bytes(), 200));
    }
    Ok((query, a))
}

pub async fn agent_poll(
    State(st): State<Shared>,
    Token(who): AgentToken,
    Path(host_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    who.may_act_as(&host_id, "poll")?;
    let o = object(&body, &["after", "answers"])?;
    let f = Fields(&o);
    let after = match f.uint("after", i64::MAX as u64)? {
        Some(a) => a,
        // A starting agent: from the newest reset on.
        None => st.store.key_resets_last().await?,
    };
    let answers = match f.present("answers") {
        None => Vec::new(),
        Some(Value::Array(a)) if a.len() <= MAX_ANSWERS => {
            a.iter().map(answer_from).collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "answers",
                format!("must be a list of at most {MAX_ANSWERS} readings"),
            ))
        }
    };
    let now = unix_ms();
    let waiting: Vec<Value> = {
        let mut q = questions();
        for (query, a) in answers {
            if let Some(q) = q.open.iter_mut().find(|q| q.id == query) {
                q.answers.insert(host_id.clone(), a);
            }
        }
        q.open
            .iter()
            .filter(|q| !q.answers.contains_key(&host_id))
            .filter(|q| now.saturating_sub(q.asked_ms) <= ANSWER_WAIT.as_millis() as u64 * 2)
            .map(|q| match &q.key {
                Some(k) => json!({"query": q.id, "strategy": q.strategy, "key": k}),
                None => json!({"query": q.id, "strategy": q.strategy, "top": true}),
            })
            .collect()
    };
    ANSWERED.notify_waiters();
    let resets = st.store.key_resets_after(after).await?;
    let last = resets.last().map_or(after, |r| r.id);
    let resets: Vec<Value> = resets
        .iter()
        .map(|r| json!({"id": r.id, "strategy": r.strategy_id, "key": r.key}))
        .collect();
    ok(json!({"after": last, "resets": resets, "queries": waiting}))
}

/// An agent's top keys: at most [`TOP_ENTRIES`] of `{"key", "rejections",
/// "requests"}`, each checked.
fn top_entries(v: &Value) -> Result<Vec<Value>, ApiError> {
    let list = v
        .as_array()
        .filter(|l| l.len() <= TOP_ENTRIES)
        .ok_or_else(|| {
            ApiError::invalid(
                "answers.entries",
                format!("must be a list of at most {TOP_ENTRIES}"),
            )
        })?;
    list.iter()
        .map(|e| {
            let key = e["key"]
                .as_str()
                .filter(|k| k.len() <= 1024)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "answers.entries.key",
                        "must be a string of at most 1024 bytes",
                    )
                })?;
            let n = |k: &str| {
                e[k].as_u64().ok_or_else(|| {
                    ApiError::invalid(&format!("answers.entries.{k}"), "must be a number")
                })
            };
            Ok(json!({"key": key, "rejections": n("rejections")?, "requests": n("requests")?}))
        })
        .collect()
}

/// One key's rejections, requests and hosts, summed over the fleet.
type Merged = (u64, u64, Vec<String>);

/// Most top keys one agent reports (its tables' entries).
const TOP_ENTRIES: usize = rate_ctl::core::keys::top::ENTRIES;

/// `GET /api/v1/strategies/{id}/top`: the fleet's top keys of the last
/// minute, merged (sums per key), by rejections then requests.
pub async fn show_top(State(st): State<Shared>, _: ReadToken, Path(id): Path<String>) -> ApiResult {
    let id = per_key_strategy(&st, &id).await?;
    let now = unix_ms();
    let (fresh, answers) = ask(&st, id, None, now).await?;
    let mut merged: std::collections::BTreeMap<String, Merged> = Default::default();
    for (host, a) in &answers {
        for e in a["entries"].as_array().into_iter().flatten() {
            let k = e["key"].as_str().unwrap_or("").to_string();
            let m = merged.entry(k).or_default();
            m.0 += e["rejections"].as_u64().unwrap_or(0);
            m.1 += e["requests"].as_u64().unwrap_or(0);
            m.2.push(host.clone());
        }
    }
    let mut entries: Vec<(String, Merged)> = merged.into_iter().collect();
    entries.sort_by_key(|e| std::cmp::Reverse((e.1 .0, e.1 .1)));
    let entries: Vec<Value> = entries
        .into_iter()
        .map(|(key, (rej, req, mut hosts))| {
            hosts.sort();
            json!({"key": key, "rejections": rej, "requests": req, "hosts": hosts})
        })
        .collect();
    let missing: Vec<&String> = fresh.iter().filter(|h| !answers.contains_key(*h)).collect();
    ok(json!({"strategy": id, "asked_at": now, "entries": entries,
              "hosts_answered": answers.len(), "hosts_not_answering": missing}))
}
