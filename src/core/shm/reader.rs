//! The worker side: one [`Reader`] per nginx worker process.
//!
//! Per request the reader costs one acquire load (has the sequence moved?).
//! When it moved, the active segment is copied, validated and compiled into
//! a new [`Table`]; a bad segment is refused and the previous table stays.
//! At most once a second (by the caller's monotonic clock) the reader also
//! checks that the mapped file is still whole and still the one at the path:
//! a truncated file is dropped before it can raise SIGBUS in a worker, and a
//! file the agent recreated is mapped afresh. Without a usable file the
//! reader fails open: [`Reader::table`] is `None` and requests pass.
//!
//! A truncation inside that second raises SIGBUS; where the
//! [`sigbus`](crate::core::shm::sigbus) guard is installed (nginx workers, the agent)
//! the mapping then reads as zeros, so the sequence appears to change and
//! the next refresh drops the mapping and fails open until the file is
//! whole again.
//!
//! Every change of state is reported once by [`Reader::refresh`], never per
//! request.

use std::path::PathBuf;
use std::sync::Arc;

use crate::core::shm::loader::{self, Built, Pending};
use crate::core::shm::segment::SegmentError;
use crate::core::shm::{Mapping, ShmError};
use crate::core::table::Table;

/// How often a missing, replaced or truncated file is looked for.
pub const RECHECK_NS: u64 = 1_000_000_000;
/// Attempts to read a segment the writer is busy with, per refresh.
const BUSY_RETRIES: usize = 16;
/// Pause before trying a busy segment again.
const BUSY_BACKOFF_NS: u64 = 200_000;

/// Severity of a state change, for the caller's logger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Notice,
}

/// A change of the reader's state, to be logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub level: Severity,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Enforcing,
    NothingPublished,
    FileUnusable,
    SegmentRefused,
}

pub struct Reader {
    path: PathBuf,
    map: Option<Arc<Mapping>>,
    table: Option<Arc<Table>>,
    seen_seq: u64,
    next_check_ns: u64,
    busy_until_ns: u64,
    state: State,
    buf: Vec<u8>,
    notice: Option<StateChange>,
    /// Large segments are loaded by a helper thread ([`loader`]).
    background: bool,
    /// The load under way on a helper thread, and the mapping it reads.
    pending: Option<(Pending, Arc<Mapping>)>,
    /// nginx's `rate_ctl_shm_owner`: a configuration owned by anyone but
    /// root or this uid is refused ([`Mapping::open_owned`]); `None`: by
    /// anyone but root or the owner of its directory.
    owner: Option<u32>,
    /// [`recheck_always`](Self::recheck_always): every refresh leaves the
    /// reader due for the next one.
    always_due: bool,
}

impl Reader {
    /// Opens nothing yet: the first [`Reader::refresh`] does.
    pub fn new(path: impl Into<PathBuf>) -> Reader {
        Reader {
            path: path.into(),
            map: None,
            table: None,
            seen_seq: 0,
            next_check_ns: 0,
            busy_until_ns: 0,
            state: State::Start,
            buf: Vec::new(),
            notice: None,
            background: false,
            pending: None,
            owner: None,
            always_due: false,
        }
    }

    /// Refuses a configuration owned by anyone but root or `owner` (by
    /// default, `None`: root or the owner of the file's directory).
    pub fn with_owner(mut self, owner: Option<u32>) -> Reader {
        self.owner = owner;
        self
    }

    /// Loads segments of [`loader::BACKGROUND_MIN`] strategies or more on
    /// a helper thread from now on (an nginx worker, once it has loaded
    /// its first table at start): until the new table is built, requests
    /// are decided with the current one.
    pub fn set_background(&mut self, on: bool) {
        self.background = on;
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The table to decide with; `None` = fail open.
    #[inline]
    pub fn table(&self) -> Option<&Arc<Table>> {
        self.table.as_ref()
    }

    /// The mapped file, when there is one (for stats).
    pub fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.map.as_ref()
    }

    /// Whether [`refresh`](Self::refresh) would do nothing at `now_ns`:
    /// one compare and, with a file mapped, one acquire load of the publish
    /// sequence (the per-request cost).
    #[inline]
    pub fn is_current(&self, now_ns: u64) -> bool {
        now_ns < self.next_check_ns && self.map.as_ref().is_none_or(|m| m.seq() == self.seen_seq)
    }

    /// Makes [`is_current`](Self::is_current) say no from now on, whatever
    /// refreshes the reader meanwhile (the module's test knob for a panic
    /// in its request handler, which it raises on that path).
    pub fn recheck_always(&mut self) {
        self.always_due = true;
        self.next_check_ns = 0;
    }

