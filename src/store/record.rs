//! Strategy and blacklist records as stored, exported and printed.
//!
//! A [`StrategyRecord`] is what an operator writes: the core
//! [`Strategy`] fields plus a name and a scope. Validation is the core's
//! [`Strategy::validate`] (one implementation); [`StrategyRecord::validate`]
//! only adds the store's own fields.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::{Field, Invalid};

use rate_ctl::core::model::each::OnFull;
use rate_ctl::core::model::{
    parse_ip_net, valid_dimension_name, Action, Algorithm, Condition, ModelError, Strategy, Unit,
    WarmUp, DEFAULT_COLD_FACTOR, MAX_VALUE_LEN,
};

/// Longest strategy name, in bytes.
pub const MAX_NAME_LEN: usize = rate_ctl::core::model::MAX_NAME_LEN;
/// Longest blacklist reason, in bytes.
pub const MAX_REASON_LEN: usize = 500;

/// Whose rate a strategy states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The rate is for the whole fleet; each host enforces its weighted share.
    Cluster,
    /// The rate applies on every host as written.
    Host,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Host => "host",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cluster" => Ok(Scope::Cluster),
            "host" => Ok(Scope::Host),
            other => Err(Invalid::new(
                Field::Scope,
                "scope",
                format!("unknown value {other:?} (expected one of cluster, host)"),
            )),
        }
    }
}

/// How a `cluster` strategy's rate is divided among the hosts. Not given:
/// `demand` for a cluster strategy that limits, `static` otherwise
/// ([`Split::default_for`], filled in by validation); a stored row from
/// before migration 7 (NULL) is `static`, what it was written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// `rate × weight / Σ weights` of the fresh hosts.
    Static,
    /// Leases from the fleet leader, by demand (src/fleet/lease.rs); the
    /// static split while a host has no valid lease.
    Demand,
}

impl Split {
    /// The split of a strategy that names none: leases by demand for a
    /// cluster rate (it admits the rate under skew, README "Fleet leases"),
    /// the static split where nothing is leased (host scope, allow).
    pub fn default_for(scope: Scope, action: ActionKind) -> Split {
        if scope == Scope::Cluster && action != ActionKind::Allow {
            Split::Demand
        } else {
            Split::Static
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Split::Static => "static",
            Split::Demand => "demand",
        }
    }
}

impl FromStr for Split {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Split::Static, Split::Demand]
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                let why = format!("unknown value {s:?} (expected one of static, demand)");
                Invalid::new(Field::Column("split"), "split", why)
            })
    }
}

/// The overflow action, as stored: a keyword plus its optional parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Reject,
    Delay,
    DryRun,
    /// Pass unlimited (see `core::model::Action::Allow`).
    Allow,
}

impl ActionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Reject => "reject",
            ActionKind::Delay => "delay",
            ActionKind::DryRun => "dry_run",
            ActionKind::Allow => "allow",
        }
    }
}

impl FromStr for ActionKind {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reject" => Ok(ActionKind::Reject),
            "delay" => Ok(ActionKind::Delay),
            "dry_run" | "dry-run" => Ok(ActionKind::DryRun),
            "allow" => Ok(ActionKind::Allow),
            other => Err(Invalid::new(
                Field::Action,
                "action",
                format!("unknown value {other:?} (expected one of reject, delay, dry_run, allow)"),
            )),
        }
    }
}

