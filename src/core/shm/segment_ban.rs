//! The penalty box's block of a strategy record (issue 32): flagged by
//! bit [`FLAG_BAN`] of the record's flags (bytes 54..56, reserved and 0
//! before), stored as the record's last [`BAN_BLOCK`] bytes, after the
//! other fields and their padding: `u32` ban_after, `u32` ban_within
//! (seconds), `u32` ban_for (seconds), `u32` reserved 0. The other fields'
//! decoders are handed the record without it, so they never read it as
//! theirs. See docs/SHM-LAYOUT.md, *Penalty box block*.

use crate::core::model::ban::Ban;

/// Bit of the record's flags (bytes 54..56) saying the block is there.
pub const FLAG_BAN: u16 = 1;
/// Bytes of the block (a multiple of 8: the record stays aligned).
pub const BAN_BLOCK: usize = 16;

/// The flags bit to write for `ban`.
pub fn flags(ban: &Option<Ban>) -> u16 {
    if ban.is_some() {
        FLAG_BAN
    } else {
        0
    }
}

/// Appends the block (after the record's zero padding) if the strategy
/// has a penalty box.
pub fn encode(ban: &Option<Ban>, out: &mut Vec<u8>) {
    if let Some(b) = ban {
        debug_assert!(out.len() % 8 == 0);
        out.extend_from_slice(&b.after.to_le_bytes());
        out.extend_from_slice(&b.within_s.to_le_bytes());
        out.extend_from_slice(&b.for_s.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
    }
}

/// Splits `record` (whole, from its length field, `fixed` bytes of fixed
/// part) into the part the other fields' decoders read and the penalty
/// box; the model checks the values afterwards.
pub fn decode(
    flags: u16,
    record: &[u8],
    fixed: usize,
) -> Result<(&[u8], Option<Ban>), &'static str> {
    if flags & FLAG_BAN == 0 {
        return Ok((record, None));
    }
    let at = record
        .len()
        .checked_sub(BAN_BLOCK)
        .filter(|&at| at >= fixed)
        .ok_or("ban: truncated")?;
    let word = |i: usize| {
        let b = &record[at + 4 * i..at + 4 * i + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    if word(3) != 0 {
        return Err("ban: reserved bytes not zero");
    }
    Ok((
        &record[..at],
        Some(Ban {
            after: word(0),
            within_s: word(1),
            for_s: word(2),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_round_trips_and_hostile_bytes_are_refused() {
        let b = Some(Ban {
            after: 3,
            within_s: 10,
            for_s: 30,
        });
        let mut rec = vec![7u8; 56];
        encode(&b, &mut rec);
        assert_eq!(rec.len(), 56 + BAN_BLOCK);
        let (rest, got) = decode(flags(&b), &rec, 56).unwrap();
        assert_eq!((rest.len(), got), (56, b));
        // No flag: the bytes are the record's own.
        assert_eq!(decode(0, &rec, 56).unwrap(), (&rec[..], None));
        // Flagged but too short for the block after the fixed part.
        assert_eq!(decode(FLAG_BAN, &rec[..64], 56), Err("ban: truncated"));
        let mut bad = rec.clone();
        bad[56 + 12] = 1;
        assert!(decode(FLAG_BAN, &bad, 56).is_err());
    }
}
