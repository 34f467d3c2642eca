//! The fleet's shared rates: what `cluster` strategies give each host.
//!
//! Used by the agent (its local rates, its leases, and as a candidate
//! leader when it reaches the store directly) and by `rate-ctl serve` (which
//! always runs the leader loop), so it sits below both and names neither
//! (tests/layering.rs checks it):
//!
//! * [`rates`] — the static split: this host's share of a cluster rate by
//!   weight among fresh hosts.
//! * [`lease`] — the demand-aware allocator: pure computation over the
//!   hosts' reports, no store, no clock.
//! * [`leader`] — the leader's loop around the allocator: reads reports
//!   from the store, writes the leases back, one leader at a time.

pub mod leader;
pub mod lease;
pub mod rates;
