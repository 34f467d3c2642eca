//! The nginx-free core: strategy model, shared-memory layout, writer and
//! reader, matcher, limiters and blacklist. Used by the nginx module
//! (`src/module`) and by the `rate-ctl` binary (`src/cli`).

pub mod blacklist;
pub mod model;
pub mod region;
pub mod slot;
