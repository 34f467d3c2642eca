//! Reading and resetting one key from outside the request path (issue 33):
//! `rate-ctl shm key`, the agent's answers to the fleet view and its
//! resets.
//!
//! A key is named as `$rate_ctl_key` prints it: `name=value` parts in the
//! strategy's `each` order, separated by `,` (`ip=203.0.113.0/24,userid=u1`);
//! a strategy with one dimension also takes the bare value (`203.0.113.7`).
//! An `ip` value is an address, with or without a prefix length, and is
//! aggregated to the strategy's prefixes as the module does; a text value
//! takes the escapes `$rate_ctl_key` writes (`\\`, `\xNN`). The key is then
//! hashed with the file's secret ([`KeyTable::hasher`]) exactly as a
//! request's, and looked up in its [`PROBE`](super::PROBE) entries: the read
//! is bounded (at most 48 entries, no allocation from the file), and any
//! word the file holds gives an answer (the limiters' arithmetic saturates).

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use super::super::limiter::Now;
use super::{IpPrefix, KeyId, KeyLimiter, KeyTable, PROBE};

/// Longest key text accepted (bytes).
pub const MAX_KEY_TEXT: usize = 4096;

/// One part of a key, in the strategy's `each` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    Ip(IpPrefix),
    Value(Vec<u8>),
}

/// Why a key text does not name a key of the strategy (the message names
/// the part).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key: {0}")]
pub struct KeyTextError(pub String);

