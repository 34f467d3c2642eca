//! The fuzzing entry point (fuzz/fuzz_targets/reader.rs, tests/corrupt.rs):
//! every reader-side parser over arbitrary bytes. Kept apart from `shm` so
//! that the file layer does not depend on the matcher (`table`).

use std::path::Path;

use super::region::Region;
use super::segment::{decode_payload, read_segment, Decoded};
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
