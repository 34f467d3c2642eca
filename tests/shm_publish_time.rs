//! Issue 29: what the agent's writer spends on a one-strategy change of a
//! 10,000-strategy table (t-nginx/43's `userid=u<i> AND api=/y`), a full
//! encode (`publish_valid`) against one told the changed id
//! (`publish_changed`, the agent's). A measurement, not a check: run
//! `cargo test --release --test shm_publish_time -- --ignored --nocapture`.

use rate_ctl::core::model::{Algorithm, Condition, Strategy, Unit, ValidStrategy};
use rate_ctl::core::shm::segment::encode_records;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use std::time::Instant;

fn s(i: u32, api: &str) -> ValidStrategy {
    Strategy {
        burst: 1_000_000,
        ..Strategy::plain(
            i,
            vec![
                Condition::from_key("userid", format!("u{i}").as_str()),
                Condition::from_key("api", api),
            ],
            Algorithm::TokenBucket,
            1_000_000,
            Unit::Second,
        )
    }
    .into_valid()
    .unwrap()
}

#[test]
#[ignore]
fn one_change_publish_time() {
    let n = 10_000u32;
    let mut list: Vec<ValidStrategy> = (1..=n).map(|i| s(i, "/y")).collect();
    let path = std::env::temp_dir().join(format!("rate-ctl-publish-time-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut w =
        Writer::create_or_adopt(&path, Capacities::tables(16_384, 16 << 20), 0o600).unwrap();
    w.publish_valid(&list, &[], 1).unwrap();
    let mut tot = Vec::new();
    let mut inc = Vec::new();
    for k in 0..400u32 {
        let id = k * 37 % n + 1;
        list[(id - 1) as usize] = s(id, if k % 2 == 0 { "/z" } else { "/y" });
        let refs: Vec<&ValidStrategy> = list.iter().collect();
        let t = Instant::now();
        if k % 2 == 0 {
            w.publish_valid(&refs, &[], 2 + k as u64).unwrap();
            tot.push(t.elapsed().as_secs_f64() * 1e3);
        } else {
            w.publish_changed(&refs, &[], 2 + k as u64, Some(&[id]))
                .unwrap();
            inc.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    inc.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "publish_changed one change: p50 {:.3} p90 {:.3} max {:.3} ms",
        inc[inc.len() / 2],
        inc[inc.len() * 9 / 10],
        inc[inc.len() - 1]
    );
    let mut enc = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let p = encode_records(list.iter().map(|s| (&**s, 1u32, 1u64)), &[], 1_100_000);
        enc.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(p);
    }
    let p = encode_records(list.iter().map(|s| (&**s, 1u32, 1u64)), &[], 1_100_000);
    let mut crc = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        std::hint::black_box(crc32fast::hash(&p));
        crc.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for v in [&mut tot, &mut enc, &mut crc] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    eprintln!(
        "publish one change: p50 {:.3} p90 {:.3} max {:.3} ms",
        tot[tot.len() / 2],
        tot[tot.len() * 9 / 10],
        tot[tot.len() - 1]
    );
    eprintln!(
        "encode all: p50 {:.3} ms; crc {} bytes p50 {:.3} ms",
        enc[enc.len() / 2],
        p.len(),
        crc[crc.len() / 2]
    );
    let _ = std::fs::remove_file(&path);
}
