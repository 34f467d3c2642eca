//! The fuzzing entry point (fuzz/fuzz_targets/reader.rs, tests/corrupt.rs):
//! every reader-side parser over arbitrary bytes. Kept apart from `shm` so
//! that the file layer does not depend on the matcher (`table`).

use std::path::Path;

use super::shm::region::Region;
use super::shm::segment::{decode_payload, read_segment, Decoded};
use super::shm::{Geometry, HEADER_SIZE, H_SEQ};
use super::table::Table;

/// Fuzzing entry point: treats `data` as a whole file image and as a bare
/// segment payload and runs every reader-side parser over it. Must never
/// panic or read out of bounds, whatever the bytes.
pub fn fuzz_reader(data: &[u8]) {
    // 1. A bare payload: the first 8 bytes give the counts.
    if data.len() >= 8 {
        let count = u32::from_le_bytes(data[0..4].try_into().expect("4 bytes")) % 4096;
        let dims = u32::from_le_bytes(data[4..8].try_into().expect("4 bytes")) % 128;
        if let Ok((strategies, bl)) = decode_payload(&data[8..], count, dims) {
            let decoded = Decoded {
                publish_seq: 1,
                config_version: 1,
                published_unix_ms: 0,
                strategies,
                blacklist_dimensions: bl,
            };
            let t = Table::build(decoded, None);
            let vals: Vec<Option<&[u8]>> = t
                .dimensions()
                .iter()
                .enumerate()
                .map(|(i, _)| data.get(i..i + 3))
                .collect();
            t.matching(&vals);
        }
    }
    // 2. A whole file image: header geometry, then both segments.
    let words = Region::words_from_bytes(data);
    let whole = Region::from_atomics(&words);
    let Some(h) = whole.sub(0, HEADER_SIZE) else {
        return;
    };
    // The image is both files back to back, as a worker maps them.
    let n = whole.len() as u64;
    let Ok(g) = Geometry::read(&h, n, n, Path::new("fuzz")) else {
        return;
    };
    let seq = h.load(H_SEQ);
    let mut buf = Vec::new();
    for off in g.seg_off {
        if let Some(seg) = whole.sub(off, g.seg_len) {
            let _ = read_segment(&seg, seq, &mut buf);
            // The worker's path: decoded and compiled straight from the copy.
            if let Ok(t) = Table::read(&seg, seq, &mut buf, None) {
                t.matching(&vec![Some(&b"10.0.0.1"[..]); t.dimensions().len()]);
            }
        }
    }
}

/// A hostile segment, checksum-valid (anyone who can write the file can
/// compute the checksum): what the crafted-input tests, the t-nginx tool
/// and the fuzz regression publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crafted {
    /// One real record, the header announcing 2^32-1 strategies (before
    /// the count was bounded by the payload, the table builder reserved
    /// ~800 GB for them and the worker aborted).
    Count,
    /// One record whose length field says 0xFFFF_FFF8 bytes.
    RecordLength,
    /// One record, the header announcing 2^32-1 blacklist dimensions.
    BlacklistDimensions,
}

impl Crafted {
    pub const ALL: [Crafted; 3] = [
        Crafted::Count,
        Crafted::RecordLength,
        Crafted::BlacklistDimensions,
    ];

    /// The name the t-nginx tool takes (`craft PATH NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Crafted::Count => "count",
            Crafted::RecordLength => "record-length",
            Crafted::BlacklistDimensions => "blacklist-dimensions",
        }
    }

    pub fn from_name(name: &str) -> Option<Crafted> {
        Crafted::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The payload and the header's strategy and blacklist dimension counts.
    pub fn payload(self) -> (Vec<u8>, u32, u32) {
        use super::model::{Algorithm, Condition, Strategy, Unit};
        use super::shm::segment::{encode_payload, Published};
        let s = Strategy::plain(
            1,
            vec![Condition::new("api", b"/crafted")],
            Algorithm::TokenBucket,
            1,
            Unit::Second,
        );
        let mut payload = encode_payload(
            &[Published {
                strategy: s,
                slot: 0,
                generation: 1,
            }],
            &[],
        );
        match self {
            Crafted::Count => (payload, u32::MAX, 0),
            Crafted::RecordLength => {
                payload[0..4].copy_from_slice(&0xFFFF_FFF8u32.to_le_bytes());
                (payload, 1, 0)
            }
            Crafted::BlacklistDimensions => (payload, 1, u32::MAX),
        }
    }

    /// Writes the segment into `map`'s inactive half with a valid checksum
    /// and announces it as the next sequence, as a hostile writer would;
    /// returns that sequence.
    pub fn publish(self, map: &super::shm::Mapping) -> u64 {
        let next = map.seq() + 1;
        let seg = map.segment((next & 1) as usize);
        let (payload, count, bl_dims) = self.payload();
        super::shm::segment::write_segment(&seg, &payload, count, bl_dims, next, 999, 0);
        if let Some(w) = map.header().u64_at(H_SEQ) {
            w.store(next, std::sync::atomic::Ordering::Release);
        }
        next
    }
}

