//! Calendar windows (issue 33): `fixed_window` strategies counted per
//! local day, week (Monday 00:00) or month (the 1st, 00:00) of an IANA
//! time zone (`tz`; UTC when empty), daylight saving time included (a
//! local day lasts 23, 24 or 25 hours).
//!
//! The zone rules come from jiff: the host's `/usr/share/zoneinfo`
//! (Debian's `tzdata`, updated with the system) when the host has one, or
//! else the copy of the IANA database compiled into the binary (hosts
//! without `tzdata`, such as slim containers). Nothing is downloaded.
//!
//! Zone arithmetic is kept off the request path. Compiling a strategy
//! (the table build: the loader, off the event loop for large tables)
//! interns its `(unit, tz)` pair ([`intern`]): one [`Cell`] per pair for
//! the life of the process, holding a [`Calendar`], the starts of
//! [`BOUNDARIES`] consecutive windows from the window before the one of
//! the build, as Unix nanoseconds. A request loads the list's pointer, the
//! cursor, the two starts around it and compares ([`Calendar::window`]);
//! only when `now` left that window does it search the list (a binary
//! search of a few dozen words) and move the cursor.
//!
//! Refresh: once half of a list is behind ([`Calendar::refresh_at_ns`]),
//! the next table build or the reader's once-a-second file check
//! ([`refresh_due`]: one load and a compare until then) lists the windows
//! ahead again and swaps the cell's pointer. The list replaced is kept
//! (a request may still be reading it): 272 bytes per pair every 15 days,
//! weeks or months. If a list does run out all the same (a process that
//! never checks, a wall clock stepped far ahead), the last listed window
//! is taken to last its nominal length (`Unit::period_ns`) from its start,
//! and then counts go on in it: never more admitted, the limit back at
//! the next refresh.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

pub use crate::core::model::calendar::{check, is_calendar, zone, CalendarError, MAX_TZ_LEN};
use crate::core::model::Unit;

/// Window starts a [`Calendar`] lists (the window before the build's, the
/// build's, and 30 after it: a month of days, 30 weeks, 30 months).
pub const BOUNDARIES: usize = 32;

const MINUTE_NS: u64 = 60_000_000_000;

/// One calendar window: its id in the state word (the start in Unix
/// minutes), its start and its end (Unix ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub id: u64,
    pub start: u64,
    pub end: u64,
}

/// The window starts of one strategy, listed when the table is built.
#[derive(Debug)]
pub struct Calendar {
    /// Ascending Unix ns; at least 2.
    starts: Box<[u64]>,
    /// Index `i` of the window `[starts[i], starts[i + 1])` the last
    /// request fell in (`i + 1 < starts.len()`).
    cursor: AtomicUsize,
    /// The nominal length of a window (the last one, if the list ran out).
    nominal_ns: u64,
}

/// The local date that starts the window holding `d`.
fn window_date(unit: Unit, d: Date) -> Date {
    match unit {
        Unit::Week => {
            let back = d.weekday().since(Weekday::Monday);
            d.checked_sub(i64::from(back).days()).unwrap_or(d)
        }
        Unit::Month => d.first_of_month(),
        _ => d,
    }
}

fn next_date(unit: Unit, d: Date) -> Option<Date> {
    let step = match unit {
        Unit::Week => 7.days(),
        Unit::Month => 1.month(),
        _ => 1.day(),
    };
    d.checked_add(step).ok()
}

fn prev_date(unit: Unit, d: Date) -> Option<Date> {
    let step = match unit {
        Unit::Week => 7.days(),
        Unit::Month => 1.month(),
        _ => 1.day(),
    };
    d.checked_sub(step).ok()
}

/// The instant local midnight of `d` begins in `tz` (a midnight skipped
/// by a DST change: the first instant after the gap; a repeated one: the
/// first).
fn midnight_ns(tz: &TimeZone, d: Date) -> Option<u64> {
    let z = d.to_zoned(tz.clone()).ok()?;
    u64::try_from(z.timestamp().as_nanosecond()).ok()
}

impl Calendar {
    /// The starts of [`BOUNDARIES`] windows of `unit` in zone `tz`, from
    /// the window before the one holding `now_unix_ns` (not interned).
    pub fn build(unit: Unit, tz: &str, now_unix_ns: u64) -> Result<Calendar, CalendarError> {
        Self::build_n(unit, &zone(tz)?, now_unix_ns, BOUNDARIES)
    }

