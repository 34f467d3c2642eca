//! Config segments A and B: encoding (writer) and validated decoding
//! (reader). Layout in `docs/SHM-LAYOUT.md`.
//!
//! The reader never trusts a segment: it copies it out of shared memory
//! under a per-segment seqlock, checks magic, version, lengths, every record
//! and the CRC, and validates every strategy again with the model's rules.

use std::sync::atomic::{fence, Ordering};

use smallvec::SmallVec;

use crate::core::model::{Action, Algorithm, Condition, Op, Strategy, Unit, WarmUp};
use crate::core::shm::region::Region;

/// `"RCSG"` little-endian.
pub const SEG_MAGIC: u32 = u32::from_le_bytes(*b"RCSG");
pub const SEG_VERSION: u16 = 1;
pub const SEG_HEADER: usize = 64;
// Segment header offsets.
const S_MAGIC_VER: usize = 0; // u32 magic | u16 version << 32
const S_WRITE_SEQ: usize = 8; // seqlock: odd while the writer writes
const S_PUBLISH_SEQ: usize = 16;
const S_CONFIG_VERSION: usize = 24;
const S_LEN_COUNT: usize = 32; // u32 payload length | u32 strategy count << 32
const S_CRC_DIMS: usize = 40; // u32 crc | u32 blacklist dimension count << 32
const S_PUBLISHED_AT: usize = 48;
/// Fixed part of a strategy record (48 before layout version 3 added the
/// priority).
pub const REC_FIXED: usize = 56;
/// Most dimension names one table may use (strategies and blacklist).
pub const MAX_TABLE_DIMENSIONS: usize = 64;

/// One strategy as published: the model plus its stat slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub strategy: Strategy,
    pub slot: u32,
    pub generation: u64,
}

/// A decoded segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub publish_seq: u64,
    pub config_version: u64,
    pub published_unix_ms: u64,
    pub strategies: Vec<Published>,
    /// Dimensions that have blacklist entries (`ip` included).
    pub blacklist_dimensions: Vec<String>,
}

/// Why a segment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    #[error("segment is being written (retry)")]
    Busy,
    #[error("segment magic/version mismatch")]
    Magic,
    #[error("segment payload length {0} does not fit the segment")]
    Length(u64),
    #[error("segment checksum mismatch")]
    Checksum,
    #[error("segment holds sequence {found}, header published {expected}")]
    Sequence { expected: u64, found: u64 },
    #[error("segment {field} {count} does not fit its {len}-byte payload")]
    Count {
        field: &'static str,
        count: u64,
        len: u64,
    },
    #[error("record {index}: {what}")]
    Record { index: usize, what: String },
}

/// Encodes strategies (already validated) and blacklist dimension names
/// into a payload. Pure; used by the writer before touching the file.
pub fn encode_payload(items: &[Published], bl_dims: &[String]) -> Vec<u8> {
    encode_records(
        items.iter().map(|p| (&p.strategy, p.slot, p.generation)),
        bl_dims,
        items.len() * 96,
    )
}

/// [`encode_payload`] of `(strategy, slot, generation)` triples borrowed
/// from the caller (the writer's plan: no copy of the table), into a
/// buffer of `capacity` bytes to start with.
pub fn encode_records<'a>(
    items: impl Iterator<Item = (&'a Strategy, u32, u64)>,
    bl_dims: &[String],
    capacity: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    for (s, slot, generation) in items {
        encode_record(s, slot, generation, &mut out);
    }
    encode_tail(bl_dims, &mut out);
    out
}

