//! Helpers shared by the limiter property tests: a strategy without
//! conditions, zeroed local slots and a slot's state words.
#![allow(dead_code)]

use std::sync::atomic::Ordering;

use rate_ctl::core::model::{self, Action, Algorithm, Unit};
use rate_ctl::core::shm::slot::{LocalSlots, Slot};

pub const S: u64 = 1_000_000_000;

/// A strategy without conditions (must be valid).
pub fn strategy(
    algorithm: Algorithm,
    rate: u64,
    per: Unit,
    burst: u32,
    action: Action,
) -> model::Strategy {
    model::Strategy::unconditioned(algorithm, rate, per, burst, action).expect("valid strategy")
}

/// Runs `f` with one zeroed slot.
pub fn with_slot<R>(f: impl FnOnce(&Slot) -> R) -> R {
    let local = LocalSlots::new(1);
    let region = local.region();
    f(&Slot::at(&region, 0).unwrap())
}

/// Runs `f` with two zeroed slots.
pub fn with_slots<R>(f: impl FnOnce(&Slot, &Slot) -> R) -> R {
    let local = LocalSlots::new(2);
    let region = local.region();
    f(
        &Slot::at(&region, 0).unwrap(),
        &Slot::at(&region, 1).unwrap(),
    )
}

/// The two state words of `s`.
pub fn words(s: &Slot) -> (u64, u64) {
    (
        s.state0().load(Ordering::Relaxed),
        s.state1().load(Ordering::Relaxed),
    )
}