    pub(crate) fn build_n(
        unit: Unit,
        tz: &TimeZone,
        now_unix_ns: u64,
        n: usize,
    ) -> Result<Calendar, CalendarError> {
        let bad = || CalendarError::UnknownZone(String::new());
        let now = Timestamp::from_nanosecond(i128::from(now_unix_ns)).map_err(|_| bad())?;
        let today = tz.to_datetime(now).date();
        let mut d = window_date(unit, today);
        // Midnight may fall after `now` on a day that starts late (a gap at
        // midnight): then `now` is in the window before.
        if midnight_ns(tz, d).is_some_and(|s| s > now_unix_ns) {
            d = prev_date(unit, d).ok_or_else(bad)?;
        }
        let mut d = prev_date(unit, d).ok_or_else(bad)?;
        let mut starts = Vec::with_capacity(n.max(2));
        while starts.len() < n.max(2) {
            let s = midnight_ns(tz, d).ok_or_else(bad)?;
            if starts.last().is_none_or(|&l| s > l) {
                starts.push(s);
            }
            d = next_date(unit, d).ok_or_else(bad)?;
        }
        Ok(Calendar {
            starts: starts.into_boxed_slice(),
            cursor: AtomicUsize::new(1),
            nominal_ns: unit.period_ns(),
        })
    }

    /// The window holding `now` (Unix ns): a load of the cursor and two
    /// compares while `now` stays in the window the last request saw.
    #[inline]
    pub fn window(&self, now: u64) -> Window {
        let i = self.cursor.load(Ordering::Relaxed);
        if let (Some(&s), Some(&e)) = (self.starts.get(i), self.starts.get(i + 1)) {
            if now >= s && now < e {
                return Window {
                    id: s / MINUTE_NS,
                    start: s,
                    end: e,
                };
            }
        }
        self.window_slow(now)
    }

    #[cold]
    #[inline(never)]
    fn window_slow(&self, now: u64) -> Window {
        let st = &self.starts;
        let n = st.len();
        let k = st.partition_point(|&s| s <= now);
        let (start, end) = if k == 0 {
            // Before the list (a clock far behind the build): the first
            // window; a newer stored window still counts (stale clock).
            (st[0], st[1])
        } else if k >= n {
            // Ran out (see the module documentation).
            let s = st[n - 1];
            (s, s.saturating_add(self.nominal_ns))
        } else {
            self.cursor.store(k - 1, Ordering::Relaxed);
            (st[k - 1], st[k])
        };
        Window {
            id: start / MINUTE_NS,
            start,
            end,
        }
    }

    /// The window whose id is `id` (a stored word's), or the one holding
    /// its start if the list does not have it.
    pub fn window_of_id(&self, id: u64) -> Window {
        self.window(id.saturating_mul(MINUTE_NS))
    }

    /// When the table should be rebuilt: half of the list behind.
    pub fn refresh_at_ns(&self) -> u64 {
        self.starts[self.starts.len() / 2]
    }

    /// The listed starts (tests, `shm inspect`).
    pub fn starts(&self) -> &[u64] {
        &self.starts
    }
}

/// One `(unit, zone)` pair's calendar, interned for the life of the
/// process ([`intern`]); its list is swapped when it is due.
pub struct Cell {
    unit: Unit,
    name: String,
    zone: TimeZone,
    list: AtomicPtr<Calendar>,
}

impl Cell {
    /// The current list.
    #[inline]
    pub fn get(&self) -> &Calendar {
        // SAFETY: `list` always holds a pointer from `Box::into_raw` of a
        // list that is never freed (replaced lists are kept: see the module
        // documentation), so it is valid for the process's life.
        unsafe { &*self.list.load(Ordering::Acquire) }
    }

    /// Lists the windows ahead again if the list is due at `now`.
    fn refresh(&self, now: u64) {
        if now < self.get().refresh_at_ns() {
            return;
        }
        if let Ok(c) = Calendar::build_n(self.unit, &self.zone, now, BOUNDARIES) {
            // The old list stays allocated (readers may hold it).
            self.list
                .store(Box::into_raw(Box::new(c)), Ordering::Release);
        }
    }
}