/// Fuzzing entry point (fuzz/fuzz_targets/segment.rs): `data` as one
/// segment, header included, its magic, version and seqlock word made
/// right so that the fuzzer gets to the counts and records (the checksum
/// is skipped in fuzz builds, see [`read_raw`](super::shm::segment::read_raw)).
/// The worker's decoder and builder and the agent's decoder both run;
/// returns what the worker's made of it (the number of strategies
/// published), never panics or allocates by what the bytes announce.
pub fn fuzz_segment(data: &[u8]) -> Result<usize, super::shm::segment::SegmentError> {
    use super::shm::segment::{SEG_HEADER, SEG_MAGIC, SEG_VERSION};
    let mut image = data.to_vec();
    image.resize(image.len().max(SEG_HEADER), 0);
    image[0..8].copy_from_slice(&(SEG_MAGIC as u64 | (SEG_VERSION as u64) << 32).to_le_bytes());
    image[8..16].copy_from_slice(&0u64.to_le_bytes());
    let words = Region::words_from_bytes(&image);
    let seg = Region::from_atomics(&words);
    let seq = seg.load(16);
    let mut buf = Vec::new();
    let _ = read_segment(&seg, seq, &mut buf);
    let t = Table::read(&seg, seq, &mut buf, None)?;
    let vals: Vec<Option<&[u8]>> = (0..t.dimensions().len())
        .map(|i| data.get(i..i + 4))
        .collect();
    t.matching(&vals);
    Ok(t.published_strategies())
}

/// The segment image of a [`Crafted`] input, as [`fuzz_segment`] takes it
/// (the regression test of the pre-fix crash).
pub fn crafted_image(c: Crafted, publish_seq: u64) -> Vec<u8> {
    let (payload, count, bl_dims) = c.payload();
    let len = (super::shm::segment::SEG_HEADER + payload.len()).next_multiple_of(4096);
    let words: Vec<std::sync::atomic::AtomicU64> = (0..len / 8)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let seg = Region::from_atomics(&words);
    super::shm::segment::write_segment(&seg, &payload, count, bl_dims, publish_seq, 1, 0);
    let mut out = vec![0u8; len];
    seg.read_bytes(0, &mut out);
    out
}

/// Bytes consumed one at a time (zeros once they run out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn pick<'v>(&mut self, from: &[&'v str]) -> &'v str {
        from[self.u8() as usize % from.len()]
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The dimensions and values the request-path fuzzer draws from: few, so
/// that tables and requests meet.
const FUZZ_DIMS: [&str; 4] = ["ip", "api", "userid", "d3"];
const FUZZ_VALUES: [&str; 8] = [
    "10.0.0.1",
    "10.0.0.0/8",
    "::1",
    "/login",
    "/a",
    "u1",
    "u2",
    "",
];

/// One strategy drawn from the bytes (the model may refuse it).
fn fuzz_strategy(b: &mut Bytes<'_>, id: u32) -> super::model::Strategy {
    use super::model::each::OnFull;
    use super::model::{Action, Algorithm, Condition, Strategy, Unit};
    let algorithm = Algorithm::ALL[b.u8() as usize % Algorithm::ALL.len()];
    let per = Unit::ALL[b.u8() as usize % Unit::ALL.len()];
    let mut s = Strategy::plain(id, Vec::new(), algorithm, 1 + (b.u8() % 5) as u64, per);
    s.burst = 1 + (b.u8() % 4) as u32;
    s.action = match b.u8() % 5 {
        0 => Action::Reject { status: None },
        1 => Action::Delay {
            max_delay_ms: (b.u8() as u32) * 4,
        },
        2 => Action::DryRun,
        3 => Action::Allow,
        _ => Action::Reject { status: Some(429) },
    };
    s.priority = (b.u8() % 3) as i32 - 1;
    if algorithm == Algorithm::WarmUp {
        s.warm_up.period_ms = 1000;
        s.warm_up.cold_factor = super::model::DEFAULT_COLD_FACTOR;
    }
    for _ in 0..b.u8() % 3 {
        let dim = b.pick(&FUZZ_DIMS);
        let value = b.pick(&FUZZ_VALUES);
        s.conditions.push(Condition::new(dim, value.as_bytes()));
    }
    match b.u8() % 4 {
        0 => s.each.dims = vec!["ip".into()],
        1 => s.each.dims = vec![b.pick(&FUZZ_DIMS[1..]).into()],
        2 => s.each.dims = vec!["ip".into(), "userid".into()],
        _ => {}
    }
    s.each.ipv6_prefix = [64, 128, 48][b.u8() as usize % 3];
    s.each.on_full = OnFull::ALL[b.u8() as usize % OnFull::ALL.len()];
    s
}