/// One strategy as the store holds it and as `export`/`import` and
/// `--json` write it (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyRecord {
    /// 0 = not yet stored (import assigns one).
    #[serde(default)]
    pub id: u32,
    pub name: String,
    /// `dimension = value` conditions (all must hold).
    #[serde(rename = "match", default)]
    pub conditions: BTreeMap<String, String>,
    #[serde(with = "keyword")]
    pub algorithm: Algorithm,
    pub rate: u64,
    #[serde(with = "keyword", default = "default_unit")]
    pub per: Unit,
    #[serde(default = "one")]
    pub burst: u32,
    #[serde(default = "default_action")]
    pub action: ActionKind,
    /// Reject status; `None` = the location's `rate_ctl_status` (503).
    /// With `dry_run`: the status it rejects with again once dry run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Longest wait of a `delay` action. With `dry_run`: set when the
    /// strategy delays (with this cap) again once dry run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u32>,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_scope")]
    pub scope: Scope,
    /// `warm_up` only: time from cold to the full rate (1 s … 1 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up_ms: Option<u32>,
    /// `warm_up` only: cold interval = cold_factor × 1/rate (2 … 10;
    /// validation fills in 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_factor: Option<u8>,
    /// -1000 ..= 1000, default 0: only the matched strategies at the
    /// highest priority present apply.
    #[serde(default)]
    pub priority: i32,
    /// Per-key: one limiter state per value tuple of these dimensions
    /// (1–4; empty: one shared state).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub each: Vec<String>,
    /// Per-key: IPv4 client addresses aggregated to this prefix (default
    /// 32, filled in by validation for a per-key strategy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_prefix: Option<u8>,
    /// Per-key: IPv6 client addresses aggregated to this prefix (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_prefix: Option<u8>,
    /// Per-key: what a new key gets when its part of the key table is full
    /// (default overflow).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_keyword")]
    pub on_full: Option<OnFull>,
    /// `cluster` only: static weight split or demand-aware leases; `None`
    /// (not given) until validation fills in [`Split::default_for`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// Unix ms; set by the store.
    #[serde(default)]
    pub created_ms: u64,
    #[serde(default)]
    pub updated_ms: u64,
    /// Config version of the last change to this strategy; set by the store.
    #[serde(default)]
    pub version: u64,
    /// Statuses that count (`401,403`, `4xx`; `status=` accepted and
    /// dropped by validation): the request is charged only if its final
    /// status is one of them (issue 31).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_if: Option<String>,
    /// The dimension whose integer value is the request's cost up front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_from: Option<String>,
    /// The dimension read when the request ends: its final cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_after: Option<String>,
    /// Per-key: most key-table entries the strategy's keys may hold (1 …
    /// 2^31); `None`: half of the agent's key table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys: Option<u32>,
    /// Calendar windows (issue 33): the IANA zone (`Europe/Berlin`) whose
    /// local days, weeks (from Monday) and months a `fixed_window` counts
    /// in; `None`: UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// The penalty box (issue 32): rejections of one key by this strategy
    /// that ban it (1 …), within `ban_within` seconds, for `ban_for`
    /// seconds (1 s … 30 days); all three or none, `each ip` or `userid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_after: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_within: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_for: Option<u32>,
}

fn default_unit() -> Unit {
    Unit::Second
}
fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn default_action() -> ActionKind {
    ActionKind::Reject
}
fn default_scope() -> Scope {
    Scope::Cluster
}

/// [`keyword`] for an optional keyword (`null` or absent = `None`).
mod opt_keyword {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        match Option::<String>::deserialize(d)? {
            Some(s) => s.parse().map(Some).map_err(D::Error::custom),
            None => Ok(None),
        }
    }
}

/// Serialises the core keyword enums (`Algorithm`, `Unit`) as their names.
mod keyword {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let s = String::deserialize(d)?;
        s.parse().map_err(D::Error::custom)
    }
}

impl StrategyRecord {
    /// The core action for the stored keyword and parameters.
    pub fn core_action(&self) -> Result<Action, Invalid> {
        self.core_action_as(self.action)
    }

