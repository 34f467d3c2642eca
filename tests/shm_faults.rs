//! Faults of the shared-memory file met by real `rate-ctl agent` processes
//! (issue 11): a second agent on the same file, a full tmpfs, a file
//! planted by another local user. The README's "Faults" table is kept true
//! by these tests.
#![cfg(feature = "cli")]

#[path = "support/agent.rs"]
mod agent;
#[path = "support/cli.rs"]
mod cli;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agent::{wait_for, AgentProc, Reader};
use cli::{ok, sqlite_store, version, TestStore};

const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// As root: a store holding one strategy, for a test that runs processes
/// as `nobody` (setpriv). Otherwise `None`, having said the test is skipped.
fn store_for_setpriv(test: &str) -> Option<TestStore> {
    root_or_skip(test, "for setpriv").then(|| {
        let s = sqlite_store();
        add(&s.url, "one");
        s
    })
}

/// `true` as root; otherwise says loudly that `test` is skipped and why.
fn root_or_skip(test: &str, why: &str) -> bool {
    if !is_root() {
        eprintln!("SKIPPED {test}: needs root {why}");
    }
    is_root()
}

fn add(s: &str, name: &str) {
    ok(&[
        "strategy",
        "add",
        "--store",
        s,
        "--name",
        name,
        "--match",
        &format!("api=/{name}"),
        "--algorithm",
        "token_bucket",
        "--rate",
        "10",
        "--scope",
        "host",
    ]);
}

/// Waits for the agent to publish the store's current version.
fn published(s: &str, shm: &Path) {
    let mut r = Reader::open(shm);
    assert!(
        r.wait_version(version(s) as u64, Duration::from_secs(10))
            .is_some(),
        "agent did not publish"
    );
}

/// A world-writable sticky directory, like `/dev/shm`.
fn sticky_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

#[test]
fn a_second_agent_on_the_same_file_is_refused_naming_the_holder() {
    let (s1, s2) = (sqlite_store(), sqlite_store());
    add(&s1.url, "one");
    add(&s2.url, "two");
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("rc.shm");
    let first = AgentProc::start(&s1.url, &shm, "h1", &dir.path().join("a1.log"), &[]);
    published(&s1.url, &shm);
    // Another store, same file: it must not start writing.
    let mut second = AgentProc::start(&s2.url, &shm, "h2", &dir.path().join("a2.log"), &[]);
    let status = second.stop_with(0, Duration::from_secs(10));
    let log = second.log_text();
    assert!(
        matches!(status, Some(st) if st.code().is_some_and(|c| c != 0)),
        "second agent still running or killed: {status:?}\n{log}"
    );
    assert!(
        log.contains(&format!("another writer holds it (pid {})", first.pid())),
        "the refusal names the holder: {log}"
    );
    // The first agent's table is untouched.
    let mut r = Reader::open(&shm);
    let t = r.table().expect("table");
    assert_eq!(t.config_version(), version(&s1.url) as u64);
    drop(first);
    // The holder gone (the kernel drops its lock): the next agent adopts.
    let third = AgentProc::start(&s2.url, &shm, "h2", &dir.path().join("a3.log"), &[]);
    published(&s2.url, &shm);
    drop(third);
}

#[test]
fn a_full_tmpfs_is_an_error_line_not_a_crash() {
    if !root_or_skip(
        "a_full_tmpfs_is_an_error_line_not_a_crash",
        "to mount a tmpfs",
    ) {
        return;
    }
    let s = sqlite_store();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let m = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(m.success(), "mount tmpfs");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    let shm = mnt.join("rc.shm");
    let log = dir.path().join("a.log");
    // Twice: a restart meets the same full file system (no crash loop).
    for round in 0..2 {
        let mut a = AgentProc::start(&s.url, &shm, "h", &log, &[]);
        let text = a.exits_with_error(&format!("round {round}"));
        assert!(
            text.contains("No space left on device"),
            "round {round}: the error names the cause: {text}"
        );
        let left: Vec<_> = std::fs::read_dir(&mnt).unwrap().flatten().collect();
        assert!(
            left.is_empty(),
            "round {round}: nothing left behind: {left:?}"
        );
    }
}