/// Fuzzing entry point (fuzz/fuzz_targets/decide.rs): a table drawn from
/// the first bytes, published into a small real file (key table
/// included), and requests drawn from the rest through the worker's
/// decide path (per-key strategies included). Must never panic. Returns
/// the requests decided (0 when the model refused the table).
pub fn fuzz_decide(data: &[u8]) -> usize {
    use std::sync::{Mutex, OnceLock};
    static FILE: OnceLock<Mutex<(super::shm::writer::Writer, super::shm::reader::Reader, u64)>> =
        OnceLock::new();
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    /// Removes the file when the process exits (test harness, libFuzzer).
    extern "C" fn remove_file() {
        if let Some(p) = PATH.get() {
            let _ = std::fs::remove_file(p);
        }
    }
    let file = FILE.get_or_init(|| {
        let path =
            std::env::temp_dir().join(format!("rate_ctl_fuzz_decide.{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        if PATH.set(path.clone()).is_ok() {
            // SAFETY: atexit takes a plain `extern "C" fn()`; `remove_file`
            // only reads a OnceLock and unlinks a path.
            unsafe { libc::atexit(remove_file) };
        }
        let caps = super::shm::Capacities {
            max_strategies: 64,
            segment_bytes: 64 << 10,
            blacklist_entries: 16,
            keys: 64,
        };
        let w = super::shm::writer::Writer::create_or_adopt(&path, caps, 0o600).expect("fuzz file");
        Mutex::new((w, super::shm::reader::Reader::new(&path), 0))
    });
    let mut guard = file.lock().unwrap_or_else(|e| e.into_inner());
    let (w, r, version) = &mut *guard;
    let mut b = Bytes(data);
    let n = b.u8() % 6;
    let list: Vec<_> = (0..n)
        .map(|i| fuzz_strategy(&mut b, 1 + i as u32))
        .collect();
    let blacklist: Vec<super::blacklist::BlacklistEntry> = match b.u8() % 4 {
        0 => vec![super::blacklist::BlacklistEntry {
            dimension: b.pick(&FUZZ_DIMS).into(),
            value: b.pick(&FUZZ_VALUES).as_bytes().to_vec(),
            expires_unix_ms: None,
        }],
        _ => Vec::new(),
    };
    *version += 1;
    if w.publish(&list, &blacklist, *version).is_err() {
        return 0;
    }
    let mut now_ns = *version * 1_000_000_000;
    r.refresh(now_ns);
    let Some(t) = r.table().cloned() else {
        return 0;
    };
    let dims = t.dimensions().len();
    let mut held_all = Vec::new();
    let mut decided = 0;
    while !b.is_empty() {
        let owned: Vec<Vec<u8>> = (0..dims)
            .map(|_| match b.u8() % 4 {
                0 => Vec::new(),
                1 => {
                    let n = b.u8() as usize % 8;
                    (0..n).map(|_| b.u8()).collect()
                }
                _ => b.pick(&FUZZ_VALUES).as_bytes().to_vec(),
            })
            .collect();
        let values: Vec<Option<&[u8]>> = owned
            .iter()
            .map(|v| (!v.is_empty()).then_some(&v[..]))
            .collect();
        let ip: std::net::IpAddr = match b.u8() % 3 {
            0 => std::net::Ipv4Addr::from(b.u32()).into(),
            1 => std::net::Ipv6Addr::from((b.u32() as u128) << 64 | b.u32() as u128).into(),
            _ => [10, 0, 0, 1].into(),
        };
        now_ns += (b.u8() as u64) * 10_000_000;
        let d = t.decide(&super::table::Request {
            values: &values[..],
            ip: Some(ip.into()),
            now_ns,
            now_unix_ms: now_ns / 1_000_000,
            dry_run: b.u8() % 8 == 0,
            quota: b.u8() % 2 == 0,
        });
        decided += 1;
        if b.u8() % 2 == 0 {
            t.release(&d.held);
        } else {
            held_all.push(d.held);
        }
    }
    for h in held_all {
        t.release(&h);
    }
    decided
}