    /// When the file is checked next after a check at `now_ns`.
    fn next_check(&self, now_ns: u64) -> u64 {
        match self.always_due {
            true => 0,
            false => now_ns.saturating_add(RECHECK_NS),
        }
    }

    /// Call once per request with a monotonic time in nanoseconds (or
    /// after [`is_current`](Self::is_current) said no): rechecks the file
    /// once a second and reloads a newly published table.
    pub fn refresh(&mut self, now_ns: u64) -> Option<StateChange> {
        if self.is_current(now_ns) {
            return None;
        }
        if let Some(e) = self
            .map
            .as_ref()
            .filter(|m| m.faulted())
            .map(|m| m.fault_error())
        {
            // Truncated under us (a zeroed mapping reads as a new sequence):
            // fail open now, look for a whole file again in a second.
            self.next_check_ns = self.next_check(now_ns);
            return self.fail_open(&e);
        }
        let mut change = None;
        if now_ns >= self.next_check_ns {
            self.next_check_ns = self.next_check(now_ns);
            change = self.check_file();
            // Calendar windows (issue 33): list the windows ahead again
            // once half of a list is behind (a load and a compare till then).
            crate::core::calendar::refresh_due(crate::core::clock::unix_ns());
        }
        if let Some(map) = &self.map {
            if map.seq() != self.seen_seq && now_ns >= self.busy_until_ns {
                let map = map.clone();
                change = self.reload(&map, now_ns).or(change);
            }
        }
        change
    }

    fn set_state(&mut self, state: State, level: Severity, message: String) -> Option<StateChange> {
        if self.state == state {
            return None;
        }
        self.state = state;
        Some(StateChange { level, message })
    }

    /// [`set_state`](Self::set_state) with a message about the file:
    /// `rate_ctl: PATH: what`.
    fn file_state(
        &mut self,
        state: State,
        level: Severity,
        what: std::fmt::Arguments<'_>,
    ) -> Option<StateChange> {
        let message = format!("rate_ctl: {}: {what}", self.path.display());
        self.set_state(state, level, message)
    }

    fn fail_open(&mut self, err: &ShmError) -> Option<StateChange> {
        // A build under way is kept (and dropped once done, by the next
        // reload): no second one starts beside it.
        self.map = None;
        self.table = None;
        self.seen_seq = 0;
        self.set_state(
            State::FileUnusable,
            Severity::Error,
            format!("rate_ctl: {err}; requests pass unlimited until the file is usable"),
        )
    }

    fn check_file(&mut self) -> Option<StateChange> {
        if let Some(map) = &self.map {
            match map.still_valid() {
                Ok(true) => return self.reclaim(),
                Ok(false) => {} // replaced or removed: reopen below
                Err(e) => return self.fail_open(&e),
            }
        }
        match Mapping::open_owned(&self.path, self.owner) {
            Ok(m) => {
                self.map = Some(Arc::new(m));
                self.seen_seq = u64::MAX; // force a reload
                self.state = State::Start;
                self.reclaim()
            }
            Err(e) => self.fail_open(&e),
        }
    }

    /// Gives back the concurrency units of processes that died holding
    /// them (see [`crate::core::shm::ledger`]); at most once a second, with the file
    /// check.
    fn reclaim(&mut self) -> Option<StateChange> {
        let n = self.map.as_ref()?.reclaim_dead();
        if n > 0 {
            self.notice = Some(StateChange {
                level: Severity::Notice,
                message: format!(
                    "rate_ctl: {}: gave back {n} concurrency units held by a process that died",
                    self.path.display()
                ),
            });
        }
        None
    }

    /// An event to log besides the state changes [`refresh`](Self::refresh)
    /// reports (units given back); taken once.
    pub fn take_notice(&mut self) -> Option<StateChange> {
        self.notice.take()
    }

