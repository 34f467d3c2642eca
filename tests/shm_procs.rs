//! Real processes on one file: a writer publishing continuously while
//! readers copy the active segment; a writer killed with SIGKILL mid-write.
//! A reader must never accept a table that is not internally consistent.

#[path = "support/shm.rs"]
mod shm;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rate_ctl::core::model::{Algorithm, Strategy, Unit};
use rate_ctl::core::shm::segment::{read_segment, Decoded, SegmentError};
use rate_ctl::core::shm::slot::Slot;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Mapping;
use shm::{role, small_caps, spawn_role, strategy};

/// Table number `n`: strategy 1 never changes; strategies 2..=40 have
/// rate n and a userid value naming n. Config version = n. (The set of ids
/// stays the same so that continuous publishing needs no new slots.)
fn table(n: u64) -> Vec<Strategy> {
    let mut v = vec![strategy(
        1,
        &[("api", "/steady")],
        Algorithm::FixedWindow,
        1000,
        Unit::Hour,
    )];
    for id in 2..=40u32 {
        let user = format!("u{id}-{n}");
        v.push(strategy(
            id,
            &[("userid", user.as_str())],
            Algorithm::FixedWindow,
            n,
            Unit::Hour,
        ));
    }
    v
}

fn consistent(d: &Decoded) -> Result<(), String> {
    let n = d.config_version;
    let want = table(n);
    if d.strategies.len() != want.len() {
        return Err(format!(
            "version {n}: {} strategies, want {}",
            d.strategies.len(),
            want.len()
        ));
    }
    for (got, want) in d.strategies.iter().zip(&want) {
        if got.strategy != *want {
            return Err(format!("version {n}: strategy {} differs", want.id));
        }
    }
    Ok(())
}

fn writer_loop(path: &Path, seconds: f64) -> ! {
    let mut w = Writer::create_or_adopt(path, small_caps(), 0o600).expect("adopt");
    let start = Instant::now();
    let mut n = 2 + w.seq();
    while start.elapsed().as_secs_f64() < seconds {
        w.publish(&table(n), &[], n).expect("publish");
        n += 1;
    }
    std::process::exit(0)
}

fn reader_loop(path: &Path, want_reads: u64) -> ! {
    let map = Mapping::open(path).expect("open");
    let mut buf = Vec::new();
    let (mut ok, mut busy) = (0u64, 0u64);
    let mut versions = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ok < want_reads && Instant::now() < deadline {
        let seq = map.seq();
        match read_segment(&map.segment((seq & 1) as usize), seq, &mut buf) {
            Ok(d) => {
                if let Err(e) = consistent(&d) {
                    eprintln!("reader accepted an inconsistent table: {e}");
                    std::process::exit(2);
                }
                versions.insert(d.config_version);
                ok += 1;
            }
            Err(SegmentError::Busy) | Err(SegmentError::Sequence { .. }) => busy += 1,
            Err(e) => {
                eprintln!("reader: unexpected refusal of a good writer's segment: {e}");
                std::process::exit(3);
            }
        }
    }
    eprintln!(
        "reader {}: {ok} consistent reads, {busy} retries, {} distinct versions",
        std::process::id(),
        versions.len()
    );
    std::process::exit(if ok >= want_reads && versions.len() > 10 {
        0
    } else {
        4
    })
}

/// `dir/rc`, created with `table(1)` published in it.
fn published_file(dir: &Path) -> PathBuf {
    let path = dir.join("rc");
    Writer::create_or_adopt(&path, small_caps(), 0o600)
        .unwrap()
        .publish(&table(1), &[], 1)
        .unwrap();
    path
}

#[test]
fn readers_never_accept_a_torn_table() {
    if let Some((role, path)) = role() {
        match role.as_str() {
            "writer" => writer_loop(&path, 4.0),
            "reader" => reader_loop(&path, 100_000),
            _ => unreachable!(),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published_file(dir.path());
    let test = "readers_never_accept_a_torn_table";
    let mut writer = spawn_role(test, "writer", &path);
    let readers: Vec<_> = (0..3).map(|_| spawn_role(test, "reader", &path)).collect();
    for mut r in readers {
        let status = r.wait().unwrap();
        assert!(status.success(), "reader failed: {status}");
    }
    assert!(writer.wait().unwrap().success());
}

#[test]
fn writer_killed_mid_publish_leaves_the_last_good_table() {
    if let Some((role, path)) = role() {
        if role == "writer" {
            writer_loop(&path, 30.0)
        }
        unreachable!()
    }
    let dir = tempfile::tempdir().unwrap();
    let path = published_file(dir.path());
    let steady_slot = {
        let map = Mapping::open(&path).unwrap();
        let d = read_segment(&map.segment(1), 1, &mut Vec::new()).unwrap();
        d.strategies[0].slot
    };
    let mut buf = Vec::new();
    for i in 0..20u64 {
        let counted = i;
        let mut child = spawn_role(
            "writer_killed_mid_publish_leaves_the_last_good_table",
            "writer",
            &path,
        );
        std::thread::sleep(Duration::from_millis(30 + (i * 7) % 40));
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let map = Mapping::open(&path).expect("file still valid after SIGKILL");
        let seq = map.seq();
        let d = read_segment(&map.segment((seq & 1) as usize), seq, &mut buf)
            .expect("the active segment is whole");
        consistent(&d).expect("the active segment is consistent");
        // Counters of the unchanged strategy continue across writers.
        let steady = &d.strategies[0];
        assert_eq!(steady.slot, steady_slot, "unchanged strategy kept its slot");
        let slot = Slot::at(&map.slots(), steady.slot).unwrap();
        assert_eq!(slot.counters().passed, counted);
        slot.passed()
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // A new writer adopts the file and publishes.
    let mut w = Writer::create_or_adopt(&path, small_caps(), 0o600).unwrap();
    let seq = w.seq();
    w.publish(&table(5), &[], 5).unwrap();
    assert_eq!(w.seq(), seq + 1);
}
