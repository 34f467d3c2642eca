//! Helpers shared by the core integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;

use rate_ctl::core::model::{Algorithm, Condition, Strategy, Unit};
use rate_ctl::core::shm::reader::Reader;
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;
use rate_ctl::core::table::Table;

/// Small capacities so tests are fast.
pub fn small_caps() -> Capacities {
    Capacities::tables(1024, 256 << 10)
}

/// A new shared-memory file (small capacities) in a temporary directory,
/// and its writer; keep the directory alive as long as the file is used.
pub fn fresh_writer() -> (tempfile::TempDir, PathBuf, Writer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let w = adopt(&path);
    (dir, path, w)
}

/// [`adopt`] the file at `path` and publish `strategies` as config version 1.
pub fn adopt_published(path: &Path, strategies: &[Strategy]) -> Writer {
    let mut w = adopt(path);
    w.publish(strategies, &[], 1).unwrap();
    w
}

/// The table `reader` holds once refreshed at `now_ns`.
pub fn table_at(reader: &mut Reader, now_ns: u64) -> Arc<Table> {
    reader.refresh(now_ns);
    reader.table().unwrap().clone()
}

/// [`fresh_writer`] with room for `max_strategies` strategies only.
pub fn capped_writer(max_strategies: u32) -> (tempfile::TempDir, PathBuf, Writer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rc");
    let mut caps = small_caps();
    caps.max_strategies = max_strategies;
    let w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
    (dir, path, w)
}

/// The writer of the test file at `path` (small capacities), creating the
/// file or adopting the one there, as the agent does at start.
pub fn adopt(path: &std::path::Path) -> Writer {
    Writer::create_or_adopt(path, small_caps(), 0o600).unwrap()
}

pub fn strategy(
    id: u32,
    conds: &[(&str, &str)],
    algorithm: Algorithm,
    rate: u64,
    per: Unit,
) -> Strategy {
    Strategy::plain(
        id,
        conds.iter().map(|(d, v)| Condition::new(*d, *v)).collect(),
        algorithm,
        rate,
        per,
    )
}

/// A token bucket of 10 a second on `api` (the tests' usual strategy).
pub fn api_bucket(id: u32, api: &str) -> Strategy {
    strategy(
        id,
        &[("api", api)],
        Algorithm::TokenBucket,
        10,
        Unit::Second,
    )
}

/// Runs the current test binary again as a child playing `role`: the test
/// function named `test` sees RATE_CTL_TEST_ROLE and does the role's work
/// instead of the test. Real processes, no fork in a threaded harness.
pub fn spawn_role(test: &str, role: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("RATE_CTL_TEST_ROLE", role)
        .env("RATE_CTL_TEST_PATH", path)
        .spawn()
        .expect("spawn child")
}

/// The role this process plays, if it is a child.
pub fn role() -> Option<(String, std::path::PathBuf)> {
    let role = std::env::var("RATE_CTL_TEST_ROLE").ok()?;
    let path = std::env::var_os("RATE_CTL_TEST_PATH")?;
    Some((role, path.into()))
}
