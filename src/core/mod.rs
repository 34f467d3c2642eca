//! The nginx-free core: strategy model, shared-memory layout, writer and
//! reader, matcher, limiters and blacklist. Used by the nginx module
//! (`src/module`) and by the `rate-ctl` binary (`src/main.rs`).

pub mod admit;
pub mod bans;
pub mod blacklist;
pub mod calendar;
pub mod clock;
pub mod escape;
pub mod fuzz;
pub mod headers;
pub mod key_ops;
pub mod keys;
pub mod limiter;
pub mod model;
pub mod normalise;
pub mod pattern;
pub mod response;
pub mod shm;
pub mod stats;
pub mod table;
#[cfg(test)]
pub(crate) mod test_rng;
pub mod tuple_map;
pub mod value_map;
