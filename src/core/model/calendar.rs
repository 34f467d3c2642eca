//! The calendar fields of a strategy (issue 33): which `per` and `tz`
//! a strategy may take, and the zone's name checked against the IANA
//! database (jiff). The windows themselves are `core::calendar`'s.

use jiff::tz::{TimeZone, TimeZoneDatabase};

use super::{Algorithm, Unit};

/// Longest `tz` name, in bytes (the longest IANA name is 32).
pub const MAX_TZ_LEN: usize = 64;

/// Why a strategy's calendar fields were refused; each names its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    #[error("per: {per} windows are for fixed_window only, not {algorithm}")]
    PerNeedsFixedWindow { per: Unit, algorithm: Algorithm },
    #[error("tz: a time zone applies to fixed_window counted per day, week or month, not {algorithm} per {per}")]
    TzNeedsCalendar { per: Unit, algorithm: Algorithm },
    #[error("tz: {0:?} is not a known IANA time zone (AREA/CITY, e.g. Europe/Berlin, or UTC)")]
    UnknownZone(String),
}

/// Whether a strategy counts in calendar windows (week, month, or a day
/// in a named zone); a plain UTC day without `tz` keeps `now / period`.
pub fn is_calendar(per: Unit, tz: &str) -> bool {
    matches!(per, Unit::Week | Unit::Month) || !tz.is_empty()
}

/// Checks the calendar fields of a strategy (the zone exists).
pub fn check(algorithm: Algorithm, per: Unit, tz: &str) -> Result<(), CalendarError> {
    if matches!(per, Unit::Week | Unit::Month) && algorithm != Algorithm::FixedWindow {
        return Err(CalendarError::PerNeedsFixedWindow { per, algorithm });
    }
    if tz.is_empty() {
        return Ok(());
    }
    if algorithm != Algorithm::FixedWindow || !matches!(per, Unit::Day | Unit::Week | Unit::Month) {
        return Err(CalendarError::TzNeedsCalendar { per, algorithm });
    }
    zone(tz).map(|_| ())
}

/// The zone named `name`: the host's database first, the bundled copy
/// for a name the host does not know (an older `tzdata`).
pub fn zone(name: &str) -> Result<TimeZone, CalendarError> {
    let unknown = || CalendarError::UnknownZone(name.chars().take(MAX_TZ_LEN).collect());
    if name.is_empty() || name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    // A name is a path below the database's directory: refuse anything
    // that is not a plain AREA/CITY spelling before it reaches one.
    if name.len() > MAX_TZ_LEN
        || name.starts_with('/')
        || name
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-+".contains(&b))
    {
        return Err(unknown());
    }
    jiff::tz::db()
        .get(name)
        .or_else(|_| bundled().get(name))
        .map_err(|_| unknown())
}

fn bundled() -> &'static TimeZoneDatabase {
    static DB: std::sync::OnceLock<TimeZoneDatabase> = std::sync::OnceLock::new();
    DB.get_or_init(TimeZoneDatabase::bundled)
}