#[test]
fn a_file_planted_by_another_user_is_not_adopted() {
    let Some(s) = store_for_setpriv("a_file_planted_by_another_user_is_not_adopted") else {
        return;
    };
    let dir = sticky_dir();
    let shm = dir.path().join("rc.shm");
    // A valid rate_ctl file, made by `nobody` at the agent's path.
    let mut planter = AgentProc::start(&s.url, &shm, "p", &dir.path().join("p.log"), &[]);
    published(&s.url, &shm);
    planter.stop_with(libc::SIGTERM, Duration::from_secs(5));
    let planted = dir.path().join("planted");
    let state = rate_ctl::core::shm::state_path(&shm);
    let planted_state = rate_ctl::core::shm::state_path(&planted);
    for (from, to) in [(&shm, &planted), (&state, &planted_state)] {
        std::fs::copy(from, to).unwrap();
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::remove_file(from).unwrap();
    }
    let cp = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg("sh")
        .arg("-c")
        .arg(format!(
            "umask 0; cp {} {} && cp {} {} && chmod 0666 {} {}",
            planted.display(),
            shm.display(),
            planted_state.display(),
            state.display(),
            shm.display(),
            state.display()
        ))
        .status()
        .unwrap();
    assert!(cp.success(), "nobody plants the file");
    assert_eq!(std::fs::metadata(&shm).unwrap().uid(), NOBODY);

    let log = dir.path().join("a.log");
    let a = AgentProc::start(&s.url, &shm, "h", &log, &["--mode", "0660", "--group", "0"]);
    // The planted copy already holds the current version, so wait for the
    // agent's own file (bounded), then check it.
    let _ = wait_for(Duration::from_secs(5), || {
        a.log_text().contains("owned by nobody").then_some(())
    });
    published(&s.url, &shm);
    let meta = std::fs::metadata(&shm).unwrap();
    assert_eq!(
        meta.uid(),
        0,
        "the planted file was replaced by the agent's own"
    );
    // The configuration without group write, the state file as asked.
    assert_eq!(meta.mode() & 0o7777, 0o640, "--mode applied");
    assert_eq!(meta.gid(), 0, "--group applied");
    let smeta = std::fs::metadata(&state).unwrap();
    assert_eq!(smeta.uid(), 0, "the planted state file was replaced too");
    assert_eq!(smeta.mode() & 0o7777, 0o660, "--mode applied");
    let text = a.log_text();
    assert!(
        text.contains("owned by nobody (uid 65534)"),
        "the log names the owner: {text}"
    );
    // nobody cannot write the table any more.
    let write = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg("sh")
        .arg("-c")
        .arg(format!("echo x >> {}", shm.display()))
        .output()
        .unwrap();
    assert!(
        !write.status.success(),
        "nobody can no longer write the file"
    );

    // Restarted with another mode, the agent applies it to the file it adopts.
    drop(a);
    let b = AgentProc::start(&s.url, &shm, "h", &log, &["--mode", "0640"]);
    published(&s.url, &shm);
    let ok_mode = wait_for(Duration::from_secs(5), || {
        (std::fs::metadata(&state).unwrap().mode() & 0o7777 == 0o640).then_some(())
    });
    assert!(ok_mode.is_some(), "--mode applied on adoption");
    drop(b);
}

