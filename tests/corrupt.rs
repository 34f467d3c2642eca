//! Corrupt files: random bytes, flipped bits and truncation in every region
//! give an error value (or a table that still validates), never a panic or
//! an out-of-bounds read; a worker keeps its last good table.

#[path = "support/shm.rs"]
mod shm;

use std::path::Path;

use proptest::prelude::*;
use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::{Algorithm, Unit};
use rate_ctl::core::shm::reader::{Reader, RECHECK_NS};
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::{Mapping, ShmError};
use rate_ctl::core::table::Request;
use shm::{api_bucket, fresh_writer, small_caps, strategy};

/// A valid file with strategies and a blacklist, as bytes.
fn good_image(dir: &Path) -> Vec<u8> {
    let path = dir.join("good");
    let mut w = Writer::create_or_adopt(&path, small_caps(), 0o600).unwrap();
    let list: Vec<_> = (1..=20)
        .map(|i| {
            let user = format!("u{i}");
            strategy(
                i,
                &[("ip", "10.0.0.1"), ("userid", user.as_str())],
                Algorithm::TokenBucket,
                10,
                Unit::Second,
            )
        })
        .collect();
    let bl = vec![BlacklistEntry {
        dimension: "userid".into(),
        value: b"evil".to_vec(),
        expires_unix_ms: None,
    }];
    w.publish(&list, &bl, 1).unwrap();
    w.publish(&list, &bl, 2).unwrap(); // both segments written
                                       // Both files back to back, as a worker maps them (layout version 4).
    let mut image = std::fs::read(&path).unwrap();
    image.extend(std::fs::read(rate_ctl::core::shm::state_path(&path)).unwrap());
    image
}

/// Writes an image as the pair at `path`: the configuration up to where
/// its header says the state file begins (clamped), the state file after.
fn write_pair(path: &Path, bytes: &[u8]) {
    let at = rate_ctl::core::shm::H_STATE_OFF;
    let split = bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(0)
        .min(bytes.len() as u64) as usize;
    let split = if split == 0 { bytes.len() } else { split };
    std::fs::write(path, &bytes[..split]).unwrap();
    std::fs::write(rate_ctl::core::shm::state_path(path), &bytes[split..]).unwrap();
}

/// Opens `bytes` as a file and runs a worker over it: refresh, decide.
fn exercise(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    write_pair(&path, bytes);
    let mut e = Reader::new(&path);
    e.refresh(0);
    if let Some(t) = e.table() {
        let values: Vec<Option<&[u8]>> = t
            .dimensions()
            .iter()
            .map(|d| match d.as_str() {
                "ip" => Some(&b"10.0.0.1"[..]),
                _ => Some(&b"u3"[..]),
            })
            .collect();
        let r = Request {
            values: &values,
            ip: Some("10.0.0.1".parse::<std::net::IpAddr>().unwrap().into()),
            now_ns: 5,
            now_unix_ms: 5,
            dry_run: false,
            quota: true,
        };
        let d = t.decide(&r);
        t.release(&d.held);
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn truncation_in_every_region_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = good_image(dir.path());
    let g = Mapping::open(&dir.path().join("good")).unwrap().geometry;
    let cuts = [
        0,
        100,
        4095,
        g.bitmap_off + 8,
        g.seg_off[0] + 100,
        g.seg_off[1] + 100,
        g.slots_off + 64,
        g.bl_off + 10,
        g.file_size - 8,
    ];
    for cut in cuts {
        let path = dir.path().join("cut");
        write_pair(&path, &image[..cut as usize]);
        let err = Mapping::open(&path)
            .err()
            .unwrap_or_else(|| panic!("cut at {cut} accepted"));
        assert!(
            matches!(err, ShmError::TooSmall { .. } | ShmError::Truncated { .. }),
            "cut at {cut}: {err}"
        );
        let mut e = Reader::new(&path);
        let change = e.refresh(0).expect("one error line");
        assert!(
            e.table().is_none(),
            "fail open at cut {cut}: {}",
            change.message
        );
    }
}

#[test]
fn a_worker_keeps_its_table_when_the_file_is_corrupted_under_it() {
    let (_dir, path, mut w) = fresh_writer();
    let s = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&s), &[], 1).unwrap();
    w.publish(std::slice::from_ref(&s), &[], 2).unwrap(); // sequence 2, segment 0
    let mut e = Reader::new(&path);
    e.refresh(0);
    assert_eq!(e.table().unwrap().config_version(), 2);
    // Flip one bit of the inactive segment's payload (sequence 1's), then
    // make the header name it as sequence 3.
    // Through the agent's mapping: a worker's maps the configuration
    // read-only (a store there is a SIGSEGV).
    let map = w.mapping().clone();
    let seg = map.segment(1);
    seg.store(64 + 8, seg.load(64 + 8) ^ 1);
    seg.store(16, 3); // its publish sequence
    map.header()
        .u64_at(rate_ctl::core::shm::H_SEQ)
        .unwrap()
        .store(3, std::sync::atomic::Ordering::Release);
    let c = e.refresh(1).expect("refusal logged once");
    assert!(c.message.contains("checksum"), "{}", c.message);
    assert_eq!(
        e.table().unwrap().config_version(),
        2,
        "last good table kept"
    );
    assert!(e.refresh(RECHECK_NS).is_none());
}

/// The PREACCESS test knob's reader: due for a check at every request,
/// whatever refreshed it in between (the worker's watch timer does, every
/// 5 ms); an ordinary reader is current for a second after a check.
#[test]
fn a_reader_told_to_recheck_always_stays_due_after_refreshes() {
    let (_dir, path, mut w) = fresh_writer();
    w.publish(&[api_bucket(1, "/a")], &[], 1).unwrap();
    let mut plain = Reader::new(&path);
    plain.refresh(0);
    assert!(plain.is_current(1));
    let mut knob = Reader::new(&path);
    knob.refresh(0);
    knob.recheck_always();
    for now in [1, 2, RECHECK_NS + 3] {
        knob.refresh(now);
        assert!(!knob.is_current(now + 1), "at {now}");
    }
    assert_eq!(knob.table().unwrap().config_version(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn flipped_bits_anywhere_never_panic(flips in proptest::collection::vec((any::<u64>(), 0u8..8), 1..16)) {
        let dir = tempfile::tempdir().unwrap();
        let mut image = good_image(dir.path());
        // Bias half the flips into the header and the active segment's head.
        for (i, (pos, bit)) in flips.iter().enumerate() {
            let len = image.len() as u64;
            let at = if i % 2 == 0 { pos % 4096.min(len) } else { pos % len };
            image[at as usize] ^= 1 << bit;
        }
        exercise(dir.path(), "flipped", &image);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        let dir = tempfile::tempdir().unwrap();
        exercise(dir.path(), "random", &bytes);
        rate_ctl::core::fuzz::fuzz_reader(&bytes);
    }

    #[test]
    fn a_random_header_over_a_good_body_never_panics(header in proptest::collection::vec(any::<u8>(), 4096)) {
        let dir = tempfile::tempdir().unwrap();
        let mut image = good_image(dir.path());
        // Keep the magic and version so the geometry parser is reached.
        image[16..4096].copy_from_slice(&header[16..4096]);
        exercise(dir.path(), "header", &image);
    }
}
