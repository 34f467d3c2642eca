//! Parsers of command-line values: `--match`, durations, and the flag that
//! carries a model field (for error messages).

use std::collections::BTreeMap;

use rate_ctl::core::model::ModelError;

/// The CLI argument that carries a model field, for error messages.
pub fn flag_for_field(message: &str) -> &'static str {
    let field = message.split(':').next().unwrap_or("");
    match field {
        f if f.starts_with("conditions") => "--match",
        "rate" => "--rate",
        "burst" => "--burst",
        "per" => "--per",
        "algorithm" => "--algorithm",
        "action.status" | "status" => "--status",
        "action.max_delay_ms" | "max_delay_ms" => "--max-delay-ms",
        "action" => "--action",
        "name" => "--name",
        "scope" => "--scope",
        "id" => "ID",
        "dimension" => "--dimension",
        "value" => "--value",
        "expires" => "--expires",
        "reason" => "--reason",
        "weight" => "--weight",
        _ => "arguments",
    }
}

/// Parses a `--match dimension=value` argument.
pub fn parse_match(arg: &str) -> Result<(String, String), String> {
    let (d, v) = arg
        .split_once('=')
        .ok_or_else(|| format!("conditions: {arg:?} is not dimension=value"))?;
    Ok((d.trim().to_string(), v.to_string()))
}

/// Turns `--match` arguments into the condition map, refusing a dimension
/// given twice (the map would silently keep one).
pub fn conditions_from_args(args: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for (index, a) in args.iter().enumerate() {
        let (d, v) = parse_match(a)?;
        if map.insert(d.clone(), v).is_some() {
            return Err(ModelError::DuplicateDimension { index, name: d }.to_string());
        }
    }
    Ok(map)
}

/// Parses a duration such as `30s`, `10m`, `2h`, `1d` or `500ms`.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 10m, 2h, 1d"))?;
    let mul = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?} is not a duration like 30s, 10m, 2h, 1d")),
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_args() {
        let m = conditions_from_args(&["ip=1.2.3.4".into(), "api=/a=b".into()]).unwrap();
        assert_eq!(m["api"], "/a=b");
        let e = conditions_from_args(&["ip=1".into(), "ip=2".into()]).unwrap_err();
        assert!(e.starts_with("conditions[1].dimension"), "{e}");
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
