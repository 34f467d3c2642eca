//! Top keys (issue 33): a small heavy-hitter summary per per-key strategy
//! in the state file's last region (header `H_TOP_*`, layout version 5),
//! so that "who is limited right now" needs no log.
//!
//! One **table** per stat slot below [`MAX_TABLES`] (strategies in higher
//! slots are not tracked), [`TABLE_BYTES`] each:
//!
//! | offset | size | content |
//! |---:|---:|---|
//! | 0 | 8 | owner: `generation << 24 \| (slot + 1)` of the strategy counting here |
//! | 8 | 8 | minute (Unix minutes) the counts are for |
//! | 16 | 48 | reserved |
//! | 64 | [`ENTRIES`] × 96 | entries |
//!
//! An **entry**: the key's ident in the key table (8 bytes, 0: empty),
//! requests (8), rejections (8), the text's length (8), then the key as
//! `$rate_ctl_key` prints it, at most [`TEXT`] bytes.
//!
//! Workers count a key with atomics only: the rejections of a key of a
//! known entry, every one; its admitted requests sampled, one in
//! [`SAMPLE`] (chosen by a multiply of the key's new state word: no extra
//! state, no branch beyond one compare on the admitted path), counted as
//! [`SAMPLE`] requests each. A key not in the table replaces the entry
//! with the fewest counts and carries them on (space-saving: a key's
//! count is over-estimated by at most the smallest count, never
//! under-estimated). The first count of a new minute clears the table
//! (a compare-and-swap of the minute word decides who clears): the counts
//! are those of the current minute, and a reader shows the table while
//! its minute is the current or the previous one. Races between workers
//! may lose an increment or pair a text with another key for a moment: a
//! summary, not an account (the key table's counts are exact).
//!
//! A reader ([`TopKeys::read`]) trusts nothing of the region: every
//! length is clipped, every text escaped, the entries are at most
//! [`ENTRIES`].

use std::sync::atomic::Ordering;

use super::super::shm::region::Region;

/// Entries per table.
pub const ENTRIES: usize = 32;
/// Bytes of key text an entry keeps.
pub const TEXT: usize = 64;
const ENTRY_BYTES: usize = 96;
const TABLE_HEADER: usize = 64;
/// Bytes of one table.
pub const TABLE_BYTES: u64 = (TABLE_HEADER + ENTRIES * ENTRY_BYTES) as u64;
/// Tables at most (stat slots 0 .. 1023).
pub const MAX_TABLES: u32 = 1024;
/// One admitted request in this many is counted (with this weight).
pub const SAMPLE: u64 = 64;

// Entry words.
const E_IDENT: usize = 0;
const E_REQUESTS: usize = 8;
const E_REJECTIONS: usize = 16;
const E_LEN: usize = 24;
const E_TEXT: usize = 32;

/// Tables for a file of `slot_count` stat slots.
pub fn tables_for(slot_count: u32) -> u32 {
    slot_count.min(MAX_TABLES)
}

/// Bytes of the region (before page rounding).
pub fn region_bytes(tables: u32) -> u64 {
    tables as u64 * TABLE_BYTES
}

/// Does a region of `len` bytes hold `tables` tables? (header validation)
pub fn fits(tables: u32, slot_count: u32, len: u64) -> bool {
    tables <= tables_for(slot_count) && region_bytes(tables) <= len
}

/// Is an admitted request whose key's new word is `token` sampled? One in
/// [`SAMPLE`], by the top bits of a multiply of the word (it changes with
/// every admission).
#[inline(always)]
pub fn sampled(token: u64) -> bool {
    token.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58 == 0
}

/// One key of a table, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopEntry {
    /// As `$rate_ctl_key` prints it (escaped again here; cut at [`TEXT`]
    /// bytes: `truncated`).
    pub key: String,
    pub truncated: bool,
    pub requests: u64,
    pub rejections: u64,
}

/// The top-keys region of a mapped file.
#[derive(Clone, Copy)]
pub struct TopKeys<'a> {
    region: Region<'a>,
    tables: u32,
}

fn owner(slot: u32, generation: u64) -> u64 {
    generation << 24 | (slot as u64 + 1)
}

impl<'a> TopKeys<'a> {
    /// The tables in `region` (at most as many as fit in it).
    pub fn new(region: Region<'a>, tables: u32) -> TopKeys<'a> {
        let fit = (region.len() as u64 / TABLE_BYTES).min(u32::MAX as u64) as u32;
        TopKeys {
            region,
            tables: tables.min(fit),
        }
    }

    pub fn tables(&self) -> u32 {
        self.tables
    }

    fn table(&self, slot: u32) -> Option<Region<'a>> {
        if slot >= self.tables {
            return None;
        }
        self.region.sub(slot as u64 * TABLE_BYTES, TABLE_BYTES)
    }

