//! Parsers of command-line values (`--match`, durations) and the flag that
//! carries a field (for error messages).

use std::collections::BTreeMap;

use crate::store::{Field, Invalid};
use rate_ctl::core::model::ModelError;

/// The command-line argument that carries a field, for error messages:
/// the one place it is decided ("arguments" for a field no flag sets).
pub fn flag(field: Option<Field>) -> &'static str {
    match field {
        Some(Field::Conditions | Field::Condition(_)) => "--match",
        Some(Field::Rate) => "--rate",
        Some(Field::Burst) => "--burst",
        Some(Field::Per) => "--per",
        Some(Field::Algorithm) => "--algorithm",
        Some(Field::Status) => "--status",
        Some(Field::MaxDelayMs) => "--max-delay-ms",
        Some(Field::Action) => "--action",
        Some(Field::Name) => "--name",
        Some(Field::Scope) => "--scope",
        Some(Field::Id) => "ID",
        Some(Field::Dimension) => "--dimension",
        Some(Field::Value) => "--value",
        Some(Field::Expires) => "--expires",
        Some(Field::Reason) => "--reason",
        Some(Field::Weight) => "--weight",
        Some(Field::WarmUpMs) => "--warm-up",
        Some(Field::ColdFactor) => "--cold-factor",
        Some(Field::Priority) => "--priority",
        Some(Field::Each) => "--each",
        Some(Field::Ipv4Prefix) => "--ipv4-prefix",
        Some(Field::Ipv6Prefix) => "--ipv6-prefix",
        Some(Field::OnFull) => "--on-full",
        Some(Field::Column("split")) => "--split",
        Some(Field::CountIf) => "--count-if",
        Some(Field::CostFrom) => "--cost-from",
        Some(Field::CostAfter) => "--cost-after",
        Some(Field::Tz) => "--tz",
        Some(Field::Column("max_keys")) => "--max-keys",
        Some(Field::Column("ban_after")) => "--ban-after",
        Some(Field::Column("ban_within")) => "--ban-within",
        Some(Field::Column("ban_for")) => "--ban-for",
        Some(Field::Enabled | Field::HostId | Field::Column(_)) | None => "arguments",
    }
}

/// Parses a `--match dimension=value` argument.
pub fn parse_match(arg: &str) -> Result<(String, String), Invalid> {
    let (d, v) = arg.split_once('=').ok_or_else(|| {
        Invalid::new(
            Field::Conditions,
            "conditions",
            format!("{arg:?} is not dimension=value"),
        )
    })?;
    Ok((d.trim().to_string(), v.to_string()))
}

/// Turns `--match` arguments into the condition map, refusing a dimension
/// given twice (the map would silently keep one).
pub fn conditions_from_args(args: &[String]) -> Result<BTreeMap<String, String>, Invalid> {
    let mut map = BTreeMap::new();
    for (index, a) in args.iter().enumerate() {
        let (d, v) = parse_match(a)?;
        if map.insert(d.clone(), v).is_some() {
            return Err(ModelError::DuplicateDimension { index, name: d }.into());
        }
    }
    Ok(map)
}

/// A command-line value that is not what its argument takes (clap shows
/// the message after the argument's name).
#[derive(Debug, thiserror::Error)]
pub enum BadValue {
    #[error("{0:?}: not a group name")]
    NotAGroup(String),
    #[error("{0:?}: no such group")]
    NoSuchGroup(String),
    #[error("{0:?} is not an octal mode like 0660")]
    NotAMode(String),
    #[error("{0:?} is not a duration like 30s, 10m, 2h, 1d")]
    NotADuration(String),
    #[error("{0:?} is too long")]
    TooLong(String),
    #[error("warm_up_ms: {0} ms is more than 1 hour")]
    WarmUpTooLong(u64),
    /// A mode the agent refuses for its file (the writer's reason).
    #[error("{0}")]
    RefusedMode(String),
}

/// Parses a duration such as `30s`, `10m`, `2h`, `1d` or `500ms`.
pub fn parse_duration_ms(s: &str) -> Result<u64, BadValue> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| BadValue::NotADuration(s.into()))?;
    let mul = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(BadValue::NotADuration(s.into())),
    };
    n.checked_mul(mul)
        .ok_or_else(|| BadValue::TooLong(s.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_args() {
        let m = conditions_from_args(&["ip=1.2.3.4".into(), "api=/a=b".into()]).unwrap();
        assert_eq!(m["api"], "/a=b");
        let e = conditions_from_args(&["ip=1".into(), "ip=2".into()]).unwrap_err();
        assert!(e.to_string().starts_with("conditions[1].dimension"), "{e}");
        assert_eq!(flag(e.field), "--match");
        assert!(parse_match("novalue").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("10m").unwrap(), 600_000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert!(parse_duration_ms("1w").is_err());
    }
}
