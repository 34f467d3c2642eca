//! Strategy sets shared by the benchmarks (`mod common;` in each).
#![allow(dead_code)]

use rate_ctl::core::model::{Algorithm, Condition, Strategy, Unit};

const DIMS: [&str; 6] = ["ip", "userid", "api", "method", "host", "appid"];

/// `n` strategies over 6 dimensions, 1 to 3 conditions each, deterministic.
/// Like real strategy sets, low-cardinality values (method, host) only
/// narrow a strategy that also names a caller (ip, userid, appid) or an
/// api: thousands of global "every GET" limits would be one strategy.
pub fn strategies(n: u32) -> Vec<Strategy> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (1..=n)
        .map(|id| {
            let k = 1 + (rnd() % 3) as usize;
            // First condition: a high-cardinality dimension.
            let mut dims: Vec<usize> = vec![[0, 1, 2, 5][(rnd() % 4) as usize]];
            while dims.len() < k {
                let d = (rnd() % 6) as usize;
                if !dims.contains(&d) {
                    dims.push(d);
                }
            }
            let conditions = dims
                .iter()
                .map(|&d| {
                    let v = match DIMS[d] {
                        "ip" => format!("10.{}.{}.{}", rnd() % 256, rnd() % 256, rnd() % 256),
                        "api" => format!("/api/v{}", rnd() % 200),
                        "method" => ["GET", "POST", "PUT"][(rnd() % 3) as usize].to_string(),
                        "host" => format!("h{}.example", rnd() % 50),
                        other => format!("{other}{}", rnd() % (n as u64 * 4)),
                    };
                    Condition::new(DIMS[d], v)
                })
                .collect();
            never_full(id, conditions)
        })
        .collect()
}

/// A strategy that never rejects, on `conds`.
pub fn passing(id: u32, conds: &[(&str, String)]) -> Strategy {
    let conditions = conds
        .iter()
        // A key may carry an operator (`api^`, `api~`, `a!`).
        .map(|(d, v)| Condition::from_key(d, v.as_str()))
        .collect();
    never_full(id, conditions)
}

/// A token bucket of a million a second: every request passes.
pub fn never_full(id: u32, conditions: Vec<Condition>) -> Strategy {
    Strategy {
        burst: 1_000_000,
        ..Strategy::plain(
            id,
            conditions,
            Algorithm::TokenBucket,
            1_000_000,
            Unit::Second,
        )
    }
}

/// A scratch directory for the benchmark's files, in /dev/shm when there
/// is one (as the nginx workers' file).
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap()
}