    /// The core action for keyword `kind` with this record's parameters.
    fn core_action_as(&self, kind: ActionKind) -> Result<Action, Invalid> {
        match kind {
            ActionKind::Reject => {
                if self.max_delay_ms.is_some() {
                    return Err(Invalid::new(
                        Field::MaxDelayMs,
                        "max_delay_ms",
                        "only for action delay",
                    ));
                }
                Ok(Action::Reject {
                    status: self.status,
                })
            }
            ActionKind::Delay => {
                if self.status.is_some() {
                    return Err(Invalid::new(
                        Field::Status,
                        "status",
                        "only for action reject",
                    ));
                }
                let max_delay_ms = self.max_delay_ms.ok_or_else(|| {
                    Invalid::new(
                        Field::MaxDelayMs,
                        "max_delay_ms",
                        "required for action delay",
                    )
                })?;
                Ok(Action::Delay { max_delay_ms })
            }
            ActionKind::DryRun => {
                // The one action that may carry max_delay_ms besides delay:
                // a dry-run strategy keeps the parameters of the action it
                // enforces when dry run ends (see `enforcing_action`), so that
                // toggling dry run off restores it, also across restarts.
                // Both at once would not say which action that is.
                if self.status.is_some() && self.max_delay_ms.is_some() {
                    return Err(Invalid::new(
                        Field::Action,
                        "action",
                        "dry_run keeps either status (reject after dry run) \
                         or max_delay_ms (delay after dry run), not both",
                    ));
                }
                // A kept delay cap is published: a dry run then queues as
                // the delay would (and reports DRY_RUN_DELAYED) instead of
                // reporting rejections enforcement would not make.
                Ok(match self.max_delay_ms {
                    Some(max_delay_ms) => Action::DryRunDelay { max_delay_ms },
                    None => Action::DryRun,
                })
            }
            ActionKind::Allow => {
                // An allowed request is neither refused nor queued.
                for (given, field, name) in [
                    (self.status.is_some(), Field::Status, "status"),
                    (
                        self.max_delay_ms.is_some(),
                        Field::MaxDelayMs,
                        "max_delay_ms",
                    ),
                    (self.warm_up_ms.is_some(), Field::WarmUpMs, "warm_up_ms"),
                    (self.cold_factor.is_some(), Field::ColdFactor, "cold_factor"),
                    // No rate to lease out.
                    (
                        self.split == Some(Split::Demand),
                        Field::Column("split"),
                        "split",
                    ),
                ] {
                    if given {
                        return Err(Invalid::new(
                            field,
                            name,
                            "makes no sense for action allow (an allowed request is not limited)",
                        ));
                    }
                }
                Ok(Action::Allow)
            }
        }
    }

    /// The action this strategy enforces: its own, or for `dry_run` the one
    /// it goes back to when dry run ends — `delay` if it kept a
    /// `max_delay_ms`, else `reject` (with the `status` it kept, if any).
    pub fn enforcing_action(&self) -> ActionKind {
        match self.action {
            ActionKind::DryRun if self.max_delay_ms.is_some() => ActionKind::Delay,
            ActionKind::DryRun => ActionKind::Reject,
            a => a,
        }
    }

    /// The core strategy with `rate` and `burst` as given (no host share).
    /// A record without an id yet is checked as id 1.
    pub fn to_core(&self, rate: u64, burst: u32) -> Result<Strategy, Invalid> {
        Ok(Strategy {
            id: if self.id == 0 { 1 } else { self.id },
            conditions: self
                .conditions
                .iter()
                .map(|(k, v)| Condition::from_key(k, v.clone().into_bytes()))
                .collect(),
            algorithm: self.algorithm,
            rate,
            per: self.per,
            burst,
            action: self.core_action()?,
            enabled: self.enabled,
            warm_up: self.core_warm_up()?,
            priority: self.priority,
            each: self.core_each(),
            name: self.name.clone(),
            response: self.core_response()?,
            tz: self.tz.clone().unwrap_or_default(),
            ban: self.core_ban()?,
        })
    }

    /// The core penalty box (issue 32; `None`: none).
    fn core_ban(&self) -> Result<Option<rate_ctl::core::model::ban::Ban>, Invalid> {
        rate_ctl::core::model::ban::Ban::from_parts(
            self.ban_after.map(u64::from),
            self.ban_within.map(u64::from),
            self.ban_for.map(u64::from),
        )
        .map_err(|e| Invalid::from(ModelError::from(e)))
    }

