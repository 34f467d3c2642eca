//! The store's errors, typed: which field a validation error is about is
//! data ([`Field`]), not text to be parsed back. The field's name in the
//! REST API is decided in `serve/error.rs`, its command-line flag in
//! `cli/flags.rs`; the messages themselves are as the model writes them.

use std::fmt;

use rate_ctl::core::model::ModelError;

/// A field of a strategy, blacklist entry or host that an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Id,
    Name,
    /// The set of conditions (the `match` of the API, `--match`).
    Conditions,
    /// One condition, by its index in the record's (sorted) conditions.
    Condition(usize),
    Algorithm,
    Rate,
    Per,
    Burst,
    Action,
    Status,
    MaxDelayMs,
    WarmUpMs,
    ColdFactor,
    Priority,
    /// `each` (per-key dimensions) and its options.
    Each,
    Ipv4Prefix,
    Ipv6Prefix,
    OnFull,
    Enabled,
    Scope,
    Dimension,
    Value,
    Expires,
    Reason,
    HostId,
    Weight,
    /// Another stored column (a row broken in the database), by name.
    Column(&'static str),
    /// `count_if`, `cost_from`, `cost_after` (issue 31).
    CountIf,
    CostFrom,
    CostAfter,
    /// `tz`, the calendar windows' zone (issue 33).
    Tz,
}

impl Field {
    /// The record field of a model keyword (`UnknownKeyword::field`).
    fn of_keyword(name: &'static str) -> Field {
        match name {
            "algorithm" => Field::Algorithm,
            "per" => Field::Per,
            "action" => Field::Action,
            "scope" => Field::Scope,
            other => Field::Column(other),
        }
    }
}

/// An invalid field: which one, and the message naming it the way the
/// model does ("conditions[1].value: …", "action.status: …").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// `None` for an answer of `rate-ctl serve` naming no field we know.
    pub field: Option<Field>,
    /// How the message names the field; empty when the message is given
    /// whole ([`Invalid::whole`]).
    name: String,
    /// What is wrong, after "name: ".
    text: String,
}

impl Invalid {
    /// `field`, named `name` in the message, and what is wrong with it.
    pub fn new(field: Field, name: impl Into<String>, text: impl Into<String>) -> Invalid {
        Invalid {
            field: Some(field),
            name: name.into(),
            text: text.into(),
        }
    }

    /// A complete message (e.g. from `rate-ctl serve`'s answer) about
    /// `field`, if known.
    pub fn whole(field: Option<Field>, message: impl Into<String>) -> Invalid {
        Invalid {
            field,
            name: String::new(),
            text: message.into(),
        }
    }

    /// What is wrong, without the field's name.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            f.write_str(&self.text)
        } else {
            write!(f, "{}: {}", self.name, self.text)
        }
    }
}

impl std::error::Error for Invalid {}

impl From<ModelError> for Invalid {
    /// The field from the variant; the message is the model's.
    fn from(e: ModelError) -> Invalid {
        use ModelError as E;
        let (field, name) = match &e {
            E::ZeroId => (Field::Id, "id".to_string()),
            E::NameTooLong(_) => (Field::Name, "name".to_string()),
            E::TooManyConditions(_) => (Field::Conditions, "conditions".to_string()),
            E::BadDimension { index, .. } | E::DuplicateDimension { index, .. } => (
                Field::Condition(*index),
                format!("conditions[{index}].dimension"),
            ),
            E::BadValueLength { index, .. }
            | E::BadIp { index, .. }
            | E::BadIpNet { index, .. }
            | E::BadTemplate { index, .. }
            | E::ControlCharacter { index, .. } => (
                Field::Condition(*index),
                format!("conditions[{index}].value"),
            ),
            E::IpOperator { index, .. } => {
                (Field::Condition(*index), format!("conditions[{index}]"))
            }
            E::ZeroRate | E::RateTooHigh { .. } | E::CountTooHigh { .. } => {
                (Field::Rate, "rate".to_string())
            }
            E::BadBurst { .. } | E::BurstOverflow { .. } | E::BelowClockTick { .. } => {
                (Field::Burst, "burst".to_string())
            }
            E::BadStatus(_) => (Field::Status, "action.status".to_string()),
            E::BadMaxDelay(_) => (Field::MaxDelayMs, "action.max_delay_ms".to_string()),
            E::BadWarmUp(_) | E::WarmUpNeedsWarmUp(_) => {
                (Field::WarmUpMs, "warm_up_ms".to_string())
            }
            E::BadColdFactor(_) => (Field::ColdFactor, "cold_factor".to_string()),
            E::BadPriority(_) => (Field::Priority, "priority".to_string()),
            E::DelayNeedsBucket(_) => (Field::Action, "action".to_string()),
            E::UnknownKeyword { field, .. } => (Field::of_keyword(field), field.to_string()),
            E::Each(each) => each_field(each),
            E::Response(r) => response_field(r),
            E::Calendar(c) => calendar_field(c),
            E::Ban(b) => ban_field(b),
        };
        let message = e.to_string();
        // The model's messages are "name: text"; `name` is known from the variant.
        match message.strip_prefix(&format!("{name}: ")) {
            Some(text) => Invalid::new(field, name, text),
            None => Invalid::whole(Some(field), message),
        }
    }
}

