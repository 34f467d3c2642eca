//! Checksum-valid but hostile segments (issue 28): counts and lengths
//! from the file are bounded by the bytes present before anything is
//! allocated or looped over. Each is refused with one message naming what
//! was wrong, by the worker (foreground and background loading), the
//! agent's and `rate-ctl shm`'s decoder, and the previous table is kept.
//! A writer flipping sequences cannot grow the builder threads.

#[path = "support/shm.rs"]
mod shm;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rate_ctl::core::fuzz::Crafted;
use rate_ctl::core::shm::loader;
use rate_ctl::core::shm::reader::{Reader, Severity, RECHECK_NS};
use rate_ctl::core::shm::segment::{
    encode_payload, read_segment, write_segment, Published, SegmentError,
};
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::{Capacities, Mapping, H_SEQ};
use rate_ctl::core::table::Table;
use shm::{api_bucket, fresh_writer};

/// The builder-thread count is per process: the tests that load in the
/// background take turns.
static BACKGROUND: Mutex<()> = Mutex::new(());

/// What each crafted segment's refusal names.
fn expected(c: Crafted) -> &'static str {
    match c {
        Crafted::Count => "strategy count 4294967295 does not fit",
        Crafted::RecordLength => "bad record length",
        Crafted::BlacklistDimensions => "blacklist dimension count 4294967295 does not fit",
    }
}

/// A file with a good table at config version 2, a reader enforcing it.
fn enforcing(background: bool) -> (tempfile::TempDir, Reader, Arc<Mapping>) {
    let (dir, path, mut w) = fresh_writer();
    let s = api_bucket(1, "/a");
    w.publish(std::slice::from_ref(&s), &[], 1).unwrap();
    w.publish(std::slice::from_ref(&s), &[], 2).unwrap();
    let mut r = Reader::new(&path);
    r.refresh(0);
    assert_eq!(r.table().unwrap().config_version(), 2);
    r.set_background(background);
    // The agent's mapping: a worker maps the configuration read-only.
    let map = w.mapping().clone();
    (dir, r, map)
}

#[test]
fn the_pre_fix_crash_input_is_refused_by_the_table_builder() {
    // The security review's PoC (H1): one record, 2^32-1 announced, a
    // valid checksum, then `Table::read` — which aborted the process.
    let (_dir, _r, map) = enforcing(false);
    let seq = Crafted::Count.publish(&map);
    let mut buf = Vec::new();
    let err = Table::read(&map.segment((seq & 1) as usize), seq, &mut buf, None)
        .err()
        .expect("refused");
    assert!(
        matches!(err, SegmentError::Count { count, .. } if count == u32::MAX as u64),
        "{err}"
    );
}

#[test]
fn every_crafted_segment_is_refused_by_a_worker_that_keeps_its_table() {
    for c in Crafted::ALL {
        let (_dir, mut r, map) = enforcing(false);
        let seq = c.publish(&map);
        let change = r.refresh(1).expect("one line for the refusal");
        assert_eq!(change.level, Severity::Error);
        assert!(
            change
                .message
                .contains(&format!("refused segment of sequence {seq}"))
                && change.message.contains(expected(c))
                && change.message.contains("keeping the previous table"),
            "{}: {}",
            c.name(),
            change.message
        );
        assert_eq!(r.table().unwrap().config_version(), 2, "{}", c.name());
        // Logged once, not per request.
        assert!(r.refresh(2).is_none());
        assert!(r.refresh(RECHECK_NS + 2).is_none());
    }
}

#[test]
fn every_crafted_segment_is_refused_by_the_agents_decoder() {
    // `read_segment` is what the agent (publish check) and `rate-ctl shm`
    // decode a segment with.
    for c in Crafted::ALL {
        let (_dir, _r, map) = enforcing(false);
        let seq = c.publish(&map);
        let mut buf = Vec::new();
        let err = read_segment(&map.segment((seq & 1) as usize), seq, &mut buf)
            .err()
            .unwrap_or_else(|| panic!("{} accepted", c.name()));
        assert!(err.to_string().contains(expected(c)), "{}: {err}", c.name());
    }
}

