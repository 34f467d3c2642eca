//! The per-key fields in a segment's strategy record: after the
//! conditions, for a strategy with `each` only (a strategy without it
//! writes nothing, so its record is as before):
//!
//! | size | field |
//! |---:|---|
//! | 1 | `each` count (1–4; 0 or the record's end: no `each`) |
//! | 1 | `ipv4_prefix` |
//! | 1 | `ipv6_prefix` |
//! | 1 | `on_full`: 1 overflow, 2 reject, 3 allow |
//! | … | each name: `u8` length, bytes |
//! | 4 | `max_keys` (`u32` LE; 0 or past the record's end: the default share of the table) |

use crate::core::model::each::{Each, OnFull};

pub fn encode(e: &Each, out: &mut Vec<u8>) {
    if !e.is_keyed() {
        return;
    }
    out.push(e.dims.len() as u8);
    out.push(e.ipv4_prefix);
    out.push(e.ipv6_prefix);
    out.push(e.on_full as u8);
    for d in &e.dims {
        out.push(d.len() as u8);
        out.extend_from_slice(d.as_bytes());
    }
    out.extend_from_slice(&e.max_keys.to_le_bytes());
}

/// Reads the fields from the rest of a record (zero padding included);
/// the model checks the values afterwards.
pub fn decode(rest: &[u8]) -> Result<Each, &'static str> {
    let n = rest.first().copied().unwrap_or(0) as usize;
    if n == 0 {
        return Ok(Each::default());
    }
    let [_, v4, v6, on_full, ref names @ ..] = *rest else {
        return Err("each: truncated");
    };
    let on_full = OnFull::from_u8(on_full).ok_or("each: unknown on_full")?;
    let mut dims = Vec::with_capacity(n.min(crate::core::model::each::MAX_EACH + 1));
    let mut at = names;
    for _ in 0..n {
        let (&len, tail) = at.split_first().ok_or("each: truncated")?;
        let name = tail.get(..len as usize).ok_or("each: truncated")?;
        dims.push(
            std::str::from_utf8(name)
                .map_err(|_| "each: dimension not UTF-8")?
                .to_string(),
        );
        at = &tail[len as usize..];
    }
    // Written after the names; a record from before it ends (or is zero
    // padding) there: the default.
    let max_keys = at
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    Ok(Each {
        dims,
        ipv4_prefix: v4,
        ipv6_prefix: v6,
        on_full,
        max_keys,
    })
}