    /// Counts a request of the key `ident` of the strategy in stat slot
    /// `slot` at `generation`, in Unix minute `minute`: a rejection, or
    /// `weight` admitted requests. `text` gives the key's text when the
    /// key takes an entry (only then: it is formatted off the request's
    /// values).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub fn count(
        &self,
        slot: u32,
        generation: u64,
        ident: u64,
        minute: u64,
        rejected: bool,
        weight: u64,
        text: impl FnOnce() -> Option<String>,
    ) {
        let Some(t) = self.table(slot) else { return };
        let (Some(own), Some(min)) = (t.u64_at(0), t.u64_at(8)) else {
            return;
        };
        let me = owner(slot, generation);
        let m = min.load(Ordering::Acquire);
        if m > minute && own.load(Ordering::Relaxed) == me {
            return; // a clock behind another worker's: not counted
        }
        if m != minute || own.load(Ordering::Relaxed) != me {
            // A new minute or another strategy's table: whoever moves the
            // minute word clears it (the others count into the cleared one).
            if min
                .compare_exchange(m, minute, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                t.zero(TABLE_HEADER, ENTRIES * ENTRY_BYTES);
                own.store(me, Ordering::Release);
            } else if own.load(Ordering::Acquire) != me {
                return;
            }
        }
        let at = |i: usize, off: usize| t.u64_at(TABLE_HEADER + i * ENTRY_BYTES + off);
        let (add, off) = if rejected {
            (1, E_REJECTIONS)
        } else {
            (weight, E_REQUESTS)
        };
        // The key's entry, or the one with the fewest counts.
        let mut least: Option<(usize, u64, u64, u64)> = None;
        for i in 0..ENTRIES {
            let Some(id) = at(i, E_IDENT) else { return };
            let cur = id.load(Ordering::Acquire);
            if cur == ident {
                if let Some(c) = at(i, off) {
                    c.fetch_add(add, Ordering::Relaxed);
                }
                return;
            }
            let req = at(i, E_REQUESTS).map_or(0, |c| c.load(Ordering::Relaxed));
            let rej = at(i, E_REJECTIONS).map_or(0, |c| c.load(Ordering::Relaxed));
            let score = rej.saturating_mul(SAMPLE * 1024).saturating_add(req);
            let score = if cur == 0 { 0 } else { score.max(1) };
            if least.is_none_or(|l| score < l.1) {
                least = Some((i, score, cur, req));
            }
            if cur == 0 {
                break; // the first empty entry: nothing after it
            }
        }
        let Some((i, _, old, _)) = least else { return };
        let Some(id) = at(i, E_IDENT) else { return };
        if id
            .compare_exchange(old, ident, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return; // another worker took it: this count is lost
        }
        // Space-saving: the counts stay (the new key's over-estimate).
        if let Some(c) = at(i, off) {
            c.fetch_add(add, Ordering::Relaxed);
        }
        let text = text().unwrap_or_default();
        let mut n = text.len().min(TEXT);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        let truncated = n < text.len();
        let base = TABLE_HEADER + i * ENTRY_BYTES;
        t.write_bytes(base + E_TEXT, &text.as_bytes()[..n]);
        t.store(base + E_LEN, n as u64 | (truncated as u64) << 63);
    }

    /// The keys of the strategy in `slot` at `generation` counted in the
    /// current minute `minute` or the previous one, by rejections then
    /// requests (most first).
    pub fn read(&self, slot: u32, generation: u64, minute: u64) -> Vec<TopEntry> {
        let Some(t) = self.table(slot) else {
            return Vec::new();
        };
        if t.load(0) != owner(slot, generation) {
            return Vec::new();
        }
        let m = t.load(8);
        if m != minute && m.saturating_add(1) != minute {
            return Vec::new();
        }
        let mut out = Vec::new();
        for i in 0..ENTRIES {
            let base = TABLE_HEADER + i * ENTRY_BYTES;
            if t.load(base + E_IDENT) == 0 {
                continue;
            }
            let requests = t.load(base + E_REQUESTS);
            let rejections = t.load(base + E_REJECTIONS);
            if requests == 0 && rejections == 0 {
                continue;
            }
            let lw = t.load(base + E_LEN);
            let n = ((lw & 0xFFFF) as usize).min(TEXT);
            let mut buf = [0u8; TEXT];
            t.read_bytes(base + E_TEXT, &mut buf[..n]);
            out.push(TopEntry {
                key: crate::core::escape::escape_bytes(&buf[..n], TEXT * 4),
                truncated: lw >> 63 == 1,
                requests,
                rejections,
            });
        }
        out.sort_by(|a, b| {
            (b.rejections, b.requests, &a.key).cmp(&(a.rejections, a.requests, &b.key))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn words(tables: u32) -> Vec<AtomicU64> {
        (0..region_bytes(tables) / 8)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    #[test]
    fn ranks_by_rejections_then_requests_and_turns_over_each_minute() {
        let w = words(4);
        let t = TopKeys::new(Region::from_atomics(&w), 4);
        fn key(s: &'static str) -> impl FnOnce() -> Option<String> {
            move || Some(s.to_string())
        }
        for _ in 0..5 {
            t.count(1, 7, 100, 50, false, SAMPLE, key("ip=10.0.0.1"));
        }
        t.count(1, 7, 200, 50, false, SAMPLE, key("ip=10.0.0.2"));
        t.count(1, 7, 200, 50, true, 0, key("ip=10.0.0.2"));
        t.count(1, 7, 200, 50, true, 0, key("ignored: known key"));
        let r = t.read(1, 7, 50);
        assert_eq!(
            r.iter()
                .map(|e| (e.key.as_str(), e.rejections, e.requests))
                .collect::<Vec<_>>(),
            [("ip=10.0.0.2", 2, SAMPLE), ("ip=10.0.0.1", 0, 5 * SAMPLE)]
        );
        assert_eq!(t.read(1, 7, 51).len(), 2, "shown through the next minute");
        assert!(t.read(1, 7, 52).is_empty(), "then gone");
        assert!(t.read(1, 8, 50).is_empty(), "another generation's");
        assert!(t.read(0, 7, 50).is_empty() && t.read(9, 7, 50).is_empty());
        // A new minute clears the table.
        t.count(1, 7, 300, 51, true, 0, key("ip=10.0.0.3"));
        let r = t.read(1, 7, 51);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].key, "ip=10.0.0.3");
        // A clock behind is not counted.
        t.count(1, 7, 300, 50, true, 0, key("x"));
        assert_eq!(t.read(1, 7, 51)[0].rejections, 1);
    }

    #[test]
    fn a_full_table_replaces_the_least_and_keeps_the_heavy_hitter() {
        let w = words(1);
        let t = TopKeys::new(Region::from_atomics(&w), 1);
        for _ in 0..50 {
            t.count(0, 1, 1, 9, true, 0, || Some("heavy".into()));
        }
        for k in 2..500u64 {
            t.count(0, 1, k, 9, false, SAMPLE, || Some(format!("k{k}")));
        }
        let r = t.read(0, 1, 9);
        assert_eq!(r.len(), ENTRIES);
        assert_eq!((r[0].key.as_str(), r[0].rejections), ("heavy", 50));
        // A long text is cut at a character boundary and flagged.
        let long = "é".repeat(40);
        t.count(0, 1, 9999, 9, true, 0, || Some(long.clone()));
        let e = t.read(0, 1, 9).into_iter().find(|e| e.truncated).unwrap();
        assert_eq!(e.key, "é".repeat(32));
    }

    /// A region holding anything: reads are bounded, escaped, never panic.
    #[test]
    fn a_hostile_region_gives_bounded_answers() {
        let w = words(2);
        let t = TopKeys::new(Region::from_atomics(&w), 2);
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for round in 0..500 {
            for x in &w {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                x.store(
                    if round % 3 == 0 { u64::MAX } else { seed },
                    Ordering::Relaxed,
                );
            }
            w[0].store(owner(0, 3), Ordering::Relaxed);
            w[1].store(77, Ordering::Relaxed);
            let r = t.read(0, 3, 77);
            assert!(r.len() <= ENTRIES);
            for e in &r {
                assert!(!e.key.chars().any(char::is_control), "{e:?}");
            }
            t.count(0, 3, seed | 1, 77, round % 2 == 0, SAMPLE, || {
                Some("k".into())
            });
        }
        // More tables asked than the region holds: only those that fit.
        assert_eq!(TopKeys::new(Region::from_atomics(&w), 99).tables(), 2);
    }

    #[test]
    fn about_one_admission_in_sample_is_counted() {
        let n = (0..64_000u64)
            .filter(|&w| sampled(w * 1_000_003 + 17))
            .count();
        assert!((700..1300).contains(&n), "{n}");
    }
}