#[test]
fn a_publish_refused_by_the_slot_quarantine_is_retried_without_another_change() {
    let st = sqlite_store();
    let s = st.url.as_str();
    for i in 0..4 {
        add(s, &format!("q{i}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("rc.shm");
    let a = AgentProc::start(
        s,
        &shm,
        "h",
        &dir.path().join("a.log"),
        &["--max-strategies", "4"],
    );
    published(s, &shm);
    // At capacity: remove one and add another within the 2 s quarantine of
    // the freed slot. The new strategy has no free slot yet: the removal is
    // published at once and the rest deferred ...
    ok(&["strategy", "rm", "--store", s, "1"]);
    add(s, "fresh");
    let t0 = std::time::Instant::now();
    let v = version(s) as u64;
    let staged = wait_for(Duration::from_secs(5), || {
        a.log_text().contains("published in stages").then_some(())
    });
    assert!(staged.is_some(), "deferred first:\n{}", a.log_text());
    // ... and applied by the next stage once the slot is free, with no
    // other change.
    let mut r = Reader::open(&shm);
    let t = r.wait_version(v, Duration::from_secs(5));
    let took = t0.elapsed();
    let t = t.unwrap_or_else(|| panic!("never applied:\n{}", a.log_text()));
    assert!(
        t.strategies().iter().any(|c| c.strategy.id == 5),
        "the new strategy is published"
    );
    println!("applied {took:?} after the change");
    assert!(took < Duration::from_secs(3), "applied after {took:?}");
    assert_eq!(
        a.log_text().matches("published in stages").count(),
        1,
        "the deferral is logged once"
    );
}

#[test]
fn a_file_truncated_under_the_agent_is_replaced_and_republished() {
    let st = sqlite_store();
    let s = st.url.as_str();
    add(s, "one");
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("rc.shm");
    let mut a = AgentProc::start(s, &shm, "h", &dir.path().join("a.log"), &[]);
    published(s, &shm);
    // Truncated in place (the agent's next heartbeat write faults on it).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shm)
        .unwrap()
        .set_len(0)
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut r = Reader::open(&shm);
    let back = r.wait_version(version(s) as u64, Duration::from_secs(8));
    assert!(a.alive(), "the agent is alive:\n{}", a.log_text());
    assert!(back.is_some(), "republished:\n{}", a.log_text());
    assert!(
        std::fs::metadata(&shm).unwrap().len() > 4096,
        "a whole file again"
    );
    let text = a.log_text();
    assert!(
        text.contains("the shared-memory file was changed by someone else; repaired"),
        "logged: {text}"
    );
    println!("republished {:?} after the truncation", t0.elapsed());
}

#[test]
fn a_symlink_planted_at_the_path_never_changes_the_file_it_points_to() {
    let Some(s) =
        store_for_setpriv("a_symlink_planted_at_the_path_never_changes_the_file_it_points_to")
    else {
        return;
    };
    // A root-only file elsewhere, and `nobody` pointing the agent's path at it.
    let private = tempfile::tempdir().unwrap();
    let secret = private.path().join("secret");
    std::fs::write(&secret, b"root only\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    let dir = sticky_dir();
    let shm = dir.path().join("rc.shm");
    let ln = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg("ln")
        .arg("-s")
        .arg(&secret)
        .arg(&shm)
        .status()
        .unwrap();
    assert!(ln.success(), "nobody plants the symlink");
    let before = std::fs::metadata(&secret).unwrap();

    // The agent gives its file to nobody's group: through the symlink that
    // would make the secret readable by nobody. It refuses the path instead,
    // naming it, and exits with an error.
    let log = dir.path().join("a.log");
    let mut a = AgentProc::start(
        &s.url,
        &shm,
        "h",
        &log,
        &["--mode", "0660", "--group", &NOBODY.to_string()],
    );
    let exited = wait_for(Duration::from_secs(10), || (!a.alive()).then_some(()));
    assert!(
        exited.is_some(),
        "the agent does not run on a planted symlink"
    );
    assert!(
        a.log_text()
            .contains("is a symbolic link; refusing to follow it"),
        "the refusal names the cause: {}",
        a.log_text()
    );
    let after = std::fs::metadata(&secret).unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode() & 0o7777),
        (before.uid(), before.gid(), 0o640),
        "the file behind the symlink keeps its owner, group and mode"
    );
    assert_eq!(std::fs::read(&secret).unwrap(), b"root only\n");
}
