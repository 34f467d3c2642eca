//! The shared-memory file: header, geometry, mapping and validation
//! (`header.rs`, `map.rs`, `error.rs`), and the parts that live in it:
//! segments, slots, the ledger, the writer and the reader.
//!
//! The byte-by-byte layout is documented in `docs/SHM-LAYOUT.md`; the
//! constants here are the source of truth and a test checks the document
//! against them. Everything read from the file is untrusted: the header's
//! geometry is validated against the real file size before any region is
//! used, and every later access goes through a bounds-checked [`Region`](region::Region).

pub mod calendar_block;
pub mod ledger;
pub mod loader;
pub mod reader;
pub mod region;
pub mod segment;
pub mod segment_ban;
pub mod segment_diff;
pub mod sigbus;
pub mod slot;
pub mod writer;

pub mod error;
mod header;
mod map;
mod owner;

pub use error::ShmError;
pub use header::*;
pub use map::*;
pub use owner::{uid_of, user_name};
