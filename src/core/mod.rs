//! The nginx-free core: strategy model, shared-memory layout, writer and
//! reader, matcher, limiters and blacklist. Used by the nginx module
//! (`src/module`) and by the `rate-ctl` binary (`src/main.rs`).

pub mod admit;
pub mod blacklist;
pub mod clock;
pub mod each;
pub mod escape;
pub mod fuzz;
pub mod headers;
pub mod ipnet;
pub mod keys;
pub mod keyword;
pub mod ledger;
pub mod limiter;
pub mod loader;
pub mod model;
pub mod normalise;
pub mod pattern;
pub mod reader;
pub mod region;
pub mod response;
pub mod segment;
pub mod shm;
pub mod sigbus;
pub mod slot;
pub mod stats;
pub mod table;
pub mod tuple_map;
pub mod value_map;
pub mod writer;
