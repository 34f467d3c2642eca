//! The agent's copy of the store's configuration (issue 29): read whole
//! once (start, reconnect, a gap in the store's change log, an import), then
//! kept up to date with only what each version changed
//! ([`crate::store::Changes`]), so that reading one change costs one row,
//! not the table.

use crate::store::{Changes, Snapshot};

/// What the agent reads when the version moved.
#[derive(Debug, Clone)]
pub enum Update {
    /// Everything, at its version.
    Full(Snapshot),
    /// What changed after version `after`.
    Delta { after: u64, changes: Changes },
}

/// The configuration at one version: a snapshot whose strategies stay
/// sorted by id, changed in place (a binary search per changed strategy).
#[derive(Debug, Clone)]
pub struct Table {
    pub version: u64,
    snap: Snapshot,
    /// Ids of the strategies changed (added, replaced, removed, turned
    /// bad) since [`take_changed`](Self::take_changed) last ran; `None`:
    /// any may have (a full read).
    changed: Option<Vec<u32>>,
}

impl Table {
    pub fn full(mut snap: Snapshot) -> Table {
        snap.strategies.sort_by_key(|s| s.id);
        snap.bad_rows.sort_by_key(|b| b.id);
        Table {
            version: snap.version,
            snap,
            changed: None,
        }
    }

    /// Applies `update`; `false` (the table unchanged) when it is a delta
    /// from another version than this table's: a full read is needed.
    pub fn apply(this: &mut Option<Table>, update: Update) -> bool {
        match update {
            Update::Full(snap) => {
                *this = Some(Table::full(snap));
                true
            }
            Update::Delta { after, changes } => match this {
                Some(t) if t.version == after => {
                    t.apply_changes(changes);
                    true
                }
                // Already there (a delta read twice).
                Some(t) if t.version == changes.version && after < t.version => true,
                _ => false,
            },
        }
    }

    fn remove(&mut self, id: u32) {
        if let Ok(i) = self.snap.strategies.binary_search_by_key(&id, |s| s.id) {
            self.snap.strategies.remove(i);
        }
        self.snap.bad_rows.retain(|b| b.id != id as i64);
    }

    fn apply_changes(&mut self, c: Changes) {
        if let Some(changed) = &mut self.changed {
            changed.extend(c.removed.iter().copied());
            changed.extend(c.bad_rows.iter().filter_map(|b| u32::try_from(b.id).ok()));
            changed.extend(c.strategies.iter().map(|s| s.id));
        }
        for id in c.removed {
            self.remove(id);
        }
        for b in c.bad_rows {
            if let Ok(id) = u32::try_from(b.id) {
                self.remove(id);
            }
            self.snap.bad_rows.push(b);
        }
        self.snap.bad_rows.sort_by_key(|b| b.id);
        for s in c.strategies {
            self.snap.bad_rows.retain(|b| b.id != s.id as i64);
            match self.snap.strategies.binary_search_by_key(&s.id, |x| x.id) {
                Ok(i) => self.snap.strategies[i] = s,
                Err(i) => self.snap.strategies.insert(i, s),
            }
        }
        if let Some(b) = c.blacklist {
            self.snap.blacklist = b;
        }
        self.version = c.version;
        self.snap.version = c.version;
    }

    pub fn len(&self) -> usize {
        self.snap.strategies.len()
    }

    /// The table as a snapshot (strategies by id, as the store reads them).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// The ids changed since the last call, sorted, each once (`None`:
    /// any may have changed); from now on changes are counted afresh.
    pub fn take_changed(&mut self) -> Option<Vec<u32>> {
        let mut ids = self.changed.replace(Vec::new())?;
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::StrategyRecord;
    use crate::store::valid::Valid;

    fn rec(id: u32, rate: u64) -> Valid<StrategyRecord> {
        let mut r = serde_json::from_str::<StrategyRecord>(&format!(
            r#"{{"name":"s{id}","algorithm":"token_bucket","rate":{rate},"burst":4,"scope":"host"}}"#
        ))
        .unwrap();
        r.id = id;
        r.into_valid().unwrap()
    }

    #[test]
    fn deltas_add_replace_and_remove_and_a_gap_needs_a_full_read() {
        let mut t = None;
        let snap = Snapshot {
            version: 5,
            strategies: vec![rec(1, 10), rec(2, 20)],
            bad_rows: vec![],
            blacklist: vec![],
        };
        assert!(Table::apply(&mut t, Update::Full(snap)));
        // A full read: any strategy may have changed.
        assert_eq!(t.as_mut().unwrap().take_changed(), None);
        let changes = Changes {
            version: 7,
            strategies: vec![rec(2, 25), rec(3, 30)],
            removed: vec![1],
            ..Changes::default()
        };
        assert!(Table::apply(
            &mut t,
            Update::Delta {
                after: 5,
                changes: changes.clone()
            }
        ));
        // The delta changed ids 1 to 3 (and nothing since).
        assert_eq!(t.as_mut().unwrap().take_changed(), Some(vec![1, 2, 3]));
        assert_eq!(t.as_mut().unwrap().take_changed(), Some(vec![]));
        let s = t.as_ref().unwrap().snapshot();
        assert_eq!(s.version, 7);
        let got: Vec<(u32, u64)> = s.strategies.iter().map(|r| (r.id, r.rate)).collect();
        assert_eq!(got, [(2, 25), (3, 30)]);
        // A delta from a version this table is not at is refused.
        let later = Changes {
            version: 9,
            ..Changes::default()
        };
        assert!(!Table::apply(
            &mut t,
            Update::Delta {
                after: 8,
                changes: later
            }
        ));
        assert_eq!(t.as_ref().unwrap().version, 7);
    }
}