    /// The core response and cost fields (issue 31).
    fn core_response(&self) -> Result<rate_ctl::core::model::response::Response, Invalid> {
        let count_if = match self.count_if.as_deref() {
            Some(t) => rate_ctl::core::model::response::StatusSet::parse(t)
                .map_err(|e| Invalid::from(ModelError::from(e)))?,
            None => Default::default(),
        };
        Ok(rate_ctl::core::model::response::Response {
            count_if,
            cost_from: self.cost_from.clone().unwrap_or_default(),
            cost_after: self.cost_after.clone().unwrap_or_default(),
        })
    }

    /// The core per-key fields (defaults for what is not given).
    fn core_each(&self) -> rate_ctl::core::model::each::Each {
        let d = rate_ctl::core::model::each::Each::default();
        rate_ctl::core::model::each::Each {
            dims: self.each.clone(),
            ipv4_prefix: self.ipv4_prefix.unwrap_or(d.ipv4_prefix),
            ipv6_prefix: self.ipv6_prefix.unwrap_or(d.ipv6_prefix),
            on_full: self.on_full.unwrap_or(d.on_full),
            max_keys: self.max_keys.unwrap_or(d.max_keys),
        }
    }

    /// The core warm-up: required for `warm_up`, refused for the others.
    fn core_warm_up(&self) -> Result<WarmUp, Invalid> {
        if self.algorithm != Algorithm::WarmUp {
            if self.warm_up_ms.is_some() {
                return Err(Invalid::new(
                    Field::WarmUpMs,
                    "warm_up_ms",
                    format!("only for algorithm warm_up, not {}", self.algorithm),
                ));
            }
            if self.cold_factor.is_some() {
                return Err(Invalid::new(
                    Field::ColdFactor,
                    "cold_factor",
                    format!("only for algorithm warm_up, not {}", self.algorithm),
                ));
            }
            return Ok(WarmUp::NONE);
        }
        Ok(WarmUp {
            period_ms: self.warm_up_ms.ok_or_else(|| {
                Invalid::new(
                    Field::WarmUpMs,
                    "warm_up_ms",
                    "required for algorithm warm_up",
                )
            })?,
            cold_factor: self.cold_factor.unwrap_or(DEFAULT_COLD_FACTOR),
        })
    }

