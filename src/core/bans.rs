//! The local ban table (issue 32, the penalty box): a region at the end of
//! the state file (`PATH.state`, after the key table) where workers record
//! the rejections of keys by strategies with `ban_after` and, once a key's
//! rejections reach the strategy's `ban_after` within `ban_within`, ban it:
//! every worker of the host refuses it with the blacklist status from its
//! next request on (checked with the blacklist, before any strategy). The
//! agent copies the bans to the store (as blacklist entries) and frees rows
//! whose ban ended or was lifted (`src/agent/bans.rs`).
//!
//! Layout (docs/SHM-LAYOUT.md, *Ban table*): a 256-byte header of counters,
//! then `capacity` rows of 256 bytes (32 words):
//!
//! | word | field |
//! |---:|---|
//! | 0 | ident: 0 free, else the keyed hash of (kind, key bytes) with bit 0 set; claimed by CAS |
//! | 1 | meta: strategy id (bits 0–31), kind (32–39: 1 ip, 2 userid), key length (48–63); stored (release) once the key bytes are written: 0 = not ready |
//! | 2 | count: window start (unix s) << 32 \| rejections in it |
//! | 3 | banned until (unix ms; 0 = never banned since claimed) |
//! | 4 | reported until (the agent: the `banned until` it wrote to the store) |
//! | 5 | banned at (unix ms) |
//! | 6 | the strategy's ban_within (s), for the agent's sweep |
//! | 7 | rejections that raised the ban |
//! | 8..32 | key bytes (at most [`MAX_KEY`]): `ip` the prefix's 6 or 18 bytes (`IpPrefix::bytes`), `userid` the value |
//!
//! A key may be in any row of its window of [`WINDOW`] rows (from the row
//! its hash picks, wrapping). Workers only claim free rows; when a key's
//! window has none, the rejection is not counted (the header's `full`
//! counter) — bans already raised stay, and the agent frees stale rows
//! (no ban in force, count window over) every tick. Nothing read from a
//! row is trusted: lengths are bounded, and a row whose bytes are not the
//! key's is another key's.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::shm::region::Region;

pub const HEADER_BYTES: u64 = 256;
pub const ROW_BYTES: u64 = 256;
const ROW_WORDS: usize = 32;
/// Rows a key may be in.
pub const WINDOW: u64 = 8;
/// Longest key a row holds (the rest of a row).
pub const MAX_KEY: usize = 192;
/// Rows the agent lays the table out with: 4096 rows, 1 MiB (a reader
/// takes the count the header gives, at least [`WINDOW`]).
pub const ROWS: u64 = 4096;

// Header words.
/// Rows with a ban (raised, not yet freed by the agent): the request
/// path's one load when nobody is banned.
const H_BANNED: usize = 0;
const H_RAISED: usize = 8;
const H_FULL: usize = 16;
const H_TOO_LONG: usize = 24;
const H_WOULD: usize = 32;

// Row words.
const W_IDENT: usize = 0;
const W_META: usize = 1;
const W_COUNT: usize = 2;
const W_UNTIL: usize = 3;
const W_REPORTED: usize = 4;
const W_AT: usize = 5;
const W_WITHIN: usize = 6;
const W_RAISED_BY: usize = 7;
const W_KEY: usize = 8;

/// Which blacklist dimension a ban is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ip = 1,
    UserId = 2,
}

impl Kind {
    pub fn dimension(self) -> &'static str {
        match self {
            Kind::Ip => "ip",
            Kind::UserId => "userid",
        }
    }
}

/// Bytes of the region (before page rounding).
pub fn region_bytes(capacity: u64) -> u64 {
    HEADER_BYTES + capacity * ROW_BYTES
}

/// Does a region of `len` bytes hold `capacity` rows? (header validation)
pub fn fits(capacity: u64, len: u64) -> bool {
    capacity >= WINDOW
        && capacity
            .checked_mul(ROW_BYTES)
            .and_then(|b| b.checked_add(HEADER_BYTES))
            .is_some_and(|need| need <= len)
}

/// What one rejection did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Counted; `n` rejections in the window so far.
    Counted(u32),
    /// The key's rejections reached `ban_after`: banned until this unix ms
    /// (a dry run: would have been, nobody is banned).
    Banned {
        until_ms: u64,
        count: u32,
    },
    WouldBan {
        count: u32,
    },
    /// No free row in the key's window (counted in the header).
    Full,
    /// A key longer than [`MAX_KEY`] (counted in the header).
    TooLong,
}