/// Appends one strategy's record to `out` (whose length is a multiple
/// of 8: every record starts 8-aligned). A record's bytes depend only on
/// the strategy, its slot and generation, not on where it starts: the
/// writer copies the unchanged ones from its previous payload (issue 29).
pub fn encode_record(s: &Strategy, slot: u32, generation: u64, out: &mut Vec<u8>) {
    debug_assert!(out.len() % 8 == 0);
    let start = out.len();
    out.extend_from_slice(&0u32.to_le_bytes()); // record length, patched below
    out.extend_from_slice(&s.id.to_le_bytes());
    out.extend_from_slice(&slot.to_le_bytes());
    out.extend_from_slice(&s.warm_up.period_ms.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&s.rate.to_le_bytes());
    out.extend_from_slice(&s.burst.to_le_bytes());
    let (kind, status, max_delay) = match s.action {
        Action::Reject { status } => (1u8, status.unwrap_or(0), 0u32),
        Action::Delay { max_delay_ms } => (2, 0, max_delay_ms),
        Action::DryRun => (3, 0, 0),
        // Readers that predate it see a plain dry run (they ignore the cap).
        Action::DryRunDelay { max_delay_ms } => (3, 0, max_delay_ms),
        Action::Allow => (4, 0, 0),
    };
    out.extend_from_slice(&max_delay.to_le_bytes());
    out.push(s.algorithm as u8);
    out.push(s.per as u8);
    out.push(kind);
    out.push(s.conditions.len() as u8);
    out.extend_from_slice(&status.to_le_bytes());
    out.push(s.enabled as u8);
    out.push(s.warm_up.cold_factor);
    out.extend_from_slice(&s.priority.to_le_bytes());
    // The name's length (checked: at most MAX_NAME_LEN), 2 reserved
    // bytes, then the name before the conditions.
    out.extend_from_slice(&(s.name.len() as u16).to_le_bytes());
    // Record flags (bytes 54..56): which optional blocks end the
    // record (bit 0: the penalty box, last; bit 15: the calendar,
    // before it).
    let flags = super::calendar_block::flags(s) | super::segment_ban::flags(&s.ban);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(s.name.as_bytes());
    for c in &s.conditions {
        // The operator in the top two bits (a name is at most 32 bytes).
        out.push(c.dimension.len() as u8 | (c.op as u8) << 6);
        out.extend_from_slice(c.dimension.as_bytes());
        out.extend_from_slice(&(c.value.len() as u16).to_le_bytes());
        out.extend_from_slice(&c.value);
    }
    crate::core::keys::segment::encode(&s.each, out);
    encode_response(&s.each, &s.response, out);
    // Last: it ends at the record's end (src/core/shm/calendar_block.rs).
    super::calendar_block::encode(s, start, out);
    while out.len() % 8 != 0 {
        out.push(0);
    }
    super::segment_ban::encode(&s.ban, out);
    let len = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends the blacklist dimension names after the records, padded to 8.
pub fn encode_tail(bl_dims: &[String], out: &mut Vec<u8>) {
    for d in bl_dims {
        out.push(d.len() as u8);
        out.extend_from_slice(d.as_bytes());
    }
    while out.len() % 8 != 0 {
        out.push(0);
    }
}

/// Marks the response section of a record (layout version 4).
const RESPONSE_TAG: u8 = b'R';

/// The response and cost fields (issue 31), appended after the `each`
/// fields: a strategy without them writes nothing. With them, a record
/// without `each` first writes the `each` count 0, then: the tag `R`,
/// `count_if` as canonical text, `cost_from`, `cost_after` (each a `u8`
/// length and bytes; empty: not set). See docs/SHM-LAYOUT.md.
fn encode_response(
    each: &crate::core::model::each::Each,
    r: &crate::core::model::response::Response,
    out: &mut Vec<u8>,
) {
    if r.is_plain() {
        return;
    }
    if !each.is_keyed() {
        out.push(0);
    }
    out.push(RESPONSE_TAG);
    let count_if = if r.count_if.is_empty() {
        String::new()
    } else {
        r.count_if.to_string()
    };
    for field in [count_if.as_str(), &r.cost_from, &r.cost_after] {
        // Validated: at most MAX_COUNT_IF_LEN / 32 bytes.
        out.push(field.len().min(255) as u8);
        out.extend_from_slice(&field.as_bytes()[..field.len().min(255)]);
    }
}

/// Reads the response fields from the rest of a record (after the
/// conditions; zero padding included). The model checks them afterwards.
fn decode_response(rest: &[u8]) -> Result<crate::core::model::response::Response, &'static str> {
    // Skip the `each` fields: count, 3 bytes, the names, then `max_keys`
    // (4 bytes, written for every per-key strategy; issue 28).
    let mut at = match rest.first() {
        None => return Ok(Default::default()),
        Some(0) => 1,
        Some(&n) => {
            let mut at = 4;
            for _ in 0..n {
                let len = *rest.get(at).ok_or("each: truncated")? as usize;
                at += 1 + len;
            }
            at + 4
        }
    };
    if rest.get(at) != Some(&RESPONSE_TAG) {
        return Ok(Default::default());
    }
    at += 1;
    let mut fields = [""; 3];
    for f in &mut fields {
        let len = *rest.get(at).ok_or("response: truncated")? as usize;
        let bytes = rest
            .get(at + 1..at + 1 + len)
            .ok_or("response: truncated")?;
        *f = std::str::from_utf8(bytes).map_err(|_| "response: not UTF-8")?;
        at += 1 + len;
    }
    let count_if = crate::core::model::response::StatusSet::parse(fields[0])
        .map_err(|_| "response: bad count_if")?;
    Ok(crate::core::model::response::Response {
        count_if,
        cost_from: fields[1].to_string(),
        cost_after: fields[2].to_string(),
    })
}

