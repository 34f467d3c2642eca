//! One key of a published strategy in a mapped file (issue 33): the glue
//! of `rate-ctl shm key` and the agent's readings and resets between the
//! file's active table (the strategy's `each`, slot and generation) and the
//! key table's bounded read and reset ([`super::keys::read`]). Apart from
//! `keys/` so that the key table does not depend on the mapping that holds
//! it.

use super::keys::read::{key_text, parse_key, KeyReading, KeyTextError};
use super::keys::{KeyId, KeyLimiter};
use super::limiter::Now;
use super::shm::segment::Published;
use super::shm::Mapping;

/// A key of a published strategy, parsed and located in `map`'s table:
/// its text as `$rate_ctl_key` prints it, the key and the strategy's
/// per-key limiter.
pub fn locate(
    map: &Mapping,
    p: &Published,
    text: &str,
) -> Result<(String, KeyId, KeyLimiter), KeyTextError> {
    let e = &p.strategy.each;
    let parts = parse_key(text, &e.dims, e.ipv4_prefix, e.ipv6_prefix)?;
    let lim = KeyLimiter::from_strategy(&p.strategy)
        .ok_or_else(|| KeyTextError("the strategy's algorithm has no per-key state".into()))?;
    let kt = map.keys();
    let key = kt
        .key_of(p.strategy.id, p.slot, p.generation, &parts)
        .ok_or_else(|| KeyTextError("the file has no key table for this strategy".into()))?;
    Ok((key_text(&parts, &e.dims), key, lim))
}

/// Reads `text`'s key of the published strategy `p` in `map` at `now`.
pub fn read_published(
    map: &Mapping,
    p: &Published,
    text: &str,
    now: Now,
) -> Result<(String, KeyReading), KeyTextError> {
    let (canonical, key, lim) = locate(map, p, text)?;
    Ok((canonical, map.keys().read_key(&key, &lim, now)))
}

/// Resets `text`'s key of the published strategy `p` in `map`; `true`
/// when its state changed.
pub fn reset_published(map: &Mapping, p: &Published, text: &str) -> Result<bool, KeyTextError> {
    let (_, key, lim) = locate(map, p, text)?;
    Ok(map.keys().reset_key(&key, &lim))
}

/// The top keys of the published strategy `p` in `map`, of the current
/// or the previous minute ([`super::keys::top::TopKeys::read`]).
pub fn top_of(map: &Mapping, p: &Published) -> Vec<super::keys::top::TopEntry> {
    let minute = super::clock::unix_ms() / 60_000;
    map.top().read(p.slot, p.generation, minute)
}