    /// Checks every field (the core model's rules plus name and action
    /// parameters) and canonicalises `ip` values in place. The error text
    /// names the field at fault.
    pub fn validate(&mut self) -> Result<(), Invalid> {
        let name = self.name.trim();
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(Invalid::new(
                Field::Name,
                "name",
                format!("must be 1 to {MAX_NAME_LEN} bytes"),
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(Invalid::new(
                Field::Name,
                "name",
                "must not contain control characters",
            ));
        }
        self.name = name.to_string();
        if self.action == ActionKind::Allow {
            // No limit: the rate fields are stored as fixed placeholders
            // (the API and the CLI refuse them when given).
            (self.algorithm, self.rate, self.per, self.burst) =
                (Algorithm::FixedWindow, 1, Unit::Second, 1);
        }
        if matches!(self.algorithm, Algorithm::LeakyBucket | Algorithm::WarmUp) {
            self.burst = 1;
        }
        if self.algorithm == Algorithm::WarmUp && self.cold_factor.is_none() {
            self.cold_factor = Some(DEFAULT_COLD_FACTOR);
        }
        if self.max_keys == Some(0) {
            // 0 is the model's "default share": not a cap anyone asks for.
            return Err(
                ModelError::from(rate_ctl::core::model::each::EachError::MaxKeys(0)).into(),
            );
        }
        let mut core = self.to_core(self.rate, self.burst)?;
        if !self.each.is_empty() {
            // A per-key strategy shows its aggregation and on_full.
            self.ipv4_prefix = Some(core.each.ipv4_prefix);
            self.ipv6_prefix = Some(core.each.ipv6_prefix);
            self.on_full = Some(core.each.on_full);
        }
        let dry_run = self.action == ActionKind::DryRun;
        if dry_run {
            // What dry run keeps must be valid once dry run ends: check the
            // strategy with the action it goes back to (a dry run itself
            // has nothing more to check). The clock-tick rule gives the
            // published dry run the same answer: it queues with the kept
            // cap (`Action::max_delay_ns`), so the agent publishes it.
            core.action = self.core_action_as(self.enforcing_action())?;
        }
        core.validate().map_err(|e| match e {
            ModelError::DelayNeedsBucket(a) if dry_run => Invalid::new(
                Field::MaxDelayMs,
                "max_delay_ms",
                format!("delay after dry run needs token_bucket, leaky_bucket or warm_up, not {a}"),
            ),
            e => Invalid::from(e),
        })?;
        self.conditions = core
            .conditions
            .into_iter()
            .map(|c| {
                (
                    c.key(),
                    String::from_utf8(c.value).expect("validated values stay UTF-8"),
                )
            })
            .collect();
        // Not given: the default for what it is (after the checks above,
        // which refuse only a `demand` someone asked for).
        self.split = Some(self.split());
        // Canonical texts (issue 31): `count_if` as classes and codes in
        // ascending order; an empty value is no value.
        self.count_if = Some(core.response.count_if.to_string()).filter(|t| !t.is_empty());
        self.cost_from = self.cost_from.take().filter(|t| !t.is_empty());
        self.cost_after = self.cost_after.take().filter(|t| !t.is_empty());
        Ok(())
    }

    /// The split: the one given, else [`Split::default_for`] what it is
    /// (validation stores that, so a validated record always has one).
    pub fn split(&self) -> Split {
        self.split
            .unwrap_or(Split::default_for(self.scope, self.action))
    }
}

/// One blacklist entry as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlacklistRecord {
    pub id: u64,
    pub dimension: String,
    pub value: String,
    /// Unix ms after which the entry no longer applies; `None` = never.
    pub expires_ms: Option<u64>,
    pub reason: String,
    pub created_ms: u64,
    /// Who made it: `None` an operator, `Some("ban")` the penalty box of a
    /// strategy (issue 32; the agent writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl BlacklistRecord {
    /// Checks dimension, value and reason; canonicalises an `ip` value.
    pub fn validate(&mut self) -> Result<(), Invalid> {
        if !valid_dimension_name(&self.dimension) {
            return Err(Invalid::new(
                Field::Dimension,
                "dimension",
                format!(
                    "{:?} is not a valid name ([a-z][a-z0-9_]*, at most 32 bytes)",
                    self.dimension
                ),
            ));
        }
        if self.value.is_empty() || self.value.len() > MAX_VALUE_LEN {
            return Err(Invalid::new(
                Field::Value,
                "value",
                format!(
                    "must be 1 to {MAX_VALUE_LEN} bytes, got {}",
                    self.value.len()
                ),
            ));
        }
        if self.value.chars().any(char::is_control) {
            return Err(Invalid::new(
                Field::Value,
                "value",
                "must not contain control characters",
            ));
        }
        if self.reason.chars().any(char::is_control) {
            return Err(Invalid::new(
                Field::Reason,
                "reason",
                "must not contain control characters",
            ));
        }
        if self.dimension == "ip" {
            // An address or a network (`203.0.113.0/24`).
            self.value = parse_ip_net(self.value.as_bytes())
                .map_err(|e| Invalid::new(Field::Value, "value", format!("{:?}: {e}", self.value)))?
                .to_string();
        }
        if self.reason.len() > MAX_REASON_LEN {
            return Err(Invalid::new(
                Field::Reason,
                "reason",
                format!("at most {MAX_REASON_LEN} bytes"),
            ));
        }
        Ok(())
    }
}