/// Bytes a payload needs, for capacity checks.
pub fn capacity_bytes(seg_len: u64) -> u64 {
    seg_len.saturating_sub(SEG_HEADER as u64)
}

/// Writer side: writes a payload into a segment under its seqlock.
/// The caller checked that it fits.
pub fn write_segment(
    seg: &Region<'_>,
    payload: &[u8],
    count: u32,
    bl_dims: u32,
    publish_seq: u64,
    config_version: u64,
    now_ms: u64,
) {
    let ws = seg.u64_at(S_WRITE_SEQ).expect("segment header in range");
    let w = ws.load(Ordering::Relaxed);
    let begin = (w | 1).wrapping_add(if w & 1 == 1 { 2 } else { 0 });
    ws.store(begin, Ordering::Relaxed);
    fence(Ordering::Release);
    seg.store(S_MAGIC_VER, SEG_MAGIC as u64 | (SEG_VERSION as u64) << 32);
    seg.store(S_PUBLISH_SEQ, publish_seq);
    seg.store(S_CONFIG_VERSION, config_version);
    seg.store(S_LEN_COUNT, payload.len() as u64 | (count as u64) << 32);
    seg.store(S_PUBLISHED_AT, now_ms);
    seg.write_bytes(SEG_HEADER, payload);
    let crc = checksum(payload, publish_seq, config_version, count, bl_dims);
    seg.store(S_CRC_DIMS, crc as u64 | (bl_dims as u64) << 32);
    ws.store(begin.wrapping_add(1), Ordering::Release);
}

fn checksum(payload: &[u8], seq: u64, version: u64, count: u32, bl_dims: u32) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&version.to_le_bytes());
    h.update(&count.to_le_bytes());
    h.update(&bl_dims.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The strategy count the segment's header announces, read without the
/// seqlock: a hint (the reader chooses where to load it), never trusted.
pub fn announced_count(seg: &Region<'_>) -> u32 {
    (seg.load(S_LEN_COUNT) >> 32) as u32
}

/// What a segment's header says about the payload [`read_raw`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSegment {
    pub publish_seq: u64,
    pub config_version: u64,
    pub published_unix_ms: u64,
    /// Strategy records in the payload.
    pub count: u32,
    /// Blacklist dimension names after them.
    pub bl_dims: u32,
}

/// Reader side: copies the segment out under its seqlock and decodes it.
/// `expected_seq` is the header sequence that named this segment.
pub fn read_segment(
    seg: &Region<'_>,
    expected_seq: u64,
    buf: &mut Vec<u8>,
) -> Result<Decoded, SegmentError> {
    let raw = read_raw(seg, expected_seq, buf)?;
    let (strategies, blacklist_dimensions) = decode_payload(buf, raw.count, raw.bl_dims)?;
    Ok(Decoded {
        publish_seq: raw.publish_seq,
        config_version: raw.config_version,
        published_unix_ms: raw.published_unix_ms,
        strategies,
        blacklist_dimensions,
    })
}

