//! `fixed_window` over calendar windows (`per` week or month, or a `tz`;
//! issue 33): the word of [`super::fixed_window`], `window << 32 | count`,
//! with `window` the start of the calendar window in Unix minutes, taken
//! from the strategy's [`Calendar`] (listed when the table was built).
//! The same rules as the plain fixed window: an older stored window is
//! over, an equal or newer one counts (a stale clock never resets a
//! window); `retry_after` and the quota's reset are the real end of the
//! counted window (a local midnight, Monday or 1st, DST included).

use super::window::{pack, unpack};
use super::{Quota, Step};
use crate::core::calendar::{Calendar, Window};

/// The window and count a request at `now` sees, with the counted
/// window's bounds.
#[inline]
fn current(word: u64, now: u64, cal: &Calendar) -> (Window, u64) {
    let (sw, sc) = unpack(word);
    let w = cal.window(now);
    if sw < w.id {
        (w, 0)
    } else if sw == w.id {
        (w, sc)
    } else {
        // A newer window than `now`'s: a stale clock; count against it.
        let mut stored = cal.window_of_id(sw);
        stored.id = sw;
        (stored, sc)
    }
}

/// [`super::fixed_window::step`] on calendar windows.
pub fn step(word: u64, now: u64, cal: &Calendar, limit: u64, n: u64) -> Step {
    let (w, count) = current(word, now, cal);
    if count.saturating_add(n) > limit {
        return Step::Reject {
            retry_after_ns: if n > limit {
                u64::MAX
            } else {
                w.end.saturating_sub(now).max(1)
            },
        };
    }
    Step::Admit {
        next: pack(w.id, count + n),
        wait_ns: 0,
    }
}

/// Is the word at `now` a new key's (count 0 or its window over)?
pub fn is_fresh(word: u64, now: u64, cal: &Calendar) -> bool {
    let (sw, sc) = unpack(word);
    sc == 0 || sw < cal.window(now).id
}

/// Quota at `now`: the reset is the counted window's end, `window_ns`
/// its real length (a 23-hour day, a 29-day February).
pub fn quota(word: u64, now: u64, cal: &Calendar, limit: u64) -> Quota {
    let (w, count) = current(word, now, cal);
    Quota {
        window_ns: w.end.saturating_sub(w.start),
        ..Quota::new(
            limit,
            limit.saturating_sub(count),
            w.end.saturating_sub(now),
        )
    }
}

/// The id of the window a request admitted at `at` was counted in.
pub fn window_id(at: u64, cal: &Calendar) -> u64 {
    cal.window(at).id
}

/// The charge after the response (issue 31), as
/// [`super::window::charge_after`] on calendar windows.
pub fn charge_after(word: u64, now: u64, cal: &Calendar, charged: u64, delta: i64) -> Option<u64> {
    if delta >= 0 {
        let (w, count) = current(word, now, cal);
        Some(pack(
            w.id,
            count.saturating_add(delta as u64).min(u32::MAX as u64 - 1),
        ))
    } else {
        let (sw, sc) = unpack(word);
        (sw == charged && sc > 0).then(|| pack(sw, sc.saturating_sub(delta.unsigned_abs())))
    }
}