/// One host as the hosts table holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    pub host_id: String,
    pub weight: u32,
    pub last_heartbeat_ms: Option<u64>,
    pub applied_version: Option<u64>,
    pub applied_ms: Option<u64>,
    /// The agent's last publish refusal (cleared by its next successful
    /// publish) and when it happened.
    pub publish_error: Option<String>,
    pub publish_error_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::flags::flag;

    fn rec() -> StrategyRecord {
        serde_json::from_str(
            r#"{"name":"pay","match":{"ip":"::ffff:1.2.3.4","api":"/pay"},
                "algorithm":"token_bucket","rate":100,"burst":20}"#,
        )
        .unwrap()
    }

    #[test]
    fn json_defaults_and_canonical_ip() {
        let mut r = rec();
        assert_eq!(r.per, Unit::Second);
        assert_eq!(r.scope, Scope::Cluster);
        assert_eq!(r.action, ActionKind::Reject);
        assert!(r.enabled);
        r.validate().unwrap();
        assert_eq!(r.conditions["ip"], "1.2.3.4");
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains(r#""algorithm":"token_bucket""#), "{line}");
        assert!(line.contains(r#""per":"second""#), "{line}");
    }

    #[test]
    fn errors_name_the_field() {
        let mut r = rec();
        r.rate = 0;
        let e = r.validate().unwrap_err();
        assert!(e.to_string().starts_with("rate:"), "{e}");
        assert_eq!(e.field, Some(Field::Rate));
        assert_eq!(flag(e.field), "--rate");

        let mut r = rec();
        r.action = ActionKind::Delay;
        let e = r.validate().unwrap_err();
        assert!(e.to_string().starts_with("max_delay_ms:"), "{e}");

        let mut r = rec();
        r.name = " ".into();
        assert!(r.validate().unwrap_err().to_string().starts_with("name:"));

        let e =
            serde_json::from_str::<StrategyRecord>(r#"{"name":"x","algorithm":"bogus","rate":1}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("algorithm"), "{e}");
    }

    #[test]
    fn dry_run_keeps_the_enforcing_action_and_publishes_as_dry_run() {
        // A delay strategy in dry run keeps its cap; it publishes as a dry
        // run of that delay and goes back to delay.
        let mut r = rec();
        r.algorithm = Algorithm::LeakyBucket;
        r.action = ActionKind::DryRun;
        r.max_delay_ms = Some(500);
        r.validate().unwrap();
        assert_eq!(
            r.to_core(r.rate, r.burst).unwrap().action,
            Action::DryRunDelay { max_delay_ms: 500 }
        );
        assert_eq!(r.enforcing_action(), ActionKind::Delay);
        // A reject strategy in dry run keeps its status.
        let mut r = rec();
        r.action = ActionKind::DryRun;
        r.status = Some(429);
        r.validate().unwrap();
        assert_eq!(r.to_core(r.rate, r.burst).unwrap().action, Action::DryRun);
        assert_eq!(r.enforcing_action(), ActionKind::Reject);
        // Nothing kept: reject with the location's status.
        r.status = None;
        assert_eq!(r.enforcing_action(), ActionKind::Reject);
        // Enforcing strategies enforce their own action.
        r.action = ActionKind::Delay;
        assert_eq!(r.enforcing_action(), ActionKind::Delay);
    }

    #[test]
    fn dry_run_refuses_what_could_not_be_enforced_afterwards() {
        type Change = fn(&mut StrategyRecord);
        let cases: [(Change, &str); 4] = [
            (
                |r| {
                    r.status = Some(429);
                    r.max_delay_ms = Some(500);
                },
                "action: dry_run keeps either status",
            ),
            (
                |r| r.status = Some(200),
                "action.status: must be between 400 and 599",
            ),
            (|r| r.max_delay_ms = Some(0), "action.max_delay_ms:"),
            (
                |r| {
                    r.algorithm = Algorithm::FixedWindow;
                    r.max_delay_ms = Some(500);
                },
                "max_delay_ms: delay after dry run needs token_bucket",
            ),
        ];
        for (change, want) in cases {
            let mut r = rec();
            r.action = ActionKind::DryRun;
            change(&mut r);
            let e = r.validate().unwrap_err();
            assert!(e.to_string().starts_with(want), "{e}");
        }

        // The other actions' rules are unchanged.
        let mut r = rec();
        r.max_delay_ms = Some(500);
        assert_eq!(
            r.validate().unwrap_err().to_string(),
            "max_delay_ms: only for action delay"
        );
        let mut r = rec();
        r.action = ActionKind::Delay;
        r.max_delay_ms = Some(500);
        r.status = Some(429);
        assert_eq!(
            r.validate().unwrap_err().to_string(),
            "status: only for action reject"
        );
    }
}
