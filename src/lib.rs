//! rate_ctl: dynamic, fine-grained rate control for nginx.
//!
//! * [`core`] — nginx-free: model, shared-memory layout, matcher, limiters,
//!   blacklist. Used by the module and the agent.
//! * `module` (feature `module`) — the nginx dynamic module glue; all FFI
//!   `unsafe` lives there.

pub mod core;
#[cfg(feature = "module")]
mod module;

// The directive parsers are nginx-free: test them in the ordinary build too.
// Items only the nginx glue uses are dead here.
#[cfg(all(test, not(feature = "module")))]
#[allow(dead_code)]
#[path = "module/parse.rs"]
mod module_parse;