/// A strategy's calendar: a `Copy` reference to its interned [`Cell`]
/// (the limiters are plain data); equal when it is the same cell.
#[derive(Clone, Copy)]
pub struct CalRef(&'static Cell);

impl CalRef {
    #[inline]
    pub fn get(self) -> &'static Calendar {
        self.0.get()
    }
}

impl PartialEq for CalRef {
    fn eq(&self, o: &CalRef) -> bool {
        std::ptr::eq(self.0, o.0)
    }
}
impl Eq for CalRef {}

impl std::fmt::Debug for CalRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Calendar({}, {:?})", self.0.unit, self.0.name)
    }
}

static CELLS: Mutex<Vec<&'static Cell>> = Mutex::new(Vec::new());
/// The earliest `refresh_at_ns` of the interned lists.
static DUE_AT: AtomicU64 = AtomicU64::new(u64::MAX);

fn update_due(cells: &[&'static Cell]) {
    let due = cells
        .iter()
        .map(|c| c.get().refresh_at_ns())
        .min()
        .unwrap_or(u64::MAX);
    DUE_AT.store(due, Ordering::Relaxed);
}

/// The calendar of `unit` in zone `tz` (empty: UTC), its list fresh at
/// `now` (Unix ns): the cell of that pair, created on first use. At most
/// one cell per pair, so cells are bounded by the zones and units in use.
pub fn intern(unit: Unit, tz: &str, now: u64) -> Result<CalRef, CalendarError> {
    let mut cells = CELLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = cells.iter().find(|c| c.unit == unit && c.name == tz) {
        c.refresh(now);
        update_due(&cells);
        return Ok(CalRef(c));
    }
    let zone = zone(tz)?;
    let list = Calendar::build_n(unit, &zone, now, BOUNDARIES)?;
    let cell: &'static Cell = Box::leak(Box::new(Cell {
        unit,
        name: tz.to_string(),
        zone,
        list: AtomicPtr::new(Box::into_raw(Box::new(list))),
    }));
    cells.push(cell);
    update_due(&cells);
    Ok(CalRef(cell))
}