/// [`super::window::repair_foreign`] for a calendar window: a stored
/// window starting more than [`super::MAX_STALENESS_NS`] after a fresh
/// `clock` cannot be this clock's: the current window full replaces it.
pub(super) fn repair_foreign(
    slot: &crate::core::shm::slot::Slot,
    cal: &Calendar,
    limit: u64,
    clock: impl FnOnce() -> u64,
) -> bool {
    use std::sync::atomic::Ordering;
    let w = slot.state0();
    let cur = w.load(Ordering::SeqCst);
    let now = clock();
    let (sw, _) = unpack(cur);
    let w_now = cal.window(now).id;
    if sw <= w_now
        || sw.saturating_mul(60_000_000_000) <= now.saturating_add(super::MAX_STALENESS_NS)
    {
        return false;
    }
    w.compare_exchange(cur, pack(w_now, limit), Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Unit;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_month_counts_until_the_first_and_resets_there() {
        // 2026-11-27 20:00 UTC = 2026-11-28 09:00 NZDT; next Auckland
        // month start: 2026-12-01 00:00 NZDT = 2026-11-30 11:00 UTC.
        let now = 1_795_809_600 * S;
        let next = 1_796_036_400 * S;
        let cal = Calendar::build(Unit::Month, "Pacific/Auckland", now).unwrap();
        let mut w = 0;
        for _ in 0..3 {
            let Step::Admit { next, .. } = step(w, now, &cal, 3, 1) else {
                panic!()
            };
            w = next;
        }
        assert_eq!(
            step(w, now, &cal, 3, 1),
            Step::Reject {
                retry_after_ns: next - now
            }
        );
        let q = quota(w, now, &cal, 3);
        assert_eq!((q.remaining, q.reset_ns), (0, next - now));
        assert_eq!(q.window_ns, 30 * 86_400 * S); // November, all NZDT
        assert!(!is_fresh(w, next - 1, &cal));
        assert!(is_fresh(w, next, &cal));
        assert!(matches!(step(w, next, &cal, 3, 1), Step::Admit { .. }));
        // A stale clock reading of the old month after the new one began
        // counts against the new one.
        let Step::Admit { next: w2, .. } = step(0, next, &cal, 3, 1) else {
            panic!()
        };
        let Step::Admit { next: w3, .. } = step(w2, next - S, &cal, 3, 1) else {
            panic!()
        };
        assert_eq!(unpack(w3), (unpack(w2).0, 2));
        // Charge after and give back to the admission's window.
        let id = window_id(next, &cal);
        assert_eq!(charge_after(w3, next, &cal, id, -1), Some(pack(id, 1)));
        assert_eq!(charge_after(w3, next, &cal, id, 5), Some(pack(id, 7)));
    }

    /// The compiled limiters (shared slot and per key) of a month in
    /// Auckland, around the next month start from now (the list is built
    /// from the wall clock when the strategy is compiled).
    #[test]
    fn compiled_limiters_count_to_the_local_month_start() {
        use crate::core::clock::unix_ns;
        use crate::core::keys::KeyLimiter;
        use crate::core::limiter::test_util::*;
        let mut st = Strategy::plain(1, vec![], Algorithm::FixedWindow, 2, Unit::Month);
        st.tz = "Pacific/Auckland".into();
        st.validate().unwrap();
        let l = Limiter::from_strategy(&st);
        assert_eq!(l.algorithm(), Algorithm::FixedWindow);
        let now = unix_ns();
        let next = crate::core::calendar::intern(Unit::Month, "Pacific/Auckland", now)
            .unwrap()
            .get()
            .window(now)
            .end;
        with_slot(|slot| {
            assert!(admitted(&l, slot, now));
            assert!(admitted(&l, slot, now));
            match l.acquire(slot, now) {
                Acquired::Rejected { retry_after_ns } => assert_eq!(retry_after_ns, next - now),
                other => panic!("{other:?}"),
            }
            let q = l.quota(slot, now);
            assert_eq!((q.remaining, q.reset_ns), (0, next - now));
            // One nanosecond before the local 1st: still full; at it: new.
            assert!(!admitted(&l, slot, next - 1));
            let Acquired::Admitted(r) = l.acquire(slot, next) else {
                panic!("the new month admits")
            };
            l.refund(slot, r);
            assert_eq!(l.quota(slot, next).remaining, 2, "refunded exactly");
        });
        let k = KeyLimiter::from_strategy(&st).unwrap();
        let mut w = 0;
        for _ in 0..2 {
            let Step::Admit { next: n, .. } = k.step(w, now) else {
                panic!()
            };
            w = n;
        }
        assert_eq!(
            k.step(w, now),
            Step::Reject {
                retry_after_ns: next - now
            }
        );
        assert_eq!(k.quota(w, now).reset_ns, next - now);
        assert!(!k.is_fresh(w, next - 1) && k.is_fresh(w, next));
    }
}