/// One row as the agent reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanRow {
    pub index: u64,
    pub ident: u64,
    pub kind: Kind,
    pub strategy_id: u32,
    pub key: Vec<u8>,
    pub banned_until_ms: u64,
    pub banned_at_ms: u64,
    pub reported_until_ms: u64,
    pub count: u32,
}

/// Header counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BanStats {
    pub banned_rows: u64,
    pub raised: u64,
    pub full: u64,
    pub too_long: u64,
    pub would: u64,
}

/// The ban table over its region.
#[derive(Clone, Copy)]
pub struct BanTable<'a> {
    header: Region<'a>,
    rows: &'a [[AtomicU64; ROW_WORDS]],
}

impl<'a> BanTable<'a> {
    /// The table over `region` (header, then whole rows; an empty table if
    /// the region is too small for a window).
    pub fn new(region: Region<'a>) -> BanTable<'a> {
        let header = region.sub(0, HEADER_BYTES).unwrap_or(region);
        let rows = region
            .sub(
                HEADER_BYTES,
                (region.len() as u64).saturating_sub(HEADER_BYTES),
            )
            .map(|r| r.records::<ROW_WORDS>())
            .unwrap_or(&[]);
        let rows = if (rows.len() as u64) < WINDOW {
            &[]
        } else {
            rows
        };
        BanTable { header, rows }
    }

    /// The table of `capacity` rows (the header's) over `region` (page
    /// rounded: it may hold more; every process uses the same rows).
    pub fn with_capacity(region: Region<'a>, capacity: u64) -> BanTable<'a> {
        let mut t = BanTable::new(region);
        let n = (t.rows.len() as u64).min(capacity);
        t.rows = if n < WINDOW {
            &[]
        } else {
            &t.rows[..n as usize]
        };
        t
    }

    pub fn capacity(&self) -> u64 {
        self.rows.len() as u64
    }

    fn hw(&self, off: usize) -> Option<&'a AtomicU64> {
        self.header.u64_at(off)
    }

    fn bump(&self, off: usize, by: i64) {
        if let Some(w) = self.hw(off) {
            w.fetch_add(by as u64, Ordering::Relaxed);
        }
    }

    /// Is any key banned? The request path's first (and, while nobody is,
    /// only) load.
    #[inline(always)]
    pub fn any_banned(&self) -> bool {
        self.hw(H_BANNED)
            .is_some_and(|w| w.load(Ordering::Relaxed) != 0)
    }

    pub fn stats(&self) -> BanStats {
        let l = |o| self.hw(o).map_or(0, |w| w.load(Ordering::Relaxed));
        BanStats {
            banned_rows: l(H_BANNED),
            raised: l(H_RAISED),
            full: l(H_FULL),
            too_long: l(H_TOO_LONG),
            would: l(H_WOULD),
        }
    }

    /// The rows of `ident`'s window, in order.
    fn window(&self, ident: u64) -> impl Iterator<Item = (u64, &'a [AtomicU64; ROW_WORDS])> + 'a {
        let rows = self.rows;
        let n = rows.len() as u64;
        let start = if n == 0 { 0 } else { ((ident >> 32) * n) >> 32 };
        (0..if n == 0 { 0 } else { WINDOW }).map(move |i| {
            let at = (start + i) % n;
            (at, &rows[at as usize])
        })
    }

    /// Does row `row` hold exactly `key` of `kind` (ready)?
    fn holds(row: &[AtomicU64; ROW_WORDS], kind: Kind, key: &[u8]) -> bool {
        let meta = row[W_META].load(Ordering::Acquire);
        if meta == 0 || (meta >> 32) as u8 != kind as u8 || (meta >> 48) as usize != key.len() {
            return false;
        }
        key.chunks(8).enumerate().all(|(i, c)| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            row[W_KEY + i].load(Ordering::Relaxed) == u64::from_le_bytes(w)
        })
    }

    /// Is `key` (hashed to `ident`, see [`ident`]) banned at `now_ms`?
    #[inline]
    pub fn is_banned(&self, ident: u64, kind: Kind, key: &[u8], now_ms: u64) -> bool {
        self.window(ident).any(|(_, row)| {
            row[W_IDENT].load(Ordering::Relaxed) == ident
                && row[W_UNTIL].load(Ordering::Acquire) > now_ms
                && Self::holds(row, kind, key)
        })
    }

    /// The row holding `key`, or a free one claimed for it.
    fn row_for(
        &self,
        ident: u64,
        kind: Kind,
        key: &[u8],
        strategy_id: u32,
    ) -> Option<&'a [AtomicU64; ROW_WORDS]> {
        if let Some((_, row)) = self.window(ident).find(|(_, row)| {
            row[W_IDENT].load(Ordering::Relaxed) == ident && Self::holds(row, kind, key)
        }) {
            return Some(row);
        }
        for (_, row) in self.window(ident) {
            if row[W_IDENT]
                .compare_exchange(0, ident, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                for w in &row[W_COUNT..ROW_WORDS] {
                    w.store(0, Ordering::Relaxed);
                }
                for (i, c) in key.chunks(8).enumerate() {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    row[W_KEY + i].store(u64::from_le_bytes(w), Ordering::Relaxed);
                }
                row[W_META].store(
                    strategy_id as u64 | (kind as u64) << 32 | (key.len() as u64) << 48,
                    Ordering::Release,
                );
                return Some(row);
            }
        }
        None
    }

