//! The calendar block of a segment's strategy record (issue 33): the
//! strategy's `tz`, for a `fixed_window` counted in a named zone's days,
//! weeks or months (`per` week and month need no block: the unit byte
//! says it, and an empty `tz` is UTC). Present when bit 15
//! ([`FLAG_CALENDAR`]) of the record's flags (bytes 54..56) is set; it
//! ends exactly at the record's end, so it is found from there whatever
//! blocks come before it:
//!
//! | size | field |
//! |---:|---|
//! | 2 | zero (ends the `each` / response fields of readers that scan) |
//! | … | zero padding, so that the block ends on the record's 8-byte end |
//! | L | the zone's name, ASCII (`Pacific/Auckland`) |
//! | 1 | L (1 … 64) |
//!
//! The encoder writes it last in the record. The model checks the name
//! (a known IANA zone) afterwards, with the rest of the strategy.

use crate::core::model::calendar::MAX_TZ_LEN;
use crate::core::model::Strategy;

/// The record flag of a calendar block: the highest bit of the `u16` at
/// record bytes 54..56 (the other blocks take the lowest free ones).
pub const FLAG_CALENDAR: u16 = 1 << 15;

/// This strategy's record flags from the calendar block.
pub fn flags(s: &Strategy) -> u16 {
    if s.tz.is_empty() {
        0
    } else {
        FLAG_CALENDAR
    }
}

/// Appends the block for the record that starts at `record_start` in
/// `out` (nothing without a `tz`): the record then needs no padding.
pub fn encode(s: &Strategy, record_start: usize, out: &mut Vec<u8>) {
    if s.tz.is_empty() {
        return;
    }
    // Validated: at most MAX_TZ_LEN bytes; never more than the length byte.
    let name = &s.tz.as_bytes()[..s.tz.len().min(MAX_TZ_LEN)];
    out.extend_from_slice(&[0, 0]);
    while (out.len() - record_start + name.len() + 1) % 8 != 0 {
        out.push(0);
    }
    out.extend_from_slice(name);
    out.push(name.len() as u8);
}

/// The `tz` of the record `record` (all of its bytes, from its length
/// field; `fixed` the bytes of its fixed part and name), `flags` its flags.
pub fn decode(record: &[u8], fixed: usize, flags: u16) -> Result<String, &'static str> {
    if flags & FLAG_CALENDAR == 0 {
        return Ok(String::new());
    }
    let (&len, head) = record.split_last().ok_or("calendar: truncated")?;
    let len = usize::from(len);
    if len == 0 || len > MAX_TZ_LEN || head.len() < fixed + 2 + len {
        return Err("calendar: bad tz length");
    }
    let name = &head[head.len() - len..];
    if !name.iter().all(|b| b.is_ascii_graphic()) {
        return Err("calendar: tz not printable ASCII");
    }
    Ok(String::from_utf8_lossy(name).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Algorithm, Unit};

    #[test]
    fn the_block_ends_the_record_and_reads_back() {
        for tz in ["UTC", "Pacific/Auckland", "America/Argentina/Buenos_Aires"] {
            for pre in 0..8 {
                let mut s = Strategy::plain(1, vec![], Algorithm::FixedWindow, 5, Unit::Month);
                s.tz = tz.into();
                let mut out = vec![9u8; 3];
                let start = out.len();
                out.extend(std::iter::repeat_n(7u8, 56 + pre));
                encode(&s, start, &mut out);
                assert_eq!((out.len() - start) % 8, 0);
                let rec = &out[start..];
                assert_eq!(decode(rec, 56 + pre, flags(&s)).unwrap(), tz);
                assert_eq!(decode(rec, 56 + pre, 0).unwrap(), "");
            }
        }
        let mut bad = vec![0u8; 64];
        *bad.last_mut().unwrap() = 60;
        assert!(decode(&bad, 56, FLAG_CALENDAR).is_err());
        *bad.last_mut().unwrap() = 0;
        assert!(decode(&bad, 56, FLAG_CALENDAR).is_err());
        assert!(decode(&[], 0, FLAG_CALENDAR).is_err());
    }
}