/// Parses `text` as a key of a strategy whose `each` dimensions are `dims`
/// with prefixes `v4`/`v6`.
pub fn parse_key(
    text: &str,
    dims: &[String],
    v4: u8,
    v6: u8,
) -> Result<Vec<KeyPart>, KeyTextError> {
    fn err<T>(m: String) -> Result<T, KeyTextError> {
        Err(KeyTextError(m))
    }
    if dims.is_empty() {
        return err("the strategy has no `each`: it keeps no per-key state".into());
    }
    if text.is_empty() {
        return err("empty".into());
    }
    if text.len() > MAX_KEY_TEXT {
        return err(format!("longer than {MAX_KEY_TEXT} bytes"));
    }
    // The value of each dimension: a `name=` prefix at the start and after
    // the previous value's `,` (values may hold commas: the next part is
    // found by its name, and the last part takes the rest).
    let mut values: Vec<&str> = Vec::with_capacity(dims.len());
    let named = text.starts_with(&format!("{}=", dims[0]));
    if !named {
        if dims.len() > 1 {
            return err(format!(
                "give every part as name=value, in the strategy's order: {}",
                dims.iter()
                    .map(|d| format!("{d}=…"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        values.push(text);
    } else {
        let mut rest = text;
        for (i, d) in dims.iter().enumerate() {
            let head = format!("{d}=");
            let Some(after) = rest.strip_prefix(head.as_str()) else {
                return err(format!(
                    "expected `{d}=` at `{}`",
                    crate::core::escape::escape_bytes(rest.as_bytes(), 64)
                ));
            };
            match dims.get(i + 1) {
                Some(next) => {
                    let sep = format!(",{next}=");
                    let Some(at) = after.find(sep.as_str()) else {
                        return err(format!("missing part `{next}=`"));
                    };
                    values.push(&after[..at]);
                    rest = &after[at + 1..];
                }
                None => values.push(after),
            }
        }
    }
    dims.iter()
        .zip(values)
        .map(|(d, v)| {
            if v.is_empty() {
                return Err(KeyTextError(format!(
                    "`{d}` is empty (an empty value is never counted)"
                )));
            }
            if d == "ip" {
                let addr = v.split_once('/').map_or(v, |(a, _)| a);
                let addr: IpAddr = addr.parse().map_err(|_| {
                    KeyTextError(format!(
                        "`ip`: not an address: `{}`",
                        crate::core::escape::escape_bytes(v.as_bytes(), 64)
                    ))
                })?;
                if let Some((_, p)) = v.split_once('/') {
                    let max = if addr.is_ipv4() { 32 } else { 128 };
                    if !p.parse::<u8>().is_ok_and(|p| p <= max) {
                        return Err(KeyTextError(format!(
                            "`ip`: bad prefix length `/{}`",
                            crate::core::escape::escape_bytes(p.as_bytes(), 16)
                        )));
                    }
                }
                Ok(KeyPart::Ip(IpPrefix::new(addr, v4, v6)))
            } else {
                unescape(v)
                    .map(KeyPart::Value)
                    .ok_or_else(|| KeyTextError(format!("`{d}`: bad escape (only \\\\ and \\xNN)")))
            }
        })
        .collect()
}

/// Undoes [`crate::core::escape::push_escaped`]: `\\` and `\xNN`.
fn unescape(v: &str) -> Option<Vec<u8>> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1)? {
            b'\\' => {
                out.push(b'\\');
                i += 2;
            }
            b'x' => {
                let hex = std::str::from_utf8(b.get(i + 2..i + 4)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The key's text as `$rate_ctl_key` prints it (addresses aggregated).
pub fn key_text(parts: &[KeyPart], dims: &[String]) -> String {
    let mut out = String::new();
    for (d, p) in dims.iter().zip(parts) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(d);
        out.push('=');
        match p {
            KeyPart::Ip(ip) => out.push_str(&ip.to_string()),
            KeyPart::Value(v) => {
                crate::core::escape::push_escaped(&mut out, v, crate::core::escape::LOG_VALUE_MAX)
            }
        }
    }
    out
}

/// One key's state as read from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyReading {
    /// The key has an entry (else: a new key's state, nothing used).
    pub found: bool,
    /// Requests per window / the burst / the in-flight limit.
    pub limit: u64,
    pub used: u64,
    pub remaining: u64,
    /// Until the quota is full again (a fixed window: until it ends).
    pub reset_ms: u64,
    /// `concurrency`: requests in flight now.
    pub in_flight: Option<u64>,
}

impl KeyTable<'_> {
    /// The key of strategy `strategy_id` (in stat slot `slot` at
    /// `generation`) whose parts are `parts`; `None` when the table cannot
    /// hold it (no table, or a slot past [`super::MAX_SLOT`]).
    pub fn key_of(
        &self,
        strategy_id: u32,
        slot: u32,
        generation: u64,
        parts: &[KeyPart],
    ) -> Option<KeyId> {
        let mut h = self.hasher(strategy_id);
        for p in parts {
            match p {
                KeyPart::Ip(ip) => ip.hash_into(&mut h),
                KeyPart::Value(v) => h.part(v),
            }
        }
        self.key(h, slot, generation)
    }

    /// The state of `key` under `lim` at `now` (a bounded read of its
    /// probe entries).
    pub fn read_key(&self, key: &KeyId, lim: &KeyLimiter, now: Now) -> KeyReading {
        let word = if self.capacity == 0 {
            None
        } else {
            self.peek(key)
        };
        let q = lim.quota(word.unwrap_or(0), lim.clock(now));
        KeyReading {
            found: word.is_some(),
            limit: q.limit,
            used: q.limit.saturating_sub(q.remaining),
            remaining: q.remaining,
            reset_ms: q.reset_ns.div_ceil(1_000_000),
            in_flight: lim.is_concurrency().then(|| word.unwrap_or(0)),
        }
    }

    /// Resets `key` to a new key's state (the word 0), keeping its entry;
    /// `concurrency` keys keep their units in flight (their requests
    /// still end and give them back). `true` when a word was changed.
    pub fn reset_key(&self, key: &KeyId, lim: &KeyLimiter) -> bool {
        if self.capacity == 0 || !self.usable() || lim.is_concurrency() {
            return false;
        }
        for p in 0..PROBE {
            let i = self.at(key, p);
            // A word may change under us: retry a few times, then give up
            // (a table under such contention is reset again next round).
            for _ in 0..64 {
                let (ident, st) = self.load(i);
                if ident != key.ident {
                    break;
                }
                if st == 0 {
                    return false;
                }
                if self.cas(i, [ident, st], [ident, 0]).is_ok() {
                    return true;
                }
            }
            if self.entry(i).load(Ordering::Acquire) == key.ident {
                return false;
            }
        }
        false
    }
}

/// Both clocks now (a reading outside the request path).
pub fn now() -> Now {
    Now {
        mono_ns: super::super::clock::MonotonicClock::now(),
        wall_ns: super::super::clock::unix_ns(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::keys::{aligned, Charge};
    use crate::core::model::{Action, Algorithm, Strategy, Unit};
    use crate::core::shm::slot::{LocalSlots, Slot};

    const S: u64 = 1_000_000_000;

    fn dims(d: &[&str]) -> Vec<String> {
        d.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_variable_syntax() {
        let ip = dims(&["ip"]);
        let p = parse_key("203.0.113.7", &ip, 24, 64).unwrap();
        assert_eq!(key_text(&p, &ip), "ip=203.0.113.0/24");
        assert_eq!(parse_key("ip=203.0.113.0/24", &ip, 24, 64).unwrap(), p);
        let two = dims(&["ip", "userid"]);
        let p = parse_key("ip=10.0.0.1,userid=a,b\\x01\\\\", &two, 32, 128).unwrap();
        assert_eq!(p[1], KeyPart::Value(b"a,b\x01\\".to_vec()));
        assert_eq!(key_text(&p, &two), "ip=10.0.0.1,userid=a,b\\x01\\\\");
        for (bad, names) in [
            ("10.0.0.1", "name=value"),
            ("ip=10.0.0.1", "missing part `userid=`"),
            ("userid=u,ip=1.2.3.4", "in the strategy's order"),
            ("ip=10.0.0.300,userid=u", "not an address"),
            ("ip=10.0.0.1/33,userid=u", "prefix length"),
            ("ip=10.0.0.1,userid=", "`userid` is empty"),
            ("ip=10.0.0.1,userid=\\q", "bad escape"),
            ("ip=10.0.0.1,userid=\\x4", "bad escape"),
        ] {
            let e = parse_key(bad, &two, 32, 128).unwrap_err().0;
            assert!(e.contains(names), "{bad}: {e}");
        }
        assert!(parse_key("", &ip, 32, 128).is_err());
        assert!(parse_key(&"x".repeat(MAX_KEY_TEXT + 1), &dims(&["u"]), 32, 128).is_err());
        assert!(parse_key("x", &[], 32, 128)
            .unwrap_err()
            .0
            .contains("no `each`"));
    }

    fn limiter(algorithm: Algorithm, rate: u64, per: Unit) -> KeyLimiter {
        let s = Strategy::unconditioned(algorithm, rate, per, 1, Action::Reject { status: None })
            .unwrap();
        KeyLimiter::from_strategy(&s).unwrap()
    }

    #[test]
    fn reads_what_requests_charged_and_resets_it() {
        let slots = LocalSlots::new(4);
        Slot::at(&slots.region(), 1).unwrap().reset(9, 3);
        let words = KeyTable::local_words(4, 1024);
        let t = KeyTable::local(aligned(&words), 4, 1024, [3; 16]);
        let lim = limiter(Algorithm::FixedWindow, 5, Unit::Day);
        let ip = dims(&["ip"]);
        let parts = parse_key("192.0.2.1", &ip, 32, 128).unwrap();
        let k = t.key_of(9, 1, 3, &parts).unwrap();
        // The same key a request hashes.
        let mut h = t.hasher(9);
        h.ip(0xffff_c000_0201, 32, 128);
        assert_eq!(t.key(h, 1, 3), Some(k));
        let now = Now::from(1_700_000_000 * S);
        let fresh = t.read_key(&k, &lim, now);
        assert_eq!((fresh.found, fresh.used, fresh.remaining), (false, 0, 5));
        for _ in 0..3 {
            let c = t.charge(&k, &lim, now, false, &slots.region(), |_| Some(&lim));
            assert!(matches!(c, Charge::Admitted { .. }), "{c:?}");
        }
        let r = t.read_key(&k, &lim, now);
        assert_eq!((r.found, r.limit, r.used, r.remaining), (true, 5, 3, 2));
        assert!(r.reset_ms > 0 && r.reset_ms <= 86_400_000, "{r:?}");
        assert_eq!(r.in_flight, None);
        // Another key of the same strategy is untouched; reset restores 5.
        let other = t
            .key_of(9, 1, 3, &parse_key("192.0.2.2", &ip, 32, 128).unwrap())
            .unwrap();
        assert!(!t.reset_key(&other, &lim));
        assert!(t.reset_key(&k, &lim));
        let r = t.read_key(&k, &lim, now);
        assert_eq!((r.found, r.used, r.remaining), (true, 0, 5));
        assert!(!t.reset_key(&k, &lim), "nothing left to reset");
        // Concurrency: in flight is read, never reset.
        let cc = limiter(Algorithm::Concurrency, 2, Unit::Second);
        let c = t.charge(&other, &cc, now, false, &slots.region(), |_| Some(&cc));
        assert!(matches!(c, Charge::Admitted { .. }));
        let r = t.read_key(&other, &cc, now);
        assert_eq!((r.in_flight, r.used, r.remaining), (Some(1), 1, 1));
        assert!(!t.reset_key(&other, &cc));
    }

    /// A file whose entries hold anything: the read names no entry but the
    /// key's own, never panics (overflow checks are on in tests) and stays
    /// within the key's probe entries.
    #[test]
    fn a_hostile_table_gives_bounded_answers() {
        let words = KeyTable::local_words(2, 64);
        let t = KeyTable::local(aligned(&words), 2, 64, [1; 16]);
        let parts = parse_key("u1", &dims(&["user"]), 32, 128).unwrap();
        let k = t.key_of(5, 0, 1, &parts).unwrap();
        let lims = [
            limiter(Algorithm::FixedWindow, 5, Unit::Day),
            limiter(Algorithm::SlidingWindow, 5, Unit::Minute),
            limiter(Algorithm::TokenBucket, 5, Unit::Second),
            limiter(Algorithm::Concurrency, 5, Unit::Second),
        ];
        let mut seed = 0x1234_5678_9abc_def0u64;
        for round in 0..2000u64 {
            for w in aligned(&words) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let v = match round % 4 {
                    0 => u64::MAX,
                    1 => seed,
                    _ => seed % 7,
                };
                w.store(v, Ordering::Relaxed);
            }
            // Plant the key's ident at a random probe entry.
            let p = seed % PROBE;
            let i = t.at(&k, p);
            t.words(i)[0].store(k.ident, Ordering::Relaxed);
            for lim in &lims {
                for now in [0, 1, u64::MAX / 2, u64::MAX] {
                    let r = t.read_key(&k, lim, Now::from(now));
                    assert!(r.found);
                    assert!(r.remaining <= r.limit && r.used <= r.limit, "{r:?}");
                }
                let _ = t.reset_key(&k, lim);
            }
        }
        // A table of no entries answers "not found".
        let t0 = KeyTable::local(aligned(&words), 2, 0, [1; 16]);
        assert!(t0.key_of(5, 0, 1, &parts).is_none());
    }
}