/// Copies the segment's payload into `buf` under its seqlock and checks
/// the header and the checksum; the records are not decoded yet
/// ([`decode_records`], or [`read_segment`] for the whole of it).
pub fn read_raw(
    seg: &Region<'_>,
    expected_seq: u64,
    buf: &mut Vec<u8>,
) -> Result<RawSegment, SegmentError> {
    let ws = seg.u64_at(S_WRITE_SEQ).ok_or(SegmentError::Magic)?;
    let w1 = ws.load(Ordering::Acquire);
    if w1 & 1 == 1 {
        return Err(SegmentError::Busy);
    }
    let mv = seg.load(S_MAGIC_VER);
    let publish_seq = seg.load(S_PUBLISH_SEQ);
    let config_version = seg.load(S_CONFIG_VERSION);
    let lc = seg.load(S_LEN_COUNT);
    let crc_dims = seg.load(S_CRC_DIMS);
    let published_unix_ms = seg.load(S_PUBLISHED_AT);
    let len = (lc & 0xffff_ffff) as usize;
    let count = (lc >> 32) as u32;
    let ok_len = len <= capacity_bytes(seg.len() as u64) as usize && len % 8 == 0;
    // Every byte is overwritten (or the copy refused): only a payload
    // longer than the last one zeroes (a worker reuses its buffer).
    let ok_len = ok_len && {
        buf.truncate(len);
        buf.resize(len, 0);
        seg.read_bytes(SEG_HEADER, buf)
    };
    fence(Ordering::Acquire);
    if ws.load(Ordering::Relaxed) != w1 {
        return Err(SegmentError::Busy);
    }
    // From here on the copy is stable; validate it.
    if mv as u32 != SEG_MAGIC || (mv >> 32) as u16 != SEG_VERSION {
        return Err(SegmentError::Magic);
    }
    if !ok_len {
        return Err(SegmentError::Length(len as u64));
    }
    if publish_seq != expected_seq {
        return Err(SegmentError::Sequence {
            expected: expected_seq,
            found: publish_seq,
        });
    }
    let bl_dims = (crc_dims >> 32) as u32;
    // Fuzz builds (`--cfg fuzzing`, set by cargo-fuzz) skip the checksum so
    // that the fuzzer reaches the decoder: anyone who can write the file
    // can compute a valid one, so it guards against nothing hostile.
    if !cfg!(fuzzing)
        && checksum(buf, publish_seq, config_version, count, bl_dims) != crc_dims as u32
    {
        return Err(SegmentError::Checksum);
    }
    // Counts are sizes and loop bounds for the decoder and the table
    // builder: bound them by the bytes copied before anyone uses them (a
    // checksum-valid header announcing 2^32-1 strategies once made the
    // builder reserve ~800 GB and abort the worker).
    check_counts(len, count, bl_dims)?;
    Ok(RawSegment {
        publish_seq,
        config_version,
        published_unix_ms,
        count,
        bl_dims,
    })
}

/// Most strategy records a payload of `len` bytes can hold.
#[inline]
pub fn max_records(len: usize) -> usize {
    len / REC_FIXED
}

/// Refuses counts that the payload's `len` bytes cannot hold: at most
/// `len / REC_FIXED` records, at most [`MAX_TABLE_DIMENSIONS`] blacklist
/// dimension names (each at least one byte).
pub fn check_counts(len: usize, count: u32, bl_dims: u32) -> Result<(), SegmentError> {
    if count as usize > max_records(len) {
        return Err(SegmentError::Count {
            field: "strategy count",
            count: count.into(),
            len: len as u64,
        });
    }
    if bl_dims as usize > MAX_TABLE_DIMENSIONS.min(len) {
        return Err(SegmentError::Count {
            field: "blacklist dimension count",
            count: bl_dims.into(),
            len: len as u64,
        });
    }
    Ok(())
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }
}

/// One strategy record of a payload, checked with the model's rules,
/// its conditions borrowed from the payload: `strategy.conditions` is
/// empty, `conditions` holds them (`(dimension, value)`, as published).
pub struct Record<'a> {
    pub strategy: Strategy,
    pub slot: u32,
    pub generation: u64,
    pub conditions: SmallVec<[(&'a str, Op, &'a [u8]); 4]>,
}

impl Record<'_> {
    /// The record with its conditions owned, as [`decode_payload`] gives it.
    pub fn into_published(self) -> Published {
        let mut strategy = self.strategy;
        strategy.conditions = self
            .conditions
            .iter()
            .map(|&(d, op, v)| Condition::with_op(d, op, v))
            .collect();
        Published {
            strategy,
            slot: self.slot,
            generation: self.generation,
        }
    }
}

