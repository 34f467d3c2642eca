//! rate_ctl: dynamic, fine-grained rate control for nginx.
//!
//! * [`core`] — nginx-free: model, shared-memory layout, matcher, limiters,
//!   blacklist. Used by the module and the agent.
//! * `module` (feature `module`) — the nginx dynamic module glue; all FFI
//!   `unsafe` lives there.

pub mod core;