/// The field (and its name in the message) of a calendar error (issue 33).
fn calendar_field(e: &rate_ctl::core::model::calendar::CalendarError) -> (Field, String) {
    use rate_ctl::core::model::calendar::CalendarError as E;
    match e {
        E::PerNeedsFixedWindow { .. } => (Field::Per, "per".into()),
        E::TzNeedsCalendar { .. } | E::UnknownZone(_) => (Field::Tz, "tz".into()),
    }
}

/// The field (and its name in the message) of a per-key error.
fn each_field(e: &rate_ctl::core::model::each::EachError) -> (Field, String) {
    use rate_ctl::core::model::each::EachError as E;
    match e {
        E::BadDimension { index, .. } | E::Duplicate { index, .. } => {
            (Field::Each, format!("each[{index}]"))
        }
        E::TooMany(_) | E::Algorithm(_) | E::Allow => (Field::Each, "each".into()),
        E::SlidingCount(_) => (Field::Rate, "rate".into()),
        E::Ipv4Prefix(_) | E::NeedsEach("ipv4_prefix") => (Field::Ipv4Prefix, "ipv4_prefix".into()),
        E::Ipv6Prefix(_) | E::NeedsEach("ipv6_prefix") => (Field::Ipv6Prefix, "ipv6_prefix".into()),
        E::MaxKeys(_) | E::NeedsEach("max_keys") => (Field::Column("max_keys"), "max_keys".into()),
        E::OnFull(_) | E::NeedsEach(_) => (Field::OnFull, "on_full".into()),
    }
}

/// The field (and its name in the message) of a penalty box error.
fn ban_field(e: &rate_ctl::core::model::ban::BanError) -> (Field, String) {
    use rate_ctl::core::model::ban::BanError as E;
    let name = match e {
        E::Duration { field, .. } | E::BadDuration { field, .. } => field,
        E::Missing(field) => field,
        E::After(_) | E::Each(_) | E::Allow => "ban_after",
    };
    (Field::Column(name), name.to_string())
}

/// The field (and its name in the message) of a response/cost error.
fn response_field(e: &rate_ctl::core::model::response::ResponseError) -> (Field, String) {
    use rate_ctl::core::model::response::ResponseError as E;
    let field = match e {
        E::BadCountIf(_) => "count_if",
        E::BadDimension { field, .. } | E::Algorithm { field, .. } | E::Allow { field } => field,
    };
    let f = match field {
        "count_if" => Field::CountIf,
        "cost_from" => Field::CostFrom,
        _ => Field::CostAfter,
    };
    (f, field.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or is unreachable.
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{0}")]
    NotFound(String),
    /// A field is invalid or conflicts with stored data.
    #[error("{0}")]
    Invalid(Invalid),
    /// A line of an import (1-based) is invalid; nothing was imported.
    #[error("line {line}: {cause}")]
    Import { line: usize, cause: Invalid },
    #[error("store: {0}")]
    Url(String),
    /// An update based on a version that is no longer current.
    #[error("{0}")]
    Conflict(String),
    /// The HTTP store (`--store http://…`, `--api`) failed or refused.
    #[error("{0}")]
    Http(String),
    /// A replace import with no strategy would delete all of these; it
    /// needs an explicit confirmation.
    #[error("replace: the import holds no strategy and would delete all {0} stored; confirm with --allow-empty (API: allow_empty=true)")]
    EmptyReplace(u64),
    /// The HTTP store refused our token (401/403): a configuration error,
    /// not an outage.
    #[error("{0}")]
    Auth(String),
}

impl From<Invalid> for StoreError {
    fn from(e: Invalid) -> StoreError {
        StoreError::Invalid(e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
