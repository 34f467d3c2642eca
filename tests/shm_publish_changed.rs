//! Issue 29: a publish told which strategies changed copies the others'
//! records from the writer's last payload. The segment it writes must be
//! byte for byte the payload a fresh encode of the same table (with the
//! slots and generations it assigned) gives, whatever the sequence of
//! adds, updates, removals, algorithm changes (new slots) and blacklist
//! changes — workers diff payloads record by record
//! (`core::shm::segment_diff`).

use rate_ctl::core::blacklist::BlacklistEntry;
use rate_ctl::core::model::{Action, Algorithm, Condition, Strategy, Unit, ValidStrategy};
use rate_ctl::core::shm::segment::{encode_records, read_raw};
use rate_ctl::core::shm::writer::Writer;
use rate_ctl::core::shm::Capacities;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn strategy(rng: &mut Rng, id: u32) -> ValidStrategy {
    let dims = ["userid", "api", "ip", "host"];
    let mut conditions = Vec::new();
    for d in dims.iter().take(1 + rng.below(3) as usize) {
        let v = match *d {
            "ip" => format!("10.0.{}.{}", rng.below(4), rng.below(256)),
            _ => format!("/{d}{}", rng.below(1000)),
        };
        conditions.push(Condition::from_key(d, v.as_str()));
    }
    let algorithm = [Algorithm::TokenBucket, Algorithm::FixedWindow][rng.below(2) as usize];
    let mut s = Strategy::plain(
        id,
        conditions,
        algorithm,
        10 + rng.below(1000),
        Unit::Second,
    );
    s.burst = 10 + rng.below(1000) as u32;
    s.enabled = rng.below(8) != 0;
    s.name = "n".repeat(rng.below(20) as usize);
    if algorithm == Algorithm::TokenBucket && rng.below(4) == 0 {
        s.action = Action::Delay {
            max_delay_ms: 1 + rng.below(500) as u32,
        };
    }
    s.into_valid().unwrap()
}

/// The payload of `w`'s active segment.
fn active_payload(w: &Writer) -> Vec<u8> {
    let map = w.mapping();
    let seq = map.seq();
    let mut buf = Vec::new();
    read_raw(&map.segment((seq & 1) as usize), seq, &mut buf).unwrap();
    buf
}

/// A fresh encode of `table` with the slots `w` published it with.
fn fresh_encode(w: &Writer, table: &[ValidStrategy], bl: &[BlacklistEntry]) -> Vec<u8> {
    let slots: Vec<(u32, u32, u64)> = w.published().collect();
    let mut bl_dims: Vec<String> = Vec::new();
    for e in bl {
        if !bl_dims.contains(&e.dimension) {
            bl_dims.push(e.dimension.clone());
        }
    }
    let items = table.iter().map(|s| {
        let (_, slot, generation) = *slots.iter().find(|p| p.0 == s.id).unwrap();
        (&**s, slot, generation)
    });
    encode_records(items, &bl_dims, 0)
}

#[test]
fn publishing_only_the_changed_records_writes_a_fresh_encodes_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let caps = Capacities::tables(4096, 4 << 20);
    for seed in 1..=20u64 {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
        let path = dir.path().join(format!("changed-{seed}"));
        let mut w = Writer::create_or_adopt(&path, caps, 0o600).unwrap();
        let mut table: Vec<ValidStrategy> = (1..=200).map(|id| strategy(&mut rng, id)).collect();
        let mut bl: Vec<BlacklistEntry> = Vec::new();
        // The first publish has no previous payload: all encoded.
        w.publish_changed(&table, &bl, 1, Some(&[])).unwrap();
        assert_eq!(active_payload(&w), fresh_encode(&w, &table, &bl));
        for step in 0..30u64 {
            let mut changed = Vec::new();
            for _ in 0..1 + rng.below(6) {
                let id = 1 + rng.below(260) as u32;
                changed.push(id);
                match (table.binary_search_by_key(&id, |s| s.id), rng.below(3)) {
                    (Ok(i), 0) => {
                        table.remove(i);
                    }
                    (Ok(i), _) => table[i] = strategy(&mut rng, id),
                    (Err(i), _) => table.insert(i, strategy(&mut rng, id)),
                }
            }
            if rng.below(5) == 0 {
                bl.push(BlacklistEntry {
                    dimension: ["host", "userid", "api"][rng.below(3) as usize].to_string(),
                    value: format!("v{}", rng.below(100)).into_bytes(),
                    expires_unix_ms: None,
                });
            }
            changed.sort_unstable();
            changed.dedup();
            w.publish_changed(&table, &bl, 2 + step, Some(&changed))
                .unwrap();
            assert_eq!(
                active_payload(&w),
                fresh_encode(&w, &table, &bl),
                "seed {seed} step {step}"
            );
        }
    }
}

/// The test above can fail: a change left out of `changed` publishes the
/// strategy's old record, which a fresh encode does not.
#[test]
fn a_change_left_out_of_the_list_keeps_its_old_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(7);
    let path = dir.path().join("left-out");
    let mut w = Writer::create_or_adopt(&path, Capacities::tables(1024, 1 << 20), 0o600).unwrap();
    let mut table: Vec<ValidStrategy> = (1..=50).map(|id| strategy(&mut rng, id)).collect();
    w.publish_changed(&table, &[], 1, None).unwrap();
    let mut s = Strategy::clone(&table[10]);
    s.rate += 1;
    table[10] = s.into_valid().unwrap();
    w.publish_changed(&table, &[], 2, Some(&[])).unwrap();
    assert_ne!(active_payload(&w), fresh_encode(&w, &table, &[]));
    // Listed: encoded again.
    w.publish_changed(&table, &[], 3, Some(&[11])).unwrap();
    assert_eq!(active_payload(&w), fresh_encode(&w, &table, &[]));
}