/// Refreshes the lists that are due at `now` (Unix ns): one load and a
/// compare when none is (the reader calls it once a second).
pub fn refresh_due(now: u64) {
    if now < DUE_AT.load(Ordering::Relaxed) {
        return;
    }
    let cells = CELLS.lock().unwrap_or_else(|e| e.into_inner());
    for c in cells.iter() {
        c.refresh(now);
    }
    update_due(&cells);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Algorithm;

    const S: u64 = 1_000_000_000;
    const H: u64 = 3_600 * S;

    /// Unix ns of an RFC 3339 instant.
    fn at(s: &str) -> u64 {
        let t: Timestamp = s.parse().unwrap();
        t.as_nanosecond() as u64
    }

    fn cal(unit: Unit, tz: &str, now: &str) -> Calendar {
        Calendar::build(unit, tz, at(now)).unwrap()
    }

    #[test]
    fn berlin_days_across_dst_are_23_and_25_hours() {
        // 2026-03-29: CET -> CEST (02:00 -> 03:00): a 23-hour day.
        let c = cal(Unit::Day, "Europe/Berlin", "2026-03-29T10:00:00Z");
        let w = c.window(at("2026-03-29T10:00:00Z"));
        assert_eq!(w.start, at("2026-03-28T23:00:00Z"));
        assert_eq!(w.end, at("2026-03-29T22:00:00Z"));
        assert_eq!(w.end - w.start, 23 * H);
        // 2026-10-25: CEST -> CET: a 25-hour day.
        let c = cal(Unit::Day, "Europe/Berlin", "2026-10-25T12:00:00Z");
        let w = c.window(at("2026-10-25T12:00:00Z"));
        assert_eq!(w.start, at("2026-10-24T22:00:00Z"));
        assert_eq!(w.end - w.start, 25 * H);
        // The next day is 24 hours again and starts where this one ends.
        let w2 = c.window(w.end);
        assert_eq!((w2.start, w2.end - w2.start), (w.end, 24 * H));
        assert!(w2.id > w.id);
    }

    #[test]
    fn auckland_months_and_days_across_dst() {
        // NZ: DST ends 2026-04-05 03:00 NZDT -> 02:00 NZST; starts
        // 2026-09-27 02:00 NZST -> 03:00 NZDT.
        let c = cal(Unit::Month, "Pacific/Auckland", "2026-04-10T00:00:00Z");
        let w = c.window(at("2026-04-10T00:00:00Z"));
        // April 1st 00:00 NZDT (+13) .. May 1st 00:00 NZST (+12).
        assert_eq!(w.start, at("2026-03-31T11:00:00Z"));
        assert_eq!(w.end, at("2026-04-30T12:00:00Z"));
        assert_eq!(w.end - w.start, 30 * 24 * H + H);
        let d = cal(Unit::Day, "Pacific/Auckland", "2026-09-27T00:00:00Z");
        let w = d.window(at("2026-09-27T00:00:00Z"));
        assert_eq!(w.start, at("2026-09-26T12:00:00Z"));
        assert_eq!(w.end - w.start, 23 * H);
        // The November window, seen from late October: starts at
        // 2026-11-01 00:00 NZDT.
        let w = c.window(at("2026-10-31T11:00:00Z"));
        assert_eq!(w.start, at("2026-10-31T11:00:00Z"));
        assert_eq!(w.end, at("2026-11-30T11:00:00Z"));
        // One nanosecond before: still October.
        assert_eq!(
            c.window(at("2026-10-31T11:00:00Z") - 1).end,
            at("2026-10-31T11:00:00Z")
        );
    }

    #[test]
    fn months_have_their_lengths_and_february_leaps() {
        let c = cal(Unit::Month, "UTC", "2028-01-15T00:00:00Z");
        let len = |t: &str| {
            let w = c.window(at(t));
            (w.end - w.start) / (24 * H)
        };
        assert_eq!(len("2028-01-31T23:59:59Z"), 31);
        assert_eq!(len("2028-02-10T00:00:00Z"), 29); // 2028 is a leap year
        assert_eq!(len("2028-04-10T00:00:00Z"), 30);
        assert_eq!(len("2029-02-10T00:00:00Z"), 28);
        assert_eq!(
            c.window(at("2028-02-29T12:00:00Z")).start,
            at("2028-02-01T00:00:00Z")
        );
        // 2100 is not a leap year (a list built then).
        let c = cal(Unit::Month, "UTC", "2100-02-10T00:00:00Z");
        let w = c.window(at("2100-02-10T00:00:00Z"));
        assert_eq!(w.end - w.start, 28 * 24 * H);
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2026-11-27 is a Friday; its week starts Monday 2026-11-23.
        let c = cal(Unit::Week, "UTC", "2026-11-27T20:00:00Z");
        let w = c.window(at("2026-11-27T20:00:00Z"));
        assert_eq!(w.start, at("2026-11-23T00:00:00Z"));
        assert_eq!(w.end, at("2026-11-30T00:00:00Z"));
        // A Monday 00:00 opens a new week; Sunday 23:59:59 is the old one.
        assert_eq!(
            c.window(at("2026-11-30T00:00:00Z")).start,
            at("2026-11-30T00:00:00Z")
        );
        assert_eq!(
            c.window(at("2026-11-29T23:59:59Z")).start,
            at("2026-11-23T00:00:00Z")
        );
        // In Berlin, the week containing the October DST change lasts
        // 7 days + 1 hour (Monday 2026-10-19 00:00 CEST).
        let c = cal(Unit::Week, "Europe/Berlin", "2026-10-21T00:00:00Z");
        let w = c.window(at("2026-10-21T00:00:00Z"));
        assert_eq!(w.start, at("2026-10-18T22:00:00Z"));
        assert_eq!(w.end - w.start, 7 * 24 * H + H);
    }

    #[test]
    fn utc_day_calendar_matches_plain_days() {
        let now = at("2026-11-27T20:49:00Z");
        let c = Calendar::build(Unit::Day, "UTC", now).unwrap();
        let w = c.window(now);
        let day = 24 * H;
        assert_eq!(w.start, now / day * day);
        assert_eq!(w.end, now / day * day + day);
    }

    #[test]
    fn the_cursor_follows_time_and_the_list_can_run_out() {
        let t0 = at("2026-01-10T12:00:00Z");
        let c = Calendar::build_n(Unit::Day, &TimeZone::UTC, t0, 4).unwrap();
        // Starts: Jan 9, 10, 11, 12.
        assert_eq!(c.starts().len(), 4);
        assert_eq!(c.starts()[0], at("2026-01-09T00:00:00Z"));
        assert_eq!(c.refresh_at_ns(), at("2026-01-11T00:00:00Z"));
        let w = c.window(at("2026-01-11T05:00:00Z"));
        assert_eq!(w.start, at("2026-01-11T00:00:00Z"));
        assert_eq!(c.cursor.load(Ordering::Relaxed), 2);
        // Past the last start: that window, its nominal length.
        let w = c.window(at("2026-01-13T05:00:00Z"));
        assert_eq!(w.start, at("2026-01-12T00:00:00Z"));
        assert_eq!(w.end, at("2026-01-13T00:00:00Z"));
        let w2 = c.window(at("2026-01-20T05:00:00Z"));
        assert_eq!(w2, w, "counts go on in the last listed window");
        // A clock far behind the build: the first window.
        assert_eq!(c.window(0).start, at("2026-01-09T00:00:00Z"));
        // A rebuild (the table's refresh) lists the days ahead again.
        let c =
            Calendar::build_n(Unit::Day, &TimeZone::UTC, at("2026-01-20T05:00:00Z"), 4).unwrap();
        assert_eq!(
            c.window(at("2026-01-20T05:00:00Z")).end,
            at("2026-01-21T00:00:00Z")
        );
    }

    #[test]
    fn an_interned_list_is_refreshed_when_half_behind() {
        // Interning: one cell per pair, the earliest due time published.
        let now = crate::core::clock::unix_ns();
        let r = intern(Unit::Day, "Asia/Kathmandu", now).unwrap();
        assert_eq!(r, intern(Unit::Day, "Asia/Kathmandu", now).unwrap());
        assert!(DUE_AT.load(Ordering::Relaxed) <= r.get().refresh_at_ns());
        // The refresh itself, on a cell of its own (a far-future refresh
        // of the shared cells would move other tests' lists).
        let t0 = at("2030-01-10T12:00:00Z");
        let zone = zone("Asia/Kathmandu").unwrap();
        let list = Calendar::build_n(Unit::Day, &zone, t0, BOUNDARIES).unwrap();
        let cell = Cell {
            unit: Unit::Day,
            name: "Asia/Kathmandu".into(),
            zone,
            list: AtomicPtr::new(Box::into_raw(Box::new(list))),
        };
        let first = cell.get().starts()[0];
        let due = cell.get().refresh_at_ns();
        cell.refresh(due - 1);
        assert_eq!(cell.get().starts()[0], first, "not due yet");
        cell.refresh(due + 1);
        let w = cell.get().window(due + 1);
        assert_eq!((w.start, w.end - w.start), (due, 24 * H));
        assert!(cell.get().starts()[0] > first);
        assert!(cell.get().refresh_at_ns() > due);
        // Kathmandu is UTC+5:45: local midnight is 18:15 UTC.
        assert_eq!(w.start % (24 * H), 18 * H + 15 * 60 * S);
    }

    #[test]
    fn zone_names_are_checked() {
        assert!(zone("Pacific/Auckland").is_ok());
        assert!(zone("America/Argentina/Buenos_Aires").is_ok());
        for bad in [
            "Mars/Olympus",
            "../etc/passwd",
            "/etc/localtime",
            "Europe//Berlin",
            "a\0b",
        ] {
            assert!(
                matches!(zone(bad), Err(CalendarError::UnknownZone(_))),
                "{bad}"
            );
        }
        let e = check(Algorithm::FixedWindow, Unit::Month, "Mars/Olympus").unwrap_err();
        assert!(e.to_string().starts_with("tz: "), "{e}");
        let e = check(Algorithm::TokenBucket, Unit::Month, "").unwrap_err();
        assert!(e.to_string().starts_with("per: "), "{e}");
        let e = check(Algorithm::FixedWindow, Unit::Hour, "Europe/Berlin").unwrap_err();
        assert!(e.to_string().starts_with("tz: "), "{e}");
        assert!(check(Algorithm::FixedWindow, Unit::Day, "Europe/Berlin").is_ok());
        assert!(check(Algorithm::FixedWindow, Unit::Week, "").is_ok());
    }
}
