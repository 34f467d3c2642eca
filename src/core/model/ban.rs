//! The penalty box of a per-key strategy (issue 32): `--ban-after N
//! --ban-within W --ban-for D`. When one key's rejections by the strategy
//! reach `after` within `within_s` seconds, the worker bans the key on its
//! host for `for_s` seconds (the ban table of the state file,
//! [`crate::core::bans`]) and the agent carries the ban to the store as a
//! blacklist entry, so every host refuses it.

/// Shortest and longest `ban_within` / `ban_for`: 1 s and 30 days.
pub const MIN_BAN_SECS: u32 = 1;
pub const MAX_BAN_SECS: u32 = 30 * 86_400;
/// Most rejections `ban_after` may wait for.
pub const MAX_BAN_AFTER: u32 = 1_000_000;

/// The penalty box of a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ban {
    /// Rejections of one key that raise a ban (≥ 1).
    pub after: u32,
    /// The window they are counted in, seconds.
    pub within_s: u32,
    /// How long the key is banned, seconds.
    pub for_s: u32,
}

/// Why the ban options were refused; each message names its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BanError {
    #[error("ban_after: must be between 1 and {MAX_BAN_AFTER}, got {0}")]
    After(u64),
    #[error("{field}: must be between 1 s and 30 days ({MIN_BAN_SECS}..={MAX_BAN_SECS} seconds), got {secs}")]
    Duration { field: &'static str, secs: u64 },
    #[error("{field}: {value:?} is not a duration (a number of seconds, or with a unit: 10s, 5m, 2h, 1d)")]
    BadDuration { field: &'static str, value: String },
    #[error("ban_after: a penalty box needs each ip or each userid (the blacklist's dimensions; one dimension), got each [{0}]")]
    Each(String),
    #[error("ban_after, ban_within and ban_for go together: {0} is missing")]
    Missing(&'static str),
    #[error("ban_after: makes no sense for action allow")]
    Allow,
}

impl Ban {
    /// Checks the fields and that the strategy's `each` (its dimensions)
    /// is one the blacklist holds: `ip` or `userid` alone.
    pub fn check(&self, each: &[String]) -> Result<(), BanError> {
        if !(1..=MAX_BAN_AFTER).contains(&self.after) {
            return Err(BanError::After(self.after.into()));
        }
        for (field, secs) in [("ban_within", self.within_s), ("ban_for", self.for_s)] {
            if !(MIN_BAN_SECS..=MAX_BAN_SECS).contains(&secs) {
                return Err(BanError::Duration {
                    field,
                    secs: secs.into(),
                });
            }
        }
        match each {
            [d] if d == "ip" || d == "userid" => Ok(()),
            _ => Err(BanError::Each(each.join(", "))),
        }
    }

    /// The three options as given apart (CLI flags, store columns, JSON):
    /// all or none.
    pub fn from_parts(
        after: Option<u64>,
        within_s: Option<u64>,
        for_s: Option<u64>,
    ) -> Result<Option<Ban>, BanError> {
        match (after, within_s, for_s) {
            (None, None, None) => Ok(None),
            (Some(a), Some(w), Some(f)) => {
                let secs = |field, v: u64| {
                    u32::try_from(v).map_err(|_| BanError::Duration { field, secs: v })
                };
                Ok(Some(Ban {
                    after: u32::try_from(a).map_err(|_| BanError::After(a))?,
                    within_s: secs("ban_within", w)?,
                    for_s: secs("ban_for", f)?,
                }))
            }
            (None, ..) => Err(BanError::Missing("ban_after")),
            (_, None, _) => Err(BanError::Missing("ban_within")),
            (_, _, None) => Err(BanError::Missing("ban_for")),
        }
    }
}

/// A duration in seconds from `10`, `10s`, `5m`, `2h`, `1d`; the error
/// names `field`.
pub fn parse_secs(field: &'static str, text: &str) -> Result<u64, BanError> {
    let bad = || BanError::BadDuration {
        field,
        value: text.chars().take(64).collect(),
    };
    let t = text.trim();
    let (num, mul) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (t, 1),
        Some((i, _)) => (
            &t[..i],
            match &t[i..] {
                "s" | "sec" | "secs" | "second" | "seconds" => 1,
                "m" | "min" | "mins" | "minute" | "minutes" => 60,
                "h" | "hour" | "hours" => 3_600,
                "d" | "day" | "days" => 86_400,
                _ => return Err(bad()),
            },
        ),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(mul).ok_or_else(bad)
}

/// `secs` as the shortest text [`parse_secs`] reads back (`30s`, `5m`).
pub fn format_secs(secs: u32) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(after: u32, within_s: u32, for_s: u32) -> Ban {
        Ban {
            after,
            within_s,
            for_s,
        }
    }

    #[test]
    fn bounds_and_each_are_checked_with_the_field_named() {
        let ip = ["ip".to_string()];
        assert_eq!(ban(3, 10, 30).check(&ip), Ok(()));
        assert_eq!(ban(1, 1, MAX_BAN_SECS).check(&["userid".into()]), Ok(()));
        assert!(ban(0, 10, 30)
            .check(&ip)
            .unwrap_err()
            .to_string()
            .starts_with("ban_after:"));
        let e = ban(3, 0, 30).check(&ip).unwrap_err().to_string();
        assert!(e.starts_with("ban_within:"), "{e}");
        let e = ban(3, 10, MAX_BAN_SECS + 1)
            .check(&ip)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("ban_for:"), "{e}");
        let e = ban(3, 10, 30)
            .check(&["api".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("each ip or each userid") && e.contains("[api]"),
            "{e}"
        );
        assert!(ban(3, 10, 30).check(&[]).is_err());
        assert!(ban(3, 10, 30)
            .check(&["ip".into(), "userid".into()])
            .is_err());
    }

    #[test]
    fn durations_parse_and_format_back() {
        assert_eq!(parse_secs("ban_for", "30"), Ok(30));
        assert_eq!(parse_secs("ban_for", "10s"), Ok(10));
        assert_eq!(parse_secs("ban_for", "5m"), Ok(300));
        assert_eq!(parse_secs("ban_for", "2h"), Ok(7_200));
        assert_eq!(parse_secs("ban_for", "30d"), Ok(2_592_000));
        for bad in ["", "s", "10x", "-1", "1.5s", "99999999999999999999d"] {
            let e = parse_secs("ban_within", bad).unwrap_err().to_string();
            assert!(e.starts_with("ban_within:"), "{bad}: {e}");
        }
        for s in [1, 10, 60, 90, 3_600, 86_400, MAX_BAN_SECS] {
            assert_eq!(parse_secs("x", &format_secs(s)), Ok(s.into()));
        }
        assert_eq!(
            Ban::from_parts(Some(3), None, Some(30)),
            Err(BanError::Missing("ban_within"))
        );
        assert_eq!(Ban::from_parts(None, None, None), Ok(None));
    }
}
