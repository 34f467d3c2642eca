//! The request and its values: what the matcher reads of a request (its
//! values by dimension index, its client address, its clock and mode) and
//! the outcome it gets.

use std::net::IpAddr;

use smallvec::SmallVec;

use crate::core::admit::{Decision, Verdict};
use crate::core::clock;
use crate::core::model::parse_ip;

/// A request's value of each of [`Table::dimensions`], by index, read only
/// for the dimensions the table looks up (a slice in tests and tools; the
/// nginx module reads each one from the request when asked, so a request
/// never collects values no strategy names). An empty value is absent.
pub trait Values {
    fn value(&self, dim: usize) -> Option<&[u8]>;

    /// [`value`](Self::value), for a caller out of line that reads one
    /// value (a negation's check): a reader whose `value` keeps part of
    /// its work out of line (the module's) may inline all of it here.
    #[inline(always)]
    fn value_inline(&self, dim: usize) -> Option<&[u8]> {
        self.value(dim)
    }

    /// Whether the value of `dim` differs from `not`, an absent (or
    /// empty) value differing from every value: a negation's check, out
    /// of line and once per request like
    /// [`value_inline`](Self::value_inline). A reader may compare in
    /// place without finding the whole value (the module's `$arg`).
    #[inline(always)]
    fn differs(&self, dim: usize, not: &[u8]) -> bool {
        value_differs(self.value_inline(dim), not)
    }
}

/// Whether `v`, a value read (`None` when absent), differs from `not`: an
/// absent or empty value differs from every value (a negation's rule).
#[inline(always)]
pub fn value_differs(v: Option<&[u8]>, not: &[u8]) -> bool {
    match v {
        Some(v) if !v.is_empty() => !crate::core::value_map::bytes_eq_inline(v, not),
        _ => true,
    }
}

impl Values for [Option<&[u8]>] {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self.get(dim).copied().flatten()
    }
}

impl<const N: usize> Values for [Option<&[u8]>; N] {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self[..].value(dim)
    }
}

impl Values for Vec<Option<&[u8]>> {
    #[inline]
    fn value(&self, dim: usize) -> Option<&[u8]> {
        self[..].value(dim)
    }
}

/// What a request carries: its values for [`Table::dimensions`], by index,
/// and its client address (matched for `ip` and looked up in the
/// blacklist; without one, an `ip` text value is parsed).
pub struct Request<'r, V: Values + ?Sized = [Option<&'r [u8]>]> {
    pub values: &'r V,
    pub ip: Option<IpKey>,
    /// Monotonic time (buckets, concurrency).
    pub now_ns: u64,
    /// Wall-clock time (blacklist expiry; fixed and sliding windows, which
    /// are aligned to UTC).
    pub now_unix_ms: u64,
    /// Location-level dry run: count and report, never reject or delay.
    pub dry_run: bool,
    /// Compute the tightest quota (for `RateLimit-*` headers).
    pub quota: bool,
}

impl<V: Values + ?Sized> Request<'_, V> {
    /// Both clocks for admission: buckets on `now_ns`, windows on the wall
    /// clock (see [`clock::Now`]).
    #[inline]
    pub(crate) fn now(&self) -> clock::Now {
        clock::Now {
            mono_ns: self.now_ns,
            wall_ns: self.now_unix_ms.saturating_mul(1_000_000),
        }
    }
}

/// The outcome for one request. `D` is where the decision of a request
/// that matched is: in the outcome ([`Table::decide_into`]), or `()` when
/// it was written to the caller's place ([`Table::decide_in`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome<D = Decision> {
    /// No strategy matched.
    NoMatch,
    /// The blacklist holds the client address (`None`) or the request's
    /// value of this dimension (`Some(index)`).
    Blacklisted { dimension_index: Option<usize> },
    /// Strategies matched; see the decision.
    Limited(D),
    /// An `allow` strategy (this id) at the highest priority the request
    /// matched: it passes unlimited, counted as passed by that strategy
    /// only.
    Allowed { id: u32 },
}

/// A decision plus what is needed to release concurrency slots later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDecision {
    pub outcome: RequestOutcome,
    /// Indexes (into the table) of concurrency strategies this request
    /// holds; release them with [`Table::release`] when it ends.
    pub held: SmallVec<[u32; 2]>,
}

impl TableDecision {
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.outcome {
            RequestOutcome::Limited(d) => Some(&d.verdict),
            _ => None,
        }
    }
}

/// A client address as the matcher keys it: the IPv6 form, IPv4 as
/// v4-mapped (the model's canonical text writes a v4-mapped address as plain
/// IPv4, so both spellings meet here). A `u128` moves in two registers,
/// where an `IpAddr` is copied byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpKey(pub u128);

impl IpKey {
    /// An IPv4 address given as its 32-bit value (host order).
    #[inline]
    pub fn v4(addr: u32) -> IpKey {
        IpKey(0xffff_0000_0000 | u128::from(addr))
    }

    /// Parses an address in text (`1.2.3.4`, `::1`, `::ffff:1.2.3.4`).
    pub fn parse(text: &[u8]) -> Option<IpKey> {
        parse_ip(text).map(IpKey::from)
    }

    /// The address, v4-mapped IPv6 given back as IPv4.
    pub fn addr(self) -> IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }
}

impl From<IpAddr> for IpKey {
    #[inline]
    fn from(ip: IpAddr) -> IpKey {
        match ip {
            IpAddr::V4(a) => IpKey::v4(u32::from(a)),
            IpAddr::V6(a) => IpKey(u128::from(a)),
        }
    }
}