    fn reload(&mut self, map: &Arc<Mapping>, now_ns: u64) -> Option<StateChange> {
        if let Some((p, from)) = self.pending.take() {
            // At most one build in flight: while one runs, requests go on
            // with the current table, even when the file moved on since it
            // started (a writer flipping sequences would otherwise start a
            // thread, and a table's worth of memory, per request).
            if !p.is_finished() {
                self.pending = Some((p, from));
                return None;
            }
            // Only a build of what the file holds now is worth installing:
            // one of a table published over since (or read from a mapping
            // since replaced) is dropped off this thread, and the current
            // table is loaded below — installing it would decide requests
            // with a table the agent has already replaced.
            if Arc::ptr_eq(&from, map) && p.seq == map.seq() {
                return self.install_built(p.seq, p.take());
            }
            loader::drop_later(p.take());
        }
        let seq = map.seq();
        let announced = loader::announced_strategies(map, seq);
        if self.background && seq != 0 && announced >= loader::BACKGROUND_MIN {
            // The table decided with now, unless it is already a patch:
            // the base of a patch if few strategies changed (issue 29).
            let mut base = self
                .table
                .clone()
                .filter(|t| !t.is_patched() && t.mapping().is_some_and(|m| Arc::ptr_eq(m, map)));
            // A patch is tried here, at once (see `INLINE_PATCH_MAX`): no
            // helper thread to wait for. Not one (`Ok(None)`): the whole
            // table on a helper thread. Busy, moved on or refused — or a
            // panic, which must not leave every request retrying it on this
            // thread: the helper thread tries the patch again, as it always
            // did, and reports what it finds (its panic refuses the segment).
            if let Some(b) = base
                .as_ref()
                .filter(|_| announced <= loader::INLINE_PATCH_MAX)
            {
                let seg = map.segment((seq & 1) as usize);
                let buf = &mut self.buf;
                let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Table::read_patch(b, &seg, seq, buf)
                }));
                match tried {
                    Ok(Ok(Some(patched))) => return self.install_built(seq, Built::of(patched)),
                    Ok(Ok(None)) => base = None,
                    Ok(Err(_)) | Err(_) => {}
                }
            }
            if let Some(p) = loader::start(map.clone(), seq, base) {
                self.pending = Some((p, map.clone()));
                return None;
            }
        }
        for _ in 0..BUSY_RETRIES {
            let seq = map.seq();
            if seq == 0 {
                self.seen_seq = 0;
                self.table = None;
                return self.file_state(
                    State::NothingPublished,
                    Severity::Notice,
                    format_args!("no table published yet; requests pass"),
                );
            }
            let seg = map.segment((seq & 1) as usize);
            match Table::read(&seg, seq, &mut self.buf, Some(map.clone())) {
                Ok(mut table) => {
                    let n = table.published_strategies();
                    let version = table.config_version();
                    if n >= loader::BACKGROUND_MIN as usize {
                        // A large table is read again on a helper thread
                        // at the next publish, which may patch it (issue
                        // 29) by comparing with its payload.
                        table.keep_payload(std::mem::take(&mut self.buf));
                    }
                    self.table = Some(Arc::new(table));
                    self.seen_seq = seq;
                    return self.file_state(
                        State::Enforcing,
                        Severity::Notice,
                        format_args!("enforcing {n} strategies (config version {version})"),
                    );
                }
                // The writer published again while we copied: read afresh.
                Err(SegmentError::Busy) => {
                    std::hint::spin_loop();
                    continue;
                }
                Err(SegmentError::Sequence { .. }) if map.seq() != seq => continue,
                Err(e) => {
                    // Refused: keep the last good table until the next publish.
                    self.seen_seq = seq;
                    let kept = if self.table.is_some() {
                        "keeping the previous table"
                    } else {
                        "requests pass"
                    };
                    return self.file_state(
                        State::SegmentRefused,
                        Severity::Error,
                        format_args!("refused segment of sequence {seq}: {e}; {kept}"),
                    );
                }
            }
        }
        // Still busy: requests go on with the current table; try again shortly.
        self.busy_until_ns = now_ns.saturating_add(BUSY_BACKOFF_NS);
        None
    }

    /// Installs what a helper thread made of segment `seq`; the table it
    /// replaces is freed on a helper thread.
    fn install_built(&mut self, seq: u64, built: Built) -> Option<StateChange> {
        match built {
            Built::Table {
                table,
                strategies,
                config_version,
            } => {
                let patched = table.is_patched();
                if let Some(old) = self.table.replace(Arc::from(table)) {
                    loader::drop_later(old);
                }
                // A patch (issue 29) is replaced by the whole table, built
                // from the next refresh on (it is never the base of another).
                self.seen_seq = if patched { u64::MAX } else { seq };
                self.set_state(
                    State::Enforcing,
                    Severity::Notice,
                    format!(
                        "rate_ctl: {}: enforcing {strategies} strategies (config version {config_version})",
                        self.path.display()
                    ),
                )
            }
            Built::Refused(e) => {
                self.seen_seq = seq;
                let kept = if self.table.is_some() {
                    "keeping the previous table"
                } else {
                    "requests pass"
                };
                self.set_state(
                    State::SegmentRefused,
                    Severity::Error,
                    format!(
                        "rate_ctl: {}: refused segment of sequence {seq}: {e}; {kept}",
                        self.path.display()
                    ),
                )
            }
            // Read again at the next request.
            Built::Busy => None,
        }
    }
}