/// Decodes a payload; every record is validated with the model's rules.
pub fn decode_payload(
    payload: &[u8],
    count: u32,
    bl_dims: u32,
) -> Result<(Vec<Published>, Vec<String>), SegmentError> {
    let mut out = Vec::new();
    let end = decode_records(payload, count, |r| {
        if out.capacity() == 0 {
            out.reserve_exact(count as usize);
        }
        out.push(r.into_published());
    })?;
    let dims = decode_blacklist_dimensions(payload, end, count, bl_dims)?;
    Ok((out, dims))
}

/// Decodes and checks the `count` strategy records at the start of
/// `payload`, handing each to `each` in order, borrowed (no allocation
/// per condition); returns where the blacklist dimension names start
/// ([`decode_blacklist_dimensions`]). Ids must be strictly ascending (the
/// writer sorts them and refuses duplicates). Stops at the first bad
/// record: a caller building from them discards what it has.
pub fn decode_records<'a>(
    payload: &'a [u8],
    count: u32,
    mut each: impl FnMut(Record<'a>),
) -> Result<usize, SegmentError> {
    let mut c = Cursor { b: payload, pos: 0 };
    // A record is at least REC_FIXED bytes: bound the work by the payload.
    check_counts(payload.len(), count, 0)?;
    let mut last_id = 0u32;
    for index in 0..count as usize {
        let bad = |what: &str| SegmentError::Record {
            index,
            what: what.to_string(),
        };
        let start = c.pos;
        let len = c.u32().ok_or_else(|| bad("truncated"))? as usize;
        if len < REC_FIXED || len % 8 != 0 || start + len > payload.len() {
            return Err(bad("bad record length"));
        }
        // The record's flags (bytes 54..56) say which blocks end it: the
        // other fields are read from the record without them.
        let flags = u16::from_le_bytes([payload[start + 54], payload[start + 55]]);
        let (body, ban) =
            super::segment_ban::decode(flags, &payload[start..start + len], REC_FIXED)
                .map_err(bad)?;
        let mut r = Cursor {
            b: &payload[..start + body.len()],
            pos: c.pos,
        };
        let trunc = || bad("truncated");
        let id = r.u32().ok_or_else(trunc)?;
        let slot = r.u32().ok_or_else(trunc)?;
        let warm_up_ms = r.u32().ok_or_else(trunc)?;
        let generation = r.u64().ok_or_else(trunc)?;
        let rate = r.u64().ok_or_else(trunc)?;
        let burst = r.u32().ok_or_else(trunc)?;
        let max_delay_ms = r.u32().ok_or_else(trunc)?;
        let algorithm = Algorithm::from_u8(r.u8().ok_or_else(trunc)?)
            .ok_or_else(|| bad("unknown algorithm"))?;
        let per = Unit::from_u8(r.u8().ok_or_else(trunc)?).ok_or_else(|| bad("unknown unit"))?;
        let kind = r.u8().ok_or_else(trunc)?;
        let n = r.u8().ok_or_else(trunc)? as usize;
        let status = r.u16().ok_or_else(trunc)?;
        let enabled = r.u8().ok_or_else(trunc)? != 0;
        let cold_factor = r.u8().ok_or_else(trunc)?;
        let priority = r.u32().ok_or_else(trunc)? as i32;
        let name_len = r.u16().ok_or_else(trunc)? as usize;
        let flags = r.u16().ok_or_else(trunc)?;
        if name_len > crate::core::model::MAX_NAME_LEN {
            return Err(bad("name too long"));
        }
        let name = r.take(name_len).ok_or_else(trunc)?;
        let name = std::str::from_utf8(name)
            .map_err(|_| bad("name not UTF-8"))?
            .to_string();
        let action = match kind {
            1 => Action::Reject {
                status: (status != 0).then_some(status),
            },
            2 => Action::Delay { max_delay_ms },
            3 if max_delay_ms != 0 => Action::DryRunDelay { max_delay_ms },
            3 => Action::DryRun,
            4 => Action::Allow,
            _ => return Err(bad("unknown action")),
        };
        if n > crate::core::model::MAX_CONDITIONS {
            return Err(bad(&format!(
                "strategy {id}: {}",
                crate::core::model::ModelError::TooManyConditions(n)
            )));
        }
        let mut conditions = SmallVec::new();
        for _ in 0..n {
            let dl = r.u8().ok_or_else(trunc)?;
            let op = Op::from_bits(dl >> 6);
            let dim = r.take(usize::from(dl & 0x3f)).ok_or_else(trunc)?;
            let dim = std::str::from_utf8(dim).map_err(|_| bad("dimension not UTF-8"))?;
            let vl = r.u16().ok_or_else(trunc)? as usize;
            let value = r.take(vl).ok_or_else(trunc)?;
            conditions.push((dim, op, value));
        }
        let rest = &r.b[r.pos..];
        let each_key = crate::core::keys::segment::decode(rest).map_err(bad)?;
        let response = decode_response(rest).map_err(bad)?;
        let tz = super::calendar_block::decode(&r.b[start..], r.pos - start, flags).map_err(bad)?;
        let strategy = Strategy {
            id,
            conditions: Vec::new(),
            algorithm,
            rate,
            per,
            burst,
            action,
            enabled,
            warm_up: WarmUp {
                period_ms: warm_up_ms,
                cold_factor,
            },
            priority,
            each: each_key,
            name,
            response,
            tz,
            ban,
        };
        strategy
            .check_with(conditions.len(), |i| conditions[i])
            .map_err(|e| bad(&format!("strategy {id}: {e}")))?;
        if index > 0 && id <= last_id {
            return Err(bad(&format!(
                "strategy {id}: ids not in ascending order (after {last_id})"
            )));
        }
        last_id = id;
        each(Record {
            strategy,
            slot,
            generation,
            conditions,
        });
        c.pos = start + len;
    }
    Ok(c.pos)
}