#[test]
fn a_crafted_count_loaded_in_the_background_is_refused_once() {
    // 2^32-1 announced is over the background threshold: the helper
    // thread reads it (where the abort used to happen).
    let _turn = BACKGROUND.lock().unwrap_or_else(|e| e.into_inner());
    let (_dir, mut r, map) = enforcing(true);
    let seq = Crafted::Count.publish(&map);
    let mut lines = Vec::new();
    for i in 0..2000u64 {
        lines.extend(r.refresh(1 + i));
        if !lines.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0]
            .message
            .contains(&format!("refused segment of sequence {seq}"))
            && lines[0].message.contains(expected(Crafted::Count)),
        "{}",
        lines[0].message
    );
    assert_eq!(r.table().unwrap().config_version(), 2);
    assert!(r.refresh(5000).is_none());
}

#[test]
fn a_writer_flipping_sequences_cannot_grow_the_builder_threads() {
    let _turn = BACKGROUND.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut w = Writer::create_or_adopt(&path, Capacities::tables(8192, 2 << 20), 0o600).unwrap();
    let list: Vec<_> = (1..=5000)
        .map(|i| api_bucket(i, &format!("/p{i}")))
        .collect();
    w.publish(&list, &[], 1).unwrap();
    let mut r = Reader::new(&path);
    r.refresh(0);
    assert_eq!(r.table().unwrap().published_strategies(), 5000);
    r.set_background(true);
    let map = w.mapping().clone();
    // The same 5,000 strategies, republished under a new sequence before
    // every request: each is a full build (milliseconds).
    let published: Vec<Published> = list
        .iter()
        .enumerate()
        .map(|(i, s)| Published {
            strategy: s.clone(),
            slot: i as u32,
            generation: 1,
        })
        .collect();
    let payload = encode_payload(&published, &[]);
    let mut most = 0;
    for i in 0..300u64 {
        let next = map.seq() + 1;
        write_segment(
            &map.segment((next & 1) as usize),
            &payload,
            5000,
            0,
            next,
            10 + i,
            0,
        );
        map.header()
            .u64_at(H_SEQ)
            .unwrap()
            .store(next, Ordering::Release);
        r.refresh(1 + i);
        most = most.max(loader::in_flight());
    }
    assert!(most <= 1, "{most} builder threads at once");
    // Once the writer stops, the last table is installed.
    let last = map.seq();
    for i in 0..5000u64 {
        r.refresh(1000 + i);
        if r.table().unwrap().config_version() == 10 + 299 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(r.table().unwrap().config_version(), 10 + 299, "seq {last}");
    assert!(loader::in_flight() <= 1);
}

#[test]
fn the_fuzz_entry_points_refuse_the_pre_fix_crash_input() {
    // What the `segment` fuzz target runs, on the crash input: refused by
    // its count (here with the checksum checked, as in production).
    for c in Crafted::ALL {
        let image = rate_ctl::core::fuzz::crafted_image(c, 7);
        let err = rate_ctl::core::fuzz::fuzz_segment(&image)
            .err()
            .unwrap_or_else(|| panic!("{} accepted", c.name()));
        assert!(err.to_string().contains(expected(c)), "{}: {err}", c.name());
    }
    // The whole-file entry point over the crafted file does not abort.
    let (_dir, _r, map) = enforcing(false);
    Crafted::Count.publish(&map);
    let bytes = std::fs::read(&map.path).unwrap();
    rate_ctl::core::fuzz::fuzz_reader(&bytes);
    // The request-path entry point on a few inputs: tables the model
    // takes, requests decided through them.
    let mut decided = 0;
    for seed in 0..64u8 {
        let data: Vec<u8> = (0..200u32)
            .map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed))
            .collect();
        decided += rate_ctl::core::fuzz::fuzz_decide(&data);
    }
    assert!(decided > 100, "{decided} requests decided");
}
