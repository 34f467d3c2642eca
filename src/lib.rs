//! rate_ctl: dynamic, fine-grained rate control for nginx.
//!
//! This library is what the nginx module and the `rate-ctl` binary share:
//!
//! * [`core`] — nginx-free: strategy model, shared-memory layout, writer and
//!   reader, matcher, limiters, blacklist, stats rendering. Used by the
//!   module, the binary's agent, the tests, benches, fuzz targets and the
//!   t-nginx table tool.
//! * `module` (feature `module`) — the nginx dynamic module glue; all nginx
//!   FFI lives there. Every `unsafe` block carries a `// SAFETY:` comment
//!   (Cargo.toml's `[lints]` deny it otherwise).
//!
//! The binary's own modules (agent, store, serve, client, cli) are declared
//! in `src/main.rs`; docs/ARCHITECTURE.md maps all of them.

pub mod core;
#[cfg(feature = "module")]
mod module;

// The directive parsers are nginx-free: test them in the ordinary build too.
// Items only the nginx glue uses are dead here.
#[cfg(all(test, not(feature = "module")))]
#[allow(dead_code)]
#[path = "module/parse.rs"]
mod module_parse;

// The module's allocator is nginx-free too: its unit tests run here.
#[cfg(all(test, not(feature = "module")))]
#[path = "module/alloc.rs"]
mod module_alloc;