/// The `bl_dims` blacklist dimension names at `at` (after the `count`
/// records, see [`decode_records`]).
pub fn decode_blacklist_dimensions(
    payload: &[u8],
    at: usize,
    count: u32,
    bl_dims: u32,
) -> Result<Vec<String>, SegmentError> {
    let mut c = Cursor {
        b: payload,
        pos: at,
    };
    let mut dims = Vec::with_capacity(bl_dims.min(MAX_TABLE_DIMENSIONS as u32) as usize);
    for index in 0..bl_dims as usize {
        let bad = || SegmentError::Record {
            index: count as usize + index,
            what: "blacklist dimension".into(),
        };
        if index >= MAX_TABLE_DIMENSIONS {
            return Err(bad());
        }
        let dl = c.u8().ok_or_else(bad)? as usize;
        let d = c.take(dl).ok_or_else(bad)?;
        let d = std::str::from_utf8(d).map_err(|_| bad())?;
        if !crate::core::model::valid_dimension_name(d) {
            return Err(bad());
        }
        dims.push(d.to_string());
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn sample(id: u32) -> Published {
        let mut s = Strategy {
            id,
            conditions: vec![
                Condition::new("ip", "10.0.0.1"),
                Condition::new("userid", format!("u{id}")),
            ],
            algorithm: Algorithm::TokenBucket,
            rate: 100,
            per: Unit::Second,
            burst: 5,
            action: Action::Reject { status: Some(429) },
            enabled: true,
            warm_up: WarmUp::NONE,
            priority: id as i32 - 5,
            name: format!("rule \"{id}\" \\ \n"),
            each: if id % 2 == 0 {
                crate::core::model::each::Each {
                    ipv6_prefix: 56,
                    on_full: crate::core::model::each::OnFull::Reject,
                    max_keys: 100,
                    ..crate::core::model::each::Each::of(&["ip", "userid"])
                }
            } else {
                Default::default()
            },
            // Response fields with and without `each` (issue 31).
            response: match id % 3 {
                1 => crate::core::model::response::Response {
                    count_if: crate::core::model::response::StatusSet::parse("401,5xx").unwrap(),
                    cost_after: "upcost".into(),
                    ..Default::default()
                },
                2 => crate::core::model::response::Response {
                    cost_from: "cost".into(),
                    ..Default::default()
                },
                _ => Default::default(),
            },
            tz: String::new(),
            ban: None,
        };
        // Calendar windows with and without `each` and response fields
        // (issue 33).
        if matches!(id, 2 | 4 | 6 | 7 | 9) {
            s.algorithm = Algorithm::FixedWindow;
            s.burst = 1;
            (s.per, s.tz) = match id % 3 {
                0 => (Unit::Month, "Pacific/Auckland".into()),
                1 => (Unit::Day, "America/Argentina/Buenos_Aires".into()),
                _ => (Unit::Week, String::new()),
            };
        }
        // A penalty box (issue 32) on per-key strategies of one dimension,
        // with and without response fields.
        if id % 4 == 0 {
            s.each.dims = vec![if id % 8 == 0 { "userid" } else { "ip" }.into()];
            s.ban = Some(crate::core::model::ban::Ban {
                after: id,
                within_s: 10,
                for_s: 30 * id,
            });
        }
        if id == 3 {
            s.action = Action::Allow;
            s.conditions[0].value = b"10.0.0.0/8".to_vec();
        }
        s.validate().unwrap();
        Published {
            strategy: s,
            slot: id * 2,
            generation: 3,
        }
    }

    #[test]
    fn round_trip_through_a_segment() {
        let words: Vec<AtomicU64> = (0..1024).map(|_| AtomicU64::new(0)).collect();
        let seg = Region::from_atomics(&words);
        let items: Vec<_> = (1..=10).map(sample).collect();
        let dims = vec!["userid".to_string()];
        let payload = encode_payload(&items, &dims);
        write_segment(&seg, &payload, 10, 1, 7, 42, 1000);
        let mut buf = Vec::new();
        let d = read_segment(&seg, 7, &mut buf).unwrap();
        assert_eq!(d.strategies, items);
        assert_eq!(d.blacklist_dimensions, dims);
        assert_eq!(d.config_version, 42);
        assert_eq!(
            read_segment(&seg, 8, &mut buf).unwrap_err(),
            SegmentError::Sequence {
                expected: 8,
                found: 7
            }
        );
        // A flipped payload bit is caught by the checksum.
        let v = seg.load(SEG_HEADER + 16);
        seg.store(SEG_HEADER + 16, v ^ 4);
        assert_eq!(
            read_segment(&seg, 7, &mut buf).unwrap_err(),
            SegmentError::Checksum
        );
        // A writer in progress makes the reader retry.
        seg.store(S_WRITE_SEQ, 5);
        assert_eq!(
            read_segment(&seg, 7, &mut buf).unwrap_err(),
            SegmentError::Busy
        );
    }

    /// The writer sorts by id and refuses duplicates: a segment whose ids
    /// are not strictly ascending is refused, naming the record.
    #[test]
    fn decoder_refuses_ids_out_of_order_or_repeated() {
        for ids in [[2, 1], [3, 3]] {
            let items: Vec<_> = ids.iter().map(|&i| sample(i)).collect();
            let payload = encode_payload(&items, &[]);
            match decode_payload(&payload, 2, 0) {
                Err(SegmentError::Record { index: 1, what }) => {
                    assert!(what.contains("ascending"), "{what}")
                }
                other => panic!("{ids:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn decoder_rejects_invalid_records_even_with_a_good_checksum() {
        let mut bad = sample(1);
        bad.strategy.rate = 0; // bypasses validate: the decoder must catch it
        let payload = encode_payload(&[bad], &[]);
        assert!(matches!(
            decode_payload(&payload, 1, 0),
            Err(SegmentError::Record { index: 0, .. })
        ));
        let payload = encode_payload(&[sample(1)], &[]);
        assert!(decode_payload(&payload, 2, 0).is_err());
        assert!(decode_payload(&payload, u32::MAX, 0).is_err());
        assert!(decode_payload(&payload[..40], 1, 0).is_err());
        // A hostile name: too long, or not UTF-8 (the CRC is the writer's).
        let mut long = payload.clone();
        long[52..54].copy_from_slice(&201u16.to_le_bytes());
        assert_eq!(
            decode_payload(&long, 1, 0).unwrap_err().to_string(),
            "record 0: name too long"
        );
        let mut not_utf8 = payload.clone();
        not_utf8[56] = 0xFF;
        assert_eq!(
            decode_payload(&not_utf8, 1, 0).unwrap_err().to_string(),
            "record 0: name not UTF-8"
        );
        let mut past_end = payload;
        let len = past_end.len() as u16;
        past_end[52..54].copy_from_slice(&(len.min(200)).to_le_bytes());
        assert!(
            decode_payload(&past_end, 1, 0).is_err(),
            "a name past the record"
        );
    }
}