    /// Counts one rejection of `key` by strategy `strategy_id` with penalty
    /// box `ban` at `now_ms`; bans the key when its rejections reach
    /// `ban.after` within `ban.within_s` (unless `dry_run`: then only
    /// "would ban", and the count starts over).
    #[allow(clippy::too_many_arguments)]
    pub fn count(
        &self,
        ident: u64,
        kind: Kind,
        key: &[u8],
        strategy_id: u32,
        ban: &crate::core::model::ban::Ban,
        dry_run: bool,
        now_ms: u64,
    ) -> Counted {
        if key.len() > MAX_KEY {
            self.bump(H_TOO_LONG, 1);
            return Counted::TooLong;
        }
        let Some(row) = self.row_for(ident, kind, key, strategy_id) else {
            self.bump(H_FULL, 1);
            return Counted::Full;
        };
        let now_s = now_ms / 1000;
        row[W_WITHIN].store(ban.within_s as u64, Ordering::Relaxed);
        let w = &row[W_COUNT];
        let mut cur = w.load(Ordering::Relaxed);
        let count = loop {
            let (start, n) = (cur >> 32, cur as u32);
            let (start, n) = if now_s.saturating_sub(start) >= ban.within_s as u64 || n == 0 {
                (now_s, 1)
            } else {
                (start, n.saturating_add(1))
            };
            let next = if n >= ban.after {
                0
            } else {
                start << 32 | n as u64
            };
            match w.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break n,
                Err(c) => cur = c,
            }
        };
        if count < ban.after {
            return Counted::Counted(count);
        }
        if dry_run {
            self.bump(H_WOULD, 1);
            return Counted::WouldBan { count };
        }
        let until = now_ms.saturating_add(ban.for_s as u64 * 1000);
        row[W_AT].store(now_ms, Ordering::Relaxed);
        row[W_RAISED_BY].store(count as u64, Ordering::Relaxed);
        row[W_META].fetch_and(!0xFFFF_FFFF, Ordering::Relaxed);
        row[W_META].fetch_or(strategy_id as u64, Ordering::Release);
        let prev = row[W_UNTIL].fetch_max(until, Ordering::AcqRel);
        if prev == 0 {
            self.bump(H_BANNED, 1);
        }
        self.bump(H_RAISED, 1);
        Counted::Banned {
            until_ms: until,
            count,
        }
    }

    /// Rows holding a ban (in force or ended, not yet freed), for the agent.
    pub fn banned_rows(&self) -> Vec<BanRow> {
        let mut out = Vec::new();
        for (i, row) in self.rows.iter().enumerate() {
            let ident = row[W_IDENT].load(Ordering::Acquire);
            let until = row[W_UNTIL].load(Ordering::Acquire);
            if ident == 0 || until == 0 {
                continue;
            }
            let meta = row[W_META].load(Ordering::Acquire);
            let kind = match (meta >> 32) as u8 {
                1 => Kind::Ip,
                2 => Kind::UserId,
                _ => continue, // not ready, or garbage
            };
            let len = (meta >> 48) as usize;
            if len == 0 || len > MAX_KEY {
                continue;
            }
            let mut key = Vec::with_capacity(len);
            for w in &row[W_KEY..W_KEY + len.div_ceil(8)] {
                key.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
            key.truncate(len);
            out.push(BanRow {
                index: i as u64,
                ident,
                kind,
                strategy_id: meta as u32,
                key,
                banned_until_ms: until,
                banned_at_ms: row[W_AT].load(Ordering::Relaxed),
                reported_until_ms: row[W_REPORTED].load(Ordering::Relaxed),
                count: row[W_RAISED_BY].load(Ordering::Relaxed) as u32,
            });
        }
        out
    }

    /// The agent wrote row `index`'s ban (until `until_ms`) to the store.
    pub fn set_reported(&self, index: u64, ident: u64, until_ms: u64) {
        if let Some(row) = self.rows.get(index as usize) {
            if row[W_IDENT].load(Ordering::Acquire) == ident {
                row[W_REPORTED].fetch_max(until_ms, Ordering::Relaxed);
            }
        }
    }

    /// Lifts the ban of row `index` if it still holds `ident` (its store
    /// entry was removed, or it ended) and frees the row.
    pub fn lift(&self, index: u64, ident: u64) -> bool {
        let Some(row) = self.rows.get(index as usize) else {
            return false;
        };
        if row[W_IDENT].load(Ordering::Acquire) != ident {
            return false;
        }
        if row[W_UNTIL].swap(0, Ordering::AcqRel) != 0 {
            self.bump(H_BANNED, -1);
        }
        self.free_row(row, ident)
    }

    fn free_row(&self, row: &[AtomicU64; ROW_WORDS], ident: u64) -> bool {
        // Readers compare the ident first and the key bytes after: the
        // meta word (not ready) goes before the ident frees the row.
        row[W_META].store(0, Ordering::Release);
        row[W_COUNT].store(0, Ordering::Relaxed);
        row[W_IDENT]
            .compare_exchange(ident, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Frees the rows nothing needs any more: no ban (or one that ended,
    /// and was reported) and a count window that is over. Returns how many.
    pub fn sweep(&self, now_ms: u64) -> u64 {
        let mut freed = 0;
        let now_s = now_ms / 1000;
        for row in self.rows {
            let ident = row[W_IDENT].load(Ordering::Acquire);
            if ident == 0 || row[W_META].load(Ordering::Acquire) == 0 {
                continue;
            }
            let until = row[W_UNTIL].load(Ordering::Acquire);
            if until > now_ms {
                continue;
            }
            let c = row[W_COUNT].load(Ordering::Relaxed);
            let within = row[W_WITHIN].load(Ordering::Relaxed);
            if c != 0 && now_s.saturating_sub(c >> 32) < within {
                continue;
            }
            if until != 0
                && row[W_UNTIL]
                    .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                self.bump(H_BANNED, -1);
            }
            if self.free_row(row, ident) {
                freed += 1;
            }
        }
        freed
    }

    /// Empties the table (a file adopted from another boot).
    pub fn clear(&self) {
        for row in self.rows {
            for w in row {
                w.store(0, Ordering::Relaxed);
            }
        }
        if let Some(w) = self.hw(H_BANNED) {
            w.store(0, Ordering::Relaxed);
        }
    }
}

/// The ident of a key: the file's keyed hash (`hasher`: the key table's,
/// for strategy id 0, which no strategy has) over the kind and the key
/// bytes, bit 0 set so that it is never 0.
#[inline]
pub fn ident(mut hasher: crate::core::keys::KeyHasher, kind: Kind, key: &[u8]) -> u64 {
    hasher.part(&[kind as u8]);
    hasher.part(key);
    hasher.finish() | 1
}

/// The blacklist value of a row's key: an `ip` prefix's text (an address,
/// or a network when aggregated), a `userid` as it was (lossy UTF-8: the
/// store takes text; a value that is not UTF-8 is not written).
pub fn key_text(kind: Kind, key: &[u8]) -> Option<String> {
    match kind {
        Kind::Ip => {
            let (addr, prefix): (std::net::IpAddr, u8) = match key {
                [4, a, b, c, d, p] => (std::net::Ipv4Addr::new(*a, *b, *c, *d).into(), *p),
                [6, rest @ ..] if rest.len() == 17 => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&rest[..16]);
                    (std::net::Ipv6Addr::from(o).into(), rest[16])
                }
                _ => return None,
            };
            let p = crate::core::keys::IpPrefix::new(addr, prefix, prefix);
            Some(p.to_string())
        }
        Kind::UserId => std::str::from_utf8(key).ok().map(str::to_string),
    }
}

#[cfg(test)]
mod tests;
